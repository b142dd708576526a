"""The ONNX Runtime stack end to end: FineTuneJob with ``acceleration: ort`` → real operator → pods on the real API
server → local node agent → ``finetune-trainer`` of the ORT stack → ORTTrainer ranks → status.

Why on the node agent and not on real nodes (tests/realnodes, where every other example runs): the ORT image's
Dockerfile starts from NVIDIA's CUDA base image, which cannot be fetched here, so no ORT image can be built; the node
agent runs the ORT stack's venv in its place. Mocked: only the kubelet and container runtime (``hack/nodeagent``, a
documented test double). Real: etcd, kube-apiserver, kube-controller-manager, the operator process, the trainer,
torch.distributed and ONNX Runtime. Everything waits on observable state with timeouts; no duration is asserted.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import E2E, ORT_IMAGE
from tests.examplejobs import tiny_job
from tests.trainer.helpers import ort_venv_problem
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

TRAIN_TIMEOUT = 420  # generous: 2 CPU cores shared with other work


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
    e2e.jobs.create(
        tiny_job(
            "tiny-ort",
            acceleration="ort",
            terminationGracePeriodSeconds=20,
            **{"training.maxSteps": 10, "training.checkpointEverySteps": 5},
        )
    )
    assert {p.spec.containers[0].image for p in e2e.jobs.wait_pods("tiny-ort", 2)} == {ORT_IMAGE}
    st = _wait_terminal(e2e, "tiny-ort", TRAIN_TIMEOUT)
    assert st["state"] == "Succeeded", st
    result = e2e.result("tiny-ort")
    assert (result["acceleration"], result["attention"], result["world_size"]) == ("ort", "eager", 2), result
    assert result["steps"] == 10 and e2e.complete_checkpoints("tiny-ort")[-1] == 10
