"""An elastic job on real nodes, through the chart-installed operator: min 1, max 2 nodes; DDP with LoRA. (FSDP's
sharded checkpoints resharding 2 -> 1 -> 2 ranks, with the global batch kept, are the trainer tier's
``tests/trainer/test_elastic_resume.py``: here the resize itself, the nodes and the operator are under test, and one
variant of the trainer does for that.)

The node of one rank (not the operator's) is lost as a machine whose power goes (``NodeCluster.lose``). The job does
not wait for it: its next attempt trains on the node left, with the gradient accumulation doubled so the global batch
stays the one asked for. While it runs smaller, a placeholder pod (the trainer pod's resources and affinity, at the
chart's placeholder PriorityClass) waits for a node; the lost node boots again (``NodeCluster.rejoin``), the
scheduler places the placeholder there and its kubelet runs it, and after the job's resize cooldown the operator
stops the gang at an agreed step (its SIGTERM checkpoint) and runs the next attempt on both nodes. The job is then
suspended (its ranks agree on a step and checkpoint it), which ends the last attempt's record.

What is checked comes from the trainer's own records on the output claim (``attempts/attempt-<n>.json``, the
checkpoints' ``trainer_state.json``): the sizes and the global batch of every attempt, the step each resumed from,
the loss going on from where it was; from the API server: no two attempts' pods overlap, the conditions, events and
``kubectl get`` columns; from the operator's metrics: the resize counters.

Real: everything (control plane, node lifecycle and taint eviction controllers, scheduler and its preemption rules,
kubelets, containerd, the operator's Deployment, the trainer image).
"""

from __future__ import annotations

import json
import time
from statistics import mean
from typing import Any

import pytest
from kubernetes import client

from tests.faults.harness import Observed, PodWatch
from tests.realnodes.conftest import RealCluster, diagnostics, job_status
from tests.realnodes.jobs import complete_checkpoints, event_reasons, long_tiny, node_of, pods, report
from tests.realnodes.test_node_loss import FAST_FAILOVER
from tests.waiting import wait_for

pytestmark = [pytest.mark.realnodes, pytest.mark.faults]
COOLDOWN = 45  # spec.elastic.resizeCooldownSeconds
INTERVAL = 20  # checkpoint every this many steps
# One rank per node, required (as the operator sets it for multi-node GPU jobs): the placeholder of the missing rank
# then waits for a node the gang does not hold.
ONE_PER_NODE = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {
                    "matchExpressions": [{"key": "finetune.dev/job-name", "operator": "In", "values": ["elastic"]}]
                },
            }
        ]
    }
}


def running_at(
    rc: RealCluster, namespace: str, out: Any, attempt: int, *, nodes: int, past_step: int
) -> dict[str, Any] | None:
    """The status once ``attempt`` trains on ``nodes`` nodes (its pods run and rank 0 has written the attempt's record,
    which it does as training starts) and rank 0 reports a step beyond ``past_step``. The record matters: the status
    keeps the step the attempt before reached until the new one's first scrape, and that is past a checkpoint of
    before already."""
    st = job_status(rc, namespace, "elastic")
    step = (st.get("progress") or {}).get("step") or 0
    elastic = st.get("elastic") or {}
    ok = st.get("attempt") == attempt and st.get("state") == "Running" and elastic.get("currentNodes") == nodes
    started = (out / "attempts" / f"attempt-{attempt}.json").exists()
    return st if ok and started and step > past_step else None


def record(out: Any, attempt: int) -> dict[str, Any]:
    return dict(json.loads((out / "attempts" / f"attempt-{attempt}.json").read_text()))


