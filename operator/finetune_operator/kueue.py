"""Kueue's plain pod groups, as the operator uses them (docs/kueue.md): the labels and annotations of an attempt's pods,
and what the attempt's Workload says about its admission. Pure: the controller reads the Workload.

Each attempt is one pod group, so one Workload, named for the attempt. The operator never replaces a pod inside a
group (a failed rank restarts the whole gang as the next attempt), so every pod says so up front with
``retriable-in-group: "false"``: Kueue then finishes the attempt's Workload, and gives its quota back, as soon as all of
the attempt's pods are terminal, instead of holding it for replacement pods that never come.

The group metadata is on every trainer pod, with or without ``spec.queueName``: Kueue also queues pods that name no
queue (a namespace's LocalQueue ``default``, or ``manageJobsWithoutQueueName``), and those must be admitted as one
gang too. Where Kueue does not manage the pods, the labels are inert.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
# Kueue's scheduling gates: kueue.x-k8s.io/admission, lifted on admission, and kueue.x-k8s.io/topology where
# topology-aware scheduling is on (lifted after admission when the Workload does not use it).
GATE_PREFIX = "kueue.x-k8s.io/"
TERMINATION_TARGET = "TerminationTarget"  # the pod condition Kueue sets before it stops a group's pods
WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD_PLURAL = "kueue.x-k8s.io", "v1beta2", "workloads"


def group_name(job: str, attempt: int, uid: str) -> str:
    """The attempt's pod group, and so its Workload's name (Kueue names a group's Workload after the group): unique
    per job and attempt, at most 63 characters. A piece of the job's uid keeps a job deleted and created again under
    the same name away from the first one's finished Workloads (Kueue would adopt a Workload of the same name, finished,
    and never admit the new pods)."""
    group = f"{job}-attempt-{attempt}-{uid[:6]}"
    if len(group) > 63:  # a label value
        group = f"{job[:40]}-{hashlib.sha256(job.encode()).hexdigest()[:8]}-a{attempt}-{uid[:6]}"
    return group


def placeholder_group(job: str, attempt: int, uid: str, generation: int = 0) -> str:
    """The pod group of an elastic job's placeholders while ``attempt`` runs (finetune_operator.elastic): a group, so a
    Workload, of its own, which Kueue admits when the quota fits the ranks a grow would add. A set replaced after one
    of its pods finished (preempted, evicted) is a new ``generation``, so a new group: Kueue never admits new pods into
    a finished group (its pods are not retriable in the group)."""
    suffix = "-g" if not generation else f"-g{generation}"
    return f"{group_name(job, attempt, uid)[: 63 - len(suffix)]}{suffix}"


def pod_metadata(
    queue: str | None, job: str, uid: str, attempt: int, nodes: int, *, group: str | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that put an attempt's pods in one Kueue pod group (``group``, else the attempt's), in
    LocalQueue ``queue`` if given."""
    labels = {GROUP_LABEL: group or group_name(job, attempt, uid), **({QUEUE_LABEL: queue} if queue else {})}
    return labels, {TOTAL_COUNT_ANNOTATION: str(nodes), RETRIABLE_ANNOTATION: "false"}


def is_kueue_gate(name: str) -> bool:
    return name.startswith(GATE_PREFIX)


@dataclass(frozen=True)
class WorkloadState:
    """Where an attempt's Workload stands: admitted or not, and Kueue's reason and message."""

    admitted: bool
    reason: str
    message: str


UNREADABLE = WorkloadState(
    False,
    "Queued",
    "Kueue holds the attempt's pods until it admits the whole gang (the "
    "operator may not read Kueue's Workloads: install the chart with kueue.enabled=true for "
    "Kueue's reason)",
)


def read_workload(workload: dict[str, Any] | None) -> WorkloadState:
    """Kueue's word on the Workload: why it waits, from its conditions. Evicted first (why it was stopped); once quota
    is reserved, the Admitted condition (admission checks pending); before that, QuotaReserved (why the quota does not
    fit)."""
    if workload is None:
        return WorkloadState(False, "WaitingForWorkload", "Kueue has not created the attempt's Workload yet")
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    admitted = conditions.get("Admitted") or {}
    if admitted.get("status") == "True":
        return WorkloadState(True, "Admitted", str(admitted.get("message") or "admitted by Kueue"))
    evicted = conditions.get("Evicted") or {}
    reserved = (conditions.get("QuotaReserved") or {}).get("status") == "True"
    order = ("Admitted", "QuotaReserved") if reserved else ("QuotaReserved", "Admitted")
    candidates = [evicted] if evicted.get("status") == "True" else []
    for c in [*candidates, *(conditions.get(t) or {} for t in order)]:
        if c.get("message"):
            return WorkloadState(False, str(c.get("reason") or "Pending"), str(c["message"]))
    return WorkloadState(False, "Pending", "waiting for Kueue to consider the Workload")
