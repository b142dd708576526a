"""Pure: where a job's ranks go on the network, through Kueue's Topology-Aware Scheduling (docs/placement.md).

``spec.topology`` asks Kueue to place the attempt's gang in one domain of a topology level (``required``: one domain or
none; ``preferred``: one domain when one has room, else the fewest; ``unconstrained``: anywhere there is capacity, but
counted by TAS). Each trainer pod carries the Kueue annotation that says so, and names the operator's rank label as
the pod group's index label, so Kueue lays consecutive ranks out in consecutive domains (ranks 0-3 in one rack, say).

Before the job's first pod the operator reads the job's LocalQueue, its ClusterQueue, their ResourceFlavors and
Topologies (``read_queue_topology``, with the controller's reads injected) and refuses a job whose queue cannot honour
the request (``check``), naming the field. Once the ranks run, the status records each rank's domain (``domains``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

REQUIRED_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_ANNOTATION = "kueue.x-k8s.io/podset-preferred-topology"
UNCONSTRAINED_ANNOTATION = "kueue.x-k8s.io/podset-unconstrained-topology"
INDEX_LABEL_ANNOTATION = "kueue.x-k8s.io/pod-group-pod-index-label"
MODES = ("required", "preferred", "unconstrained")
DEFAULT_QUEUE = "default"  # Kueue's LocalQueue defaulting: the namespace's LocalQueue of this name takes the rest
HOSTNAME = "kubernetes.io/hostname"
# A label key: an optional DNS-subdomain prefix and a name of at most 63 characters.
LABEL_KEY_RE = re.compile(
    r"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?)(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
KQ = ("kueue.x-k8s.io", "v1beta2")


@dataclass(frozen=True)
class Topology:
    """``spec.topology``: ``mode`` one of MODES; ``level`` the node label of the domain (None when unconstrained)."""

    mode: str
    level: str | None = None


def parse_topology(d: Any, add: Callable[[str, str], None]) -> Topology | None:
    """``spec.topology`` (None when absent); every problem goes to ``add(field, message)``."""
    f = "spec.topology"
    if d is None:
        return None
    if not isinstance(d, dict):
        add(f, f"must be an object, got {d!r}")
        return None
    for k in sorted(set(d) - set(MODES)):
        add(f"{f}.{k}", "unknown field; spec.topology takes one of required, preferred or unconstrained")
    asked = [m for m in MODES if d.get(m) is not None]
    if len(asked) != 1:
        add(
            f,
            "needs exactly one of required (a node label: all ranks in one domain of it), preferred (the same when "
            f"there is room) or unconstrained (true), got {', '.join(asked) or 'none'}",
        )
        return None
    mode = asked[0]
    if mode == "unconstrained":
        if d[mode] is not True:
            add(f"{f}.unconstrained", f"must be true (omit spec.topology for no topology request), got {d[mode]!r}")
            return None
        return Topology(mode)
    level = d[mode]
    if not isinstance(level, str) or len(level) > 317 or not LABEL_KEY_RE.match(level):
        add(
            f"{f}.{mode}",
            f"{level!r} must be a node label key naming a level of the cluster's Kueue Topology "
            "(for example cloud.google.com/gce-topology-block or kubernetes.io/hostname)",
        )
        return None
    return Topology(mode, level)


def topology_problems(topology: Topology | None, *, elastic: bool) -> list[tuple[str, str]]:
    """Cross-field rules: an elastic gang is placed unconstrained, as Kueue places its own resizable workloads
    (elastic workload slices): a gang that shrinks and grows around lost nodes cannot promise one domain."""
    if topology is not None and elastic and topology.mode != "unconstrained":
        return [
            (
                f"spec.topology.{topology.mode}",
                "an elastic job resizes its gang around lost nodes and cannot promise one domain, so it is placed "
                "unconstrained (as Kueue places its resizable workloads): use spec.topology "
                "{unconstrained: true}, or remove spec.elastic to keep the ranks in one domain",
            )
        ]
    return []


def pod_annotations(topology: Topology | None, rank_label: str) -> dict[str, str]:
    """The annotations that carry the request to Kueue; the rank label orders the ranks across domains."""
    if topology is None:
        return {}
    if topology.mode == "unconstrained":
        return {UNCONSTRAINED_ANNOTATION: "true", INDEX_LABEL_ANNOTATION: rank_label}
    key = REQUIRED_ANNOTATION if topology.mode == "required" else PREFERRED_ANNOTATION
    assert topology.level is not None
    return {key: topology.level, INDEX_LABEL_ANNOTATION: rank_label}


@dataclass(frozen=True)
class QueueTopology:
    """What the job's queue offers: ``levels`` per topology-aware ResourceFlavor of its ClusterQueue; ``problem`` says
    what is missing (None: all was read); ``unreadable``: the operator may not read Kueue's objects, or this API server
    does not serve them (``problem`` then says which)."""

    queue: str
    cluster_queue: str | None = None
    levels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    problem: str | None = None
    unreadable: bool = False
    no_queue: bool = False  # the job's LocalQueue is not there: spec.queueName is what to fix


def read_queue_topology(
    get: Callable[[str, str, str | None], dict[str, Any] | None], namespace: str, queue: str | None
) -> QueueTopology:
    """Follow the job's LocalQueue (``queue``, else the namespace's ``default``) to its ClusterQueue, its flavors and
    their Topologies. ``get(plural, name, namespace)`` reads one of Kueue's objects (None: not found); it raises
    PermissionError when the operator may not read them (or this Kueue does not serve them), LookupError when the
    cluster has no Kueue."""
    name = queue or DEFAULT_QUEUE
    try:
        lq = get("localqueues", name, namespace)
        if lq is None:
            how = "" if queue else " (spec.queueName is not set, so the namespace's LocalQueue default)"
            problem = f"LocalQueue {name} does not exist in namespace {namespace}{how}"
            return QueueTopology(name, problem=problem, no_queue=True)
        cq_name = str((lq.get("spec") or {}).get("clusterQueue") or "")
        if not cq_name:
            return QueueTopology(name, problem=f"LocalQueue {name} names no ClusterQueue")
        cq = get("clusterqueues", cq_name, None)
        if cq is None:
            return QueueTopology(name, cq_name, problem=f"ClusterQueue {cq_name} of LocalQueue {name} does not exist")
        flavors = [
            str(fl.get("name"))
            for group in (cq.get("spec") or {}).get("resourceGroups") or []
            for fl in group.get("flavors") or []
        ]
        levels: dict[str, tuple[str, ...]] = {}
        for flavor in dict.fromkeys(flavors):
            rf = get("resourceflavors", flavor, None)
            if rf is None:
                return QueueTopology(
                    name, cq_name, problem=f"ResourceFlavor {flavor} of ClusterQueue {cq_name} does not exist"
                )
            topology_name = (rf.get("spec") or {}).get("topologyName")
            if not topology_name:
                continue
            topology = get("topologies", str(topology_name), None)
            if topology is None:
                return QueueTopology(
                    name, cq_name, problem=f"Topology {topology_name} of ResourceFlavor {flavor} does not exist"
                )
            levels[flavor] = tuple(str(lv.get("nodeLabel")) for lv in (topology.get("spec") or {}).get("levels") or [])
        return QueueTopology(name, cq_name, levels)
    except PermissionError as e:
        return QueueTopology(name, problem=str(e), unreadable=True)
    except LookupError as e:
        return QueueTopology(name, problem=str(e))


def check(topology: Topology | None, qt: QueueTopology | None) -> str | None:
    """Why the job's queue cannot honour its topology request (Kueue would hold the gang forever), naming the field;
    None when it can, or when it could not be read. The operator refuses such a job before any pod."""
    if topology is None or qt is None or qt.unreadable:
        return None
    f = f"spec.topology.{topology.mode}"
    fix = (
        "; place the job in a queue whose ClusterQueue has a ResourceFlavor with spec.topologyName "
        "(docs/placement.md), or remove spec.topology"
    )
    if qt.no_queue:
        return f"spec.queueName: Kueue cannot place the job ({f}): {qt.problem}; name the job's LocalQueue"
    if qt.problem is not None:
        return f"{f}: Kueue cannot place the job: {qt.problem}{fix}"
    if not qt.levels:
        where = f"ClusterQueue {qt.cluster_queue} (of LocalQueue {qt.queue})"
        return f"{f}: {where} has no topology-aware ResourceFlavor{fix}"
    if topology.level is not None and not any(topology.level in lv for lv in qt.levels.values()):
        offered = sorted({level for lv in qt.levels.values() for level in lv})
        return (
            f"{f}: {topology.level} is not a level of the Topology of ClusterQueue {qt.cluster_queue}; its levels "
            f"are {', '.join(offered)}: name one of them"
        )
    return None


def level_to_record(topology: Topology | None, recorded_attempt: int | None, attempt: int) -> str | None:
    """The topology level whose domains status.placement is yet to name for ``attempt`` (``recorded_attempt``: the
    attempt it names now, None before any); None when the job asks for none or the attempt is recorded."""
    if topology is None or topology.level is None or recorded_attempt == attempt:
        return None
    return topology.level


def domain_of(topology: Topology, node_selector: Mapping[str, str], node_labels: Mapping[str, str] | None) -> str:
    """The domain (the level label's value) a rank landed in: from the node selector Kueue gave the pod, else from
    its node's labels; "" when neither says."""
    if topology.level is None:
        return ""
    if topology.level in node_selector:
        return node_selector[topology.level]
    return (node_labels or {}).get(topology.level, "")
