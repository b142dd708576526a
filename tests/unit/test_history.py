"""``status.history``: the training curves a client draws without Prometheus stay bounded over any run length, keep
every attempt's ends (restarts stay visible), and record only what a scrape saw."""

from __future__ import annotations

import pytest
from finetune_operator import history
from finetune_operator.history import MAX_EVAL_POINTS, MAX_TRAIN_POINTS, EvalPoint, History, TrainPoint
from finetune_operator.progress import parse_metrics
from finetune_operator.render import curve_rows, sparkline
from finetune_operator.status import Progress, Status

pytestmark = pytest.mark.unit


def scrape(step: int, **more: float) -> Progress:
    return Progress(step=step, total_steps=100_000, **more)  # type: ignore[arg-type]


def test_a_point_per_step_moved_and_per_new_evaluation() -> None:
    h = None
    for step, loss in [(1, 3.0), (1, 3.0), (5, 2.5), (9, 2.0)]:
        h = history.record(h, scrape(step, loss=loss, samples_per_second=10.0, learning_rate=2e-5), attempt=1)
    for step, ev in [(9, 1.9), (12, 1.9), (20, 1.7)]:
        h = history.record(h, scrape(step, eval_loss=ev), attempt=1)
    assert h is not None
    assert [(p.step, p.loss) for p in h.train] == [(1, 3.0), (5, 2.5), (9, 2.0), (12, None), (20, None)]
    # A gauge the trainer sets after the step (a scrape in between saw the step alone) fills in that step's point.
    h = history.record(h, scrape(20, loss=1.5), attempt=1)
    assert h.train[-1] == TrainPoint(1, 20, 1.5) and len(h.train) == 5
    assert h.train[0] == TrainPoint(1, 1, 3.0, 10.0, 2e-5)
    assert h.eval == (EvalPoint(1, 9, 1.9), EvalPoint(1, 20, 1.7))


def test_a_restart_starts_a_new_run_even_at_the_same_step_and_eval_loss() -> None:
    """Attempt 2 resumes from the checkpoint at step 8, below attempt 1's last step, with the same evaluation."""
    h = history.record(None, scrape(10, loss=2.0, eval_loss=1.5), attempt=1)
    h = history.record(h, scrape(8, loss=2.1, eval_loss=1.5), attempt=2)
    h = history.record(h, scrape(8, loss=2.1), attempt=2)
    assert [(p.attempt, p.step) for p in h.train] == [(1, 10), (2, 8)]
    assert [(p.attempt, p.step) for p in h.eval] == [(1, 10), (2, 8)]


