"""Pure lifecycle decisions: (job, its pods, now) in, a Plan out. No I/O here.

Level-based: every pass compares what exists with what the spec wants, so a lost event or an
operator restart converges by itself. The gang never overlaps attempts: the failed attempt's pods are
deleted and must be gone before the next attempt is created under the same names.

A pass walks the phases in order, each a small function over the typed state (state.Job, state.Gang,
status.Status): a finished job stays finished; a spec the operator will not run is refused; a suspended job
holds no pods; the deadline; an earlier attempt's pods go first; an attempt not created yet is admitted and
created; a created one is watched for failure, success, running, or ranks that wait. The states and their
transitions: docs/architecture.md, "Lifecycle"; one pass step by step: docs/design.md.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from finetune_operator import admission, elastic, guardrails, history, multikueue, placement, runtimes
from finetune_operator.admission import Observed
from finetune_operator.builders import (
    build_config_map,
    build_network_policy,
    build_output_claim,
    build_pdb,
    build_placeholder,
    build_pod_group,
    build_pods,
    build_service,
    build_workload,
    gang_of,
    placeholder_name,
    pod_group_name,
    pod_name,
)
from finetune_operator.failures import Failure
from finetune_operator.gang import API, KIND, resource_key
from finetune_operator.kueue import WorkloadState, group_name, read_workload
from finetune_operator.progress import attempt_gpu_seconds, steps_lost
from finetune_operator.settings import Settings
from finetune_operator.spec import JobSpec, SpecError, elastic_problems
from finetune_operator.state import Gang, Job, PodState, bound_ranks
from finetune_operator.status import (
    CREATED,
    FAILED,
    PENDING,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
    TERMINAL,
    Elastic,
    ModelEvaluation,
    Placement,
    Progress,
    Status,
    merge_progress,
    parse_ts,
)

QUOTA_RETRY_SECONDS = 30.0  # a job waiting for quota or a namespace limit tries again this often
QUEUE_REFRESH_SECONDS = 10.0  # a job Kueue holds re-reads its Workload's message this often
# A rank of an elastic gang failed while its peers run: the node controller may not have marked a lost node yet (its
# grace period is 40-50 s). The restart waits this long from the failure for the node to be seen down.
NODE_LOSS_WAIT_SECONDS = 60.0


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str  # CamelCase
    message: str


@dataclass(frozen=True)
class PodDelete:
    name: str
    uid: str
    grace_seconds: int | None = None  # None: the pod's own terminationGracePeriodSeconds


@dataclass
class Plan:
    """What one reconcile pass should do, in order: creates, deletes, status, events."""

    status: Status
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[PodDelete] = field(default_factory=list)
    delete_objects: list[tuple[str, str]] = field(default_factory=list)  # (kind, name): the gang's PDB
    events: list[Event] = field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None
    restart_reason: str | None = None  # for the operator's restarts-by-reason metric
    restarts_in_place: int = 0  # restarts the trainer's agents made in place, newly seen by this pass (the same metric)
    resize: tuple[str, int] | None = None  # an elastic job's resize (Shrunk | Grown, steps lost): for the metrics
    keep_status: bool = False  # a job MultiKueue dispatched: its status is the worker's, copied by MultiKueue
    finish_workload: dict[str, Any] | None = None  # a worker's copy ended: its Workload's Finished (multikueue.py)


@dataclass
class _Pass:
    """One decision in the making: the job as read, the status being written, the plan."""

    job: Job
    now: datetime
    settings: Settings
    plan: Plan
    lost_nodes: dict[str, str] = field(default_factory=dict)  # node name → why its pods may be force-deleted
    down_nodes: dict[str, str] = field(default_factory=dict)  # node name → why it is down (elastic, on a failure)
    nodes_unreadable: bool = False  # the operator may not read nodes

    @property
    def st(self) -> Status:
        return self.plan.status

    @property
    def was(self) -> str | None:
        return self.job.status.state

    def transition(
        self, state: str, reason: str, message: str, *, warning: bool = False, always_event: bool = False
    ) -> None:
        self.st.set_state(state, now=self.now, reason=reason, message=message)
        if self.was != state or always_event:
            self.event("Warning" if warning else "Normal", reason, message)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.plan.events.append(Event(type_, reason, message))

    def delete(self, pods: list[PodState], *, keep: str | None = None, grace_seconds: int | None = None) -> None:
        """Delete pods (``grace_seconds``: None for the pod's own grace period). A pod still deleting long after its
        grace period is force-deleted only when its node is lost (state.node_lost): a force deletion frees the name
        for the next attempt, and on a node that is merely slow the old processes would still run beside it."""
        for p in pods:
            if p.name == keep:
                continue
            if p.deletion is None:
                self.plan.delete.append(PodDelete(p.name, p.uid, grace_seconds=grace_seconds))
            elif p.node is None and not p.finalizers:
                # Never scheduled, yet still there while deleting: the API server marks a pod, then removes it, and
                # died in between. No kubelet runs it and none ever will (a deleting pod cannot be bound), so nothing
                # else would finish the deletion (kube-controller-manager's pod GC may, much later): finish it.
                self.plan.delete.append(PodDelete(p.name, p.uid, grace_seconds=0))
            elif self.overdue(p) and (why := self.lost_nodes.get(p.node or "")) is not None:
                self.plan.delete.append(PodDelete(p.name, p.uid, grace_seconds=0))
                overdue = (self.now - p.deletion).total_seconds()
                self.event(
                    "Warning",
                    "ForceDeleted",
                    f"pod {p.name} force-deleted {overdue:.0f}s after its grace "
                    f"period ended: {why} (node {p.node}); its processes cannot be confirmed stopped",
                )

    def model_only_on_owned_claim(self) -> bool:
        """The job failed exporting its model (it is on the output volume), and that volume is a claim the job owns."""
        spec, failure = self.job.spec, self.st.failure
        return (
            spec is not None
            and failure is not None
            and failure.reason == "ExportFailed"
            and spec.output.template is not None
            and spec.output.reclaim_policy != "Retain"
        )

    def overdue(self, pod: PodState) -> bool:
        """Still deleting ``restart_force_delete_after_seconds`` after the deadline its deletionTimestamp gives."""
        force_after = timedelta(seconds=self.settings.restart_force_delete_after_seconds)
        return pod.deletion is not None and self.now > pod.deletion + force_after

    def ttl(self) -> None:
        ttl, done = self.job.ttl_seconds_after_finished, self.st.completion_time
        if ttl is None or done is None or self.job.prebuilt_workload:  # MultiKueue removes a worker's copy itself
            return
        if self.model_only_on_owned_claim():
            # Deleting the job would delete its claim, and with it the only copy of the trained model.
            message = (
                "spec.ttlSecondsAfterFinished is not applied: the export failed and the trained model is only on the "
                "output claim, which the job owns and would take with it. Copy the model out, then delete the job; "
                "or keep the claim: kubectl delete ftj NAME --cascade=orphan"
            )
            before = self.job.status.condition("TTLHeld")
            self.st.set_condition("TTLHeld", True, "ModelOnlyOnClaim", message, now=self.now)
            if before is None or not before.status:
                self.event("Warning", "TTLHeld", message)
            return
        _expire(self.plan, ttl, done, self.now)


def _expire(plan: Plan, ttl: int, done: datetime, now: datetime) -> None:
    """spec.ttlSecondsAfterFinished of a job that finished at ``done``: delete it once passed, else look again then."""
    remaining = float(ttl) - (now - done).total_seconds()
    if remaining <= 0:
        plan.delete_job = True
    else:
        plan.requeue_after = remaining


def decide(
    job: Job,
    pods: list[PodState],
    *,
    now: datetime,
    settings: Settings,
    progress: Progress | None = None,
    observed: Observed | None = None,
) -> Plan:
    """One reconcile decision. ``progress`` is what was just scraped from rank 0 (None: not scraped);
    ``observed`` is what the controller read for the checks before an attempt starts (claims, namespace use)."""
    if job.dispatched:  # MultiKueue runs it on a worker: its Workload here, and nothing else
        return _dispatched(job, settings, observed or Observed(), now)
    st = copy.deepcopy(job.status)
    st.observed_generation = job.generation
    observed = observed or Observed()
    p = _Pass(
        job=job,
        now=now,
        settings=settings,
        plan=Plan(status=st),
        lost_nodes=observed.lost_nodes,
        down_nodes=observed.down_nodes,
        nodes_unreadable=observed.nodes_unreadable,
    )
    gang = Gang.of(pods, uid=job.ref.uid, attempt=st.attempt)
    _decide(p, gang, progress, observed)
    _placeholders(p, gang)
    # The gang's PodDisruptionBudget lives while the job can run: it goes when the job stops or finishes.
    if job.pdb_enabled and st.state != p.was and st.state in (*TERMINAL, SUSPENDED):
        p.plan.delete_objects.append(("PodDisruptionBudget", job.ref.name))
    if st.state != p.was and st.state in (*TERMINAL, SUSPENDED):
        # The current attempt's group, and the previous one's where the job ends between two attempts.
        _delete_pod_groups(p, (job.status.attempt - 1, job.status.attempt, st.attempt))
    if job.prebuilt_workload and st.state in TERMINAL:  # the worker's quota back, and the manager told
        message = st.failure.message if st.failure is not None else ""
        p.plan.finish_workload = multikueue.finished(job.prebuilt_workload, st.state or "", message, now)
    return p.plan


def _dispatched(job: Job, settings: Settings, observed: Observed, now: datetime) -> Plan:
    """A manager's job with spec.managedBy: its Workload, shaped by its runtime as its pods would be (what the queues
    count), while it has not finished; suspended, the Workload goes (MultiKueue then deletes the worker's copy), and
    resuming makes it again, a new dispatch. Its status is the worker's copy's, which MultiKueue writes; finished,
    its ttlSecondsAfterFinished counts from the copy's completionTime."""
    plan = Plan(status=job.status, keep_status=True)
    assert job.spec is not None
    name = multikueue.workload_name(job.ref.name, job.ref.uid)
    if job.status.state in TERMINAL:  # finished on its worker: it stays so, suspended or not
        ttl, done = job.ttl_seconds_after_finished, job.status.completion_time
        if ttl is not None and done is not None:
            _expire(plan, ttl, done, now)
    elif job.spec.suspend:
        plan.delete_objects.append((multikueue.KIND, name))
        if job.status.state != SUSPENDED:  # MultiKueue copies nothing once the worker's copy is gone: said here
            _dispatch_state(
                plan, job, SUSPENDED, "spec.suspend is true: its Workload deleted, and with it the worker's copy", now
            )
    else:
        if job.status.state == SUSPENDED:  # resumed: a new dispatch, whose worker's status replaces this one
            _dispatch_state(plan, job, PENDING, "resumed: dispatched again through MultiKueue", now)
        try:
            eff = runtimes.resolve(job.raw_spec, observed.runtime or runtimes.Choice(None, "none"), settings)
            spec, settings = eff.spec, eff.settings
        except SpecError:
            spec = job.spec  # the worker's operator judges the job (and says why in the status MultiKueue copies)
        plan.create.append(build_workload(job.ref, spec, settings=settings))
    return plan


def _dispatch_state(plan: Plan, job: Job, state: str, message: str, now: datetime) -> None:
    """A dispatched job's own status write: suspended or resumed on the manager, where MultiKueue copies none."""
    plan.status = copy.deepcopy(job.status)
    plan.status.observed_generation = job.generation
    plan.status.ready_nodes = 0
    reason = "Suspended" if state == SUSPENDED else "Resumed"
    plan.status.set_state(state, now=now, reason=reason, message=message)
    plan.keep_status = False
    plan.events.append(Event("Normal", reason, message))


def _decide(p: _Pass, gang: Gang, progress: Progress | None, observed: Observed) -> None:
    if gang.foreign:
        p.plan.requeue_after = 2.0  # a namesake's pods: the garbage collector removes them, look again
    if p.was in TERMINAL:
        _stay_finished(p, gang)
        return
    spec = p.job.spec
    if spec is None:
        p.st.ready_nodes = p.st.wanted_nodes = 0
        _refuse(p, gang.mine, reason="InvalidSpec", message=p.job.spec_error or "invalid spec")
        return
    p.st.ready_nodes, p.st.wanted_nodes = gang.running, spec.nodes
    if spec.elastic is not None:
        spec = elastic.sized(spec, _track_size(p, spec).current_nodes)  # the current attempt's size
    if spec.suspend:
        _suspend(p, spec, gang)
    elif _deadline_passed(p, spec, gang):
        pass
    elif gang.stale or (p.st.attempt_start_time is None and gang.placeholders):
        # An elastic job's placeholders hold what the next attempt's ranks need: that attempt waits for them to go
        # (_placeholders deletes them, as every placeholder of a job that is not running below its size).
        _clean_up(p, gang)
    elif p.st.attempt_start_time is None:
        _start_attempt(p, spec, gang, observed)
    else:
        _watch_attempt(p, spec, gang, progress, observed.queue)
        _record_placement(p, spec, gang, observed.node_labels)


# -- the phases -------------------------------------------------------------------------------------------------


def _delete_pod_groups(p: _Pass, attempts: tuple[int, ...]) -> None:
    """The PodGroups of ``attempts`` (an attempt that ended, the job finished or suspended), of the gang scheduler the
    job's last admitted attempt used (a runtime's included; none without one). Gone already is fine; deleting the job
    deletes any left (owner references)."""
    try:
        spec: JobSpec | None = runtimes.last_admitted_spec(p.job.wire)
    except (SpecError, KeyError, TypeError, ValueError):  # as state.read_job: a spec that does not parse
        spec = p.job.spec
    scheduler = gang_of(spec, p.settings) if spec is not None else None
    if scheduler is None:
        return
    key = resource_key(KIND, API[scheduler.scheduler])
    for attempt in sorted({a for a in attempts if a >= 0}):
        p.plan.delete_objects.append((key, pod_group_name(p.job.ref, attempt)))


def _record_placement(p: _Pass, spec: JobSpec, gang: Gang, node_labels: dict[str, dict[str, str]]) -> None:
    """status.placement: the topology domain of each rank, once every rank of the attempt is bound and each one's
    domain is known (its node selector, else its node's labels as the controller read them); once per attempt."""
    topology, placed = spec.topology, p.st.placement
    level = placement.level_to_record(topology, placed.attempt if placed else None, p.st.attempt)
    if topology is None or level is None:
        return
    if p.st.attempt != p.job.status.attempt or p.st.attempt_start_time is None:
        return  # this pass ended the attempt (a restart, a resize): its pods are not the next attempt's
    ranks = bound_ranks(gang.current, spec.nodes)
    if ranks is None or not all(level in pod.node_selector or pod.node in node_labels for pod in ranks):
        return
    domains = tuple(placement.domain_of(topology, pod.node_selector, node_labels.get(pod.node or "")) for pod in ranks)
    p.st.placement = Placement(p.st.attempt, level, domains)


def _stay_finished(p: _Pass, gang: Gang) -> None:
    """A finished job stays finished whatever its spec says now; its unfinished pods go (the failed rank's pod
    is kept for its logs), and the TTL runs."""
    keep = p.st.failure.pod_name if p.was == FAILED and p.st.failure else None
    p.delete([pod for pod in gang.mine if not pod.finished], keep=keep)
    p.ttl()


def _suspend(p: _Pass, spec: JobSpec, gang: Gang) -> None:
    """spec.suspend: the pods go; the next attempt starts when resumed."""
    if p.was != SUSPENDED and p.st.attempt_start_time is not None:
        _close_attempt(p, spec, restarted=False)
        p.st.attempt += 1
        p.st.attempt_start_time = None
    p.delete(gang.mine)
    p.st.ready_nodes = 0
    p.transition(SUSPENDED, "Suspended", "spec.suspend is true: trainer pods deleted")


def _deadline_passed(p: _Pass, spec: JobSpec, gang: Gang) -> bool:
    """spec.activeDeadlineSeconds, counted from startTime (resuming restarts the clock). A job queued in Kueue since
    it started (or resumed) has not started yet: its clock starts when Kueue admits it."""
    started = p.st.start_time
    if not spec.active_deadline_seconds or started is None or p.was == SUSPENDED:
        return False
    if _queued_since_start(p.st) and any(pod.gated for pod in gang.current):
        return False
    remaining = spec.active_deadline_seconds - (p.now - started).total_seconds()
    if remaining > 0:
        p.plan.requeue_after = remaining
        return False
    _close_attempt(p, spec, restarted=False)
    _fail(
        p,
        gang.mine,
        Failure(
            "DeadlineExceeded",
            f"the job was active longer than spec.activeDeadlineSeconds={spec.active_deadline_seconds}",
        ),
        keep=None,
    )
    return True


def _clean_up(p: _Pass, gang: Gang) -> None:
    """The previous attempt's pods must be gone before the next attempt is created under the same names."""
    p.delete(gang.stale)
    if p.was not in (RESTARTING, SUSPENDED):
        p.transition(RESTARTING, "CleaningUp", "waiting for pods of an earlier attempt to terminate")
    else:
        p.st.state = RESTARTING
    p.plan.requeue_after = 2.0


def _start_attempt(p: _Pass, spec: JobSpec, gang: Gang, observed: Observed) -> None:
    """Admit the attempt (guardrails, claims, namespace totals) and create all its missing ranks at once."""
    st, now = p.st, p.now
    # Waiting for quota: retry on the clock, not on every pod event (a refused gang's own deletions would
    # otherwise re-trigger creation at once, a retry storm against the API server).
    if st.admission_retry_time is not None and now < st.admission_retry_time:
        p.plan.requeue_after = (st.admission_retry_time - now).total_seconds()
        return
    if deleting := [pod for pod in gang.current if pod.deleting]:  # the ranks of a refused creation are still going
        p.delete(deleting)  # only finishes a deletion the API server left half done
        p.plan.requeue_after = 1.0
        return
    if gang.foreign:  # a deleted namesake's pods still hold the names (checkpointing on SIGTERM, say)
        _wait_for_namesake(p, f"pod {gang.foreign[0].name}")
        return
    # The runtime is read, and the platform's guardrails are checked, when an attempt is admitted: a change to them
    # (or an operator upgrade with new rules) applies to the next attempt, never to one that runs.
    choice = observed.runtime or runtimes.Choice(None, "none")
    if (gone := runtimes.gone_since_last(p.job.status.runtime, choice)) is not None:
        _runtime_gone(p, gang, gone)
        return
    # The training settings a runtime gave the first attempt stay (None: this is the first; so is a job admitted by an
    # operator that kept none).
    pinned = (st.runtime or {}).get("training") if st.start_time is not None else None
    try:
        eff = runtimes.resolve(p.job.raw_spec, choice, p.settings, pinned=pinned)
    except SpecError as e:
        _refuse(p, gang.mine, reason="RuntimeNotFound" if choice.error else "InvalidSpec", message=str(e))
        return
    violation = _guardrails(p, p.job.spec or spec, eff)  # the job's own (no attempt is current: runtimes.spec_of)
    if violation is not None:
        _refuse(p, gang.mine, reason=violation.reason, message=violation.message)
        return
    spec, settings = eff.spec, eff.settings
    if p.job.prebuilt_workload and observed.admitted_copy:  # a MultiKueue worker's copy, admitted as that Workload
        spec = replace(spec, admitted_as=p.job.prebuilt_workload)
    floors = (
        settings.elastic_min_resize_cooldown_seconds,
        settings.elastic_min_unschedulable_seconds,
        "Helm value elastic.{}",
    )
    if st.start_time is None and (problems := elastic_problems(spec, floors)):  # judged once, before the first pod
        _refuse(p, gang.mine, reason="InvalidSpec", message="; ".join(f"{f}: {m}" for f, m in problems))
        return
    claims = admission.check_claims(p.job.ref.name, spec, observed.claims)
    if claims is not None:
        _refuse(p, gang.mine, reason=claims.reason, message=claims.message)
        return
    if (
        st.start_time is None
        and not spec.admitted_as
        and (unplaceable := placement.check(spec.topology, observed.queue_topology))
    ):
        # judged once, before the first pod: a queue edited while a job runs never fails it at a restart
        _refuse(p, gang.mine, reason="InvalidSpec", message=unplaceable)
        return
    over = admission.check_namespace(spec, observed.usage, p.settings)
    if over is not None and over.permanent:
        _refuse(p, gang.mine, reason=over.violation.reason, message=over.violation.message)
        return
    if over is not None:
        _wait_quota(p, over.violation.message)
        return
    if spec.elastic is not None:  # guardrails, claims and quota judged spec.nodes, the most the job runs on
        spec = elastic.sized(spec, _track_size(p, spec).current_nodes)
    ref, present = p.job.ref, gang.ranks
    missing = [
        pod
        for rank, pod in enumerate(
            build_pods(ref, spec, attempt=st.attempt, settings=settings, restarts_left=spec.max_restarts - st.restarts)
        )
        if rank not in present
    ]  # build_pods is in rank order; creation tolerates "already exists"
    group = build_pod_group(ref, spec, attempt=st.attempt, settings=settings)  # before the ranks that name it
    extra = [
        o
        for o in (
            build_output_claim(ref, spec),
            build_pdb(ref, spec),
            build_network_policy(ref, spec, settings),
            group,
        )
        if o is not None
    ]
    if st.attempt > 0:  # the previous attempt's group (its ranks are gone), whichever scheduler this one uses
        _delete_pod_groups(p, (st.attempt - 1,))
    p.plan.create = [*extra, build_service(ref), build_config_map(ref, spec), *missing]
    st.attempt_start_time = now
    st.admission_retry_time = None
    if st.progress is not None and st.progress.restarts_in_place is not None:
        st.progress = replace(st.progress, restarts_in_place=None)  # the new attempt's rounds count from 0
    st.runtime = runtimes.record(eff, st.attempt)
    if p.was == SUSPENDED or st.start_time is None:
        st.start_time = now  # as a Kubernetes Job: the deadline restarts when resumed
    if st.restart_requested_time is not None:
        st.last_restart_gap_seconds = round((now - st.restart_requested_time).total_seconds(), 3)
        st.restart_requested_time = None
    st.set_condition(
        "Created", True, "PodsCreated", f"attempt {st.attempt}: {spec.nodes} trainer pod(s) created", now=now
    )
    st.set_condition("Suspended", False, "Resumed", "spec.suspend is false", now=now)
    st.state = CREATED  # Restarting stays True until every rank of the new attempt runs
    runtime = f", runtime {eff.runtime.label} ({eff.how})" if eff.runtime else ""
    p.event(
        "Normal",
        "PodsCreated",
        f"attempt {st.attempt}: created {spec.nodes} trainer pod(s) "
        f"({spec.nodes} node(s) x {spec.procs_per_node} process(es)){runtime}",
    )


def _runtime_gone(p: _Pass, gang: Gang, message: str) -> None:
    """The runtime the previous attempt ran with is gone: waited for, since a Helm upgrade or a GitOps sync re-creates
    it, for up to the operator's waiting timeout; then the job fails (RuntimeNotFound)."""
    before = p.job.status.condition("Created")
    waiting = before is not None and not before.status and before.reason == "RuntimeNotFound"
    since = before.last_transition_time if waiting and before is not None else p.now
    waited = (p.now - since).total_seconds()
    if waited >= p.settings.waiting_timeout_seconds:
        _refuse(p, gang.mine, reason="RuntimeNotFound", message=f"{message} (waited {waited:.0f}s for it)")
        return
    _wait_to_create(p, "RuntimeNotFound", f"{message}; the next attempt waits for it (a Helm upgrade re-creates it)")
    created = p.st.condition("Created")
    if created is not None and not waiting:
        created.last_transition_time = p.now  # the wait starts now, whatever Created said before
    p.plan.requeue_after = min(5.0, p.settings.waiting_timeout_seconds - waited)


def _guardrails(p: _Pass, own: JobSpec, eff: runtimes.Effective) -> guardrails.Violation | None:
    """The operator's guardrails, then the runtimes' (runtimes.Effective.layers): a job must pass every layer. A
    runtime's allowlists judge what the job itself asks for (what the runtime adds is its own); the operator's judge
    what a cluster runtime adds as the platform's own too, but a namespace's runtime (its admins write it) as the
    job's: it can only narrow them."""
    tenant = eff.spec if eff.runtime is not None and eff.runtime.kind == runtimes.NAMESPACED_KIND else own
    found = guardrails.check(p.job.ref, eff.spec, eff.settings, own=tenant, image_source=eff.image_source)
    for layer, origin, theirs_too in eff.layers():
        if found is not None:
            break
        found = guardrails.check(
            p.job.ref, eff.spec, layer, own=tenant if theirs_too else own, origin=origin, image_source=eff.image_source
        )
    return found


def _watch_attempt(p: _Pass, spec: JobSpec, gang: Gang, progress: Progress | None, queue: WorkloadState | None) -> None:
    """The attempt's pods exist: the first failure restarts or fails the gang; pods Kueue holds wait for admission;
    all ranks done is success; all running is Running (with the scraped progress); otherwise some ranks wait, and the
    status says why."""
    st = p.st
    _count_in_place(p, spec, gang, progress)
    failure = _first_failure(p, spec, gang)
    queued = any(pod.gated for pod in gang.current)
    if gang.current and not queued:
        _admitted(p)
    if failure is not None and _node_loss_pending(p, spec, gang, failure):
        pass
    elif failure is not None:
        _restart_or_fail(p, spec, gang.current, failure)
    elif len(gang.current) == spec.nodes and gang.succeeded == spec.nodes:
        _close_attempt(p, spec, restarted=False)
        if st.progress is not None:
            # Every rank exited 0: the Trainer ran to its last step, whatever rank 0's last scrape had seen.
            st.progress = replace(st.progress, eta_seconds=0, eta="0s")
            if total := st.progress.total_steps:
                st.progress = replace(st.progress, step=total, step_of_total=f"{total}/{total}")
        rank0 = next((pod for pod in gang.current if pod.rank == 0), None)
        if rank0 is not None and rank0.result is not None:
            # The end of the curves from rank 0's result.json: the scrapes saw a step every few seconds at best.
            st.history = history.record_result(st.history, rank0.result, attempt=st.attempt)
            st.evaluation = ModelEvaluation.from_wire(rank0.result.get("evaluation"))
            if st.progress is None:  # it ran to the end between two scrapes: the step count from its summary
                st.progress = _progress_of_result(rank0.result, now=p.now)
        st.completion_time = p.now
        st.ready_nodes = 0
        p.transition(SUCCEEDED, "AllRanksSucceeded", f"all {spec.nodes} rank(s) exited 0 in attempt {st.attempt}")
        p.ttl()
    elif gang.running and gang.running + gang.succeeded == spec.nodes:
        if progress is not None:
            st.progress = _at_least_the_checkpoint(merge_progress(st.progress, progress, now=p.now))
            st.history = history.record(st.history, progress, attempt=st.attempt)
        if st.elastic is not None:
            st.elastic.grown_from = None  # the grown attempt runs
        if not _grow(p, spec, gang):
            p.transition(
                RUNNING, "AllRanksRunning", f"attempt {st.attempt}: {gang.running}/{spec.nodes} trainer pods running"
            )
    elif queued and _grow_held_too_long(p, spec, gang):
        pass
    elif queued:
        _queued(p, gang, queue)
    else:
        _ranks_wait(p, spec, gang)


def _count_in_place(p: _Pass, spec: JobSpec, gang: Gang, progress: Progress | None) -> None:
    """Restarts the trainer's agents made in place (a rank's process failed, every pod was there: the workers were
    forked again and resumed from the newest checkpoint, finetune_trainer.rounds) count as the operator's own gang
    restarts: against spec.maxRestarts, in ``restarts`` (and ``restartsInPlace``), the restarts metric, the steps
    lost, and a Warning event. Rank 0 reports its round in its gauges, every launcher in its termination message:
    whichever is seen first counts, once (``progress.restartsInPlace``: those of this attempt counted so far)."""
    st = p.st
    reported = max(
        [
            progress.restarts_in_place or 0 if progress is not None else 0,
            *(pod.restarts_in_place for pod in gang.current),
        ]
    )
    counted = (st.progress.restarts_in_place or 0) if st.progress is not None else 0
    if reported <= counted:
        return
    new = reported - counted
    before = st.progress or Progress()
    lost = steps_lost(before)
    st.restarts += new
    st.restarts_in_place += new
    p.plan.restarts_in_place += new
    resume = before.last_checkpoint_step or 0
    st.progress = replace(_restarted(before, lost, now=p.now), restarts_in_place=reported)
    message = (
        f"a rank's process failed in attempt {st.attempt}: every rank restarted in place, the pods kept (restart "
        f"{st.restarts}/{spec.max_restarts}); resumed from the newest checkpoint (step {resume} or later)"
        + (f", {lost} step(s) lost" if lost else "")
        + "; the cause is in result.json's attempts and the pods' logs"
    )
    st.failure = Failure(reason="TrainingError", message=message, attempt=st.attempt)
    p.event("Warning", "RestartedInPlace", message)


def _progress_of_result(result: dict[str, Any], *, now: datetime) -> Progress | None:
    """``status.progress`` of a run no scrape saw (it finished within the first progress interval), from rank 0's
    summary: the step it ended at, of as many, its throughput and its last logged loss."""
    steps = result.get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or not 0 <= steps < 2**31:
        return None
    sps = history.finite_number(result.get("samplesPerSecond"))
    losses = history.result_curve(result, "loss")
    return Progress(
        step=steps,
        total_steps=steps,
        step_of_total=f"{steps}/{steps}",
        loss=losses[-1][1] if losses else None,
        samples_per_second=sps if sps is not None and sps >= 0 else None,
        eta_seconds=0,
        eta="0s",
        update_time=now,
    )


def _at_least_the_checkpoint(progress: Progress) -> Progress:
    """The job stands at least at its newest checkpoint: a new attempt resumes from it, often a later one than the
    operator saw while the attempt before ran (the checkpoint saved as it stopped, for a drain or a resize)."""
    ckpt = progress.last_checkpoint_step
    if not ckpt or (progress.step or 0) >= ckpt:
        return progress
    total = progress.total_steps
    return replace(progress, step=ckpt, step_of_total=f"{ckpt}/{total}" if total else None)


def _grow_held_too_long(p: _Pass, spec: JobSpec, gang: Gang) -> bool:
    """A grown attempt that Kueue holds (the quota freed by the smaller one was taken meanwhile) longer than
    spec.elastic.unschedulableSeconds goes back to the size it had: waiting at the larger size would leave the job
    training nowhere. Whether it did."""
    full, el = p.job.spec, p.st.elastic
    if full is None or full.elastic is None or el is None or el.grown_from is None or el.grown_from >= spec.nodes:
        return False
    waited = (p.now - (p.st.attempt_start_time or p.now)).total_seconds()
    limit = full.elastic.unschedulable_seconds
    if waited < limit:
        p.plan.requeue_after = min(p.plan.requeue_after or limit, max(1.0, limit - waited))
        return False
    size = el.grown_from
    why = f"Kueue held the grown attempt for {waited:.0f}s; back to the {size} node(s) it trained on"
    _resize(p, spec, gang, size, reason="Shrunk", why=why, grace=1)
    return True


def _queued_since_start(st: Status) -> bool:
    """The attempt was created when the job started (or resumed): while it is queued, the job has not started."""
    return st.start_time is not None and st.start_time == st.attempt_start_time


def _workload(p: _Pass) -> str:
    return group_name(p.job.ref.name, p.st.attempt, p.job.ref.uid)


def _queued(p: _Pass, gang: Gang, queue: WorkloadState | None) -> None:
    """Kueue holds the attempt's pods (its scheduling gates) until the whole group fits its ClusterQueue's quota:
    condition Queued=True with Kueue's reason and message, one event when the attempt starts waiting. The message
    moves as the queue does, so it is read again every few seconds; the gates' removal is a pod event. The LocalQueue
    is the pods' own label: spec.queueName when they were created, or the one Kueue gave them (its default)."""
    st = p.st
    st.state = CREATED if p.was != RESTARTING else p.was
    queue = queue or read_workload(None)
    local = next((pod.queue for pod in gang.current if pod.queue), None)
    where = f"LocalQueue {local}" if local else "its pods name no LocalQueue"
    text = f"attempt {st.attempt}: waiting for Kueue to admit Workload {_workload(p)} ({where}): {queue.message}"
    before = p.job.status.condition("Queued")
    st.set_condition("Queued", True, queue.reason, text, now=p.now)
    st.set_condition("Created", True, "Queued", text, now=p.now)
    if before is None or not before.status:
        p.event("Normal", "Queued", text)
    p.plan.requeue_after = min(p.plan.requeue_after or QUEUE_REFRESH_SECONDS, QUEUE_REFRESH_SECONDS)


def _admitted(p: _Pass) -> None:
    """Kueue lifted the gates: Queued=False, and the attempt (its GPU-seconds, its waits) counts from now. The
    admission of an attempt queued since the job started (or resumed) also starts spec.activeDeadlineSeconds'
    clock."""
    st = p.st
    before = p.job.status.condition("Queued")
    if before is None or not before.status:
        return
    if _queued_since_start(st):
        st.start_time = p.now
    st.attempt_start_time = p.now
    message = f"attempt {st.attempt}: Workload {_workload(p)} admitted by Kueue"
    st.set_condition("Queued", False, "Admitted", message, now=p.now)
    st.set_condition("Created", True, "Admitted", message, now=p.now)
    p.event("Normal", "Admitted", message)


def _first_failure(p: _Pass, spec: JobSpec, gang: Gang) -> Failure | None:
    """The earliest failure of the attempt is the cause (its peers follow it); a missing rank is a disruption."""
    found: list[tuple[str, int, Failure, str | None]] = [
        (pod.failure.finished_at or "", pod.rank, pod.failure, pod.name) for pod in gang.current if pod.failure
    ]
    for r in sorted(set(range(spec.nodes)) - gang.ranks):
        found.append(
            (
                "~",
                r,
                Failure(
                    "PodDeleted",
                    f"pod {pod_name(p.job.ref.name, r)} disappeared while the attempt ran",
                    disruption=True,
                ),
                None,
            )
        )
    if not found:
        return None
    _, rank, failure, failed_pod = min(found, key=lambda x: (x[0], x[1]))
    return failure.with_rank(rank, p.st.attempt, failed_pod)


def _ranks_wait(p: _Pass, spec: JobSpec, gang: Gang) -> None:
    """Some ranks are not running yet: say why; image and config problems fail the job after a bounded wait."""
    st = p.st
    st.state = CREATED if p.was != RESTARTING else p.was
    problems = sorted(((pod.rank, pod.waiting) for pod in gang.current if pod.waiting is not None), key=lambda x: x[0])
    if not problems:
        return
    rank, problem = problems[0]
    waited = (p.now - (st.attempt_start_time or p.now)).total_seconds()
    if spec.elastic is not None and problem.reason == "Unschedulable" and _unschedulable(p, spec, gang, waited):
        return
    if problem.fatal and waited >= p.settings.waiting_timeout_seconds:
        failure = Failure(problem.reason, f"rank {rank} waited {waited:.0f}s: {problem.message}").with_rank(
            rank, st.attempt, pod_name(p.job.ref.name, rank)
        )
        _close_attempt(p, spec, restarted=False)
        _fail(p, gang.current, failure, keep=None)
        return
    before = p.job.status.condition("Created")
    st.set_condition("Created", True, problem.reason, f"rank {rank}: {problem.message}", now=p.now)
    if before is None or before.reason != problem.reason:
        p.event("Warning", problem.reason, f"rank {rank}: {problem.message}")
    if problem.fatal:
        p.plan.requeue_after = max(1.0, p.settings.waiting_timeout_seconds - waited)


# -- elastic jobs (finetune_operator.elastic) ---------------------------------------------------------------------


def _track_size(p: _Pass, spec: JobSpec) -> Elastic:
    """status.elastic of an elastic job (``spec``: the job's own, spec.nodes the most it runs on); the first pass sets
    it at full size."""
    assert spec.elastic is not None
    if p.st.elastic is None:
        batch = elastic.batch_at(spec, spec.nodes)
        p.st.elastic = Elastic(
            current_nodes=spec.nodes,
            desired_nodes=spec.nodes,
            min_nodes=spec.elastic.min_nodes,
            gradient_accumulation_steps=batch.gradient_accumulation_steps,
            global_batch_size=batch.global_batch_size,
            asked_global_batch_size=batch.asked_global_batch_size,
        )
    return p.st.elastic


def _resized(p: _Pass, spec: JobSpec, size: int, *, reason: str, why: str, lost_steps: int, event: bool) -> str:
    """Record a resize decided now: the next attempt runs on ``size`` nodes (``spec``: the ending attempt's, sized).
    Returns what the Resized condition says."""
    full, el = p.job.spec, p.st.elastic
    assert full is not None and el is not None
    before, batch = elastic.batch_at(full, spec.nodes), elastic.batch_at(full, size)
    el.current_nodes = size
    el.gradient_accumulation_steps = batch.gradient_accumulation_steps
    el.global_batch_size = batch.global_batch_size
    el.resizes += 1
    el.steps_lost_to_resizes += lost_steps
    el.last_resize_time = p.now
    el.last_resize = reason
    _bill_capacity(p, el)  # the capacity placeholders held ends with the attempt, whatever the resize
    el.placeholders_running, el.capacity_since = 0, None
    el.grown_from = spec.nodes if reason == "Grown" else None
    kept = (
        f"global batch {batch.global_batch_size} kept"
        if batch.exact
        else f"global batch {batch.global_batch_size} (asked {batch.asked_global_batch_size}: no whole accumulation "
        "gives it at this size)"
    )
    message = (
        f"{spec.nodes} -> {size} node(s) from attempt {p.st.attempt}: {why}; gradient accumulation "
        f"{before.gradient_accumulation_steps} -> {batch.gradient_accumulation_steps}, {kept}"
    )
    p.st.set_condition("Resized", True, reason, message, now=p.now)
    if p.job.pdb_enabled:  # created again by the next attempt, with its size as minAvailable
        p.plan.delete_objects.append(("PodDisruptionBudget", p.job.ref.name))
    if event:
        p.event("Normal" if reason == "Grown" else "Warning", reason, message)
    p.plan.resize = (reason, lost_steps)
    return message


def _resize(p: _Pass, spec: JobSpec, gang: Gang, size: int, *, reason: str, why: str, grace: int | None) -> None:
    """End the attempt to run the next one on ``size`` nodes: neither a failure nor a disruption (no budget is used).
    ``grace``: None lets the ranks agree on a step and checkpoint it (the pods' own grace period)."""
    st = p.st
    lost_steps = _close_attempt(p, spec, restarted=True)
    st.attempt += 1
    st.attempt_start_time = None
    st.restart_requested_time = p.now
    st.ready_nodes = 0
    p.delete(gang.current, grace_seconds=grace)
    message = _resized(p, spec, size, reason=reason, why=why, lost_steps=lost_steps, event=False)
    p.transition(RESTARTING, reason, message, warning=reason != "Grown", always_event=True)
    p.plan.requeue_after = 2.0


def _finishing(p: _Pass, gang: Gang) -> bool:
    """The attempt's training has ended on some rank (it exited 0), or rank 0 reported the last step (it saves, writes
    its result or exports): a resize would cut that short and train again what is done."""
    if gang.succeeded:
        return True
    progress = p.st.progress
    total = progress.total_steps if progress is not None else None
    return bool(progress is not None and total and (progress.step or 0) >= total)


def _lost_ranks(p: _Pass, spec: JobSpec, current: list[PodState]) -> set[int]:
    """The ranks an ending attempt lost: disrupted (evicted, preempted, deleted), missing, or on a lost node."""
    lost = set(range(spec.nodes)) - {pod.rank for pod in current}
    for pod in current:
        gone = pod.node and (pod.node in p.lost_nodes or pod.node in p.down_nodes)
        if (pod.failure is not None and pod.failure.disruption) or gone:
            lost.add(pod.rank)
    return lost


def _grow(p: _Pass, spec: JobSpec, gang: Gang) -> bool:
    """A running elastic gang below spec.nodes whose placeholders run (a node fits a rank again) grows, once the
    cooldown since the last resize has passed: stopped at an agreed step, the next attempt has them added."""
    full, el = p.job.spec, p.st.elastic
    if full is None or full.elastic is None or el is None or spec.nodes >= full.nodes:
        return False
    running = [ph for ph in gang.placeholders if ph.running and ph.attempt == p.st.attempt]
    if not running or _finishing(p, gang):
        return False
    if el.last_resize_time is not None:
        wait = full.elastic.resize_cooldown_seconds - (p.now - el.last_resize_time).total_seconds()
        if wait > 0:
            p.plan.requeue_after = min(p.plan.requeue_after or wait, wait)
            return False
    size = elastic.grown(full, spec.nodes, len(running))
    nodes = ", ".join(sorted({ph.node or "?" for ph in running}))
    _resize(
        p, spec, gang, size, reason="Grown", why=f"{len(running)} placeholder(s) running (node {nodes})", grace=None
    )
    return True


def _unschedulable(p: _Pass, spec: JobSpec, gang: Gang, waited: float) -> bool:
    """Ranks of an elastic attempt unschedulable for spec.elastic.unschedulableSeconds: the next attempt runs on the
    ranks the scheduler placed, when they are at least minNodes; fewer, and the job waits, saying so. Whether the pass
    is decided."""
    full = p.job.spec
    assert full is not None and full.elastic is not None
    limit = full.elastic.unschedulable_seconds
    if waited < limit:
        p.plan.requeue_after = min(p.plan.requeue_after or limit, max(1.0, limit - waited))
        return False
    placed = sum(1 for pod in gang.current if pod.node and not pod.deleting)
    if full.elastic.min_nodes <= placed < spec.nodes:
        grace = max(1, min(spec.termination_grace_period_seconds, p.settings.failure_restart_grace_seconds))
        why = f"{spec.nodes - placed} rank(s) unschedulable for {waited:.0f}s"
        _resize(p, spec, gang, placed, reason="Shrunk", why=why, grace=grace)
        return True
    message = (
        f"only {placed} of the attempt's {spec.nodes} rank(s) could be placed in {waited:.0f}s, fewer than "
        f"spec.elastic.minNodes={full.elastic.min_nodes}: waiting for the scheduler to place "
        f"{full.elastic.min_nodes - placed} more"
    )
    before = p.job.status.condition("Created")
    p.st.set_condition("Created", True, "BelowMinNodes", message, now=p.now)
    if before is None or before.reason != "BelowMinNodes":
        p.event("Warning", "BelowMinNodes", message)
    return True


def _placeholders(p: _Pass, gang: Gang) -> None:
    """An elastic job running below spec.nodes keeps one placeholder per missing rank (builders.build_placeholder);
    any other placeholder goes (an earlier attempt's, or the job no longer running below its size). A set one of whose
    pods finished (preempted, evicted, failed) is replaced whole, as a new generation: under Kueue a new pod group,
    since Kueue admits no new pod into a finished group. The GPUs running placeholders hold are counted when they stop
    holding them, whether a grow used them or not."""
    full, st = p.job.spec, p.st
    el = st.elastic
    missing = 0
    if full is not None and full.elastic is not None and el is not None and st.state == RUNNING:
        missing = full.nodes - el.current_nodes
    wanted = {placeholder_name(p.job.ref.name, i) for i in range(missing)}
    ours = [ph for ph in gang.placeholders if ph.name in wanted and ph.attempt == st.attempt and not ph.deleting]
    # Under Kueue a finished pod's group is finished: the set goes whole, into a new group; else only that pod goes.
    finished = [ph for ph in ours if ph.finished]
    replaced = el is not None and full is not None and bool(full.queue_name) and bool(finished)
    keep = [] if replaced else [ph for ph in ours if not ph.finished]
    p.delete([ph for ph in gang.placeholders if ph not in keep], grace_seconds=1)
    if el is None:
        return
    if replaced:
        el.placeholder_generation += 1
    running = sum(1 for ph in keep if ph.running)
    if running and el.capacity_since is None:
        el.capacity_since = p.now
    elif not running and el.capacity_since is not None:
        _bill_capacity(p, el)
        el.capacity_since = None
    el.placeholders_running = running
    if not missing or full is None or p.plan.create:
        return
    held = {ph.name for ph in gang.placeholders}  # a name still held by a deleting one is created on a later pass
    sized = elastic.sized(full, el.current_nodes)
    if image := _admitted_image(st):
        sized = replace(sized, image=image)  # the attempt's image (a runtime's, say): the one a grow will pull
    p.plan.create = [
        build_placeholder(
            p.job.ref,
            sized,
            index=i,
            count=missing,
            attempt=st.attempt,
            settings=p.settings,
            generation=el.placeholder_generation,
        )
        for i in range(missing)
        if placeholder_name(p.job.ref.name, i) not in held
    ]
    if len(keep) < len(gang.placeholders) or p.plan.create:  # some are going: look again soon
        p.plan.requeue_after = min(p.plan.requeue_after or 2.0, 2.0)


def _admitted_image(st: Status) -> str | None:
    """The trainer image the current attempt was admitted with (status.runtime's effective values)."""
    for value in (st.runtime or {}).get("values") or []:
        if isinstance(value, dict) and value.get("field") == "spec.image" and value.get("value"):
            return str(value["value"])
    return None


def _bill_capacity(p: _Pass, el: Elastic) -> None:
    """The GPUs the running placeholders held since ``capacity_since``, without training: idle, and used."""
    full = p.job.spec
    if el.capacity_since is None or full is None:
        return
    before = p.job.status.elastic
    count = before.placeholders_running if before is not None else el.placeholders_running
    held = max(0.0, (p.now - el.capacity_since).total_seconds()) * full.gpus_per_node * count
    el.idle_gpu_seconds = round(el.idle_gpu_seconds + held, 3)
    p.st.gpu_seconds_used = round((p.st.gpu_seconds_used or 0) + held, 3)


# -- endings ----------------------------------------------------------------------------------------------------


def _close_attempt(p: _Pass, spec: JobSpec, *, restarted: bool) -> int:
    """Account the attempt that ends now: GPU-seconds used and, for a restart, the work thrown away (the steps
    returned)."""
    st = p.st
    if _leave_queue(p):  # never admitted: it used no GPU and trained nothing
        return 0
    if st.attempt_start_time is None:
        return 0
    seconds = (p.now - st.attempt_start_time).total_seconds()
    st.gpu_seconds_used = round(
        (st.gpu_seconds_used or 0)
        + attempt_gpu_seconds(seconds=seconds, gpus_per_node=spec.gpus_per_node, nodes=spec.nodes),
        3,
    )
    if not restarted or st.progress is None:
        return 0
    lost = steps_lost(st.progress)
    global_batch = spec.training.per_device_batch_size * spec.world_size * spec.training.gradient_accumulation_steps
    steps_per_second = (st.progress.samples_per_second or 0) / max(1, global_batch)
    if lost and steps_per_second > 0:
        st.gpu_seconds_lost = round(
            (st.gpu_seconds_lost or 0)
            + attempt_gpu_seconds(seconds=lost / steps_per_second, gpus_per_node=spec.gpus_per_node, nodes=spec.nodes),
            3,
        )
    st.progress = _restarted(st.progress, lost, now=p.now)
    return lost


def _restarted(progress: Progress, lost: int, *, now: datetime) -> Progress:
    """The progress after a restart (of the gang, or in place) that threw ``lost`` steps away: the ranks start again
    from the newest checkpoint, so until rank 0 reports the job stands there (and a second restart before that report
    loses nothing more), with no rate or ETA."""
    resume = progress.last_checkpoint_step or 0
    total = progress.total_steps
    return replace(
        progress,
        steps_lost_to_restarts=(progress.steps_lost_to_restarts or 0) + lost,
        step=resume,
        step_of_total=f"{resume}/{total}" if total else None,
        samples_per_second=None,
        tokens_per_second=None,
        eta_seconds=None,
        eta=None,
        update_time=now,
    )


def _node_loss_pending(p: _Pass, spec: JobSpec, gang: Gang, failure: Failure) -> bool:
    """An elastic gang's rank failed (a training error, a timeout) while peers still run on nodes not seen down: a
    peer's node may be lost and its survivors fail first. The restart waits, up to NODE_LOSS_WAIT_SECONDS from the
    failure, for the node controller to mark it (then it is a disruption, and the job shrinks). Whether it waits."""
    if spec.elastic is None or failure.disruption or failure.permanent or failure.reason == "RendezvousTimeout":
        return False
    if p.nodes_unreadable:  # no `nodes: get` (forceDelete.mode never): no node is ever seen down, nothing to wait for
        return False
    peers = [pod for pod in gang.current if pod.running and pod.node]
    if not peers or any(pod.node in p.down_nodes for pod in gang.current if pod.node):
        return False
    failed_at = parse_ts(failure.finished_at) if failure.finished_at else None
    waited = (p.now - failed_at).total_seconds() if failed_at is not None else NODE_LOSS_WAIT_SECONDS
    if waited >= NODE_LOSS_WAIT_SECONDS:
        return False
    p.plan.requeue_after = min(5.0, max(1.0, NODE_LOSS_WAIT_SECONDS - waited))
    return True


def _restart_or_fail(p: _Pass, spec: JobSpec, current: list[PodState], failure: Failure) -> None:
    """A gang restart when the failure is retryable and the budget allows (disruptions against the operator's
    limit, other failures against spec.maxRestarts), else the job fails keeping the failed rank's pod.
    For an elastic job, a failure while a rank's node is down is that node's loss (a disruption: the job shrinks), and
    a rendezvous timeout while ranks wait for the scheduler is waiting, not a fault: restarted without counting."""
    st, limit = p.st, p.settings.max_disruptions
    waiting = False
    if spec.elastic is not None and not failure.permanent:
        down = sorted({pod.node for pod in current if pod.node and pod.node in p.down_nodes})
        if down and not failure.disruption:
            why = "; ".join(f"{n}: {p.down_nodes[n]}" for n in down)
            failure = replace(failure, disruption=True, message=f"node(s) lost ({why}); {failure.message}")
        waiting = failure.reason == "RendezvousTimeout" and any(pod.node is None for pod in current)
    will_restart = not failure.permanent and (
        waiting or (st.disruptions < limit if failure.disruption else st.restarts < spec.max_restarts)
    )
    lost_steps = _close_attempt(p, spec, restarted=will_restart)
    if not will_restart:
        if failure.disruption and not failure.permanent:
            failure = replace(
                failure, message=f"{failure.message}; {st.disruptions} disruptions already (operator limit {limit})"
            )
        elif not failure.permanent:
            failure = replace(
                failure, message=f"{failure.message}; restarts exhausted ({st.restarts}/{spec.max_restarts})"
            )
        _fail(p, current, failure, keep=failure.pod_name)
        return
    if waiting:
        pass
    elif failure.disruption:
        st.disruptions += 1
    else:
        st.restarts += 1
    size = spec.nodes
    if spec.elastic is not None and failure.disruption:
        lost = _lost_ranks(p, spec, current)
        size = elastic.after_loss(spec, spec.nodes, len(lost))
    st.failure = failure
    st.attempt += 1
    st.attempt_start_time = None
    st.restart_requested_time = p.now
    st.ready_nodes = 0
    # After a disruption the ranks agree on a checkpoint, which takes the pods' grace period. After a failure a rank
    # is gone, so the survivors (often blocked in a collective) can save nothing: a short grace frees the GPUs.
    # At least 1 s: a zero grace period removes the pod object at once, before its node has stopped the processes.
    grace = (
        None
        if failure.disruption
        else max(1, min(spec.termination_grace_period_seconds, p.settings.failure_restart_grace_seconds))
    )
    p.delete(current, grace_seconds=grace)
    p.plan.restart_reason = None if waiting else failure.reason
    counted = (
        "not counted: ranks wait for the scheduler"
        if waiting
        else "not counted: disruption"
        if failure.disruption
        else f"restart {st.restarts}/{spec.max_restarts}"
    )
    p.transition(
        RESTARTING,
        failure.reason,
        f"gang restart to attempt {st.attempt} ({counted}): {failure.message}",
        warning=True,
        always_event=True,
    )
    if size < spec.nodes:
        ranks = ", ".join(str(r) for r in sorted(lost))
        _resized(
            p,
            spec,
            size,
            reason="Shrunk",
            why=f"rank(s) {ranks} lost ({failure.reason})",
            lost_steps=lost_steps,
            event=True,
        )
    p.plan.requeue_after = 2.0


def _fail(p: _Pass, pods: list[PodState], failure: Failure, *, keep: str | None) -> None:
    st = p.st
    st.failure = failure
    st.completion_time = p.now
    st.ready_nodes = 0
    p.delete(pods, keep=keep)
    p.transition(FAILED, failure.reason, failure.message, warning=True)


def _leave_queue(p: _Pass) -> bool:
    """The attempt ends while Kueue still holds it: Queued=False. Whether it was queued."""
    queued = p.st.condition("Queued")
    if queued is None or not queued.status:
        return False
    p.st.set_condition(
        "Queued", False, "AttemptEnded", f"attempt {p.st.attempt} ended before Kueue admitted it", now=p.now
    )
    return True


def _refuse(p: _Pass, pods: list[PodState], *, reason: str, message: str) -> None:
    """Fail a job the operator will not run (InvalidSpec, QuotaExceeded): one Warning event, no pods, no retry."""
    _leave_queue(p)
    st, old = p.st, p.job.status
    if old.failure is None or old.failure.message != message[:1024]:
        p.event("Warning", reason, message)
    if reason == "InvalidSpec":
        st.set_condition("InvalidSpec", True, "InvalidSpec", message, now=p.now)
    st.set_state(FAILED, now=p.now, reason=reason, message=message)
    st.failure = Failure(reason, message[:1024])
    if st.completion_time is None:
        st.completion_time = p.now
    p.delete(pods)
    p.ttl()


def _wait_quota(p: _Pass, message: str) -> None:
    """Not admitted yet (a quota or a namespace limit): condition Created=False/QuotaExceeded, one event per
    change, a retry every 30 s, since quota frees up as other jobs finish."""
    st = p.st
    before = p.job.status.condition("Created")
    st.set_condition("Created", False, "QuotaExceeded", message, now=p.now, record_false=True)
    if st.state is None:
        st.state = PENDING
    if before is None or before.reason != "QuotaExceeded" or before.message != message[:1024]:
        p.event("Warning", "QuotaExceeded", message)
    p.plan.requeue_after = QUOTA_RETRY_SECONDS
    st.admission_retry_time = p.now + timedelta(seconds=QUOTA_RETRY_SECONDS)


def _wait_api_server(p: _Pass, message: str) -> None:
    """The API server cannot yet check this job's owner references (a CRD installed moments ago): condition
    Created=False/CRDNotServedYet, one event, a retry every 2 s."""
    _wait_to_create(p, "CRDNotServedYet", message)


def _wait_for_namesake(p: _Pass, what: str) -> None:
    """A child name this job needs is still held by a deleted FineTuneJob of the same name (another uid): wait for the
    garbage collector, never adopt it (its pods would count as this job's, its ConfigMap carry the old config)."""
    message = (
        f"waiting for {what}, left by a deleted FineTuneJob of the same name, to be removed; its pods may "
        "still be saving a checkpoint"
    )
    _wait_to_create(p, "PreviousJobTerminating", message)


def _wait_to_create(p: _Pass, reason: str, message: str) -> None:
    """The attempt cannot be created yet, for a passing reason: condition Created=False with ``reason``, one event
    when the reason is new, a retry every 2 s."""
    st = p.st
    before = p.job.status.condition("Created")
    st.set_condition("Created", False, reason, message, now=p.now, record_false=True)
    if st.state is None:
        st.state = PENDING
    if before is None or before.reason != reason:
        p.event("Normal", reason, message)
    p.plan.requeue_after = 2.0


def namesake_in_the_way(job: Job, *, what: str, now: datetime, settings: Settings) -> Plan:
    """A create found ``what`` controlled by another FineTuneJob's uid: this pass's attempt does not start; the job
    waits and retries."""
    st = copy.deepcopy(job.status)
    st.observed_generation = job.generation
    p = _Pass(job=job, now=now, settings=settings, plan=Plan(status=st))
    _wait_for_namesake(p, what)
    return p.plan


def name_taken(job: Job, *, what: str, now: datetime, settings: Settings) -> Plan:
    """A create found ``what`` with no controlling owner (someone else's object under the name this job needs): the
    job fails, naming it, instead of waiting for a garbage collection that will never come."""
    st = copy.deepcopy(job.status)
    st.observed_generation = job.generation
    p = _Pass(job=job, now=now, settings=settings, plan=Plan(status=st))
    _refuse(
        p,
        [],
        reason="InvalidSpec",
        message=f"{what} already exists and no FineTuneJob owns it: the job needs "
        "that name; delete the object or give the job another name",
    )
    if job.pdb_enabled:
        p.plan.delete_objects.append(("PodDisruptionBudget", job.ref.name))
    return p.plan


def create_rejected(
    job: Job, pods: list[PodState], *, what: str, code: int, message: str, now: datetime, settings: Settings
) -> Plan:
    """The API server refused a child the spec produced. A quota refusal waits and retries, and so does an owner
    reference the API server cannot check yet (a CRD installed moments ago); anything else (an invalid pod, a Pod
    Security violation) is an InvalidSpec: the job fails instead of retrying forever.
    ``pods``: the job's pods as they are now (the ranks created before the refusal among them)."""
    st = copy.deepcopy(job.status)
    st.observed_generation = job.generation
    p = _Pass(job=job, now=now, settings=settings, plan=Plan(status=st))
    text = f"the API server refused {what} ({code}): {message}"[:1024]
    # Any quota refusal is transient: "exceeded quota", and also "status unknown for quota" while the quota
    # controller has not yet counted a new ResourceQuota.
    if code == 403 and "quota" in message:
        # A gang is all or nothing: the ranks created before the refusal would hold quota and GPUs, wait for a
        # rank 0 / peers that cannot come, and count against the quota the rest of the gang needs. They go.
        p.delete(Gang.of(pods, uid=job.ref.uid, attempt=st.attempt).current)
        _wait_quota(p, text)
        return p.plan
    if code == 403 and "cannot find RESTMapping" in message:
        # The owner-reference admission check does not know the FineTuneJob kind yet: the CRD was installed moments
        # ago (helm install, then a job at once) and the API server's discovery has not caught up. Seconds, not a
        # fault of the spec.
        _wait_api_server(p, text)
        return p.plan
    if "PodSecurity" in message:
        text = (
            f"{text} — a job with spec.network.hostNetwork or spec.network.rdma needs a namespace labelled "
            "pod-security.kubernetes.io/enforce=privileged (docs/operations.md, GPU networking)"
        )[:1024]
    if what.startswith("PodGroup"):
        text = (
            f"{text} — a gang scheduler's PodGroups need its CRD installed and the chart's "
            "gangScheduling.scheduler set to it (the operator's RBAC; docs/placement.md)"
        )[:1024]
    # The pods created before the refusal are deleted by the next pass, which finds the job finished.
    _refuse(p, [], reason="InvalidSpec", message=text)
    if job.pdb_enabled:
        p.plan.delete_objects.append(("PodDisruptionBudget", job.ref.name))
    return p.plan
