"""Pure: gang scheduling without Kueue (docs/placement.md). With a gang scheduler (the Helm value
``gangScheduling.scheduler``, or ``spec.gangScheduling`` of the job or its runtime), each attempt is one ``PodGroup``
of that scheduler with ``minMember`` = the attempt's nodes, and every rank names it, so the scheduler binds all of the
attempt's ranks or none:

- ``coscheduling``: the scheduler-plugins Coscheduling plugin (``scheduling.x-k8s.io/v1alpha1`` PodGroup, named by
  the pod label ``scheduling.x-k8s.io/pod-group``);
- ``volcano``: Volcano's scheduler (``scheduling.volcano.sh/v1beta1`` PodGroup, named by the pod annotation
  ``scheduling.k8s.io/group-name``).

The pods go to that scheduler (``schedulerName``: the Helm value, else the scheduler's usual name) unless
``spec.podTemplate.schedulerName`` names another. A gang restart or an elastic resize is a new attempt, so a new group
(named like the attempt's Kueue pod group); the previous attempt's group is deleted when the next one starts, the
current one when the job finishes or suspends, and the job's deletion takes any left (owner references).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

COSCHEDULING, VOLCANO, NONE = "coscheduling", "volcano", "none"
SCHEDULERS = (COSCHEDULING, VOLCANO)
API = {COSCHEDULING: "scheduling.x-k8s.io/v1alpha1", VOLCANO: "scheduling.volcano.sh/v1beta1"}
SCHEDULER_NAMES = {COSCHEDULING: "scheduler-plugins-scheduler", VOLCANO: "volcano"}
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
KIND = "PodGroup"


@dataclass(frozen=True)
class GangScheduling:
    """``spec.gangScheduling``: ``scheduler`` one of SCHEDULERS, or ``none`` (no gang scheduler, whatever the Helm
    default); ``scheduler_name`` the pods' schedulerName (None: the Helm value, else the scheduler's usual name)."""

    scheduler: str
    scheduler_name: str | None = None


def parse_gang_scheduling(d: Any, add: Callable[[str, str], None]) -> GangScheduling | None:
    f = "spec.gangScheduling"
    if d is None:
        return None
    if not isinstance(d, dict):
        add(f, f"must be an object, got {d!r}")
        return None
    for k in sorted(set(d) - {"scheduler", "schedulerName"}):
        add(f"{f}.{k}", "unknown field; spec.gangScheduling takes scheduler and schedulerName")
    scheduler = d.get("scheduler")
    if scheduler not in (*SCHEDULERS, NONE):
        add(f"{f}.scheduler", f"{scheduler!r}: expected coscheduling, volcano or none")
        return None
    name = d.get("schedulerName")
    if name is not None and (not isinstance(name, str) or not name or len(name) > 253):
        add(f"{f}.schedulerName", f"{name!r} must name the scheduler the pods go to (a non-empty string)")
        return None
    return GangScheduling(str(scheduler), name)


def effective(own: GangScheduling | None, scheduler: str, scheduler_name: str) -> GangScheduling | None:
    """The job's gang scheduler: its own (``spec.gangScheduling``, of the job or its runtime), else the Helm default
    (``scheduler``, ``scheduler_name``); None for none."""
    if own is None:
        return GangScheduling(scheduler, scheduler_name or None) if scheduler in SCHEDULERS else None
    if own.scheduler == NONE:
        return None
    same = own.scheduler == scheduler
    return GangScheduling(own.scheduler, own.scheduler_name or (scheduler_name if same and scheduler_name else None))


def scheduler_name(gang: GangScheduling) -> str:
    return gang.scheduler_name or SCHEDULER_NAMES[gang.scheduler]


def pod_metadata(gang: GangScheduling | None, group: str) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that put a rank in the attempt's PodGroup ``group``."""
    if gang is None:
        return {}, {}
    if gang.scheduler == COSCHEDULING:
        return {COSCHEDULING_LABEL: group}, {}
    return {}, {VOLCANO_ANNOTATION: group}


def pod_group(
    gang: GangScheduling, *, name: str, namespace: str, owner: dict[str, Any], labels: dict[str, str], nodes: int
) -> dict[str, Any]:
    """The attempt's PodGroup: all ``nodes`` ranks or none are bound."""
    return {
        "apiVersion": API[gang.scheduler],
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "ownerReferences": [owner]},
        "spec": {"minMember": nodes},
    }


def resource_key(kind: str, api_version: str) -> str:
    """The key of a job's child kind in the API paths table: a PodGroup by its API group too (two schedulers)."""
    return f"{kind}.{api_version.split('/', maxsplit=1)[0]}" if kind == KIND else kind
