"""Faults done the real way, on real nodes, through the chart-installed operator:
- a dataset that does not exist: the launcher exits 78 before torchrun and the kubelet reports its termination
  message; the job fails with ConfigError at once, never restarted;
- the operator's pod killed mid-training: the Deployment brings up a new one, which adopts the running gang (same
  pods, no restart) and the job succeeds;
- the two nodes' pod networks partitioned: rank 1 cannot reach rank 0, and the job fails with RendezvousTimeout
  naming rank 0's address;
- a rank's training worker SIGKILLed inside its container (``kubectl exec``): the gang restarts once and resumes from
  the newest complete checkpoint;
- an eviction through the Eviction API: the real kubelet sends SIGTERM to the container's PID 1 (the launcher) with
  the pod's grace period; the ranks agree on a step, checkpoint, exit 143, and the next attempt resumes from exactly
  that step without counting a restart.
What each rank logged is read from the copy on the output claim (the pods of attempt 0 are gone by then)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realnodes.conftest import RealCluster, diagnostics, job_status
from tests.waiting import wait_for

pytestmark = pytest.mark.realnodes
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600
STEPS, INTERVAL = 400, 50
# Inside the container: the PID of the training worker (not torchrun's agent), then SIGKILL it.
KILL_WORKER = ("import os, signal\n"
               "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
               "    cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
               "    if b'finetune_trainer.worker' in cmd and b'torch.distributed.run' not in cmd:\n"
               "        os.kill(int(pid), signal.SIGKILL); print('killed', pid); break\n"
               "else:\n"
               "    raise SystemExit('no worker')\n")


def long_tiny(rc: RealCluster, namespace: str, name: str, **spec: Any) -> Path:
    """examples/tiny-job.yaml under ``name``, long enough to act on while it trains; returns its output directory."""
    rc.shared_claim(namespace, "finetune-workspace", content=ROOT / "examples", read_only=True)
    output = rc.shared_claim(namespace, "finetune-output")
    job = yaml.safe_load((ROOT / "examples" / "tiny-job.yaml").read_text())
    job["metadata"] = {"name": name, "namespace": namespace}
    job["spec"]["training"].update(maxSteps=STEPS, checkpointEverySteps=INTERVAL)
    job["spec"].update(spec)
    rc.kubectl("apply", "-f", "-", input=json.dumps(job))
    return output / namespace / name


def complete_checkpoints(out: Path) -> list[int]:
    return sorted(int(c.name.split("-")[1]) for c in (out / "checkpoints").glob("checkpoint-*")
                  if (c / "COMPLETE").exists())


def wait_terminal(rc: RealCluster, namespace: str, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        st = job_status(rc, namespace, name)
        return st if st.get("state") in ("Succeeded", "Failed") else None
    return dict(wait_for(done, timeout=TIMEOUT, what=f"{name} to finish", interval=2))


def test_a_rank_killed_in_its_container_restarts_the_gang_from_the_newest_checkpoint(
        real_cluster: RealCluster, chart_operator: str, namespace: str) -> None:
    rc = real_cluster
    out = long_tiny(rc, namespace, "killed", terminationGracePeriodSeconds=15)
    first = wait_for(lambda: complete_checkpoints(out), timeout=TIMEOUT, what="a complete checkpoint",
                     interval=0.5)[-1]
    killed = rc.kubectl("exec", "-n", namespace, "killed-node-1", "--", "python", "-c", KILL_WORKER)
    assert killed.startswith("killed "), killed
    assert not (out / "result.json").exists(), "training finished before the kill"

    st = wait_terminal(rc, namespace, "killed")
    assert st["state"] == "Succeeded" and st["restarts"] == 1, (st, diagnostics(rc, namespace))
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == STEPS
    resumed = result["resumed_from_step"]
    assert resumed and resumed >= first and resumed % INTERVAL == 0, result
    attempts = json.loads(rc.kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]
    assert {p["metadata"]["labels"]["finetune.dev/attempt"] for p in attempts} == {"1"}
    # The restart threw away at most one checkpoint interval of work (what was trained since the checkpoint).
    assert 0 <= st["progress"]["stepsLostToRestarts"] <= INTERVAL, st


def test_an_eviction_stops_the_gang_on_sigterm_at_an_agreed_checkpoint_and_resumes_from_it(
        real_cluster: RealCluster, chart_operator: str, namespace: str) -> None:
    rc = real_cluster
    out = long_tiny(rc, namespace, "drained", terminationGracePeriodSeconds=60, maxRestarts=0)
    first = wait_for(lambda: complete_checkpoints(out), timeout=TIMEOUT, what="a complete checkpoint",
                     interval=0.5)[-1]
    rc.kubectl("create", "-f", "-", "--raw", f"/api/v1/namespaces/{namespace}/pods/drained-node-1/eviction",
               input=json.dumps({"apiVersion": "policy/v1", "kind": "Eviction",
                                 "metadata": {"name": "drained-node-1", "namespace": namespace}}))
    assert not (out / "result.json").exists(), "training finished before the eviction"

    st = wait_terminal(rc, namespace, "drained")
    assert st["state"] == "Succeeded", (st, diagnostics(rc, namespace))
    assert (st["restarts"], st["disruptions"]) == (0, 1), st
    assert st["failure"]["reason"] == "Evicted", st["failure"]
    logs = "".join(f.read_text(errors="replace") for f in (out / "logs" / "attempt-0").glob("node-*.log"))
    stopped = {int(m) for m in re.findall(r"stopped on SIGTERM at step (\d+) after saving a checkpoint", logs)}
    assert len(stopped) == 1, (stopped, logs[-3000:])  # every rank stopped at the same agreed step
    (step,) = stopped
    result = json.loads((out / "result.json").read_text())
    assert step >= first and result["resumed_from_step"] == step, (step, result)
    assert result["steps"] == STEPS


def test_a_missing_dataset_fails_at_once_with_config_error_from_the_termination_message(
        real_cluster: RealCluster, chart_operator: str, namespace: str) -> None:
    rc = real_cluster
    long_tiny(rc, namespace, "nodata", dataset={"path": "/workspace/examples/tiny/no-such-data", "textField": "text",
                                                "labelField": "label"})
    st = wait_terminal(rc, namespace, "nodata")
    assert st["state"] == "Failed" and st.get("restarts", 0) == 0, st
    cond = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert cond["status"] == "True" and cond["reason"] == "ConfigError" and "no-such-data" in cond["message"], cond
    pods = json.loads(rc.kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]
    assert {p["metadata"]["labels"]["finetune.dev/attempt"] for p in pods} <= {"0"}
    terminated = [c["state"]["terminated"] for p in pods for c in p["status"].get("containerStatuses", [])
                  if "terminated" in c["state"]]
    assert terminated and all(t["exitCode"] == 78 for t in terminated), terminated


def test_the_operator_pod_killed_mid_training_adopts_the_running_gang(
        real_cluster: RealCluster, chart_operator: str, namespace: str) -> None:
    rc = real_cluster
    out = long_tiny(rc, namespace, "adopted", terminationGracePeriodSeconds=20)
    wait_for(lambda: complete_checkpoints(out), timeout=TIMEOUT, what="training under way", interval=0.5)
    before = {p["metadata"]["name"]: p["metadata"]["uid"]
              for p in json.loads(rc.kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]}
    assert len(before) == 2, before
    operator = json.loads(rc.kubectl("get", "pods", "-n", chart_operator, "-l", "app.kubernetes.io/component=operator",
                                     "-o", "json"))["items"][0]["metadata"]["name"]
    rc.kubectl("delete", "pod", operator, "-n", chart_operator, "--grace-period=0", "--force", "--wait=false")
    assert not (out / "result.json").exists(), "training finished before the operator died"

    st = wait_terminal(rc, namespace, "adopted")
    assert st["state"] == "Succeeded" and st.get("restarts", 0) == 0, (st, diagnostics(rc, namespace))
    after = {p["metadata"]["name"]: p["metadata"]["uid"]
             for p in json.loads(rc.kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]}
    assert after == before

    def replacement_ready() -> str | None:
        pods = json.loads(rc.kubectl("get", "pods", "-n", chart_operator, "-l",
                                     "app.kubernetes.io/component=operator", "-o", "json"))["items"]
        for p in pods:
            ready = {c["type"]: c["status"] for c in p["status"].get("conditions", [])}.get("Ready")
            if p["metadata"]["name"] != operator and ready == "True":
                return str(p["metadata"]["name"])
        return None
    wait_for(replacement_ready, timeout=120, what="the Deployment's new operator pod to be Ready")


def test_partitioned_nodes_fail_with_a_rendezvous_timeout_naming_rank_0(
        real_cluster: RealCluster, chart_operator: str, namespace: str) -> None:
    rc = real_cluster
    with rc.nodes.partition(0, 1):
        long_tiny(rc, namespace, "parted", rendezvousTimeoutSeconds=10, terminationGracePeriodSeconds=5)
        st = wait_terminal(rc, namespace, "parted")
    assert st["state"] == "Failed", st
    cond = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == "RendezvousTimeout" and "parted-node-0.parted" in cond["message"], cond
