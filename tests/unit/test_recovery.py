"""Recovery of elastic and fixed-size jobs under faults, the pure part: each decision a reconcile pass takes when a
rank fails, a node is lost, a placeholder is preempted, a termination message is malformed, or a job's TTL would take
the only copy of its model. Every case is one ``decide()`` on wire-form objects, as the controller calls it."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from finetune_operator.admission import Observed
from finetune_operator.builders import JobRef, build_pdb, build_placeholder
from finetune_operator.kueue import GROUP_LABEL
from finetune_operator.settings import Settings
from finetune_operator.spec import elastic_problems, parse_spec
from finetune_operator.status import ts

from tests.unit.factories import NOW, STARTED, base_spec, decided, job, running
from tests.unit.test_elastic import elastic_job, on_node, placeholder, shrunk

pytestmark = pytest.mark.unit

UNSCHEDULABLE = {
    "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes"}]
}


def failed_at(p: dict[str, Any], seconds_ago: float) -> dict[str, Any]:
    p["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = ts(NOW - timedelta(seconds=seconds_ago))
    return p


# -- E1: below minNodes, rendezvous timeouts are waiting, not faults ------------------------------------------------


def test_below_min_nodes_rendezvous_timeouts_never_use_the_restart_budget() -> None:
    """minNodes 2 of 2, rank 1 unschedulable, rank 0 times out (exit 75) again and again: the job waits, restarts 0."""
    wire = elastic_job(dict(STARTED, state="Created"), elastic={"minNodes": 2, "unschedulableSeconds": 30})
    for attempt in range(6):  # more than maxRestarts + 1 (3 + 1) rendezvous timeouts
        plan = decided(
            wire,
            [
                on_node(running(0, attempt=attempt, phase="Failed", code=75), "n1"),
                running(1, attempt=attempt, phase="Pending", **UNSCHEDULABLE),
            ],
        )
        st = plan.status
        assert st.state == "Restarting", (attempt, st.state, st.failure)
        assert (st.restarts, st.disruptions) == (0, 0) and st.attempt == attempt + 1
        assert "ranks wait for the scheduler" in next(e.message for e in plan.events if e.reason == "RendezvousTimeout")
        wire = elastic_job(dict(st.to_wire(), attemptStartTime=ts(NOW), state="Created"))


def test_a_fixed_size_rendezvous_timeout_is_still_counted() -> None:
    plan = decided(
        job(dict(STARTED, state="Created"), nodes=2),
        [on_node(running(0, phase="Failed", code=75), "n1"), running(1, phase="Pending", **UNSCHEDULABLE)],
    )
    assert plan.status.restarts == 1


# -- E2: a lost node seen first as the survivors' failure -------------------------------------------------------------


def lost_peer() -> list[dict[str, Any]]:
    """Rank 0 failed (NCCL saw its peer go) while rank 1 still reads Running on n2, whose node was lost."""
    return [
        failed_at(on_node(running(0, phase="Failed", code=1, message="NCCL communicator was aborted"), "n1"), 5),
        on_node(running(1), "n2"),
    ]


def test_a_failure_while_a_peers_node_is_down_is_that_nodes_loss_and_shrinks() -> None:
    down = Observed(down_nodes={"n2": "the node is Ready=Unknown since ..."})
    plan = decided(elastic_job(dict(STARTED)), lost_peer(), observed=down)
    st = plan.status
    assert st.state == "Restarting" and (st.restarts, st.disruptions) == (0, 1)
    assert st.elastic is not None and st.elastic.current_nodes == 1
    assert st.failure is not None and "node(s) lost (n2" in st.failure.message


def test_a_failure_while_peers_run_waits_for_the_node_controller_then_counts() -> None:
    plan = decided(elastic_job(dict(STARTED)), lost_peer())
    assert plan.status.state == "Running" and not plan.delete and plan.status.restarts == 0
    assert plan.requeue_after is not None and plan.requeue_after <= 5
    pods = lost_peer()
    failed_at(pods[0], 61)
    late = decided(elastic_job(dict(STARTED)), pods)
    assert late.status.restarts == 1 and late.status.elastic is not None and late.status.elastic.current_nodes == 2


# -- E3 and the bounds: refused before any pod ------------------------------------------------------------------------


def test_an_inexact_global_batch_is_refused_naming_the_sizes() -> None:
    inexact = base_spec(nodes=3, elastic={"minNodes": 2}, training={"epochs": 1, "perDeviceBatchSize": 8})
    ((field, message),) = elastic_problems(parse_spec(inexact))
    assert field == "spec.elastic.minNodes"
    assert "cannot be kept exactly at 2 node(s)" in message and "gradientAccumulationSteps" in message
    # accumulation 2 at 3 nodes: 6 micro-batches, which 2 and 3 divide
    exact = base_spec(nodes=3, elastic={"minNodes": 2}, training={"epochs": 1, "gradientAccumulationSteps": 2})
    assert elastic_problems(parse_spec(exact)) == []


def test_unschedulable_seconds_must_end_before_the_rendezvous_times_out() -> None:
    spec = base_spec(nodes=4, rendezvousTimeoutSeconds=60, elastic={"minNodes": 2, "unschedulableSeconds": 600})
    assert [f for f, m in elastic_problems(parse_spec(spec)) if "rendezvousTimeoutSeconds" in m] == [
        "spec.elastic.unschedulableSeconds"
    ]


def test_a_resize_at_every_hiccup_is_refused_below_the_platforms_floors() -> None:
    """Zero cooldown and a 1 s unschedulable window: any autoscaler delay shrinks the gang and a flapping node restarts
    it again and again. Below the operator's floors (Helm values elastic.minResizeCooldownSeconds, 60, and
    minUnschedulableSeconds, 30) a new job is refused, naming both fields and where the floors are set; a platform that
    lowers them (a test cluster) admits it."""
    hiccups = {"minNodes": 1, "resizeCooldownSeconds": 0, "unschedulableSeconds": 1}
    training = {"maxSteps": 100, "gradientAccumulationSteps": 840}  # every size from 1 to 8 keeps the global batch
    plan = decided(elastic_job({}, nodes=8, elastic=hiccups, training=training))
    assert plan.status.state == "Failed" and plan.status.failure is not None
    message = plan.status.failure.message
    assert "spec.elastic.resizeCooldownSeconds: is 0s, below the 60s" in message, message
    assert "spec.elastic.unschedulableSeconds: is 1s, below the 30s" in message, message
    assert "Helm value elastic.minUnschedulableSeconds" in message
    lowered = Settings(elastic_min_resize_cooldown_seconds=0, elastic_min_unschedulable_seconds=1)
    assert decided(elastic_job({}, nodes=8, elastic=hiccups, training=training), settings=lowered).status.state == (
        "Created"
    )
    # finetune validate does not know the platform's floors: it judges the rest
    assert elastic_problems(parse_spec(base_spec(nodes=8, elastic=hiccups, training=training))) == []


def test_the_elastic_checks_refuse_a_new_job_before_any_pod_and_never_fail_a_running_one() -> None:
    """Judged at the first admission: an operator upgrade (or an edit of rendezvousTimeoutSeconds) never fails a job
    that already runs."""
    training = {"maxSteps": 100, "perDeviceBatchSize": 8, "gradientAccumulationSteps": 1}
    new = decided(elastic_job({}, nodes=3, elastic={"minNodes": 2}, training=training))
    assert new.status.state == "Failed" and not [o for o in new.create if o["kind"] == "Pod"]
    assert new.status.failure is not None and "spec.elastic.minNodes" in new.status.failure.message
    running_job = elastic_job(dict(STARTED), nodes=3, elastic={"minNodes": 2}, training=training)
    plan = decided(running_job, [running(0), running(1), running(2)])
    assert plan.status.state == "Running"


# -- E4: a finished attempt is never stopped for a resize -------------------------------------------------------------


def test_no_grow_while_a_rank_has_succeeded() -> None:
    training = {"maxSteps": 100, "perDeviceBatchSize": 8, "gradientAccumulationSteps": 2}  # exact at 2 and 3 nodes
    three = elastic_job(
        dict(shrunk(), nodes="2/3"), nodes=3, elastic={"minNodes": 2, "resizeCooldownSeconds": 60}, training=training
    )
    three["status"]["elastic"].update(currentNodes=2, desiredNodes=3, minNodes=2, gradientAccumulationSteps=3)
    pods = [running(0, attempt=1), running(1, attempt=1, phase="Succeeded", code=0), placeholder(0, 1)]
    plan = decided(three, pods)
    assert plan.status.attempt == 1 and plan.status.state != "Restarting"
    assert "ft-node-0" not in [d.name for d in plan.delete] and plan.resize is None


def test_no_grow_once_rank_0_reported_the_last_step() -> None:
    wire = elastic_job(shrunk())
    wire["status"]["progress"] = {"step": 100, "totalSteps": 100}
    plan = decided(wire, [running(0, attempt=1), placeholder(0, 1)])
    assert plan.status.attempt == 1 and plan.resize is None and not plan.delete


# -- E5, E7, E8, E9: placeholders ------------------------------------------------------------------------------------


def test_a_finished_placeholder_replaces_the_set_in_a_new_pod_group() -> None:
    wire = elastic_job(shrunk(minutes_ago=0.1), queueName="team-a")
    plan = decided(wire, [running(0, attempt=1), placeholder(0, 1, phase="Failed")])
    assert [d.name for d in plan.delete] == ["ft-grow-0"]
    assert plan.status.elastic is not None and plan.status.elastic.placeholder_generation == 1
    nxt = decided(elastic_job(plan.status.to_wire(), queueName="team-a"), [running(0, attempt=1)])
    (ph,) = [o for o in nxt.create if o["kind"] == "Pod"]
    assert ph["metadata"]["labels"][GROUP_LABEL].endswith("-g1")


def test_a_placeholder_carries_no_kueue_priority_and_the_attempts_image() -> None:
    wire = elastic_job(shrunk(), podTemplate={"labels": {"kueue.x-k8s.io/priority-class": "urgent", "team": "a"}})
    wire["status"]["runtime"] = {
        "attempt": 1,
        "values": [{"field": "spec.image", "value": "mirror.example/trainer:1", "source": "runtime"}],
    }
    plan = decided(wire, [running(0, attempt=1)])
    (ph,) = [o for o in plan.create if o["kind"] == "Pod"]
    labels = ph["metadata"]["labels"]
    assert "kueue.x-k8s.io/priority-class" not in labels and labels["team"] == "a"
    assert ph["spec"]["containers"][0]["image"] == "mirror.example/trainer:1"


def test_the_pdb_never_selects_placeholders_and_follows_the_size() -> None:
    spec = parse_spec(base_spec(nodes=2, podDisruptionBudget={"enabled": True}, elastic={"minNodes": 1}))
    pdb = build_pdb(JobRef("ft", "ns", "uid-1"), spec)
    assert pdb is not None
    (expr,) = pdb["spec"]["selector"]["matchExpressions"]
    assert expr == {"key": "app.kubernetes.io/component", "operator": "NotIn", "values": ["placeholder"]}
    ph = build_placeholder(JobRef("ft", "ns", "uid-1"), spec, index=0, count=1, attempt=0, settings=Settings())
    assert ph["metadata"]["labels"]["app.kubernetes.io/component"] in expr["values"]
    plan = decided(
        elastic_job(dict(STARTED), podDisruptionBudget={"enabled": True}),
        [running(0), on_node(running(1, pod_reason="Evicted", phase="Failed"), "n2")],
    )
    assert ("PodDisruptionBudget", "ft") in plan.delete_objects  # the next attempt creates it at its size


# -- T6: a malformed termination message --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "result",
    [
        {"loss": [["x", 1]]},
        {"loss": [[1, 1e400]]},
        {"loss": [[1, float("nan")]], "eval": [[None, 1]]},
        {"loss": [[float("inf"), 1.0]], "samplesPerSecond": float("nan")},
        {"loss": [[10**26, 1.0], [-5, 2.0], [True, 1.0]]},
        {"loss": "not a list", "eval": {"a": 1}},
        {"loss": [[3, 10**400]]},
    ],
    ids=["string-step", "overflow", "nan-loss", "inf-step", "huge-negative-bool", "wrong-types", "huge-int-loss"],
)
def test_a_malformed_result_never_wedges_the_status(result: dict[str, Any]) -> None:
    message = json.dumps({"reason": "Completed", "result": result})  # Python's json writes NaN and Infinity
    pods = [running(0, phase="Succeeded", code=0, message=message), running(1, phase="Succeeded", code=0)]
    plan = decided(job(dict(STARTED), nodes=2), pods)
    assert plan.status.state == "Succeeded"
    body = json.dumps(plan.status.to_wire(), allow_nan=False)  # what the status PUT sends
    history = json.loads(body).get("history") or {}
    for point in history.get("train", []) + history.get("eval", []):
        assert 0 <= point["step"] < 2**53


# -- L2: placeholder GPU time -------------------------------------------------------------------------------------


def test_placeholder_gpu_time_is_counted_when_the_job_ends_without_a_grow() -> None:
    gpu = {"limits": {"nvidia.com/gpu": 1}}
    wire = elastic_job(dict(shrunk(minutes_ago=1)), resources=gpu)
    wire["status"]["attemptStartTime"] = ts(NOW - timedelta(seconds=120))
    wire["status"]["elastic"].update(placeholdersRunning=1, capacitySince=ts(NOW - timedelta(seconds=300)))
    plan = decided(wire, [running(0, attempt=1, phase="Succeeded", code=0), placeholder(0, 1)])
    st = plan.status
    assert st.state == "Succeeded" and st.elastic is not None
    assert st.elastic.idle_gpu_seconds == 300 and st.gpu_seconds_used == 420  # 120 s training on 1 GPU + 300 idle
    assert [d.name for d in plan.delete] == ["ft-grow-0"]


# -- D1: the TTL never takes the only copy of the model --------------------------------------------------------


def test_the_ttl_keeps_a_job_whose_owned_claim_holds_the_only_model() -> None:
    template = {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    failed = dict(
        STARTED,
        state="Failed",
        completionTime=ts(NOW - timedelta(minutes=5)),
        failure={"reason": "ExportFailed", "message": "push failed"},
    )
    spec = {"output": {"volumeClaimTemplate": template}, "ttlSecondsAfterFinished": 0}
    plan = decided(job(failed, **spec), [])
    held = plan.status.condition("TTLHeld")
    assert not plan.delete_job and held is not None and "only on the output claim" in held.message
    assert "TTLHeld" in [e.reason for e in plan.events]
    retained = {"output": {"volumeClaimTemplate": template, "reclaimPolicy": "Retain"}, "ttlSecondsAfterFinished": 0}
    assert decided(job(failed, **retained), []).delete_job
    other = dict(failed, failure={"reason": "TrainingError", "message": "exit 1"})
    assert decided(job(other, **spec), []).delete_job


# -- progress across attempts ---------------------------------------------------------------------------------------


def test_a_new_attempt_stands_at_the_checkpoint_it_resumes_from_before_its_first_step() -> None:
    """The attempt before stopped after the operator's last scrape, at a checkpoint it saved as it stopped (262); the
    new attempt's rank 0 serves it before its loop starts: the job stands there, not at the last one seen (200)."""
    from finetune_operator.progress import parse_metrics

    wire = elastic_job(shrunk())
    wire["status"]["progress"] = {"step": 200, "totalSteps": 1200, "stepOfTotal": "200/1200", "lastCheckpointStep": 200}
    scraped = parse_metrics("finetune_checkpoint_last_step 262\n", nodes=1)
    assert scraped is not None and scraped.step is None
    plan = decided(wire, [running(0, attempt=1)], progress=scraped)
    progress = plan.status.progress
    assert progress is not None and (progress.step, progress.last_checkpoint_step) == (262, 262)
    assert progress.step_of_total == "262/1200"


