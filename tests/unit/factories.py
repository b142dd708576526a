"""Wire-form FineTuneJobs and pods for the pure-core tests, and ``decided()``: one reconcile decision on them, read
through the same typed boundary the controller uses (state.read_job, state.read_pods)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from finetune_operator.builders import JobRef
from finetune_operator.reconcile import Plan, decide
from finetune_operator.settings import Settings
from finetune_operator.state import read_job, read_pods
from finetune_operator.status import Status, ts

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
REF = JobRef(name="ft", namespace="ns", uid="uid-1")
STARTED = {
    "attempt": 0,
    "restarts": 0,
    "disruptions": 0,
    "attemptStartTime": ts(NOW - timedelta(minutes=1)),
    "startTime": ts(NOW - timedelta(minutes=1)),
    "state": "Running",
}


def base_spec(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"path": "/m"},
        "dataset": {"path": "/d.jsonl"},
        "output": {"claimName": "o"},
        "training": {"maxSteps": 10},
    }
    spec.update(over)
    return spec


def job(
    status: Status | dict[str, Any] | None = None, *, uid: str = "uid-1", name: str = "ft", **spec_over: Any
) -> dict[str, Any]:
    wire = status.to_wire() if isinstance(status, Status) else (status or {})
    return {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "generation": 1},
        "spec": base_spec(**spec_over),
        "status": wire,
    }


def pod(
    phase: str,
    *,
    code: int | None = None,
    reason: str | None = None,
    message: str | None = None,
    pod_reason: str | None = None,
    waiting: str | None = None,
    deleting: bool = False,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    state: dict[str, Any] = {}
    if code is not None:
        state = {"terminated": {"exitCode": code, "reason": reason or "Error", "message": message}}
    if waiting:
        state = {"waiting": {"reason": waiting, "message": "detail"}}
    meta: dict[str, Any] = {
        "name": "ft-node-0",
        "uid": "u0",
        "labels": {"finetune.dev/attempt": "0", "finetune.dev/node-rank": "0"},
    }
    if deleting:
        meta["deletionTimestamp"] = ts(NOW)
    status: dict[str, Any] = {
        "phase": phase,
        "containerStatuses": [{"name": "trainer", "state": state}],
        "conditions": conditions or [],
    }
    if pod_reason:
        status["reason"] = pod_reason
    return {"metadata": meta, "status": status}


def running(
    rank: int, attempt: int = 0, phase: str = "Running", code: int | None = None, *, owner: str = "uid-1", **over: Any
) -> dict[str, Any]:
    """A trainer pod of job ``ft`` (owned by ``owner``) at ``rank`` of ``attempt``."""
    p = pod(phase, code=code, **over)
    p["metadata"].update(
        name=f"ft-node-{rank}",
        uid=f"u{rank}",
        labels={"finetune.dev/attempt": str(attempt), "finetune.dev/node-rank": str(rank)},
        ownerReferences=[{"uid": owner, "controller": True}],
    )
    return p


def decided(
    job_wire: dict[str, Any],
    pods: list[dict[str, Any]] | tuple[()] = (),
    *,
    now: datetime = NOW,
    settings: Settings | None = None,
    **kwargs: Any,
) -> Plan:
    return decide(read_job(job_wire), read_pods(list(pods)), now=now, settings=settings or Settings(), **kwargs)
