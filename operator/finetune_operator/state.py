"""What one reconcile pass observes, typed: the job (its spec parsed once, its status typed) and its pods sorted into
the gang's buckets, as JobSet sorts a JobSet's children. Built once per pass from the wire dicts; pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from finetune_operator.builders import COMPONENT_LABEL, PLACEHOLDER, JobRef
from finetune_operator.failures import (
    Failure,
    WaitingProblem,
    classify_pod,
    completion_result,
    restarts_in_place,
    waiting_problem,
)
from finetune_operator.kueue import QUEUE_LABEL, is_kueue_gate
from finetune_operator.multikueue import MANAGED_BY, claimed
from finetune_operator.runtimes import spec_of
from finetune_operator.settings import LABEL_ATTEMPT, LABEL_RANK
from finetune_operator.spec import JobSpec, SpecError, check_name
from finetune_operator.status import Status, parse_ts


@dataclass(frozen=True)
class Job:
    """A FineTuneJob as read. ``spec`` is None when it does not parse; ``spec_error`` then says why."""

    ref: JobRef
    generation: int
    spec: JobSpec | None
    spec_error: str | None
    status: Status
    ttl_seconds_after_finished: int | None  # read from the raw spec too, so it works when the spec does not parse
    pdb_enabled: bool
    wire: dict[str, Any] = field(repr=False, compare=False)  # the body as read: the status write sends it back
    # A worker's copy of a job MultiKueue dispatched, by its labels: the Workload it says Kueue admitted it as
    # (multikueue.py; checked against the Workload itself before the pods are built outside Kueue's queues)
    prebuilt_workload: str | None = None

    @property
    def dispatched(self) -> bool:
        """A manager's job that MultiKueue runs on a worker: the operator makes its Workload and nothing else."""
        return self.spec is not None and self.spec.managed_by == MANAGED_BY and self.prebuilt_workload is None

    @property
    def wire_status(self) -> dict[str, Any]:
        return dict(self.wire.get("status") or {})

    @property
    def raw_spec(self) -> dict[str, Any]:
        return dict(self.wire.get("spec") or {})