# -- E6: a grow that Kueue holds goes back -------------------------------------------------------------------------


def test_a_grown_attempt_kueue_holds_past_the_unschedulable_window_goes_back_to_its_size() -> None:
    grown = elastic_job(shrunk(), queueName="team-a")
    pods = [running(0, attempt=1), placeholder(0, 1)]
    plan = decided(grown, pods)
    assert plan.status.elastic is not None and plan.status.elastic.grown_from == 1  # grew 1 -> 2

    gated = {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}
    held = dict(plan.status.to_wire(), attemptStartTime=ts(NOW - timedelta(seconds=31)), state="Created")
    queued = [dict(running(r, attempt=2, phase="Pending"), spec=gated) for r in range(2)]
    back = decided(elastic_job(held, queueName="team-a"), queued)
    st = back.status
    assert st.state == "Restarting" and st.elastic is not None and st.elastic.current_nodes == 1
    assert st.elastic.grown_from is None and (st.restarts, st.disruptions) == (0, 0)
    assert "Kueue held the grown attempt" in (st.condition("Resized").message if st.condition("Resized") else "")
    # within the window, it waits for Kueue
    young = dict(held, attemptStartTime=ts(NOW - timedelta(seconds=5)))
    assert decided(elastic_job(young, queueName="team-a"), queued).status.elastic.current_nodes == 2  # type: ignore[union-attr]