def logged_losses(out: Any, step: int) -> list[float]:
    state = json.loads((out / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").read_text())
    return [h["loss"] for h in state["log_history"] if "loss" in h]


LORA = {"training.lora": {"r": 8, "alpha": 16, "targetModules": ["query", "value"]}}  # DDP, the tiny BERT with LoRA


def test_a_lost_node_shrinks_the_gang_and_its_return_grows_it_back_with_the_global_batch_kept(
    real_cluster: RealCluster, chart_operator: str, namespace: str, api_client: client.ApiClient
) -> None:
    rc = real_cluster
    out = long_tiny(
        rc,
        namespace,
        "elastic",
        steps=100000,  # ended by a suspend once it has grown back
        interval=INTERVAL,
        maxRestarts=0,
        terminationGracePeriodSeconds=20,  # the agreed stop of a grow checkpoints within it
        elastic={"minNodes": 1, "resizeCooldownSeconds": COOLDOWN, "unschedulableSeconds": 60},
        pod={"affinity": ONE_PER_NODE, "tolerations": FAST_FAILOVER},
        **{"training.keepCheckpoints": 50, **LORA},
    )
    seen = Observed()
    podwatch = PodWatch(api_client, namespace, seen)
    podwatch.start()
    lost_node: int | None = None
    figures: dict[str, Any] = {
        "scenario": "elastic, ddp-lora: node lost, then back (real nodes)",
        "cooldown_s": COOLDOWN,
    }
    step_at_loss = 0
    try:
        wait_for(lambda: complete_checkpoints(out), timeout=600, what="a complete checkpoint", interval=0.5)
        operator_node = rc.kubectl(
            "get", "pods", "-n", chart_operator, "-l", "app.kubernetes.io/component=operator",
            "-o", "jsonpath={.items[0].spec.nodeName}",
        )  # fmt: skip
        ranks = {r: node_of(rc, namespace, f"elastic-node-{r}") for r in (0, 1)}
        assert len(set(ranks.values())) == 2, ranks
        victim = next(r for r, n in ranks.items() if n != operator_node)
        gone = ranks[victim]
        lost_node = int(rc.kubectl("get", "node", gone, "-o", "jsonpath={.metadata.labels.finetune\\.dev/local-node}"))
        step_at_loss = (job_status(rc, namespace, "elastic").get("progress") or {}).get("step") or 0
        t0 = time.monotonic()
        rc.nodes.lose(lost_node)
        checkpoint = complete_checkpoints(out)[-1]
        small = wait_for(
            lambda: running_at(rc, namespace, out, 1, nodes=1, past_step=checkpoint),
            timeout=420,
            what="attempt 1 training on one node",
            interval=0.5,
        )
        figures["node_lost_to_training_smaller_s"] = round(time.monotonic() - t0, 1)
        columns = rc.kubectl("get", "ftj", "elastic", "-n", namespace, "--no-headers")
        assert " 1/2 " in f" {columns} ", columns
        assert small["elastic"]["gradientAccumulationSteps"] == 2, small["elastic"]
        placeholder = wait_for(
            lambda: [p for p in pods(rc, namespace) if p["metadata"]["name"] == "elastic-grow-0"],
            timeout=60,
            what="the placeholder",
            interval=0.5,
        )[0]
        assert placeholder["spec"]["priorityClassName"] == "finetune-placeholder", placeholder["spec"]
        assert placeholder["status"]["phase"] == "Pending", placeholder["status"]  # no node for it yet

        t1 = time.monotonic()
        rc.nodes.rejoin(lost_node)
        lost_node = None
        figures["node_rejoined_after_s"] = round(time.monotonic() - t1, 1)
        at_grow = complete_checkpoints(out)[-1]
        wait_for(
            lambda: running_at(rc, namespace, out, 2, nodes=2, past_step=at_grow),
            timeout=420,
            what="attempt 2 training on both nodes again",
            interval=0.5,
        )
        figures["capacity_back_to_training_full_size_s"] = round(time.monotonic() - t1, 1)
        assert {node_of(rc, namespace, f"elastic-node-{r}") for r in (0, 1)} == set(ranks.values())
        resumed = record(out, 2)["resumed_from_step"]
        wait_for(lambda: complete_checkpoints(out)[-1] > resumed, timeout=300, what="a checkpoint at full size")
        rc.kubectl("patch", "ftj", "elastic", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}')
        wait_for(lambda: "stopped_by_signal" in record(out, 2), timeout=180, what="attempt 2's record", interval=1)
    finally:
        podwatch.stop.set()
        if lost_node is not None:
            rc.nodes.rejoin(lost_node)
    st = job_status(rc, namespace, "elastic")
    events = event_reasons(rc, namespace, "elastic")
    records = [record(out, a) for a in (0, 1, 2)]
    figures.update(
        # the shrink: at least the steps rank 0 had reported past the checkpoint when the node went; the grow: exact
        steps_lost_shrink_at_least=step_at_loss - records[1]["resumed_from_step"],
        steps_lost_grow=records[1]["last_step"] - records[2]["resumed_from_step"],
        resumed_from=[r["resumed_from_step"] for r in records],
        operator_steps_lost_to_resizes=st["elastic"].get("stepsLostToResizes"),
        idle_gpu_seconds=st["elastic"].get("idleGpuSeconds"),
        overlaps=len(seen.overlaps),
    )
    report("elastic-real-ddp-lora", figures)
    assert seen.overlaps == [], seen.overlaps
    assert (st.get("restarts", 0), st.get("disruptions", 0)) == (0, 1), st
    assert st["elastic"]["resizes"] == 2 and st["elastic"]["lastResize"] == "Grown", st["elastic"]
    resized = next(c for c in st["conditions"] if c["type"] == "Resized")
    assert resized["reason"] == "Grown" and "1 -> 2 node(s)" in resized["message"], resized
    assert events.count("Shrunk") == 1 and events.count("Grown") == 1, events
    # The trainer's own records: the sizes, one global batch, each attempt resumed from the newest checkpoint.
    assert [(r["nodes"], r["gradient_accumulation_steps"]) for r in records] == [(2, 1), (1, 2), (2, 1)], records
    assert len({r["global_batch_size"] for r in records}) == 1, records
    assert {r["global_batch_size"] for r in records} == {r["global_batch_size_asked"] for r in records}
    assert records[1]["stopped_by_signal"] and records[2]["resumed_from_step"] == records[1]["last_step"], records
    assert 0 < records[1]["resumed_from_step"] < records[2]["resumed_from_step"], records
    # The loss goes on from where it was: each resumed attempt starts near the loss its checkpoint had reached, well
    # below where training began (a run that lost its state would start there again).
    for attempt in (1, 2):
        before = logged_losses(out, records[attempt]["resumed_from_step"])
        begins = [loss for _, loss in records[attempt]["loss_history"]][:3]
        first, last = mean(before[:3]), mean(before[-3:])
        assert last < first and mean(begins) < last + 0.5 * (first - last), (attempt, before, begins)
    # No placeholder is left once the job stops.
    wait_for(lambda: not pods(rc, namespace), timeout=120, what="the suspended job's pods to go", interval=1)
    assert st["state"] == "Suspended", (st, diagnostics(rc, namespace))


def test_below_min_nodes_the_job_waits_saying_so_and_runs_when_the_node_is_back(
    real_cluster: RealCluster, chart_operator: str, namespace: str
) -> None:
    """One of the two nodes cordoned: a job that needs both (minNodes 2) places one rank and waits, with condition
    Created/BelowMinNodes once the other has been unschedulable for unschedulableSeconds. The placed rank's rendezvous
    times out meanwhile, past rendezvousTimeoutSeconds x (maxRestarts + 1) (maxRestarts 0: one counted timeout would
    fail the job): waiting for the scheduler is not a fault, so no restart is counted and the job never fails.
    Uncordoned, it runs on both."""
    rc = real_cluster
    node = rc.kubectl("get", "nodes", "-o", "jsonpath={.items[1].metadata.name}")
    rc.kubectl("cordon", node)
    try:
        long_tiny(
            rc,
            namespace,
            "elastic",
            steps=40,
            maxRestarts=0,
            rendezvousTimeoutSeconds=15,
            elastic={"minNodes": 2, "unschedulableSeconds": 10},
            pod={"affinity": ONE_PER_NODE},
        )

        def below_min() -> dict[str, Any] | None:
            st = job_status(rc, namespace, "elastic")
            created = next((c for c in st.get("conditions") or [] if c["type"] == "Created"), {})
            return st if created.get("reason") == "BelowMinNodes" else None

        st = wait_for(below_min, timeout=180, what="condition BelowMinNodes", interval=1)
        created = next(c for c in st["conditions"] if c["type"] == "Created")
        assert "fewer than spec.elastic.minNodes=2" in created["message"], created
        assert st["state"] == "Created", st
        assert "BelowMinNodes" in event_reasons(rc, namespace, "elastic")
        # A rendezvous timeout (15 s, or torchrun's 60 s floor when rank 0 is the one placed), past 15 s x (0 + 1).
        st = wait_for(
            lambda: (s := job_status(rc, namespace, "elastic")).get("attempt", 0) >= 1 and s,
            timeout=300,
            what="the placed rank's rendezvous timing out",
            interval=2,
        )
        assert (st.get("restarts", 0), st.get("disruptions", 0)) == (0, 0) and st["state"] != "Failed", st
    finally:
        rc.kubectl("uncordon", node)
    st = wait_for(
        lambda: (s := job_status(rc, namespace, "elastic")).get("state") == "Running" and s,
        timeout=300,
        what="the job running on both nodes",
        interval=1,
    )
    assert st["elastic"]["currentNodes"] == 2 and st["nodes"] == "2/2", st
    assert (st.get("restarts", 0), st.get("disruptions", 0)) == (0, 0), st


def one_per_node(name: str) -> dict[str, Any]:
    rule = ONE_PER_NODE["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    term = {**rule, "labelSelector": {"matchLabels": {"finetune.dev/job-name": name}}}
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def test_a_drained_rank_0_shrinks_the_job_which_ends_at_exactly_max_steps_with_one_record_of_the_run(
    real_cluster: RealCluster, chart_operator: str, namespace: str
) -> None:
    """``kubectl drain`` of rank 0's node: its ranks agree on a step and checkpoint it (SIGTERM), the next attempt
    trains on the node left with the accumulation doubled, and the node is back (uncordoned) at once, so a placeholder
    runs there; the shrunk attempt reaches maxSteps before the cooldown ends and the job succeeds at exactly maxSteps,
    never stopped for a grow. The status moved in both attempts, and result.json describes the whole run."""
    rc, name, steps = real_cluster, "drained", 400
    out = long_tiny(
        rc,
        namespace,
        name,
        steps=steps,
        interval=50,
        terminationGracePeriodSeconds=30,
        elastic={"minNodes": 1, "resizeCooldownSeconds": 240, "unschedulableSeconds": 60},
        pod={"affinity": one_per_node(name)},
    )
    seen: list[tuple[int, int]] = []  # (attempt, step) as `kubectl get ftj` showed them

    def watch(until: Any) -> Any:
        st = job_status(rc, namespace, name)
        seen.append((st.get("attempt", 0), (st.get("progress") or {}).get("step") or 0))
        return until(st)

    wait_for(lambda: watch(lambda st: seen[-1][1] >= 60 and st), timeout=600, what="step 60 in attempt 0", interval=1)
    node = node_of(rc, namespace, f"{name}-node-0")
    rc.kubectl(
        "drain", node, f"--pod-selector=finetune.dev/job-name={name}", "--ignore-daemonsets",
        "--delete-emptydir-data", "--timeout=180s",
    )  # fmt: skip
    try:
        wait_for(
            lambda: watch(lambda st: st.get("attempt", 0) >= 1 and (st.get("elastic") or {}).get("currentNodes") == 1),
            timeout=300,
            what="the next attempt sized to one node",
            interval=1,
        )
    finally:
        rc.kubectl("uncordon", node)  # capacity is back: the placeholder runs there, the cooldown holds the grow
    st = wait_for(
        lambda: watch(lambda s: s.get("state") in ("Succeeded", "Failed") and s),
        timeout=600,
        what="the job to finish",
        interval=1,
    )
    assert st["state"] == "Succeeded", (st, diagnostics(rc, namespace))
    assert (st.get("restarts", 0), st.get("disruptions", 0), st["elastic"]["resizes"]) == (0, 1, 1), st
    assert st["progress"]["step"] == steps and st["progress"]["totalSteps"] == steps, st["progress"]
    first, second = record(out, 0), record(out, 1)
    assert first["stopped_by_signal"] and second["resumed_from_step"] == first["last_step"], (first, second)
    # the status moved in both attempts: steps of attempt 1 between its checkpoint and the end
    moving = {step for attempt, step in seen if attempt == 1 and second["resumed_from_step"] < step < steps}
    assert moving, seen
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == steps and result["steps_this_attempt"] == steps - second["resumed_from_step"]
    assert [(a["attempt"], a["nodes"]) for a in result["attempts"]] == [(0, 2), (1, 1)], result["attempts"]
    assert sum(a["steps_trained"] for a in result["attempts"]) == steps, result["attempts"]  # a drain loses nothing
    assert result["samples"] == sum(a["samples"] for a in result["attempts"]) > 0
