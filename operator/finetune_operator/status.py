"""The FineTuneJob status, typed: what a reconcile pass reads from ``status`` and writes back.

A pass works on :class:`Status` (and its :class:`Progress`, :class:`Condition`) and the controller serialises it once
with :meth:`Status.to_wire`; the camelCase keys exist only here, and a unit test checks them against the CRD's status
schema. Times are whole seconds in UTC on the wire (``2026-12-01T05:00:00Z``). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any

from finetune_operator.failures import Failure
from finetune_operator.history import MAX_STEP, History, camel, finite_number

# Job states (status.state), also the printer column.
PENDING, CREATED, RUNNING, RESTARTING = "Pending", "Created", "Running", "Restarting"
SUCCEEDED, FAILED, SUSPENDED = "Succeeded", "Failed", "Suspended"
TERMINAL = (SUCCEEDED, FAILED)
# The condition that explains each state (Created and Pending: the Created condition, e.g. PreviousJobTerminating).
STATE_CONDITION = {
    RUNNING: "Running",
    RESTARTING: "Restarting",
    SUSPENDED: "Suspended",
    SUCCEEDED: "Succeeded",
    FAILED: "Failed",
    CREATED: "Created",
    PENDING: "Created",
}
STATES = (PENDING, CREATED, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)


def ts(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_ts(s: str | None) -> datetime | None:
    if not s:
        return None
    t = datetime.fromisoformat(s)
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)  # Kubernetes times are UTC


def flat_to_wire(obj: Any) -> dict[str, Any]:
    """A dataclass of plain fields on the wire: camelCase keys, times as timestamps, None left out."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if value is not None:
            out[camel(f.name)] = ts(value) if isinstance(value, datetime) else value
    return out