def read_job(wire: dict[str, Any]) -> Job:
    meta = wire["metadata"]
    raw_spec = wire.get("spec") or {}
    spec: JobSpec | None = None
    error: str | None = None
    try:
        check_name(meta["name"])
        spec = spec_of(wire)  # with the runtime template its attempt was admitted with
    except (SpecError, KeyError, TypeError, ValueError) as e:
        error = str(e)
    prebuilt = claimed(meta.get("labels") or {}, meta.get("annotations") or {})
    ttl = raw_spec.get("ttlSecondsAfterFinished")
    return Job(
        ref=JobRef(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"]),
        generation=int(meta.get("generation", 1)),
        spec=spec,
        spec_error=error,
        status=Status.from_wire(wire.get("status")),
        ttl_seconds_after_finished=int(ttl) if isinstance(ttl, int) else None,
        pdb_enabled=bool((raw_spec.get("podDisruptionBudget") or {}).get("enabled")),
        wire=wire,
        prebuilt_workload=prebuilt,
    )


def _label_int(labels: dict[str, str], key: str) -> int:
    try:
        return int(labels[key])
    except (KeyError, ValueError):
        return -1


@dataclass(frozen=True)
class PodState:
    """One trainer pod: which attempt and rank it belongs to, its phase, and what went wrong with it."""

    name: str
    uid: str
    resource_version: int
    owner_uid: str | None  # the controlling owner's uid
    attempt: int
    rank: int
    phase: str
    deletion: datetime | None  # deletionTimestamp: the pod is going
    ip: str | None
    failure: Failure | None  # failures.classify_pod
    waiting: WaitingProblem | None  # failures.waiting_problem
    node: str | None = None  # spec.nodeName: where it was scheduled
    finalizers: bool = False  # metadata.finalizers holds something (a deletion then waits for it)
    gated: bool = False  # held by Kueue's scheduling gates: queued, not admitted yet
    queue: str | None = None  # the LocalQueue Kueue queues it in (its label: spec.queueName, or Kueue's default)
    placeholder: bool = False  # an elastic job's placeholder (builders.build_placeholder), not a rank
    # failures.completion_result: rank 0's summary of a succeeded run (not part of the pod's identity or hash)
    result: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    restarts_in_place: int = 0  # failures.restarts_in_place: the launcher's count, once the pod finished
    # spec.nodeSelector: Kueue's topology-aware scheduling writes the pod's domain there when it lifts its gate
    node_selector: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    @property
    def deleting(self) -> bool:
        return self.deletion is not None

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def running(self) -> bool:
        return self.phase == "Running" and not self.deleting


def read_pod(wire: dict[str, Any]) -> PodState:
    meta = wire["metadata"]
    labels = meta.get("labels") or {}
    owner = next((o.get("uid") for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    status = wire.get("status") or {}
    try:
        version = int(meta.get("resourceVersion") or 0)
    except (TypeError, ValueError):
        version = 0
    return PodState(
        name=meta["name"],
        uid=meta.get("uid", ""),
        resource_version=version,
        owner_uid=owner,
        attempt=_label_int(labels, LABEL_ATTEMPT),
        rank=_label_int(labels, LABEL_RANK),
        phase=str(status.get("phase") or "Pending"),
        deletion=parse_ts(meta.get("deletionTimestamp")),
        ip=status.get("podIP"),
        failure=classify_pod(wire),
        waiting=waiting_problem(wire),
        node=(wire.get("spec") or {}).get("nodeName"),
        finalizers=bool(meta.get("finalizers")),
        gated=any(is_kueue_gate(str(g.get("name"))) for g in (wire.get("spec") or {}).get("schedulingGates") or []),
        queue=labels.get(QUEUE_LABEL),
        placeholder=labels.get(COMPONENT_LABEL) == PLACEHOLDER,
        result=completion_result(wire),
        restarts_in_place=restarts_in_place(wire),
        node_selector={str(k): str(v) for k, v in ((wire.get("spec") or {}).get("nodeSelector") or {}).items()},
    )


def read_pods(wire: list[dict[str, Any]]) -> list[PodState]:
    return [read_pod(p) for p in wire]


def placement_ranks(job: Job, pods: list[PodState]) -> list[PodState] | None:
    """The current attempt's ranks, rank 0 first, once every one of them is bound to a node; None before."""
    if job.spec is None:
        return None
    return bound_ranks(Gang.of(pods, uid=job.ref.uid, attempt=job.status.attempt).current, job.spec.nodes)


def bound_ranks(current: list[PodState], nodes: int) -> list[PodState] | None:
    """An attempt's ranks (``current``, rank 0 first) once each of its ``nodes`` ranks is bound to a node; None
    before (a rank not yet bound, or one deleting and not yet replaced)."""
    live = [p for p in current if not p.deleting and p.node]
    return live if len(live) == nodes and len({p.rank for p in live}) == nodes else None


@dataclass(frozen=True)
class Gang:
    """A job's pods in buckets: the current attempt's by rank, earlier attempts', and a namesake's (controlled by
    another uid: a deleted job of the same name, never counted or deleted; the garbage collector removes them). A
    labelled pod nobody controls (a `kubectl debug` copy, say) is none of these. An elastic job's own placeholders are
    apart from the ranks (``placeholders``)."""

    current: list[PodState]
    stale: list[PodState]
    foreign: list[PodState]
    placeholders: list[PodState] = field(default_factory=list)

    @classmethod
    def of(cls, pods: list[PodState], *, uid: str, attempt: int) -> Gang:
        mine = [p for p in pods if p.owner_uid == uid and not p.placeholder]
        return cls(
            current=sorted((p for p in mine if p.attempt == attempt), key=lambda p: p.rank),
            stale=[p for p in mine if p.attempt != attempt],
            foreign=[p for p in pods if p.owner_uid is not None and p.owner_uid != uid],
            placeholders=sorted((p for p in pods if p.owner_uid == uid and p.placeholder), key=lambda p: p.name),
        )

    @property
    def mine(self) -> list[PodState]:
        return [*self.current, *self.stale]

    @property
    def ranks(self) -> set[int]:
        return {p.rank for p in self.current}

    @property
    def running(self) -> int:
        return sum(1 for p in self.current if p.running)

    @property
    def succeeded(self) -> int:
        return sum(1 for p in self.current if p.phase == "Succeeded")


OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"


def node_lost(node: dict[str, Any] | None, *, mode: str, now: datetime, after_seconds: float) -> str | None:
    """Why a pod stuck terminating on ``node`` may be force-deleted (its kubelet will never confirm the deletion),
    or None: then it may not, because its processes may still run and hold the GPU and the shared checkpoints.

    PodGC's rule (the Node object is gone, or an administrator tainted it out-of-service: non-graceful node
    shutdown), and with ``mode`` ``not-ready`` (the default) also a node whose Ready condition has been False or
    Unknown for ``after_seconds`` (the node lifecycle controller marks it Unknown when its kubelet stops
    reporting). ``never`` turns force deletion off."""
    if mode == "never":
        return None
    if node is None:
        return "the node is gone"
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("key") == OUT_OF_SERVICE_TAINT:
            return f"the node is tainted {OUT_OF_SERVICE_TAINT}"
    if mode != "not-ready":
        return None
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") != "Ready" or c.get("status") == "True":
            continue
        since = parse_ts(c.get("lastTransitionTime"))
        if since is not None and (now - since).total_seconds() >= after_seconds:
            return f"the node has been Ready={c.get('status')} since {c.get('lastTransitionTime')}"
    return None


UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"


def node_down(node: dict[str, Any] | None) -> str | None:
    """Why ``node`` cannot run a rank now (gone, unreachable, out of service, or not Ready), or None. Read for an
    elastic gang whose rank failed while its peers run: a node lost is a disruption, and the job shrinks."""
    if node is None:
        return "the node is gone"
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("key") in (UNREACHABLE_TAINT, OUT_OF_SERVICE_TAINT):
            return f"the node is tainted {taint.get('key')}"
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") != "True":
            return f"the node is Ready={c.get('status')} since {c.get('lastTransitionTime')}"
    return None
