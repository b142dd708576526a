"""End to end on one machine: FineTuneJob → real operator → pods on the real API server → local node agent →
``finetune-trainer`` → torchrun rendezvous → DDP (gloo, CPU) → checkpoints/resume → status.

Mocked: only the kubelet and container runtime (``hack/nodeagent``, a documented test double: pods run as local
processes in their own network/mount/UTS/PID namespaces). Real: etcd, kube-apiserver, kube-controller-manager,
the operator process, the trainer, torch.distributed. Everything waits on observable state with timeouts; no
duration is asserted.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import E2E, ORT_IMAGE, tiny_job
from tests.trainer.helpers import ort_venv_problem
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

TRAIN_TIMEOUT = 420  # generous: 2 CPU cores shared with other work
# The tiny example trains 30 steps in a few seconds; tests that act *during* training run it longer so that a
# checkpoint exists well before the end (they check that training had not finished when they acted).
LONG = {"training.maxSteps": 400, "training.checkpointEverySteps": 50}
INTERVAL = LONG["training.checkpointEverySteps"]


def _failed_condition(e: E2E, name: str) -> dict[str, Any]:
    cond = e.jobs.condition(name, "Failed")
    assert cond is not None and cond["status"] == "True", e.jobs.status(name)
    return cond


def _wait_terminal(e: E2E, name: str, timeout: float, on_poll: Any = None) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        st = e.jobs.status(name)
        if on_poll:
            on_poll(st)
        return st if st.get("state") in ("Succeeded", "Failed") else None
    return wait_for(probe, timeout=timeout, what=f"{name} to finish", interval=1.0)


@pytest.mark.ort
def test_ort_job_runs_on_the_onnx_runtime_image(e2e: E2E) -> None:
    """acceleration: ort → the operator gives both pods the ONNX Runtime image; the node agent runs that image from
    the ORT stack's venv; two ORTTrainer ranks rendezvous, train and the job succeeds."""
    problem = ort_venv_problem()
    if problem:
        pytest.fail(problem)
    e2e.jobs.create(tiny_job("tiny-ort", acceleration="ort", terminationGracePeriodSeconds=20,
                             **{"training.maxSteps": 10, "training.checkpointEverySteps": 5}))
    assert {p.spec.containers[0].image for p in e2e.jobs.wait_pods("tiny-ort", 2)} == {ORT_IMAGE}
    st = _wait_terminal(e2e, "tiny-ort", TRAIN_TIMEOUT)
    assert st["state"] == "Succeeded", st
    result = e2e.result("tiny-ort")
    assert (result["acceleration"], result["attention"], result["world_size"]) == ("ort", "eager", 2), result
    assert result["steps"] == 10 and e2e.complete_checkpoints("tiny-ort")[-1] == 10


def test_missing_dataset_fails_at_once_with_config_error(e2e: E2E) -> None:
    """A dataset path that does not exist: the launcher exits 78 before torchrun; the job fails, no restart."""
    e2e.jobs.create(tiny_job("nodata", **{"dataset.path": "/workspace/examples/tiny/no-such-data"}))
    st = _wait_terminal(e2e, "nodata", 180)
    assert st["state"] == "Failed", st
    cond = _failed_condition(e2e, "nodata")
    assert cond["reason"] == "ConfigError", cond
    assert "no-such-data" in cond["message"], cond
    assert st.get("restarts", 0) == 0
    assert {p.metadata.labels["finetune.dev/attempt"] for p in e2e.jobs.pods("nodata")} <= {"0"}


def test_operator_restart_while_training_keeps_pods(e2e: E2E) -> None:
    """SIGKILL the operator mid-training and start a new one: the job completes with the same pods (no
    duplicates, no restart)."""
    e2e.jobs.create(tiny_job("tiny", terminationGracePeriodSeconds=20, **LONG))

    def running() -> list[Any] | None:
        pods = [p for p in e2e.jobs.live_pods("tiny") if p.status.phase == "Running"]
        return pods if len(pods) == 2 else None

    pods = wait_for(running, timeout=120, what="2 running pods")
    uids = {p.metadata.name: p.metadata.uid for p in pods}
    wait_for(lambda: e2e.complete_checkpoints("tiny"), timeout=TRAIN_TIMEOUT, what="training under way",
             interval=0.5)
    e2e.operator.kill()
    assert not (e2e.output_dir("tiny") / "result.json").exists(), "training finished before the operator died"
    e2e.operator.start()
    seen: set[str] = set()
    wide: list[str] = []

    def track(st: dict[str, Any]) -> None:
        seen.update(p.metadata.uid for p in e2e.jobs.pods("tiny"))
        if (st.get("progress") or {}).get("stepOfTotal") and st.get("state") == "Running":
            wide.append(e2e.kubectl("get", "ftj", "tiny", "-n", e2e.namespace, "-o", "wide"))

    st = _wait_terminal(e2e, "tiny", TRAIN_TIMEOUT, track)
    assert st["state"] == "Succeeded", st
    # While it ran, `kubectl get ftj -o wide` showed step, samples/s and ETA from rank 0's metrics (and no eval
    # loss: this job does not evaluate).
    assert wide, "status.progress never appeared while the job ran"
    header, row = wide[-1].splitlines()[:2]
    assert header.split()[-4:] == ["STEP", "SAMPLES/S", "ETA", "EVAL-LOSS"], header
    at = [header.index(col) for col in ("STEP", "SAMPLES/S", "ETA", "EVAL-LOSS")]  # kubectl leaves empty cells blank
    step, samples, eta, eval_loss = (row[a:b].strip() for a, b in zip(at, [*at[1:], None], strict=True))
    assert step.endswith("/400") and float(samples) > 0 and eta and eval_loss == "", row
    assert st.get("restarts", 0) == 0
    assert seen <= set(uids.values()), (seen, uids)
    assert {p.metadata.name: p.metadata.uid for p in e2e.jobs.pods("tiny")} == uids


def test_unreachable_rank_zero_fails_with_rendezvous_timeout(e2e: E2E) -> None:
    """Rank 1 cannot resolve rank 0's name (agent hook: its hosts file omits tiny-node-0): the preflight gives
    up after spec.rendezvousTimeoutSeconds and the job fails with RendezvousTimeout naming the address."""
    e2e.agent.hide_host(e2e.namespace, "tiny-node-1", "tiny-node-0")
    e2e.jobs.create(tiny_job("tiny", rendezvousTimeoutSeconds=5, terminationGracePeriodSeconds=5))
    st = _wait_terminal(e2e, "tiny", 180)
    assert st["state"] == "Failed", st
    cond = _failed_condition(e2e, "tiny")
    assert cond["reason"] == "RendezvousTimeout", cond
    assert "tiny-node-0.tiny" in cond["message"], cond
