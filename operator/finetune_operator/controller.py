"""Runs reconcile passes: read (job, pods) → decide (pure) → write (creates, status, deletes, events).

Passes for one job are serialized by a per-job lock, because the job's own watch events, its pods'
events and the backstop timer can all ask for the same job at once; nothing waits for that lock: a
caller that finds it held marks the job dirty and the holder runs once more. The backstop loop also runs
the requeues that a plan asked for (TTL expiry, deadlines, waiting timeouts, restart clean-up), on a
small pool of its own so one slow pass delays no other job's deadline.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from finetune_operator import admission, failpoints, kueue, multikueue, placement, runtimes
from finetune_operator.admission import Observed
from finetune_operator.builders import is_placeholder
from finetune_operator.k8s import CREATED, FOREIGN, TAKEN, ApiError, Conflict, Kube, Rejected
from finetune_operator.kueue import WorkloadState
from finetune_operator.metrics import OperatorMetrics
from finetune_operator.reconcile import Event, Plan, create_rejected, decide, name_taken, namesake_in_the_way
from finetune_operator.scrape import Scraper
from finetune_operator.settings import METRICS_PORT, Settings
from finetune_operator.spec import SpecError
from finetune_operator.state import Gang, Job, PodState, node_down, node_lost, placement_ranks, read_job, read_pods
from finetune_operator.status import PENDING, RUNNING, STATES, TERMINAL, Progress
from finetune_operator.store import Store

log = logging.getLogger(__name__)
Key = tuple[str, str]


def _now() -> datetime:
    return datetime.now(UTC)


LIST_EVERY = 10  # backstop ticks between lists of the jobs when a store serves them
NS_BUSY_RETRY = 0.2  # seconds: a pass that found its namespace's admission lock held comes back after this
# A refused placeholder (a PriorityClass that does not exist, a quota) is tried again after 2 s, then twice as long
# after each refusal, up to 5 minutes: one job below its size must not cost a GET and a POST every 2 s for hours.
PLACEHOLDER_RETRY = (2.0, 300.0)
BACKSTOP_WORKERS = 4  # threads that run the backstop's passes (requeues, resyncs), so one slow pass stalls no other


class Controller:
    def __init__(
        self,
        kube: Kube,
        settings: Settings,
        metrics: OperatorMetrics | None = None,
        clock: Callable[[], datetime] = _now,
        store: Store | None = None,
    ) -> None:
        self.kube = kube
        # What the watches delivered (finetune_operator.store); None: every pass reads from the API server.
        self.store = store
        self._resyncs = 0
        self.settings = settings
        self.metrics = metrics or OperatorMetrics()
        self.clock = clock
        self._guard = threading.Lock()
        self._locks: dict[Key, threading.Lock] = {}
        self._ns_locks: dict[str, threading.Lock] = {}
        self._due: dict[Key, float] = {}
        self._dirty: set[Key] = set()  # jobs with a watch event that no pass has looked at yet
        self._queued: set[Key] = set()  # jobs with a pass waiting in the backstop's pool
        self._listed_once = False  # the backstop has listed every job into the store
        self._pool = ThreadPoolExecutor(max_workers=BACKSTOP_WORKERS, thread_name_prefix="backstop")
        self.last_tick = time.monotonic()  # the backstop loop's heartbeat (healthy())
        self._states: dict[Key, str] = {}
        # Jobs forgotten (their DELETED event) while a pass of theirs ran: that pass leaves no state behind (the
        # jobs gauge would count a ghost). Emptied as each pass ends, so it holds in-flight passes only.
        self._forgotten: set[Key] = set()
        self._passed: dict[Key, float] = {}  # monotonic end of the last pass per job
        # Rank 0's metrics, read off the reconcile path (finetune_operator.scrape); a finished scrape asks for a pass.
        self.scraper = Scraper(
            interval=settings.progress_interval_seconds,
            on_done=lambda key: self.requeue(key, 0),
            on_retry=self.requeue,
        )
        self.metrics.scrapes_slow.set_function(self.scraper.slow)
        # Whether this replica may run the backstop (kopf peering decides for its own handlers); standalone: always.
        self.active: Callable[[], bool] = lambda: True
        self._workloads_forbidden = False  # no RBAC to read Kueue's Workloads: said once in the log
        self._kueue_forbidden = False  # nor its queues (spec.topology's check)
        # Jobs whose placeholder the API server refused: the delay before the next try, and when that may be.
        self._placeholders_refused: dict[Key, tuple[float, datetime]] = {}

    def _hold_placeholders(self, key: Key, plan: Plan, now: datetime) -> None:
        """Leave out of ``plan`` the placeholders of a job whose last one was refused, until its retry is due; the
        pass comes back then."""
        with self._guard:
            refused = self._placeholders_refused.get(key)
        if refused is None or now >= refused[1] or not any(is_placeholder(o) for o in plan.create):
            return
        plan.create = [o for o in plan.create if not is_placeholder(o)]
        due = (refused[1] - now).total_seconds()
        plan.requeue_after = due if plan.requeue_after is None else min(plan.requeue_after, due)

    def _placeholder_refused(self, key: Key, now: datetime) -> bool:
        """Count a refused placeholder: the next try waits twice as long as the last (PLACEHOLDER_RETRY). Whether it is
        the first refusal since the job's placeholders were last created (or ever)."""
        first, most = PLACEHOLDER_RETRY
        with self._guard:
            before = self._placeholders_refused.get(key)
            delay = first if before is None else min(most, before[0] * 2)
            self._placeholders_refused[key] = (delay, now + timedelta(seconds=delay))
        return before is None

    def _lock(self, key: Key) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def _ns_lock(self, namespace: str) -> threading.Lock:
        with self._guard:
            return self._ns_locks.setdefault(namespace, threading.Lock())

    def requeue(self, key: Key, after: float) -> None:
        with self._guard:
            due = time.monotonic() + after
            self._due[key] = min(self._due.get(key, due), due)

    def forget(self, key: Key) -> None:
        if self.store is not None:
            self.store.drop(key)
        self.scraper.forget(key)
        with self._guard:  # the lock itself stays: a pass may hold it or wait on it right now
            self._due.pop(key, None)
            self._dirty.discard(key)
            self._states.pop(key, None)
            if (lock := self._locks.get(key)) is not None and lock.locked():
                self._forgotten.add(key)
            self._passed.pop(key, None)
            self._placeholders_refused.pop(key, None)
        self._export_states(key[0])

    def _export_states(self, namespace: str) -> None:
        """finetune_operator_jobs of one namespace, by state (zeros too, so an alert on the namespace resolves); its
        series go with its last job."""
        with self._guard:
            states = [s for (ns, _), s in self._states.items() if ns == namespace]
            for state in STATES:
                if states:
                    self.metrics.jobs.labels(finetune_namespace=namespace, state=state).set(states.count(state))
                else:
                    with contextlib.suppress(KeyError):
                        self.metrics.jobs.remove(namespace, state)

    # -- one pass ------------------------------------------------------------------------------------

    def on_event(self, namespace: str, name: str, job: dict[str, Any] | None = None) -> None:
        """A watch event for this job (or a backstop pass: a requeue, a resync with the listed ``job``): run a pass,
        coalescing, never waiting. While a pass for the job runs, further calls only mark it dirty and return at once
        (freeing the watch's worker or the backstop's); the running pass then runs once more for all of them. A
        burst of pod events (a gang's pods created, or starting together) costs two passes, not one per event."""
        key = (namespace, name)
        with self._guard:
            self._dirty.add(key)
        lock = self._lock(key)
        while lock.acquire(blocking=False):
            try:
                with self._guard:
                    self._dirty.discard(key)
                self._drain(key, self._reconcile_locked(key, job))
                job = None  # a listed body is for the first pass only: later ones read the newer store
            finally:
                lock.release()
            with self._guard:  # an event that came between the last check and the release
                if key not in self._dirty:
                    return

    def _drain(self, key: Key, plan: Plan | None) -> Plan | None:
        """With the job's lock held: one more pass while events came that were left to the holder (on_event)."""
        while True:
            with self._guard:
                if key not in self._dirty:
                    return plan
                self._dirty.discard(key)
            plan = self._reconcile_locked(key, None)

    def _reconcile_locked(self, key: Key, job: dict[str, Any] | None) -> Plan | None:
        namespace, name = key
        with self.metrics.reconcile_seconds.time():
            try:
                return self._reconcile(key, job)
            except Conflict as e:
                log.info("conflict on %s/%s, retrying: %s", namespace, name, e)
                if self.store is not None:
                    self.store.forget_job(key)  # the stored version is stale: the retry reads the job
                self.requeue(key, 0.5)
            except Exception:
                self.metrics.reconcile_errors.inc()
                log.exception("reconcile of %s/%s failed; retrying", namespace, name)
                self.requeue(key, 5.0)
            finally:
                with self._guard:
                    self._passed[key] = time.monotonic()
                    self._forgotten.discard(key)
            return None

    def _reconcile(self, key: Key, job: dict[str, Any] | None) -> Plan | None:
        namespace, name = key
        if job is None and self.store is not None:
            job = self.store.job(key)
        if job is None:
            job = self.kube.get_job(namespace, name)
            if job is not None and self.store is not None:
                self.store.put_job(job)
        if job is None or job["metadata"].get("deletionTimestamp"):
            self.forget(key)
            return None
        if self.store is not None and (wait := self.store.waiting(key)) is not None:
            # Pods this operator just created or deleted are still on their way through the watch; the event
            # that delivers the last of them starts the next pass (and a requeue covers one that never comes).
            self.requeue(key, wait)
            return None
        return self._pass(key, read_job(job))

    def _pass(self, key: Key, job: Job) -> Plan | None:
        status = job.status
        pods = self._pods(key)
        now = self.clock()  # one instant for the choice below and the decision: a retry time cannot pass between
        # The reads before an attempt starts (its runtime, claims, the namespace's use) only for a pass that may start
        # one: not while the job waits out a quota retry or for an earlier attempt's pods to go, which it may do for
        # minutes, a pass every few seconds each (two runtime LISTs and a claim GET a pass, for every waiting job).
        if job.dispatched:  # MultiKueue runs it elsewhere: only its runtime, for its Workload, until it finished
            choice = None
            if job.spec is not None and not job.spec.suspend and status.state not in TERMINAL:
                choice = self.kube.runtime_choice(job.ref.namespace, job.spec.runtime_ref)
            return self._act(key, job, Observed(runtime=choice), pods, now)
        admitting = (
            status.state not in TERMINAL and status.attempt_start_time is None and self._may_start(job, pods, now)
        )
        if admitting and (self.settings.max_nodes_per_namespace or self.settings.max_gpus_per_namespace):
            # Admission against namespace totals: one job of a namespace at a time, so two jobs cannot both
            # take the last GPUs (the first one's status write is visible to the second one's list). A pass never
            # waits for the lock (that would hold a worker of the watch or the backstop): it comes back shortly.
            ns_lock = self._ns_lock(key[0])
            if not ns_lock.acquire(blocking=False):
                self.requeue(key, NS_BUSY_RETRY)
                return None
            try:
                return self._act(key, job, self._observe(job, usage=True), pods, now)
            finally:
                ns_lock.release()
        return self._act(key, job, self._observe(job, usage=False) if admitting else Observed(), pods, now)

    def _may_start(self, job: Job, pods: list[PodState], now: datetime) -> bool:
        """Whether a pass at ``now`` could start the job's next attempt (reconcile's order): no quota retry pending, no
        pod of an earlier attempt (nor a placeholder) left to go."""
        retry = job.status.admission_retry_time
        if retry is not None and now < retry:
            return False
        gang = Gang.of(pods, uid=job.ref.uid, attempt=job.status.attempt)
        return not (gang.stale or gang.placeholders)

    def _observe(self, job: Job, *, usage: bool) -> Observed:
        """Reads for the checks before an attempt starts: the claims the job mounts, the namespace's use."""
        if job.spec is None:
            return Observed()  # decide() reports the spec error
        if job.spec.suspend:
            return Observed()  # a suspended job starts nothing: nothing to read (two LISTs per resync otherwise)
        choice = self.kube.runtime_choice(job.ref.namespace, job.spec.runtime_ref)
        try:
            spec = runtimes.resolve(job.raw_spec, choice, self.settings).spec  # its claims: the runtime may name some
        except SpecError:
            spec = job.spec  # decide() reports it
        claims = {}
        for _, claim in admission.claims_to_check(job.ref.name, spec):
            pvc = self.kube.get_claim(job.ref.namespace, claim)
            if pvc is not None:
                claims[claim] = pvc
        queue_topology = None
        if spec.topology is not None and job.status.start_time is None:
            # the queue's Kueue objects: for a job that asks for a topology, judged once, before its first pod
            queue_topology = placement.read_queue_topology(
                lambda plural, name, ns: self.kube.get_kueue(plural, name, ns), job.ref.namespace, spec.queue_name
            )
            if queue_topology.unreadable and not self._kueue_forbidden:
                log.warning(
                    "cannot read Kueue's queues, flavors or Topologies (%s): spec.topology is not checked before a "
                    "job starts; that needs Kueue v0.15 or later and the chart's kueue.enabled=true",
                    queue_topology.problem,
                )
                self._kueue_forbidden = True
        held = None
        if usage:
            # From the store once the backstop has listed every job (its first tick); before that, from the API server:
            # right after a start the store may not hold every job of the namespace yet. Never a LIST per pass of
            # every waiting job (a thousand pending jobs would be a thousand LISTs per resync).
            jobs = (
                self.store.jobs(job.ref.namespace)
                if self.store is not None and self._listed_once
                else self.kube.list_jobs(job.ref.namespace)
            )
            held = admission.usage_of(jobs, exclude_uid=job.ref.uid)
        copy = False
        if job.prebuilt_workload:  # a MultiKueue worker's copy: its Workload must be MultiKueue's, admitted
            copy = multikueue.admitted_copy(
                self.kube.get_workload(job.ref.namespace, job.prebuilt_workload), spec.nodes
            )
        return Observed(claims=claims, usage=held, runtime=choice, queue_topology=queue_topology, admitted_copy=copy)

    def _pods(self, key: Key) -> list[PodState]:
        """The job's pods from the store when it can be trusted for them, else listed (and stored)."""
        if self.store is None:
            return read_pods(self.kube.list_pods(*key))
        held = self.store.pods(key)
        if held is not None:
            return held
        seen = self.store.events_seen(key)
        pods, version = self.kube.list_pods_at(*key)
        self.store.replace_pods(key, pods, version=version, events_seen=seen)
        return read_pods(pods)

    def _lost_nodes(self, pods: list[PodState]) -> dict[str, str]:
        """The nodes of pods stuck deleting past their grace period, when state.node_lost says they are lost. Read
        only for such pods (rare); a node the operator may not read (no ``nodes: get``) counts as not lost."""
        now, after = self.clock(), self.settings.restart_force_delete_after_seconds
        stuck = {
            p.node for p in pods if p.node and p.deletion is not None and (now - p.deletion).total_seconds() > after
        }
        lost = {}
        for node_name in sorted(stuck):
            try:
                node = self.kube.get_node(node_name)
            except ApiError as e:
                log.warning("cannot read node %s, so its stuck pods are not force-deleted: %s", node_name, e)
                continue
            why = node_lost(node, mode=self.settings.force_delete, now=now, after_seconds=after)
            if why is not None:
                lost[node_name] = why
        return lost

    def _down_nodes(self, job: Job, pods: list[PodState]) -> tuple[dict[str, str], bool]:
        """The down nodes of an elastic attempt's ranks, read only when one of its ranks failed (not a disruption):
        a rank's node lost is often first seen as its peers' failure (reconcile._node_loss_pending); and whether the
        operator may not read nodes at all."""
        if job.spec is None or job.spec.elastic is None:
            return {}, False
        current = [
            p for p in pods if p.attempt == job.status.attempt and not p.placeholder and p.owner_uid == job.ref.uid
        ]
        if not any(p.failure is not None and not p.failure.disruption for p in current):
            return {}, False
        down = {}
        for node_name in sorted({p.node for p in current if p.node}):
            try:
                node = self.kube.get_node(node_name)
            except ApiError as e:
                if e.code == 403:
                    return {}, True
                log.warning("cannot read node %s: %s", node_name, e)
                continue
            if (why := node_down(node)) is not None:
                down[node_name] = why
        return down, False

    def _placement_nodes(self, job: Job, pods: list[PodState]) -> dict[str, dict[str, str]]:
        """The labels of the nodes an attempt's ranks were placed on, for the domain of each rank in the status: read
        once per attempt of a job with a topology level, when every rank is bound and a pod's node selector does not
        name the level (where the Topology's lowest level is the hostname, Kueue gives a pod only that one)."""
        placed = job.status.placement
        level = placement.level_to_record(
            job.spec.topology if job.spec is not None else None,
            placed.attempt if placed else None,
            job.status.attempt,
        )
        ranks = placement_ranks(job, pods) if level is not None else None
        if level is None or ranks is None or all(level in p.node_selector for p in ranks):
            return {}
        labels: dict[str, dict[str, str]] = {}
        for node_name in sorted({p.node for p in ranks if p.node and level not in p.node_selector}):
            try:
                node = self.kube.get_node(node_name)
            except ApiError as e:
                if e.code != 403:
                    log.warning("cannot read node %s for the placement of its ranks (read again): %s", node_name, e)
                    return {}  # a later pass reads it again
                node = None  # no `nodes: get` (the chart grants it with operator.forceDelete): the domain stays ""
            labels[node_name] = dict(((node or {}).get("metadata") or {}).get("labels") or {})
        return labels

    def _finish_workload(self, namespace: str, body: dict[str, Any]) -> None:
        """Mark a MultiKueue worker's Workload Finished, once: only one MultiKueue made (its origin label), and not
        again once finished (every pass of a finished copy would otherwise write it)."""
        try:
            wl = self.kube.get_workload(namespace, body["metadata"]["name"])
            if wl is None or multikueue.is_finished(wl):
                return
            if not multikueue.made_by_multikueue(wl):
                log.warning("%s/%s: not MultiKueue's Workload: left alone", namespace, body["metadata"]["name"])
                return
            self.kube.finish_workload(namespace, body)
        except ApiError as e:  # the next pass of the finished job tries again
            log.warning("%s/%s: cannot mark its Workload Finished: %s", namespace, body["metadata"]["name"], e)

    def _queue(self, job: Job) -> WorkloadState:
        """Kueue's word on the Workload of the job's current attempt, while Kueue holds its pods. Without
        ``workloads: get`` (the chart's kueue.enabled), the status says only that Kueue holds the pods."""
        try:
            wl = self.kube.get_workload(
                job.ref.namespace, kueue.group_name(job.ref.name, job.status.attempt, job.ref.uid)
            )
        except ApiError as e:
            if e.code == 403:
                if not self._workloads_forbidden:
                    log.warning(
                        "the operator may not read Kueue's Workloads (%s): queued jobs will not show Kueue's "
                        "reason; install the chart with kueue.enabled=true",
                        e.message,
                    )
                self._workloads_forbidden = True
                return kueue.UNREADABLE
            log.warning("%s/%s: cannot read its Kueue Workload: %s", job.ref.namespace, job.ref.name, e)
            return WorkloadState(
                False, "Queued", f"Kueue holds the attempt's pods (its Workload could not be read: {e.message[:200]})"
            )
        return kueue.read_workload(wl)

    def _act(self, key: Key, job: Job, observed: Observed, pods: list[PodState], now: datetime) -> Plan | None:
        namespace, name = key
        if self.settings.force_delete != "never" and (lost := self._lost_nodes(pods)):
            observed = replace(observed, lost_nodes=lost)
        down, unreadable = self._down_nodes(job, pods)
        if down or unreadable:
            observed = replace(observed, down_nodes=down, nodes_unreadable=unreadable)
        if labels := self._placement_nodes(job, pods):
            observed = replace(observed, node_labels=labels)
        if job.spec is not None and any(
            p.gated and p.attempt == job.status.attempt and not p.placeholder for p in pods
        ):
            observed = replace(observed, queue=self._queue(job))
        plan = decide(
            job,
            pods,
            now=now,
            settings=self.settings,
            progress=self._scrape(key, job, pods),
            observed=observed,
        )
        log.debug(
            "%s/%s: state=%s create=%d delete=%d events=%d requeue=%s",
            namespace,
            name,
            plan.status.state,
            len(plan.create),
            len(plan.delete),
            len(plan.events),
            plan.requeue_after,
        )

        self._hold_placeholders(key, plan, now)
        new_pods = [o["metadata"]["name"] for o in plan.create if o["kind"] == "Pod"]
        if new_pods:
            # Never a gang from a stale read: the store may hold a job changed or deleted while a watch was down (or
            # while this replica stood by). One read per gang created.
            self._confirm_current(job)
        if self.store is not None and new_pods:
            # Before the creates: the watch may deliver a pod before the last create returns.
            self.store.expect(key, added=new_pods)
        sent: set[str] = set()
        try:
            for obj in plan.create:
                what = f"{obj['kind']} {obj['metadata']['name']}"
                try:
                    created = self.kube.create(obj)
                except Rejected as e:
                    if is_placeholder(obj):
                        # An elastic job's placeholder only looks for capacity: its refusal (a PriorityClass that does
                        # not exist, a quota) never fails the job, which trains on at its size; said, then retried
                        # later and later (PLACEHOLDER_RETRY).
                        if self._placeholder_refused(key, now):  # said once per run of refusals
                            log.warning("%s/%s: %s refused (%d): %s", namespace, name, what, e.code, e.message)
                            plan.events.append(Event("Warning", "PlaceholderRefused", f"{what}: {e.message}"[:1024]))
                        break  # the job's other placeholders would be refused alike
                    plan = create_rejected(
                        job,
                        read_pods(self.kube.list_pods(namespace, name)),
                        what=what,
                        code=e.code,
                        message=e.message,
                        now=self.clock(),
                        settings=self.settings,
                    )
                    break
                if created == FOREIGN:
                    plan = namesake_in_the_way(job, what=what, now=self.clock(), settings=self.settings)
                    break
                if created == TAKEN:
                    plan = name_taken(job, what=what, now=self.clock(), settings=self.settings)
                    break
                sent.add(obj["metadata"]["name"])
                if created == CREATED and obj["kind"] == "Pod":
                    self.metrics.pods_created.inc()
                if is_placeholder(obj):
                    with self._guard:
                        self._placeholders_refused.pop(key, None)
        finally:
            if self.store is not None and (unsent := [n for n in new_pods if n not in sent]):
                self.store.unexpect(key, added=unsent)  # never created: no event will come for them
        status = plan.status.to_wire()  # serialised once: the write, and the test for "nothing changed"
        if plan.keep_status:  # MultiKueue writes this job's status (the worker's copy's)
            if plan.delete_objects or plan.delete_job:
                self._confirm_current(job)  # as below: no delete from a stale read (a resume it has not seen)
        elif status != job.wire_status:
            # Carries the resourceVersion the pass read, so it is the precondition of every delete after it: a pass
            # from a stale store (after a leader change, a watch gap) gets a Conflict here and deletes nothing.
            written = self.kube.replace_status(job.wire, status)
            if self.store is not None and written:
                self.store.put_job(written)  # its watch event is then an echo, not a reason for another pass
            self.metrics.status_writes.inc()
        elif plan.delete or plan.delete_objects or plan.delete_job:
            # Nothing to write, so a read is the precondition (a write that changes nothing would be a write that
            # makes no progress: an operator that dies after each write would never get past it).
            self._confirm_current(job)
        deleted = []
        for d in plan.delete:
            if self.kube.delete_pod(namespace, d.name, uid=d.uid, grace_seconds=d.grace_seconds):
                self.metrics.pods_deleted.inc()
                deleted.append(d.uid)
            elif self.store is not None:
                # Gone, or another pod now holds the name: the store missed a deletion (a watch gap); list again.
                self.store.untrust(key)
        if self.store is not None:
            self.store.expect(key, deleted=deleted)  # only deletions that were issued
        for kind, obj_name in plan.delete_objects:
            self.kube.delete_object(kind, namespace, obj_name)
        if plan.finish_workload is not None:
            self._finish_workload(namespace, plan.finish_workload)
        if plan.restart_reason:
            self.metrics.restarts.labels(finetune_namespace=namespace, reason=plan.restart_reason).inc()
        if plan.restarts_in_place:
            self.metrics.restarts.labels(finetune_namespace=namespace, reason="TrainingError").inc(
                plan.restarts_in_place
            )
        if plan.resize is not None:
            direction, steps = plan.resize
            self.metrics.resizes.labels(finetune_namespace=namespace, direction=direction).inc()
            self.metrics.steps_lost_to_resizes.labels(finetune_namespace=namespace).inc(steps)
        for ev in plan.events:
            self.kube.post_event(job.wire, type_=ev.type, reason=ev.reason, message=ev.message)
        if plan.delete_job:
            log.info("ttlSecondsAfterFinished passed: deleting %s/%s", namespace, name)
            self.kube.delete_job(namespace, name, uid=job.ref.uid)
            self.forget(key)
            return plan
        new_state = plan.status.state or PENDING
        if new_state != job.status.state:
            log.info("%s/%s: %s -> %s", namespace, name, job.status.state, new_state)
        with self._guard:
            if key not in self._forgotten:
                self._states[key] = new_state
        self._export_states(namespace)
        if plan.requeue_after is not None:
            self.requeue(key, plan.requeue_after)
        if new_state == RUNNING and job.status.state != RUNNING and self.settings.progress_interval_seconds:
            # This pass decided from the state before (scrapes start only for a running job): the first scrape
            # starts on the next pass, now, not on the next pod event or backstop tick (up to resyncSeconds away).
            self.requeue(key, 0)
        return plan

    def _confirm_current(self, job: Job) -> None:
        """Raise :class:`Conflict` unless the API server still holds the version of the job this pass decided from."""
        current = self.kube.get_job(job.ref.namespace, job.ref.name)
        meta = (current or {}).get("metadata") or {}
        if meta.get("uid") != job.ref.uid or meta.get("resourceVersion") != job.wire["metadata"].get("resourceVersion"):
            raise Conflict(409, "the job changed (or is gone) since this pass read it: no gang from a stale read")

    def _scrape(self, key: Key, job: Job, pods: list[PodState]) -> Progress | None:
        """The newest finished scrape of rank 0's metrics for a running job; the next one starts in the background
        when the progress interval has passed (a slow or failed scrape never holds this pass, nor fails the job)."""
        if job.status.state != RUNNING or not self.settings.progress_interval_seconds or job.spec is None:
            return None
        rank0 = [
            p for p in pods if p.rank == 0 and p.attempt == job.status.attempt and p.ip and p.owner_uid == job.ref.uid
        ]
        url = f"http://{rank0[0].ip}:{METRICS_PORT}/metrics" if rank0 else None
        # Rank 0 reports its own node's rates: an elastic job runs on status.elastic.currentNodes of spec.nodes.
        nodes = job.status.elastic.current_nodes if job.status.elastic is not None else job.spec.nodes
        progress = self.scraper.take(key, url, nodes=nodes, attempt=job.status.attempt)
        if url is not None:
            self.requeue(key, self.settings.progress_interval_seconds)
        return progress

    # -- the backstop ---------------------------------------------------------------------------------

    def resync(self) -> None:
        """Reconcile every job that can still change (active ones, finished ones with a TTL). With a store the
        jobs come from memory; every :data:`LIST_EVERY` ticks (and the first) they are listed, a safety net for a
        watch that missed something. The passes go to the backstop's pool (:meth:`submit`)."""
        namespaces: tuple[str | None, ...] = self.settings.namespaces or (None,)
        listing = self.store is None or self._resyncs % LIST_EVERY == 0
        self._resyncs += 1
        if listing and self.store is not None and self._resyncs > 1:
            # Each job's pods are listed again on its next pass. Not on the first tick: nothing about pods is trusted
            # yet then (each job's are listed on its first pass), and a fresh start would list them all twice.
            self.store.invalidate()
        for ns in namespaces:
            listed_at = time.monotonic()
            jobs, list_version = self.kube.list_jobs_at(ns) if listing else (self.store.jobs(ns), 0)  # type: ignore[union-attr]
            if listing and self.store is not None:
                listed = {(j["metadata"]["namespace"], j["metadata"]["name"]) for j in jobs}
                for job in jobs:
                    self.store.put_job(job)
                for job in self.store.jobs(ns):  # deleted while a watch was down: no DELETED event came
                    key = (job["metadata"]["namespace"], job["metadata"]["name"])
                    # Not one a watch delivered after the list was taken (created since): it is no ghost.
                    if key not in listed and not self.store.newer_than(key, list_version):
                        self.forget(key)  # its pods, scrape and state (and so its metric series) too
                jobs = self.store.jobs(ns)  # a listed version older than a stored one loses
            for job in jobs:
                state = (job.get("status") or {}).get("state")
                if state in TERMINAL and (job.get("spec") or {}).get("ttlSecondsAfterFinished") is None:
                    continue
                key = (job["metadata"]["namespace"], job["metadata"]["name"])
                with self._guard:
                    if self._passed.get(key, float("-inf")) > listed_at:
                        continue  # an event-driven pass ran after the list: the listed body is stale
                self.submit(key, job)
        if listing:
            self._listed_once = True  # the store now holds every job: admission reads namespace usage from it

    def submit(self, key: Key, job: dict[str, Any] | None = None) -> None:
        """A pass for ``key`` on the backstop's pool. A job already waiting there is only marked dirty: the waiting
        or running pass covers it (:meth:`on_event`), so a slow API server never piles up passes."""
        with self._guard:
            self._dirty.add(key)
            if key in self._queued:
                return
            self._queued.add(key)
        try:
            self._pool.submit(self._pooled_pass, key, job)
        except RuntimeError:  # the pool is shut down: the operator is stopping
            with self._guard:
                self._queued.discard(key)

    def _pooled_pass(self, key: Key, job: dict[str, Any] | None) -> None:
        with self._guard:
            self._queued.discard(key)  # from now on a new reason for a pass queues another (or marks this one)
        try:
            self.on_event(key[0], key[1], job)
        except Exception:
            log.exception("backstop pass for %s/%s failed", *key)

    def run_due(self) -> None:
        now = time.monotonic()
        with self._guard:
            due = [k for k, t in self._due.items() if t <= now]
            for k in due:
                del self._due[k]
        for key in due:
            self.submit(key)

    def healthy(self, max_age: float) -> str | None:
        """None while the backstop loop ticks; else why not (for the liveness probe: a stuck loop means deadlines,
        TTLs and retries stopped, and a restart is the fix)."""
        age = time.monotonic() - self.last_tick
        if age > max_age:
            return f"the backstop loop last ticked {age:.0f}s ago (limit {max_age:.0f}s)"
        return None

    def loop(self, stop: threading.Event) -> None:
        """Backstop timer plus requeues, until ``stop`` is set. Never raises. The loop itself only decides what is
        due and hands it to the pool; resyncs run there too, one at a time, so the loop keeps ticking (its heartbeat
        is the liveness probe's) whatever the API server does."""
        next_resync = time.monotonic() + self.settings.resync_seconds
        was_active = True
        resyncing: list[Any] = []
        try:
            while not stop.wait(0.5):
                failpoints.hold(self.settings.failpoints_dir, "backstop-loop")
                self.last_tick = time.monotonic()
                self.metrics.backstop_tick.set_to_current_time()
                try:
                    if not self.active():
                        was_active = False
                        continue  # a standby replica: kopf has paused this replica's handlers too
                    if not was_active and self.store is not None:
                        self.store.invalidate()  # the watches were paused: what they missed must be listed
                    was_active = True
                    self.run_due()
                    if time.monotonic() >= next_resync and not (resyncing and not resyncing[0].done()):
                        next_resync = time.monotonic() + self.settings.resync_seconds
                        resyncing[:] = [self._pool.submit(self._resync_logged)]
                except Exception:
                    log.exception("backstop loop pass failed")
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _resync_logged(self) -> None:
        try:
            self.resync()
        except Exception:
            log.exception("backstop resync failed")