def flat_from_wire(cls: Any, d: dict[str, Any], *, times: tuple[str, ...]) -> dict[str, Any]:
    """The field values of :func:`flat_to_wire`'s form, ``times`` parsed back into datetimes."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        key = camel(f.name)
        if d.get(key) is not None:
            values[f.name] = parse_ts(d[key]) if f.name in times else d[key]
    return values


def _count(value: Any) -> int | None:
    number = finite_number(value)
    return int(number) if number is not None and 0 <= number < MAX_STEP and number == int(number) else None


def _text(value: Any, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


@dataclass(frozen=True)
class ModelEvaluation:
    """``status.evaluation``: the trained model's scores, from rank 0's summary of a succeeded run (its termination
    message: finetune_trainer.errors.evaluation_summary). The final evaluation on spec.dataset.evalSplit (held-out
    loss, perplexity, accuracy and F1, DPO's reward accuracy and margin) and the evaluation stage's (spec.evaluation:
    its state, split, samples and each metric's mean score). Read from a message a custom image may fill with
    anything, so each value is checked and bounded."""

    step: int | None = None
    loss: float | None = None
    perplexity: float | None = None
    accuracy: float | None = None
    f1: float | None = None
    reward_accuracy: float | None = None
    reward_margin: float | None = None
    state: str | None = None  # Succeeded, Failed, Stopped; None: no evaluation stage
    message: str | None = None
    split: str | None = None
    samples: int | None = None
    scores: dict[str, float] | None = None  # metric name -> mean score
    completion_length: float | None = None
    seconds: float | None = None

    _NUMBERS = (
        "loss",
        "perplexity",
        "accuracy",
        "f1",
        "reward_accuracy",
        "reward_margin",
        "completion_length",
        "seconds",
    )
    _STATES = ("Succeeded", "Failed", "Stopped")
    MAX_SCORES = 16

    @classmethod
    def from_wire(cls, d: Any) -> ModelEvaluation | None:
        """From the status, or from a result summary (the same camelCase keys); None when it holds nothing."""
        if not isinstance(d, dict):
            return None
        raw = d.get("scores")
        scores: dict[Any, Any] = raw if isinstance(raw, dict) else {}
        kept = {
            str(k)[:40]: value
            for k, v in list(scores.items())[: cls.MAX_SCORES]
            if (value := finite_number(v)) is not None
        }
        found = cls(
            step=_count(d.get("step")),
            state=d.get("state") if d.get("state") in cls._STATES else None,
            message=_text(d.get("message"), 600),
            split=_text(d.get("split"), 253),
            samples=_count(d.get("samples")),
            scores=kept or None,
            **{name: finite_number(d.get(camel(name))) for name in cls._NUMBERS},
        )
        return found if found != cls() else None

    def to_wire(self) -> dict[str, Any]:
        return flat_to_wire(self)


@dataclass(frozen=True)
class Progress:
    """``status.progress``: rank 0's training gauges (progress.parse_metrics) and the restart accounting."""

    step: int | None = None
    total_steps: int | None = None
    step_of_total: str | None = None
    epoch: float | None = None
    loss: float | None = None
    learning_rate: float | None = None
    samples_per_second: float | None = None
    tokens_per_second: float | None = None
    eta_seconds: int | None = None
    eta: str | None = None
    last_checkpoint_step: int | None = None
    mfu: float | None = None
    eval_loss: float | None = None
    eval_perplexity: float | None = None
    eval_accuracy: float | None = None
    eval_f1: float | None = None
    reward_accuracy: float | None = None  # dpo
    reward_margin: float | None = None  # dpo
    reward_mean: float | None = None  # grpo: the weighted sum of the rewards, and each function's own mean
    reward_means: dict[str, float] | None = None
    completion_length: float | None = None  # grpo
    kl: float | None = None  # grpo with beta > 0
    rollout_tokens_per_second: float | None = None  # grpo: completion tokens generated per second of generation
    steps_lost_to_restarts: int | None = None
    time_to_first_step_seconds: float | None = None
    warmup_seconds: float | None = None
    rendezvous_seconds: float | None = None
    launcher_seconds: float | None = None  # the start-up's parts (result.json's startup), the current attempt's
    data_seconds: float | None = None
    model_seconds: float | None = None
    restarts_in_place: int | None = None  # the current attempt's restarts of every rank in place (rank 0's round)
    acceleration: str | None = None  # what the current attempt trains with (auto settled by the trainer), and why
    kernels: str | None = None
    acceleration_reason: str | None = None
    update_time: datetime | None = None

    def to_wire(self) -> dict[str, Any]:
        return flat_to_wire(self)

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Progress:
        return cls(**flat_from_wire(cls, d, times=("update_time",)))

    def scraped(self) -> dict[str, Any]:
        """The fields a scrape set (all but the restart accounting and the update time)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) is not None and f.name not in ("update_time", "steps_lost_to_restarts")
        }


def merge_progress(old: Progress | None, scraped: Progress, *, now: datetime) -> Progress:
    """Scraped fields over the old ones; updateTime moves only when something else changed (no idle writes)."""
    base = old or Progress()
    merged = replace(base, **scraped.scraped())
    if replace(merged, update_time=None) != replace(base, update_time=None):
        merged = replace(merged, update_time=now)
    return merged


@dataclass
class Elastic:
    """``status.elastic``: an elastic job's size (finetune_operator.elastic). ``current_nodes`` is the size of the
    current attempt (or, between attempts, of the next one); the batch fields are what that size trains with."""

    current_nodes: int
    desired_nodes: int
    min_nodes: int
    gradient_accumulation_steps: int
    global_batch_size: int
    asked_global_batch_size: int
    resizes: int = 0
    steps_lost_to_resizes: int = 0
    idle_gpu_seconds: float = 0.0  # GPUs held without training: running placeholders, grown or not
    placeholders_running: int = 0
    placeholder_generation: int = 0  # a set of placeholders with a finished pod is replaced whole, in a new pod group
    grown_from: int | None = None  # the size before a grow, until the grown attempt runs (Kueue may hold it)
    capacity_since: datetime | None = None  # since when a placeholder has run (the capacity a grow waits to use)
    last_resize_time: datetime | None = None
    last_resize: str | None = None  # Shrunk | Grown

    def to_wire(self) -> dict[str, Any]:
        return flat_to_wire(self)

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Elastic:
        return cls(**flat_from_wire(cls, d, times=("capacity_since", "last_resize_time")))


@dataclass
class Condition:
    type: str
    status: bool
    reason: str
    message: str
    last_transition_time: datetime
    observed_generation: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": "True" if self.status else "False",
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": ts(self.last_transition_time),
            "observedGeneration": self.observed_generation,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Condition:
        return cls(
            type=d["type"],
            status=d.get("status") == "True",
            reason=str(d.get("reason") or ""),
            message=str(d.get("message") or ""),
            last_transition_time=parse_ts(d.get("lastTransitionTime")) or datetime.fromtimestamp(0, UTC),
            observed_generation=int(d.get("observedGeneration") or 0),
        )


@dataclass(frozen=True)
class Placement:
    """``status.placement``: the topology domain (the value of ``level``'s node label) each rank of ``attempt`` landed
    in, rank 0 first ("" where it could not be read); finetune_operator.placement."""

    attempt: int
    level: str
    domains: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "level": self.level, "domains": list(self.domains)}

    @classmethod
    def from_wire(cls, d: Any) -> Placement | None:
        if not isinstance(d, dict) or not isinstance(d.get("domains"), list):
            return None
        return cls(int(d.get("attempt") or 0), str(d.get("level") or ""), tuple(str(x) for x in d["domains"]))


@dataclass
class Status:
    """One job's status. ``ready_nodes``/``wanted_nodes`` are shown together as ``nodes`` ("2/4")."""

    state: str | None = None
    observed_generation: int = 0
    ready_nodes: int = 0
    wanted_nodes: int = 0
    attempt: int = 0
    restarts: int = 0
    restarts_in_place: int = 0  # of restarts: those made in place (the pods kept), over the whole job
    disruptions: int = 0
    start_time: datetime | None = None
    attempt_start_time: datetime | None = None  # None: the current attempt's pods are not created yet
    restart_requested_time: datetime | None = None
    completion_time: datetime | None = None
    admission_retry_time: datetime | None = None
    last_restart_gap_seconds: float | None = None
    gpu_seconds_used: float | None = None
    gpu_seconds_lost: float | None = None
    failure: Failure | None = None
    progress: Progress | None = None
    history: History | None = None
    conditions: list[Condition] = field(default_factory=list)
    runtime: dict[str, Any] | None = None  # what the current attempt was admitted with (runtimes.record)
    elastic: Elastic | None = None  # an elastic job's size and batch
    evaluation: ModelEvaluation | None = None  # the trained model's scores, once the job succeeded
    placement: Placement | None = None  # the topology domain of each rank (spec.topology with a level)

    # -- the wire form ------------------------------------------------------------------------------

    _TIMES = ("start_time", "attempt_start_time", "restart_requested_time", "completion_time", "admission_retry_time")
    _NUMBERS = ("last_restart_gap_seconds", "gpu_seconds_used", "gpu_seconds_lost")

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.state is not None:
            out["state"] = self.state
            if why := self.reason():
                out["reason"] = why  # derived, for the Reason column: never read back
        out.update(
            observedGeneration=self.observed_generation,
            nodes=f"{self.ready_nodes}/{self.wanted_nodes}",
            readyNodes=self.ready_nodes,
            attempt=self.attempt,
            restarts=self.restarts,
            disruptions=self.disruptions,
        )
        if self.restarts_in_place:
            out["restartsInPlace"] = self.restarts_in_place
        for name in (*self._TIMES, *self._NUMBERS):
            value = getattr(self, name)
            if value is not None:
                out[camel(name)] = ts(value) if isinstance(value, datetime) else value
        if self.failure is not None:
            out["failure"] = self.failure.as_status()
        if self.progress is not None:
            out["progress"] = self.progress.to_wire()
        if self.history is not None:
            out["history"] = self.history.to_wire()
        if self.conditions:
            out["conditions"] = [c.to_wire() for c in self.conditions]
        if self.runtime is not None:
            out["runtime"] = self.runtime
        if self.elastic is not None:
            out["elastic"] = self.elastic.to_wire()
        if self.evaluation is not None:
            out["evaluation"] = self.evaluation.to_wire()
        if self.placement is not None:
            out["placement"] = self.placement.to_wire()
        return out

    @classmethod
    def from_wire(cls, d: dict[str, Any] | None) -> Status:
        d = d or {}
        shown = str(d.get("nodes") or "0/0").partition("/")[2]
        st = cls(
            state=d.get("state"),
            observed_generation=int(d.get("observedGeneration") or 0),
            ready_nodes=int(d.get("readyNodes") or 0),
            wanted_nodes=int(shown) if shown.isdigit() else 0,
            attempt=int(d.get("attempt") or 0),
            restarts=int(d.get("restarts") or 0),
            restarts_in_place=int(d.get("restartsInPlace") or 0),
            disruptions=int(d.get("disruptions") or 0),
            failure=Failure.from_status(d["failure"]) if d.get("failure") else None,
            progress=Progress.from_wire(d["progress"]) if d.get("progress") else None,
            history=History.from_wire(d.get("history")),
            conditions=[Condition.from_wire(c) for c in d.get("conditions") or []],
            runtime=dict(d["runtime"]) if isinstance(d.get("runtime"), dict) else None,
            elastic=Elastic.from_wire(d["elastic"]) if isinstance(d.get("elastic"), dict) else None,
            evaluation=ModelEvaluation.from_wire(d.get("evaluation")),
            placement=Placement.from_wire(d.get("placement")),
        )
        for name in cls._TIMES:
            setattr(st, name, parse_ts(d.get(camel(name))))
        for name in cls._NUMBERS:
            if d.get(camel(name)) is not None:
                setattr(st, name, float(d[camel(name)]))
        return st

    # -- conditions ---------------------------------------------------------------------------------

    def explanation(self) -> tuple[str, str]:
        """Why the job is in its state, (reason, message): the failure's for a failed job, else those of the condition
        that explains the state (empty when none does yet)."""
        if self.state == FAILED and self.failure is not None:
            return self.failure.reason, self.failure.message
        c = self.condition(STATE_CONDITION.get(self.state or PENDING, ""))
        return (c.reason, c.message) if c is not None else ("", "")

    def reason(self) -> str:
        """The one-word reason of :meth:`explanation` (status.reason, the Reason column)."""
        return self.explanation()[0]

    def condition(self, ctype: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == ctype), None)

    def set_condition(
        self, ctype: str, value: bool, reason: str, message: str, *, now: datetime, record_false: bool = False
    ) -> None:
        """Set one condition; lastTransitionTime moves only when its status flips. An absent condition already
        reads as False, so a False one is written only when it exists (or ``record_false``)."""
        message = message[:1024]
        c = self.condition(ctype)
        if c is not None:
            if c.status != value:
                c.last_transition_time = now
            c.status, c.reason, c.message, c.observed_generation = value, reason, message, self.observed_generation
            return
        if value or record_false:
            self.conditions.append(Condition(ctype, value, reason, message, now, self.observed_generation))

    def set_state(self, state: str, *, now: datetime, reason: str, message: str) -> None:
        self.state = state
        self.set_condition(
            "Running", state == RUNNING, reason if state != RUNNING else "AllRanksRunning", message, now=now
        )
        self.set_condition("Restarting", state == RESTARTING, reason, message, now=now)
        self.set_condition("Suspended", state == SUSPENDED, reason, message, now=now)
        if state == SUCCEEDED:
            self.set_condition("Succeeded", True, reason, message, now=now)
        if state == FAILED:
            self.set_condition("Failed", True, reason, message, now=now)
