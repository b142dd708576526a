"""Pure failure classification from a pod's status: each failure becomes a condition reason and a
retry decision. Exit codes come from the trainer's documented contract (trainer-image/README.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from finetune_operator.kueue import TERMINATION_TARGET
from finetune_operator.settings import (
    EXIT_CONFIG_ERROR,
    EXIT_CUDA_OOM,
    EXIT_EXPORT_FAILED,
    EXIT_OUTPUT_FULL,
    EXIT_RENDEZVOUS_TIMEOUT,
    EXIT_TERMINATED,
)

CONTAINER = "trainer"
FATAL_WAITING = (
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
)


@dataclass(frozen=True)
class Failure:
    reason: str
    message: str
    disruption: bool = False  # eviction, preemption, deleted pod: retried without counting
    permanent: bool = False  # configuration errors: never retried
    rank: int | None = None
    attempt: int | None = None
    exit_code: int | None = None
    pod_name: str | None = None
    finished_at: str | None = None

    def with_rank(self, rank: int, attempt: int, pod_name: str | None) -> Failure:
        return replace(self, rank=rank, attempt=attempt, pod_name=pod_name)

    def as_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reason": self.reason, "message": self.message[:1024]}
        for key, value in (
            ("rank", self.rank),
            ("attempt", self.attempt),
            ("exitCode", self.exit_code),
            ("podName", self.pod_name),
        ):
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_status(cls, d: dict[str, Any]) -> Failure:
        """The ``status.failure`` a pass wrote (what is not on the wire reads as its default)."""
        return cls(
            reason=str(d.get("reason") or ""),
            message=str(d.get("message") or ""),
            rank=d.get("rank"),
            attempt=d.get("attempt"),
            exit_code=d.get("exitCode"),
            pod_name=d.get("podName"),
        )


@dataclass(frozen=True)
class WaitingProblem:
    reason: str
    message: str
    fatal: bool  # fails the job after the operator's waiting timeout


def _container_status(pod: dict[str, Any]) -> dict[str, Any]:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == CONTAINER:
            return dict(cs)
    return {}


def _disruption_condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    """Kubernetes' DisruptionTarget (eviction, preemption, taint) or Kueue's TerminationTarget (Kueue stops the group:
    its Workload evicted, preempted or its queue stopped, or deleted): either way the pod goes for a reason outside the
    job."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("DisruptionTarget", TERMINATION_TARGET) and c.get("status") == "True":
            return dict(c)
    return None


def termination_text(message: str | None) -> str:
    """The trainer writes {"reason", "message"} JSON (policy File: never a log tail); plain text is kept as is."""
    if not message:
        return ""
    try:
        data = json.loads(message)
        if isinstance(data, dict) and "message" in data:
            return str(data["message"])[-800:]
    except ValueError:
        pass
    return message.strip()[-800:]


def _termination_record(pod: dict[str, Any]) -> dict[str, Any]:
    """The finished trainer's termination message as the launcher writes it (a JSON object), or {}."""
    term = (_container_status(pod).get("state") or {}).get("terminated") or {}
    try:
        data = json.loads(term.get("message") or "")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def completion_result(pod: dict[str, Any]) -> dict[str, Any] | None:
    """A succeeded trainer's summary of its run from its termination message (``{"reason": "Completed", "result":
    {...}}``: rank 0 writes the end of its curves from result.json), or None (another rank, an older image)."""
    if (pod.get("status") or {}).get("phase") != "Succeeded":
        return None
    result = _termination_record(pod).get("result")
    return result if isinstance(result, dict) else None


def restarts_in_place(pod: dict[str, Any]) -> int:
    """The restarts of every rank in place a finished trainer's launcher reported (``restartsInPlace`` in its
    termination message): the rounds of the attempt, however many of them a scrape saw."""
    value = _termination_record(pod).get("restartsInPlace")
    return value if isinstance(value, int) and 0 <= value < 2**31 else 0


