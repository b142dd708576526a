"""Pure lifecycle decisions: (job, its pods, now) in, a Plan out. No I/O here.

Level-based: every pass compares what exists with what the spec wants, so a lost event or an
operator restart converges by itself. The gang never overlaps attempts: the failed attempt's pods are
deleted and must be gone before the next attempt is created under the same names.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from finetune_operator import admission, guardrails
from finetune_operator.admission import Observed
from finetune_operator.builders import (
    JobRef,
    build_config_map,
    build_output_claim,
    build_pdb,
    build_pods,
    build_service,
    pod_name,
)
from finetune_operator.failures import Failure, classify_pod, waiting_problem
from finetune_operator.progress import attempt_gpu_seconds, steps_lost
from finetune_operator.settings import LABEL_ATTEMPT, LABEL_RANK, Settings
from finetune_operator.spec import JobSpec, SpecError, check_name, parse_spec

# Job states (status.state), also the printer column.
PENDING, CREATED, RUNNING, RESTARTING = "Pending", "Created", "Running", "Restarting"
SUCCEEDED, FAILED, SUSPENDED = "Succeeded", "Failed", "Suspended"
TERMINAL = (SUCCEEDED, FAILED)
QUOTA_RETRY_SECONDS = 30.0  # a job waiting for quota or a namespace limit tries again this often


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

    status: dict[str, Any]
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[PodDelete] = field(default_factory=list)
    delete_objects: list[tuple[str, str]] = field(default_factory=list)  # (kind, name): the gang's PDB
    events: list[Event] = field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None
    restart_reason: str | None = None  # for the operator's restarts-by-reason metric


def ts(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_ts(s: str | None) -> datetime | None:
    if not s:
        return None
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def set_condition(status: dict[str, Any], ctype: str, value: bool, reason: str, message: str,
                  *, now: datetime, generation: int, record_false: bool = False) -> None:
    """Set one condition; lastTransitionTime moves only when its status flips."""
    conds: list[dict[str, Any]] = status.setdefault("conditions", [])
    new_status = "True" if value else "False"
    message = message[:1024]
    for c in conds:
        if c["type"] == ctype:
            if c.get("status") != new_status:
                c["lastTransitionTime"] = ts(now)
            c.update(status=new_status, reason=reason, message=message, observedGeneration=generation)
            return
    if not value and not record_false:
        return  # an absent condition already reads as False: write nothing
    conds.append({"type": ctype, "status": new_status, "reason": reason, "message": message,
                  "lastTransitionTime": ts(now), "observedGeneration": generation})


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for c in status.get("conditions", []):
        if c["type"] == ctype:
            return dict(c)
    return None


def _owned_by(pod: dict[str, Any], uid: str) -> bool:
    return any(o.get("uid") == uid and o.get("controller") for o in pod["metadata"].get("ownerReferences") or [])


def _attempt_of(pod: dict[str, Any]) -> int:
    try:
        return int(pod["metadata"]["labels"][LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return -1


def _rank_of(pod: dict[str, Any]) -> int:
    try:
        return int(pod["metadata"]["labels"][LABEL_RANK])
    except (KeyError, ValueError):
        return -1


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _deleting(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def _finished(pod: dict[str, Any]) -> bool:
    return _phase(pod) in ("Succeeded", "Failed")


def _running(pod: dict[str, Any]) -> bool:
    return _phase(pod) == "Running" and not _deleting(pod)


def _delete_all(pods: list[dict[str, Any]], *, keep: str | None = None, now: datetime,
                settings: Settings) -> list[PodDelete]:
    """Delete pods; a pod already deleting whose deadline passed long ago is force-deleted
    (its node no longer answers, so nothing else will ever finish the deletion)."""
    out = []
    for p in pods:
        meta = p["metadata"]
        if meta["name"] == keep:
            continue
        deadline = parse_ts(meta.get("deletionTimestamp"))
        if deadline is None:
            out.append(PodDelete(meta["name"], meta["uid"]))
        elif now > deadline + timedelta(seconds=settings.restart_force_delete_after_seconds):
            out.append(PodDelete(meta["name"], meta["uid"], grace_seconds=0))
    return out


def _set_state(st: dict[str, Any], state: str, *, now: datetime, gen: int, reason: str, message: str) -> None:
    st["state"] = state
    set_condition(st, "Running", state == RUNNING, reason if state != RUNNING else "AllRanksRunning",
                  message, now=now, generation=gen)
    set_condition(st, "Restarting", state == RESTARTING, reason, message, now=now, generation=gen)
    set_condition(st, "Suspended", state == SUSPENDED, reason, message, now=now, generation=gen)
    if state == SUCCEEDED:
        set_condition(st, "Succeeded", True, reason, message, now=now, generation=gen)
    if state == FAILED:
        set_condition(st, "Failed", True, reason, message, now=now, generation=gen)


def _close_attempt(st: dict[str, Any], spec: JobSpec, *, now: datetime, restarted: bool) -> None:
    """Account the attempt that ends now: GPU-seconds used and, for a restart, the work thrown away."""
    started = parse_ts(st.get("attemptStartTime"))
    if started is None:
        return
    seconds = (now - started).total_seconds()
    st["gpuSecondsUsed"] = round(float(st.get("gpuSecondsUsed", 0)) + attempt_gpu_seconds(
        seconds=seconds, gpus_per_node=spec.gpus_per_node, nodes=spec.nodes), 3)
    progress = st.get("progress")
    if not restarted or not progress:
        return
    lost = steps_lost(progress)
    progress["stepsLostToRestarts"] = int(progress.get("stepsLostToRestarts", 0)) + lost
    global_batch = spec.training.per_device_batch_size * spec.world_size * spec.training.gradient_accumulation_steps
    steps_per_second = float(progress.get("samplesPerSecond", 0)) / max(1, global_batch)
    if lost and steps_per_second > 0:
        st["gpuSecondsLost"] = round(float(st.get("gpuSecondsLost", 0)) + attempt_gpu_seconds(
            seconds=lost / steps_per_second, gpus_per_node=spec.gpus_per_node, nodes=spec.nodes), 3)


def merge_progress(old: dict[str, Any] | None, scraped: dict[str, Any], *, now: datetime) -> dict[str, Any]:
    """Scraped fields over the old ones; updateTime moves only when something else changed (no idle writes)."""
    base = dict(old or {})
    merged = {**base, **scraped}
    if {k: v for k, v in merged.items() if k != "updateTime"} != {k: v for k, v in base.items() if k != "updateTime"}:
        merged["updateTime"] = ts(now)
    return merged


def decide(job: dict[str, Any], pods: list[dict[str, Any]], *, now: datetime, settings: Settings,
           progress: dict[str, Any] | None = None, observed: Observed | None = None) -> Plan:
    """One reconcile decision. ``progress`` is what was just scraped from rank 0 (None: not scraped);
    ``observed`` is what the controller read for the checks before an attempt starts (claims, namespace use)."""
    plan = _decide(job, pods, now=now, settings=settings, progress=progress, observed=observed or Observed())
    # The gang's PodDisruptionBudget lives while the job can run: it goes when the job stops or finishes.
    old_state, new_state = (job.get("status") or {}).get("state"), plan.status.get("state")
    pdb = ((job.get("spec") or {}).get("podDisruptionBudget") or {}).get("enabled")
    if pdb and new_state != old_state and new_state in (*TERMINAL, SUSPENDED):
        plan.delete_objects.append(("PodDisruptionBudget", job["metadata"]["name"]))
    return plan


def _decide(job: dict[str, Any], pods: list[dict[str, Any]], *, now: datetime, settings: Settings,
            progress: dict[str, Any] | None, observed: Observed) -> Plan:
    meta = job["metadata"]
    ref = JobRef(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    gen = int(meta.get("generation", 1))
    old = job.get("status") or {}
    st = copy.deepcopy(old)
    st["observedGeneration"] = gen
    plan = Plan(status=st)
    prev_state = old.get("state")

    def transition(state: str, reason: str, message: str, *, event_type: str = "Normal",
                   always_event: bool = False) -> None:
        _set_state(st, state, now=now, gen=gen, reason=reason, message=message)
        if prev_state != state or always_event:
            plan.events.append(Event(event_type, reason, message))

    # Children of a deleted job of the same name are not ours: never count or delete them; the garbage
    # collector removes them, and a requeue looks again.
    foreign = [p for p in pods if not _owned_by(p, ref.uid)]
    pods = [p for p in pods if _owned_by(p, ref.uid)]
    if foreign:
        plan.requeue_after = 2.0

    # A finished job stays finished whatever its spec says now.
    if prev_state in TERMINAL:
        try:
            spec_or_none: JobSpec | None = parse_spec(job.get("spec") or {})
        except (SpecError, KeyError, TypeError, ValueError):
            spec_or_none = None
        keep = (old.get("failure") or {}).get("podName") if prev_state == FAILED else None
        plan.delete = _delete_all([p for p in pods if not _finished(p)], keep=keep, now=now, settings=settings)
        _ttl(plan, spec=spec_or_none, raw_spec=job.get("spec") or {}, now=now)
        return plan

    try:
        check_name(ref.name)
        spec = parse_spec(job.get("spec") or {})
    except (SpecError, KeyError, TypeError, ValueError) as e:
        st["nodes"] = "0/0"
        return _refuse(plan, job, pods, reason="InvalidSpec", message=str(e), now=now, settings=settings)

    violation = guardrails.check(spec, settings)
    if violation is not None:
        return _refuse(plan, job, pods, reason=violation.reason, message=violation.message, now=now,
                       settings=settings)

    attempt = int(st.get("attempt", 0))
    st.setdefault("attempt", attempt)
    st.setdefault("restarts", 0)
    st.setdefault("disruptions", 0)
    current = [p for p in pods if _attempt_of(p) == attempt]
    stale = [p for p in pods if _attempt_of(p) != attempt]
    running = sum(1 for p in current if _running(p))
    st["readyNodes"] = running
    st["nodes"] = f"{running}/{spec.nodes}"

    # -- suspend: pods go, the next attempt starts when resumed --------------------------------------
    if spec.suspend:
        if prev_state != SUSPENDED and st.get("attemptStartTime"):
            _close_attempt(st, spec, now=now, restarted=False)
            st["attempt"] = attempt + 1
            st["attemptStartTime"] = None
        plan.delete = _delete_all(pods, now=now, settings=settings)
        st["readyNodes"], st["nodes"] = 0, f"0/{spec.nodes}"
        transition(SUSPENDED, "Suspended", "spec.suspend is true: trainer pods deleted")
        return _clean(plan)

    # -- deadline --------------------------------------------------------------------------------------
    started = parse_ts(st.get("startTime"))
    if spec.active_deadline_seconds and started and prev_state != SUSPENDED:  # resuming restarts the clock
        remaining = spec.active_deadline_seconds - (now - started).total_seconds()
        if remaining <= 0:
            _close_attempt(st, spec, now=now, restarted=False)
            return _fail(plan, st, pods, Failure("DeadlineExceeded",
                         f"the job was active longer than spec.activeDeadlineSeconds={spec.active_deadline_seconds}"),
                         transition=transition, now=now, settings=settings, keep=None)
        plan.requeue_after = remaining

    # -- the previous attempt must be gone before the next starts -------------------------------------
    if stale:
        plan.delete = _delete_all(stale, now=now, settings=settings)
        if prev_state not in (RESTARTING, SUSPENDED):
            transition(RESTARTING, "CleaningUp", "waiting for pods of an earlier attempt to terminate")
        else:
            st["state"] = RESTARTING
        plan.requeue_after = 2.0
        return _clean(plan)

    created = bool(st.get("attemptStartTime"))
    present = {_rank_of(p) for p in current}
    if not created:
        # Waiting for quota: retry on the clock, not on every pod event (a refused gang's own deletions would
        # otherwise re-trigger creation at once, a retry storm against the API server).
        retry_at = parse_ts(st.get("admissionRetryTime"))
        if retry_at is not None and now < retry_at:
            plan.requeue_after = (retry_at - now).total_seconds()
            return _clean(plan)
        if any(_deleting(p) for p in current):  # the ranks of a refused creation are still going
            plan.requeue_after = 1.0
            return _clean(plan)
        claims = admission.check_claims(ref.name, spec, observed.claims)
        if claims is not None:
            return _refuse(plan, job, pods, reason=claims.reason, message=claims.message, now=now, settings=settings)
        over = admission.check_namespace(spec, observed.usage, settings)
        if over is not None and over.permanent:
            return _refuse(plan, job, pods, reason=over.violation.reason, message=over.violation.message, now=now,
                           settings=settings)
        if over is not None:
            return _wait_quota(plan, old, over.violation.message, now=now, gen=gen)
        # Create the attempt (all missing ranks; creation tolerates "already exists").
        missing = [p for p in build_pods(ref, spec, attempt=attempt, settings=settings)
                   if int(p["metadata"]["labels"][LABEL_RANK]) not in present]
        extra = [o for o in (build_output_claim(ref, spec), build_pdb(ref, spec)) if o is not None]
        plan.create = [*extra, build_service(ref), build_config_map(ref, spec), *missing]
        st["attemptStartTime"] = ts(now)
        st.pop("admissionRetryTime", None)
        if prev_state == SUSPENDED:
            st["startTime"] = ts(now)  # as a Kubernetes Job: the deadline restarts when resumed
        st.setdefault("startTime", ts(now))
        restart_requested = parse_ts(st.pop("restartRequestedTime", None))
        if restart_requested:
            st["lastRestartGapSeconds"] = round((now - restart_requested).total_seconds(), 3)
        set_condition(st, "Created", True, "PodsCreated",
                      f"attempt {attempt}: {spec.nodes} trainer pod(s) created", now=now, generation=gen)
        set_condition(st, "Suspended", False, "Resumed", "spec.suspend is false", now=now, generation=gen)
        # Restarting stays True until every rank of the new attempt runs.
        st["state"] = CREATED
        plan.events.append(Event("Normal", "PodsCreated",
                                 f"attempt {attempt}: created {spec.nodes} trainer pod(s) "
                                 f"({spec.nodes} node(s) x {spec.procs_per_node} process(es))"))
        return _clean(plan)

    # -- the attempt runs: look for the first failure ---------------------------------------------------
    failures: list[tuple[str, int, Failure, dict[str, Any]]] = []
    for p in current:
        f = classify_pod(p)
        if f is not None:
            failures.append((f.finished_at or "", _rank_of(p), f, p))
    for r in range(spec.nodes):
        if r not in present:
            failures.append(("~", r, Failure("PodDeleted", f"pod {pod_name(ref.name, r)} disappeared while the "
                                              "attempt ran", disruption=True), {}))
    if failures:
        failures.sort(key=lambda x: (x[0], x[1]))  # the earliest failure is the cause; peers follow it
        _, rank, failure, pod = failures[0]
        failure = failure.with_rank(rank, attempt, pod.get("metadata", {}).get("name"))
        return _restart_or_fail(plan, st, spec, current, failure, transition=transition, now=now,
                                settings=settings)

    if len(current) == spec.nodes and all(_phase(p) == "Succeeded" for p in current):
        _close_attempt(st, spec, now=now, restarted=False)
        if st.get("progress"):
            st["progress"].update(etaSeconds=0, eta="0s")
        st["completionTime"] = ts(now)
        st["readyNodes"], st["nodes"] = 0, f"0/{spec.nodes}"
        transition(SUCCEEDED, "AllRanksSucceeded", f"all {spec.nodes} rank(s) exited 0 in attempt {attempt}")
        _ttl(plan, spec=spec, raw_spec=None, now=now)
        return _clean(plan)

    done = sum(1 for p in current if _phase(p) == "Succeeded")
    if running and running + done == spec.nodes:
        if progress:
            st["progress"] = merge_progress(st.get("progress"), progress, now=now)
        transition(RUNNING, "AllRanksRunning", f"attempt {attempt}: {running}/{spec.nodes} trainer pods running")
        return _clean(plan)

    # Some ranks wait: say why; image and config problems fail the job after a bounded wait.
    problems = [(r, w) for p in current if (w := waiting_problem(p)) is not None for r in [_rank_of(p)]]
    st["state"] = CREATED if prev_state != RESTARTING else prev_state
    if problems:
        rank, problem = sorted(problems, key=lambda x: x[0])[0]
        waited = (now - (parse_ts(st.get("attemptStartTime")) or now)).total_seconds()
        if problem.fatal and waited >= settings.waiting_timeout_seconds:
            failure = Failure(problem.reason, f"rank {rank} waited {waited:.0f}s: {problem.message}").with_rank(
                rank, attempt, pod_name(ref.name, rank))
            _close_attempt(st, spec, now=now, restarted=False)
            return _fail(plan, st, current, failure, transition=transition, now=now, settings=settings, keep=None)
        old_created = condition(old, "Created") or {}
        set_condition(st, "Created", True, problem.reason, f"rank {rank}: {problem.message}", now=now,
                      generation=gen)
        if old_created.get("reason") != problem.reason:
            plan.events.append(Event("Warning", problem.reason, f"rank {rank}: {problem.message}"))
        if problem.fatal:
            plan.requeue_after = max(1.0, settings.waiting_timeout_seconds - waited)
    return _clean(plan)


def _restart_or_fail(plan: Plan, st: dict[str, Any], spec: JobSpec, current: list[dict[str, Any]],
                     failure: Failure, *, transition: Any, now: datetime, settings: Settings) -> Plan:
    will_restart = not failure.permanent and (
        st["disruptions"] < settings.max_disruptions if failure.disruption else st["restarts"] < spec.max_restarts)
    _close_attempt(st, spec, now=now, restarted=will_restart)
    if failure.permanent:
        return _fail(plan, st, current, failure, transition=transition, now=now, settings=settings,
                     keep=failure.pod_name)
    if failure.disruption:
        if st["disruptions"] >= settings.max_disruptions:
            failure = Failure(failure.reason, f"{failure.message}; {st['disruptions']} disruptions already "
                              f"(operator limit {settings.max_disruptions})", rank=failure.rank,
                              attempt=failure.attempt, pod_name=failure.pod_name)
            return _fail(plan, st, current, failure, transition=transition, now=now, settings=settings,
                         keep=failure.pod_name)
        st["disruptions"] += 1
    else:
        if st["restarts"] >= spec.max_restarts:
            failure = Failure(failure.reason, f"{failure.message}; restarts exhausted "
                              f"({st['restarts']}/{spec.max_restarts})", rank=failure.rank,
                              attempt=failure.attempt, exit_code=failure.exit_code, pod_name=failure.pod_name)
            return _fail(plan, st, current, failure, transition=transition, now=now, settings=settings,
                         keep=failure.pod_name)
        st["restarts"] += 1
    st["failure"] = failure.as_status()
    st["attempt"] = int(st["attempt"]) + 1
    st["attemptStartTime"] = None
    st["restartRequestedTime"] = ts(now)
    st["readyNodes"], st["nodes"] = 0, f"0/{spec.nodes}"
    plan.delete = _delete_all(current, now=now, settings=settings)
    plan.restart_reason = failure.reason
    counted = "not counted: disruption" if failure.disruption else f"restart {st['restarts']}/{spec.max_restarts}"
    transition(RESTARTING, failure.reason, f"gang restart to attempt {st['attempt']} ({counted}): {failure.message}",
               event_type="Warning", always_event=True)
    plan.requeue_after = 2.0
    return _clean(plan)


def _fail(plan: Plan, st: dict[str, Any], pods: list[dict[str, Any]], failure: Failure, *, transition: Any,
          now: datetime, settings: Settings, keep: str | None) -> Plan:
    st["failure"] = failure.as_status()
    st["completionTime"] = ts(now)
    st["readyNodes"] = 0
    st["nodes"] = f"0/{st.get('nodes', '0/0').split('/')[-1]}"
    plan.delete = _delete_all(pods, keep=keep, now=now, settings=settings)
    transition(FAILED, failure.reason, failure.message, event_type="Warning")
    return _clean(plan)


def _refuse(plan: Plan, job: dict[str, Any], pods: list[dict[str, Any]], *, reason: str, message: str,
            now: datetime, settings: Settings) -> Plan:
    """Fail a job the operator will not run (InvalidSpec, QuotaExceeded): one Warning event, no pods, no retry."""
    st, old = plan.status, job.get("status") or {}
    gen = int(job["metadata"].get("generation", 1))
    if (old.get("failure") or {}).get("message") != message:
        plan.events.append(Event("Warning", reason, message))
    if reason == "InvalidSpec":
        set_condition(st, "InvalidSpec", True, "InvalidSpec", message, now=now, generation=gen)
    _set_state(st, FAILED, now=now, gen=gen, reason=reason, message=message)
    st["failure"] = {"reason": reason, "message": message[:1024]}
    st.setdefault("completionTime", ts(now))
    plan.delete = _delete_all(pods, now=now, settings=settings)
    _ttl(plan, spec=None, raw_spec=job.get("spec") or {}, now=now)
    return _clean(plan)


def _ttl(plan: Plan, *, spec: JobSpec | None, raw_spec: dict[str, Any] | None, now: datetime) -> None:
    ttl = spec.ttl_seconds_after_finished if spec else (raw_spec or {}).get("ttlSecondsAfterFinished")
    done = parse_ts(plan.status.get("completionTime"))
    if ttl is None or done is None:
        return
    remaining = float(ttl) - (now - done).total_seconds()
    if remaining <= 0:
        plan.delete_job = True
    else:
        plan.requeue_after = remaining


def _wait_quota(plan: Plan, old: dict[str, Any], message: str, *, now: datetime, gen: int) -> Plan:
    """Not admitted yet (a quota or a namespace limit): condition Created=False/QuotaExceeded, one event per
    change, a retry every 30 s, since quota frees up as other jobs finish."""
    st = plan.status
    prev = condition(old, "Created") or {}
    set_condition(st, "Created", False, "QuotaExceeded", message, now=now, generation=gen, record_false=True)
    st.setdefault("state", PENDING)
    if prev.get("reason") != "QuotaExceeded" or prev.get("message") != message[:1024]:
        plan.events.append(Event("Warning", "QuotaExceeded", message))
    plan.requeue_after = QUOTA_RETRY_SECONDS
    st["admissionRetryTime"] = ts(now + timedelta(seconds=QUOTA_RETRY_SECONDS))
    return _clean(plan)


def _clean(plan: Plan) -> Plan:
    """Drop keys whose value is None so that the written status stays minimal and comparable."""
    for k in [k for k, v in plan.status.items() if v is None]:
        del plan.status[k]
    return plan


def create_rejected(job: dict[str, Any], *, what: str, code: int, message: str, now: datetime,
                    pods: list[dict[str, Any]] | None = None) -> Plan:
    """The API server refused a child the spec produced. A quota refusal waits and retries; anything else
    (an invalid pod, a Pod Security violation) is an InvalidSpec: the job fails instead of retrying forever.
    ``pods``: the job's pods as they are now (the ranks created before the refusal among them)."""
    gen = int(job["metadata"].get("generation", 1))
    old = job.get("status") or {}
    st = copy.deepcopy(old)
    st["observedGeneration"] = gen
    plan = Plan(status=st)
    text = f"the API server refused {what} ({code}): {message}"[:1024]
    # Any quota refusal is transient: "exceeded quota", and also "status unknown for quota" while the quota
    # controller has not yet counted a new ResourceQuota.
    if code == 403 and "quota" in message:
        # A gang is all or nothing: the ranks created before the refusal would hold quota and GPUs, wait for a
        # rank 0 / peers that cannot come, and count against the quota the rest of the gang needs. They go.
        attempt = str(old.get("attempt", 0))
        mine = [p for p in pods or [] if _owned_by(p, job["metadata"]["uid"])
                and p["metadata"].get("labels", {}).get(LABEL_ATTEMPT) == attempt]
        plan.delete = _delete_all(mine, now=now, settings=Settings())
        return _wait_quota(plan, old, text, now=now, gen=gen)
    if "PodSecurity" in message:
        text = (f"{text} — a job with spec.network.hostNetwork or spec.network.rdma needs a namespace labelled "
                "pod-security.kubernetes.io/enforce=privileged (docs/operations.md, GPU networking)")[:1024]
    # The pods created before the refusal are deleted by the next pass, which finds the job finished.
    plan = _refuse(plan, job, [], reason="InvalidSpec", message=text, now=now, settings=Settings())
    if ((job.get("spec") or {}).get("podDisruptionBudget") or {}).get("enabled"):
        plan.delete_objects.append(("PodDisruptionBudget", job["metadata"]["name"]))
    return plan
