"""Faults done the real way, on real nodes, through the chart-installed operator:
- a dataset that does not exist: the launcher exits 78 before torchrun and the kubelet reports its termination
  message; the job fails with ConfigError at once, never restarted;
- the operator's pod killed mid-training: the Deployment brings up a new one, which adopts the running gang (same
  pods, no restart) and the job succeeds;
- the two nodes' pod networks partitioned: rank 1 cannot reach rank 0, and the job fails with RendezvousTimeout
  naming rank 0's address;
- an eviction through the Eviction API: the real kubelet sends SIGTERM to the container's PID 1 (the launcher) with
  the pod's grace period; the ranks agree on a step, checkpoint, exit 143, and the next attempt resumes from exactly
  that step without counting a restart.
What each rank logged is read from the copy on the output claim (the pods of attempt 0 are gone by then)."""

from __future__ import annotations

import json
import time

import pytest

from tests.realnodes.conftest import RealCluster, diagnostics, job_status
from tests.realnodes.jobs import STEPS, TIMEOUT, complete_checkpoints, long_tiny, report, sigterm_steps, wait_terminal
from tests.waiting import wait_for

pytestmark = pytest.mark.realnodes


def test_an_eviction_stops_the_gang_on_sigterm_at_an_agreed_checkpoint_and_resumes_from_it(
    real_cluster: RealCluster, chart_operator: str, namespace: str
) -> None:
    rc = real_cluster
    out = long_tiny(rc, namespace, "drained", terminationGracePeriodSeconds=60, maxRestarts=0)
    first = wait_for(lambda: complete_checkpoints(out), timeout=TIMEOUT, what="a complete checkpoint", interval=0.5)[-1]
    t0 = time.monotonic()
    rc.kubectl(
        "create",
        "-f",
        "-",
        "--raw",
        f"/api/v1/namespaces/{namespace}/pods/drained-node-1/eviction",
        input=json.dumps(
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": "drained-node-1", "namespace": namespace},
            }
        ),
    )
    assert not (out / "result.json").exists(), "training finished before the eviction"

    def stepping_again() -> bool:  # the recreated gang past the step it resumed from (or already done)
        st = job_status(rc, namespace, "drained")
        resumed = (st.get("progress") or {}).get("lastCheckpointStep") or 0
        moving = st.get("state") == "Running" and ((st.get("progress") or {}).get("step") or 0) > resumed
        return st.get("attempt") == 1 and (moving or st.get("state") == "Succeeded")

    wait_for(stepping_again, timeout=TIMEOUT, what="attempt 1 stepping", interval=0.25)
    recovered = time.monotonic() - t0
    st = wait_terminal(rc, namespace, "drained")
    assert st["state"] == "Succeeded", (st, diagnostics(rc, namespace))
    assert (st["restarts"], st["disruptions"]) == (0, 1), st
    assert st["failure"]["reason"] == "Evicted", st["failure"]
    stopped = sigterm_steps(out, 0)
    assert len(stopped) == 1, stopped  # every rank stopped at the same agreed step
    (step,) = stopped
    result = json.loads((out / "result.json").read_text())
    assert step >= first and result["resumed_from_step"] == step, (step, result)
    assert result["steps"] == STEPS
    report(
        "eviction-real",
        {
            "scenario": "a pod evicted (real nodes): SIGTERM, an agreed checkpoint, the gang recreated",
            "recovered_after_s": round(recovered, 1),
            "steps_lost": 0 if result["resumed_from_step"] == step else None,
            "agreed_stop_step": step,
        },
    )


def test_a_missing_dataset_fails_at_once_with_config_error_from_the_termination_message(
    real_cluster: RealCluster, chart_operator: str, namespace: str
) -> None:
    rc = real_cluster
    long_tiny(
        rc,
        namespace,
        "nodata",
        dataset={"path": "/workspace/examples/tiny/no-such-data", "textField": "text", "labelField": "label"},
    )
    st = wait_terminal(rc, namespace, "nodata")
    assert st["state"] == "Failed" and st.get("restarts", 0) == 0, st
    cond = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert cond["status"] == "True" and cond["reason"] == "ConfigError" and "no-such-data" in cond["message"], cond
    pods = json.loads(rc.kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]
    assert {p["metadata"]["labels"]["finetune.dev/attempt"] for p in pods} <= {"0"}
    terminated = [
        c["state"]["terminated"]
        for p in pods
        for c in p["status"].get("containerStatuses", [])
        if "terminated" in c["state"]
    ]
    assert terminated and all(t["exitCode"] == 78 for t in terminated), terminated


def test_the_operator_pod_killed_mid_training_adopts_the_running_gang(
    real_cluster: RealCluster, chart_operator: str, namespace: str
) -> None:
    rc = real_cluster
    out = long_tiny(rc, namespace, "adopted", terminationGracePeriodSeconds=20)
    wait_for(lambda: complete_checkpoints(out), timeout=TIMEOUT, what="training under way", interval=0.5)
    before = {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in json.loads(rc.kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]
    }
    assert len(before) == 2, before
    operator = json.loads(
        rc.kubectl("get", "pods", "-n", chart_operator, "-l", "app.kubernetes.io/component=operator", "-o", "json")
    )["items"][0]["metadata"]["name"]
    rc.kubectl("delete", "pod", operator, "-n", chart_operator, "--grace-period=0", "--force", "--wait=false")
    assert not (out / "result.json").exists(), "training finished before the operator died"

    st = wait_terminal(rc, namespace, "adopted")
    assert st["state"] == "Succeeded" and st.get("restarts", 0) == 0, (st, diagnostics(rc, namespace))
    after = {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in json.loads(rc.kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]
    }
    assert after == before

    def replacement_ready() -> str | None:
        pods = json.loads(
            rc.kubectl("get", "pods", "-n", chart_operator, "-l", "app.kubernetes.io/component=operator", "-o", "json")
        )["items"]
        for p in pods:
            ready = {c["type"]: c["status"] for c in p["status"].get("conditions", [])}.get("Ready")
            if p["metadata"]["name"] != operator and ready == "True":
                return str(p["metadata"]["name"])
        return None

    wait_for(replacement_ready, timeout=120, what="the Deployment's new operator pod to be Ready")


def test_partitioned_nodes_fail_with_a_rendezvous_timeout_naming_rank_0(
    real_cluster: RealCluster, chart_operator: str, namespace: str
) -> None:
    rc = real_cluster
    with rc.nodes.partition(0, 1):
        long_tiny(rc, namespace, "parted", rendezvousTimeoutSeconds=10, terminationGracePeriodSeconds=5)
        st = wait_terminal(rc, namespace, "parted")
    assert st["state"] == "Failed", st
    cond = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == "RendezvousTimeout" and "parted-node-0.parted" in cond["message"], cond