def classify_pod(pod: dict[str, Any]) -> Failure | None:
    """The failure of one pod of the running attempt, or None while it is healthy or succeeded."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    disruption = _disruption_condition(pod)
    if disruption is not None or status.get("reason") in ("Evicted", "Preempting", "Terminated"):
        why = (disruption or {}).get("reason") or status.get("reason") or ""
        msg = (disruption or {}).get("message") or status.get("message") or why
        # Kueue's reason is WorkloadEvictedDueTo<why> (…DueToPreempted for a preemption); its message says why too.
        reason = "Preempted" if "Preempt" in why or "Preempted" in msg else "Evicted"
        if (disruption or {}).get("type") == TERMINATION_TARGET:
            msg = f"Kueue stopped the attempt's pod group: {msg}"
        return Failure(reason, f"{reason.lower()}: {msg}", disruption=True)
    if pod["metadata"].get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        return Failure(
            "PodDeleted", f"pod {pod['metadata']['name']} was deleted while the attempt ran", disruption=True
        )
    if phase != "Failed":
        return None
    term = (_container_status(pod).get("state") or {}).get("terminated") or {}
    code = term.get("exitCode")
    detail = termination_text(term.get("message"))
    finished = term.get("finishedAt")
    if term.get("reason") == "OOMKilled":
        return Failure(
            "OOMKilled",
            "the trainer ran out of memory (OOMKilled); raise "
            "spec.resources.limits.memory or lower spec.training.perDeviceBatchSize",
            exit_code=code,
            finished_at=finished,
        )
    if code == EXIT_CONFIG_ERROR:
        return Failure(
            "ConfigError",
            detail or "the trainer rejected its configuration (exit 78)",
            permanent=True,
            exit_code=code,
            finished_at=finished,
        )
    if code == EXIT_EXPORT_FAILED:
        # Training finished and the model is on the claim; a gang restart would not fix a destination.
        return Failure(
            "ExportFailed",
            detail
            or "training succeeded but pushing the model out failed (exit 74); the model is on the output volume",
            permanent=True,
            exit_code=code,
            finished_at=finished,
        )
    if code == EXIT_RENDEZVOUS_TIMEOUT:
        # A peer that was still Pending (autoscaler, a large image pull) is not a broken job: a gang restart,
        # counted against maxRestarts like any other.
        return Failure(
            "RendezvousTimeout",
            detail or "the rank could not reach rank 0 (exit 75)",
            exit_code=code,
            finished_at=finished,
        )
    if code == EXIT_CUDA_OOM:
        # Deterministic for a given batch size and model: another attempt would fail the same way.
        return Failure(
            "CUDAOutOfMemory",
            detail or "the GPU ran out of memory (exit 77)",
            permanent=True,
            exit_code=code,
            finished_at=finished,
        )
    if code == EXIT_OUTPUT_FULL:
        # The restart would resume and fail at the same save: only a larger claim or fewer checkpoints help.
        return Failure(
            "OutputFull",
            detail
            or "the output volume is full (exit 73); enlarge the output claim "
            "(spec.output) or lower spec.training.keepCheckpoints",
            permanent=True,
            exit_code=code,
            finished_at=finished,
        )
    if code == EXIT_TERMINATED:
        # The trainer got SIGTERM from outside the operator, saved a checkpoint and stopped: restart the gang
        # without counting it (bounded by the operator's disruption limit).
        return Failure(
            "Terminated",
            detail or "the trainer was terminated (SIGTERM) and saved a checkpoint",
            disruption=True,
            exit_code=code,
            finished_at=finished,
        )
    if code is not None:
        return Failure(
            "TrainingError",
            f"exit code {code}" + (f": {detail}" if detail else ""),
            exit_code=code,
            finished_at=finished,
        )
    return Failure("PodFailed", status.get("message") or status.get("reason") or "the pod failed", finished_at=finished)


def waiting_problem(pod: dict[str, Any]) -> WaitingProblem | None:
    """Why a pod of the attempt is not running yet, when Kubernetes says so."""
    waiting = (_container_status(pod).get("state") or {}).get("waiting") or {}
    reason = waiting.get("reason")
    if reason in FATAL_WAITING:
        return WaitingProblem(reason, waiting.get("message") or reason, fatal=True)
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return WaitingProblem("Unschedulable", c.get("message") or "no node fits the trainer pod", fatal=False)
    return None
