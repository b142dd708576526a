"""Pure: ``status.history``, a bounded and downsampled record of a job's training curves, from what the operator
scrapes from rank 0.

Clients draw loss, evaluation loss, throughput and learning-rate curves from the job alone, without Prometheus:
``finetune status`` prints them as sparklines. Two series, each bounded, whatever the job's length:

- ``train``: at most :data:`MAX_TRAIN_POINTS` points ``{attempt, step, loss, samplesPerSecond, learningRate}`` (and
  ``reward``, GRPO's mean reward), one per scrape that saw the step move (the progress interval, 15 s by default);
- ``eval``: at most :data:`MAX_EVAL_POINTS` points ``{attempt, step, evalLoss}``, one per new evaluation result (at
  the step the scrape saw it).

When the job succeeds, :func:`record_result` merges in the end of the curves from rank 0's ``result.json`` (its
termination message): the losses it logged and its evaluations, which the scrapes (every few seconds) partly missed.

When a series is full, the point whose neighbours lie closest together goes, so the points stay spread evenly over
the whole run, and never an attempt's first or last point, so restarts (a new ``attempt``; the step may go back to
the checkpoint) stay visible. About 200 x 100 bytes: the status stays small (etcd objects are limited to 1.5 MiB).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # status.py holds a History: no import at run time
    from finetune_operator.status import Progress

MAX_TRAIN_POINTS = 200
MAX_EVAL_POINTS = 100


@dataclass(frozen=True)
class TrainPoint:
    attempt: int
    step: int
    loss: float | None = None
    samples_per_second: float | None = None
    learning_rate: float | None = None
    reward: float | None = None  # grpo: the mean of the weighted rewards


@dataclass(frozen=True)
class EvalPoint:
    attempt: int
    step: int
    eval_loss: float


P = TypeVar("P", TrainPoint, EvalPoint)


def camel(name: str) -> str:
    """A field's wire name: ``samples_per_second`` → ``samplesPerSecond`` (the status's too)."""
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def _point_to_wire(p: TrainPoint | EvalPoint) -> dict[str, Any]:
    return {camel(f.name): getattr(p, f.name) for f in fields(p) if getattr(p, f.name) is not None}


def _point_from_wire(cls: type[P], d: dict[str, Any]) -> P:
    return cls(**{f.name: d[camel(f.name)] for f in fields(cls) if d.get(camel(f.name)) is not None})


@dataclass(frozen=True)
class History:
    train: tuple[TrainPoint, ...] = ()
    eval: tuple[EvalPoint, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {"train": [_point_to_wire(p) for p in self.train], "eval": [_point_to_wire(p) for p in self.eval]}

    @classmethod
    def from_wire(cls, d: dict[str, Any] | None) -> History | None:
        if not d:
            return None
        try:
            return cls(
                tuple(_point_from_wire(TrainPoint, p) for p in d.get("train") or []),
                tuple(_point_from_wire(EvalPoint, p) for p in d.get("eval") or []),
            )
        except TypeError:  # a point without its attempt or step (edited by hand): start the record again
            return None


# The series a client draws from the wire form: name, the list it is in, the point's field.
SERIES = (
    ("loss", "train", "loss"),
    ("eval_loss", "eval", "evalLoss"),
    ("samples_per_second", "train", "samplesPerSecond"),
    ("learning_rate", "train", "learningRate"),
    ("reward", "train", "reward"),
)


def series(wire: dict[str, Any] | None) -> dict[str, list[tuple[int, int, float]]]:
    """A ``status.history`` (its wire form) as series of ``(attempt, step, value)`` in the stored order (step order
    within an attempt, attempts in order); points without the series' value are left out."""
    wire = wire or {}
    return {
        name: [
            (int(p.get("attempt", 0)), int(p["step"]), float(p[field]))
            for p in wire.get(points) or []
            if p.get(field) is not None and p.get("step") is not None
        ]
        for name, points, field in SERIES
    }


def thin(points: tuple[P, ...], limit: int) -> tuple[P, ...]:
    """``points`` cut to ``limit``: while too many, the point whose neighbours lie closest together (in steps, within
    its attempt) goes, so the points stay spread evenly over the whole run; an attempt's first and last points stay
    (the oldest points go when nothing else can: hundreds of restarts)."""
    out = list(points)
    while len(out) > limit:
        best, span = -1, 0
        for i in range(1, len(out) - 1):
            if out[i - 1].attempt == out[i].attempt == out[i + 1].attempt:
                gap = out[i + 1].step - out[i - 1].step
                if best < 0 or gap < span:
                    best, span = i, gap
        del out[best if best >= 0 else 0]
    return tuple(out)


