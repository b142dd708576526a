"""Kueue's plain pod groups, as the operator uses them (docs/kueue.md): the labels and annotations of an attempt's pods,
and what the attempt's Workload says about its admission. Pure: the controller reads the Workload.

Each attempt is one pod group, so one Workload, named for the attempt. The operator never replaces a pod inside a
group (a failed rank restarts the whole gang as the next attempt), so every pod says so up front with
``retriable-in-group: "false"``: Kueue then finishes the attempt's Workload, and gives its quota back, as soon as all of
the attempt's pods are terminal, instead of holding it for replacement pods that never come.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
ADMISSION_GATE = "kueue.x-k8s.io/admission"  # the scheduling gate Kueue's pod webhook adds, and lifts on admission
TERMINATION_TARGET = "TerminationTarget"  # the pod condition Kueue sets before it deletes an evicted group's pods
WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD_PLURAL = "kueue.x-k8s.io", "v1beta2", "workloads"


def group_name(job: str, attempt: int) -> str:
    """The attempt's pod group, and so its Workload's name: unique per job and attempt, at most 63 characters."""
    group = f"{job}-attempt-{attempt}"
    if len(group) > 63:  # a label value
        group = f"{job[:40]}-{hashlib.sha256(job.encode()).hexdigest()[:8]}-a{attempt}"
    return group


def pod_metadata(queue: str | None, job: str, attempt: int, nodes: int) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that put an attempt's pods in one Kueue pod group; none without a queue."""
    if not queue:
        return {}, {}
    return ({QUEUE_LABEL: queue, GROUP_LABEL: group_name(job, attempt)},
            {TOTAL_COUNT_ANNOTATION: str(nodes), RETRIABLE_ANNOTATION: "false"})


@dataclass(frozen=True)
class WorkloadState:
    """Where an attempt's Workload stands: admitted or not, and Kueue's reason and message."""

    admitted: bool
    reason: str
    message: str


def read_workload(workload: dict[str, Any] | None) -> WorkloadState:
    """Kueue's word on the Workload: QuotaReserved (and Admitted) with its reason and message."""
    if workload is None:
        return WorkloadState(False, "WaitingForWorkload", "Kueue has not created the attempt's Workload yet")
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    admitted = conditions.get("Admitted") or {}
    if admitted.get("status") == "True":
        return WorkloadState(True, "Admitted", str(admitted.get("message") or "admitted by Kueue"))
    for ctype in ("Evicted", "QuotaReserved", "Admitted"):
        c = conditions.get(ctype) or {}
        if ctype == "Evicted" and c.get("status") != "True":
            continue
        if c.get("message"):
            return WorkloadState(False, str(c.get("reason") or "Pending"), str(c["message"]))
    return WorkloadState(False, "Pending", "waiting for Kueue to consider the Workload")