def test_any_run_length_stays_bounded_and_keeps_each_attempts_ends() -> None:
    h = None
    for attempt, steps in [(1, range(0, 5000)), (2, range(4000, 9000)), (3, range(8990, 9000))]:
        for step in steps:
            h = history.record(h, scrape(step, loss=1.0 + step / 10_000, eval_loss=step / 7 // 1), attempt=attempt)
    assert h is not None
    assert len(h.train) <= MAX_TRAIN_POINTS and len(h.eval) <= MAX_EVAL_POINTS
    assert len(h.train) > MAX_TRAIN_POINTS // 2  # thinned to half, not emptied
    ends = {(a, s) for a, s in [(1, 0), (1, 4999), (2, 4000), (2, 8999), (3, 8990), (3, 8999)]}
    assert ends <= {(p.attempt, p.step) for p in h.train}
    steps = [(p.attempt, p.step) for p in h.train]
    assert steps == sorted(steps)  # in order; spread over the whole run, not just its end
    assert sum(1 for p in h.train if p.attempt == 1) > 10


def test_the_wire_form_round_trips_through_the_status() -> None:
    h = History((TrainPoint(1, 5, 2.5, 10.0, 2e-5), TrainPoint(2, 3, None, 12.0)), (EvalPoint(1, 5, 1.25),))
    wire = Status(history=h).to_wire()
    assert wire["history"] == {
        "train": [
            {"attempt": 1, "step": 5, "loss": 2.5, "samplesPerSecond": 10.0, "learningRate": 2e-5},
            {"attempt": 2, "step": 3, "samplesPerSecond": 12.0},
        ],
        "eval": [{"attempt": 1, "step": 5, "evalLoss": 1.25}],
    }
    assert Status.from_wire(wire).history == h
    assert Status.from_wire({"history": {"train": [{"loss": 1.0}]}}).history is None  # no attempt/step: dropped


def test_the_learning_rate_keeps_its_significant_digits() -> None:
    page = (
        'finetune_train_step{namespace="n",job="j",node_rank="0"} 5\n'
        'finetune_train_total_steps{namespace="n",job="j",node_rank="0"} 50\n'
        'finetune_train_learning_rate{namespace="n",job="j",node_rank="0"} 1.23456e-05\n'
        'finetune_train_loss{namespace="n",job="j",node_rank="0"} NaN\n'
    )
    progress = parse_metrics(page, nodes=2)
    assert progress is not None and progress.learning_rate == 1.235e-05 and progress.loss is None


def test_status_draws_each_series_with_restarts_marked() -> None:
    train = [{"attempt": 1, "step": s, "loss": 3.0 - s / 100, "learningRate": 1e-4} for s in range(0, 100, 10)]
    train += [{"attempt": 2, "step": s, "loss": 2.5 - s / 100} for s in range(80, 120, 10)]
    rows = dict(curve_rows({"train": train, "eval": [{"attempt": 1, "step": 50, "evalLoss": 2.0}]}))
    assert rows["Loss"].startswith(sparkline([[3.0 - s / 100 for s in range(0, 100, 10)], [1.7, 1.6, 1.5, 1.4]]))
    assert "│" in rows["Loss"] and "3 → 1.4 (steps 0-110, attempts 1-2)" in rows["Loss"]
    assert rows["LR"].endswith("0.0001 → 0.0001 (steps 0-90)")
    assert "Eval loss" not in rows  # one evaluation is not a curve
    assert sparkline([[3.0, 2.0, 1.0]]) == "█▅▁" and sparkline([[1.0, 1.0]]) == "▁▁"
    assert len(sparkline([[float(i) for i in range(1000)]], width=40)) <= 40


def test_a_success_fills_in_the_curves_from_rank_0s_result() -> None:
    """Rank 0's summary of result.json (its termination message) adds the logged losses and evaluations the scrapes
    missed, in step order within the attempt; a scraped step keeps its throughput and takes the logged loss; earlier
    attempts are left as they were."""
    h = History(
        train=(TrainPoint(0, 4, 3.0, 10.0), TrainPoint(1, 2, 2.9, 11.0, 1e-4), TrainPoint(1, 7, 2.2, 12.0, 9e-5)),
        eval=(EvalPoint(1, 7, 2.5),),
    )
    result = {"steps": 12, "samplesPerSecond": 12.5, "loss": [[5, 2.6], [7, 2.25], [12, 1.9]], "eval": [[12, 2.0]]}
    done = history.record_result(h, result, attempt=1)
    assert done.train == (
        TrainPoint(0, 4, 3.0, 10.0),
        TrainPoint(1, 2, 2.9, 11.0, 1e-4),
        TrainPoint(1, 5, 2.6),
        TrainPoint(1, 7, 2.25, 12.0, 9e-5),
        TrainPoint(1, 12, 1.9, 12.5),
    )
    assert done.eval == (EvalPoint(1, 7, 2.5), EvalPoint(1, 12, 2.0))
    assert history.record_result(None, {"loss": [["x"], [3, "nan?"]], "eval": None}, attempt=0) == History()
    long = {"loss": [[s, 1.0] for s in range(1, 400)]}
    assert len(history.record_result(h, long, attempt=1).train) == MAX_TRAIN_POINTS


def test_the_trainers_summary_fits_a_termination_message_and_the_operator_reads_it() -> None:
    """The trainer's side (finetune_trainer.errors.result_summary, written by rank 0 on success) and the operator's
    (failures.completion_result on the succeeded pod) of the same contract."""
    import json

    from finetune_operator.failures import completion_result
    from finetune_trainer.errors import MAX_MESSAGE_CHARS, REASON_COMPLETED, result_summary

    result = {
        "steps": 5000,
        "attempt": 2,
        "samples_per_second": 123.456789,
        "loss_history": [[s, 1 / s] for s in range(5, 5001, 5)] + [[5000, float("nan")]],
        "eval_history": [{"step": s, "loss": 2 / s, "accuracy": 0.5} for s in range(100, 5001, 100)],
    }
    summary = result_summary(result)
    assert len(summary["loss"]) == 64 and summary["loss"][0] == [5, 0.2] and summary["loss"][-1] == [5000, 0.0002]
    assert len(summary["eval"]) == 16 and summary["eval"][-1] == [5000, 0.0004]
    assert summary["samplesPerSecond"] == 123.457 and (summary["steps"], summary["attempt"]) == (5000, 2)
    message = json.dumps(
        {"reason": REASON_COMPLETED, "message": "trained to step 5000", "result": summary}, separators=(",", ":")
    )  # as finetune_trainer.errors.write_termination_log writes it
    assert len(message) < MAX_MESSAGE_CHARS
    # the most a run can say: the final held-out metrics, a long split name, 16 metrics of 40-character names and a
    # failure message of characters JSON escapes: the curves thin (first and last kept) so the whole still parses
    worst = result_summary(
        {
            **result,
            "final_eval": {"step": 5000, "loss": 0.25, "reward_accuracy": 0.875, "reward_margin": 1.25},
            "evaluation": {
                "state": "Failed",
                "message": "é" * 5000,
                "split": "s" * 253,
                "samples": 200,
                "scores": {f"metric-{i:02d}".ljust(40, "x"): 1 / (i + 3) for i in range(16)},
                "completion_length_mean": 12.345678,
                "seconds": 3.25,
            },
        }
    )
    written = json.dumps(
        {"reason": REASON_COMPLETED, "message": "trained to step 5000", "result": worst}, separators=(",", ":")
    )
    assert len(written.encode()) < MAX_MESSAGE_CHARS < 4096, len(written)
    assert worst["loss"][0] == [5, 0.2] and worst["loss"][-1] == [5000, 0.0002] and len(worst["loss"]) < 64
    from finetune_operator.status import ModelEvaluation

    scores = ModelEvaluation.from_wire(worst["evaluation"])
    assert scores is not None and scores.state == "Failed" and scores.message == "é" * 200, scores
    assert (scores.step, scores.loss, scores.reward_accuracy, scores.samples) == (5000, 0.25, 0.875, 200)
    assert scores.scores is not None and len(scores.scores) == 16 and scores.completion_length == 12.3457
    pod = {
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 0, "message": message}}}],
        }
    }
    assert completion_result(pod) == summary
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = "plain text from an older image"
    assert completion_result(pod) is None
    assert completion_result({"status": {"phase": "Failed"}}) is None


def test_the_result_of_a_resumed_attempt_adds_only_its_own_steps() -> None:
    """result.json's curves cover the whole run; the points up to the step an attempt resumed from are earlier
    attempts' (their scrapes recorded them), never relabelled as the last attempt's."""
    h = History(train=(TrainPoint(0, 100, 3.0, 10.0), TrainPoint(1, 300, 2.0, 10.0)))
    result = {"steps": 400, "resumedFromStep": 262, "loss": [[50, 3.5], [100, 3.0], [262, 2.4], [300, 2.0], [400, 1.5]]}
    done = history.record_result(h, result, attempt=2)
    assert [(p.attempt, p.step) for p in done.train] == [(0, 100), (1, 300), (2, 300), (2, 400)]