def record(history: History | None, scraped: Progress, *, attempt: int) -> History:
    """``history`` with what one scrape of rank 0 saw (``scraped``: this scrape's fields only, not the status's
    carried-over ones): a training point when the step moved since the attempt's last one (at the same step, the
    newest values fill in that point), an evaluation point when the evaluation loss is not the attempt's last one."""
    h = history or History()
    if scraped.step is not None:
        last = h.train[-1] if h.train else None
        point = TrainPoint(
            attempt,
            scraped.step,
            scraped.loss,
            scraped.samples_per_second,
            scraped.learning_rate,
            scraped.reward_mean,
        )
        if last is not None and (last.attempt, last.step) == (attempt, scraped.step):
            # The same step again: what this scrape adds (a gauge the trainer had not set at the last one) fills in.
            filled = replace(
                last, **{f.name: getattr(point, f.name) for f in fields(point) if getattr(point, f.name) is not None}
            )
            if filled != last:
                h = replace(h, train=(*h.train[:-1], filled))
        else:
            h = replace(h, train=thin((*h.train, point), MAX_TRAIN_POINTS))
    if scraped.eval_loss is not None:
        last_eval = next((p for p in reversed(h.eval) if p.attempt == attempt), None)
        if last_eval is None or last_eval.eval_loss != scraped.eval_loss:
            point_e = EvalPoint(attempt, scraped.step or (last_eval.step if last_eval else 0), scraped.eval_loss)
            h = replace(h, eval=thin((*h.eval, point_e), MAX_EVAL_POINTS))
    return h


def _merge(points: tuple[P, ...], attempt: int, extra: list[P], fill: Callable[[P, P], P]) -> tuple[P, ...]:
    """``points`` with ``extra`` points of ``attempt`` merged in step order: a step already recorded keeps its point,
    with ``fill(old, new)``'s values; the attempt's points stay last (it is the newest)."""
    ours: dict[int, P] = {p.step: p for p in points if p.attempt == attempt}
    for p in extra:
        ours[p.step] = fill(ours[p.step], p) if p.step in ours else p
    others: list[P] = [p for p in points if p.attempt != attempt]
    return tuple(others + [ours[s] for s in sorted(ours)])


MAX_STEP = 2**53  # a step above it is not a step (JSON numbers stay exact below it)
MAX_RESULT_POINTS = 10_000  # of a termination message's curves (it holds at most 4 KiB anyway)


def finite_number(value: Any) -> float | None:
    """A finite JSON number (not a boolean), as a float; None for anything else (the message is the trainer's, or a
    custom image's, and may hold anything)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def result_curve(result: dict[str, Any], key: str) -> list[tuple[int, float]]:
    """One curve of rank 0's summary (``loss`` or ``eval``: ``[[step, value], ...]``), what of it is well formed."""
    items = result.get(key)
    out = []
    for item in items[:MAX_RESULT_POINTS] if isinstance(items, list) else []:
        if isinstance(item, list | tuple) and len(item) == 2:
            step, value = finite_number(item[0]), finite_number(item[1])
            if step is not None and value is not None and 0 <= step < MAX_STEP:
                out.append((int(step), value))
    return out


def record_result(history: History | None, result: dict[str, Any], *, attempt: int) -> History:
    """``history`` completed from rank 0's summary of a succeeded run (the trainer's ``result.json``, through its
    termination message): its logged losses ``[step, loss]`` and evaluations ``[step, loss]`` fill in the attempt's
    curve between and after the scrapes (which see a step every few seconds and miss the last ones); a step already
    recorded keeps its throughput and learning rate and gains the logged loss. Then thinned as always."""
    h = history or History()
    # The result's curves cover the whole run: the points up to the step this attempt resumed from are earlier
    # attempts' (their scrapes recorded them, under their own attempt).
    start = finite_number(result.get("resumedFromStep")) or 0
    sps = finite_number(result.get("samplesPerSecond"))
    train = [TrainPoint(attempt, s, loss) for s, loss in result_curve(result, "loss") if s > start]
    if train and sps is not None and sps >= 0:
        train[-1] = replace(train[-1], samples_per_second=sps)
    evals = [EvalPoint(attempt, s, loss) for s, loss in result_curve(result, "eval") if s > start]
    merged_train = _merge(
        h.train,
        attempt,
        train,
        lambda old, new: replace(
            old,
            loss=new.loss,
            samples_per_second=old.samples_per_second if new.samples_per_second is None else new.samples_per_second,
        ),
    )
    merged_eval = _merge(h.eval, attempt, evals, lambda old, new: new)
    return History(thin(merged_train, MAX_TRAIN_POINTS), thin(merged_eval, MAX_EVAL_POINTS))