# -- L4: a shrunk job's throughput ------------------------------------------------------------------------------------


def test_a_shrunk_jobs_throughput_is_rank_0s_rate_times_its_current_size() -> None:
    """The controller's scrape of rank 0 (its per-node rates) scaled by the attempt's size: 1 node of 2, not 2. The
    kube client is never used by a scrape (None here); the page is served by a stub fetch."""
    import time

    from finetune_operator.controller import Controller
    from finetune_operator.state import read_job, read_pods

    c = Controller(None, Settings(progress_interval_seconds=5))  # type: ignore[arg-type]
    c.scraper.fetch = lambda url: (
        "finetune_train_step 5\nfinetune_train_total_steps 10\nfinetune_train_samples_per_second 10\n"
    )
    try:
        job = read_job(elastic_job(shrunk()))
        pod = running(0, attempt=1)
        pod["status"]["podIP"] = "10.0.0.9"
        pods = read_pods([pod])
        c._scrape(("ns", "ft"), job, pods)  # starts the scrape
        deadline = time.monotonic() + 10
        while (progress := c._scrape(("ns", "ft"), job, pods)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert progress.samples_per_second == 10
    finally:
        c.scraper.shutdown()


# -- restarts in place ------------------------------------------------------------------------------------------------


def test_a_restart_in_place_counts_once_as_a_restart_with_the_steps_it_lost() -> None:
    """Rank 0's gauges say its agents restarted every rank in place once (round 1): one restart against maxRestarts,
    in restartsInPlace, the steps since the checkpoint lost, a Warning event; the same report again counts nothing."""
    from finetune_operator.progress import parse_metrics

    wire = job(dict(STARTED), nodes=2)
    wire["status"]["progress"] = {"step": 37, "totalSteps": 100, "stepOfTotal": "37/100", "lastCheckpointStep": 30}
    page = "finetune_train_step 31\nfinetune_train_total_steps 100\nfinetune_checkpoint_last_step 30\n"
    scraped = parse_metrics(page + "finetune_restarts_in_place 1\n", nodes=2)
    plan = decided(wire, [running(0), running(1)], progress=scraped)
    st = plan.status
    assert (st.state, st.attempt, st.restarts, st.restarts_in_place) == ("Running", 0, 1, 1)
    assert st.progress is not None and (st.progress.steps_lost_to_restarts, st.progress.step) == (7, 31)
    assert plan.restarts_in_place == 1 and not plan.delete and not plan.create
    assert [e.reason for e in plan.events if e.type == "Warning"] == ["RestartedInPlace"]
    assert st.failure is not None and "restart 1/3" in st.failure.message
    again = decided(job(st.to_wire(), nodes=2), [running(0), running(1)], progress=scraped)
    assert (again.status.restarts, again.restarts_in_place) == (1, 0)
    assert "RestartedInPlace" not in [e.reason for e in again.events]


def test_rounds_no_scrape_saw_count_from_the_termination_message_before_the_gang_restart() -> None:
    """The agents used the attempt's last restarts in place between two scrapes and then gave up: the launcher's
    termination message says how many there were, and with them the budget is spent: the job fails."""
    message = json.dumps({"reason": "TrainingError", "message": "boom", "restartsInPlace": 3})
    plan = decided(job(dict(STARTED), nodes=2), [running(0, phase="Failed", code=1, message=message), running(1)])
    st = plan.status
    assert (st.state, st.restarts, st.restarts_in_place) == ("Failed", 3, 3)
    assert st.failure is not None and "restarts exhausted (3/3)" in st.failure.message


def test_a_new_attempts_pods_get_the_restarts_left_to_make_in_place() -> None:
    plan = decided(job(dict(STARTED, restarts=1, attempt=1, attemptStartTime=None, state="Restarting"), nodes=2), [])
    envs = [
        {e["name"]: e.get("value") for e in o["spec"]["containers"][0]["env"]}
        for o in plan.create
        if o.get("kind") == "Pod"
    ]
    assert [e["FINETUNE_RESTARTS_IN_PLACE"] for e in envs] == ["2", "2"]
    assert plan.status.progress is None or plan.status.progress.restarts_in_place is None


def test_a_run_that_ends_before_its_first_scrape_shows_the_steps_of_its_summary() -> None:
    """The quickstart trains its 60 steps in seconds, inside the first progress interval: no scrape saw it, and the
    succeeded job still says 60/60, with its throughput and last loss, from rank 0's summary (its termination
    message). A progress a scrape wrote is completed, not replaced."""
    result = {"steps": 60, "attempt": 0, "samplesPerSecond": 140.5, "loss": [[50, 0.7], [60, 0.52]]}
    message = json.dumps({"reason": "Completed", "message": "done", "result": result})
    plan = decided(job(dict(STARTED), nodes=1), [running(0, phase="Succeeded", code=0, message=message)])
    p = plan.status.progress
    assert plan.status.state == "Succeeded" and p is not None
    assert (p.step, p.total_steps, p.step_of_total, p.loss, p.samples_per_second, p.eta) == (
        60, 60, "60/60", 0.52, 140.5, "0s",
    )  # fmt: skip
    wire = job(dict(STARTED), nodes=1)
    wire["status"]["progress"] = {"step": 40, "totalSteps": 60, "stepOfTotal": "40/60", "loss": 0.9}
    later = decided(wire, [running(0, phase="Succeeded", code=0, message=message)]).status.progress
    assert later is not None and (later.step, later.step_of_total, later.loss) == (60, "60/60", 0.9)
    odd = json.dumps({"reason": "Completed", "result": {"steps": "sixty", "loss": "x"}})
    assert (
        decided(job(dict(STARTED), nodes=1), [running(0, phase="Succeeded", code=0, message=odd)]).status.progress
        is None
    )


def test_a_succeeded_job_shows_its_models_scores_from_rank_0s_summary() -> None:
    """The evaluation stage's scores and the final held-out metrics reach status.evaluation when the job succeeds; a
    summary with odd values (a custom image's) gives only what checks out, and a run without them none."""
    scores = {"state": "Succeeded", "split": "test", "samples": 40, "scores": {"correct": 0.5, "format": 1.0},
              "step": 60, "loss": 0.75, "rewardAccuracy": 0.875}  # fmt: skip
    message = json.dumps({"reason": "Completed", "result": {"steps": 60, "evaluation": scores}})
    plan = decided(job(dict(STARTED), nodes=1), [running(0, phase="Succeeded", code=0, message=message)])
    assert plan.status.state == "Succeeded"
    assert plan.status.to_wire()["evaluation"] == scores
    odd = {"state": "Exploded", "samples": -3, "scores": {"a": "x", "b": 0.25}, "loss": True, "split": 7}
    message = json.dumps({"reason": "Completed", "result": {"steps": 60, "evaluation": odd}})
    plan = decided(job(dict(STARTED), nodes=1), [running(0, phase="Succeeded", code=0, message=message)])
    assert plan.status.to_wire()["evaluation"] == {"scores": {"b": 0.25}}
    message = json.dumps({"reason": "Completed", "result": {"steps": 60, "evaluation": None}})
    plan = decided(job(dict(STARTED), nodes=1), [running(0, phase="Succeeded", code=0, message=message)])
    assert plan.status.evaluation is None and "evaluation" not in plan.status.to_wire()
