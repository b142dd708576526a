"""Exact runs, for real: the ``finetune-trainer`` launcher as a subprocess (real torchrun, gloo, the tiny BERT built
from config, the tiny dataset in the repo). An attempt that resumes at the run's last step trains nothing more and
leaves one result.json for the whole run; an output path holding another run's work is refused before any step.

Nothing is mocked. Offline (HF_HUB_OFFLINE=1), CPU only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trainer.helpers import Node, read_json, tiny_config

pytestmark = pytest.mark.trainer

RUN_TIMEOUT = 420
# 400 rows at 16 a step: 25 updates an epoch, which do not divide 30. The Hugging Face Trainer resumed at step 30
# would start a second epoch's step before it checks max_steps.
STEPS = 30


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    """A run trained to its last step, which it checkpointed: (its output, its config, its result.json)."""
    work = tmp_path_factory.mktemp("finished")
    out = work / "out"
    cfg = tiny_config(out, acceleration="none", training={"maxSteps": STEPS, "checkpointEverySteps": 10})
    first = Node(work, cfg, attempt=0)
    assert first.wait(RUN_TIMEOUT) == 0, first.log()
    return out, cfg, read_json(out / "result.json")


def test_an_output_path_holding_another_runs_work_is_refused(finished: tuple[Path, dict, dict], tmp_path: Path) -> None:
    """A job re-created under a finished job's name with another learning rate is another run: refused (78) before
    any step, naming the field and the fix, and nothing of the first run is touched."""
    out, cfg, _ = finished
    run = read_json(out / "run.json")
    assert run["job"] == cfg["job"] and len(run["runId"]) == 16
    before = sorted(p.name for p in (out / "checkpoints").iterdir())
    other = tiny_config(out, acceleration="none", training={"maxSteps": STEPS, "learningRate": 1e-3})
    refused = Node(tmp_path, other, attempt=0)
    assert refused.wait(RUN_TIMEOUT) == 78, refused.log()
    term = json.loads(refused.termination_log.read_text())
    assert term["reason"] == "ConfigError" and "output.path" in term["message"]
    assert "another run" in term["message"] and "spec.output.path" in term["message"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == before and read_json(out / "run.json") == run


def test_an_attempt_resumed_at_the_last_step_trains_nothing_and_the_result_covers_the_run(
    finished: tuple[Path, dict, dict], tmp_path: Path
) -> None:
    out, cfg, before = finished
    assert before["steps"] == STEPS and before["samples"] == STEPS * 16
    assert (out / "checkpoints" / f"checkpoint-{STEPS}" / "COMPLETE").exists()  # what the next attempt resumes

    # The next attempt (a resize or a drain after the last step): the same run, resumed at its last step.
    second = Node(tmp_path, cfg, attempt=1)
    assert second.wait(RUN_TIMEOUT) == 0, second.log()
    result = read_json(out / "result.json")
    assert result["steps"] == STEPS and result["steps_this_attempt"] == 0 and result["resumed_from_step"] == STEPS
    assert "nothing left to train" in second.log()
    assert result["params_sha256"] == before["params_sha256"]  # the final model: the checkpoint's weights, untouched
    # The whole run: the rows trained by both attempts (the second trained none), one entry per attempt.
    assert result["samples"] == before["samples"] and result["tokens"] == before["tokens"]
    assert [a["attempt"] for a in result["attempts"]] == [0, 1]
    assert [a["steps_trained"] for a in result["attempts"]] == [STEPS, 0]
    assert result["samples_per_second"] == pytest.approx(before["samples_per_second"])
    assert result["attempts"][0]["samples_per_second"] == pytest.approx(before["samples_per_second"])
    assert max(step for step, _ in result["loss_history"]) <= STEPS
    term = json.loads(second.termination_log.read_text())
    assert term["result"]["resumedFromStep"] == STEPS and term["result"]["loss"] == []  # no point of this attempt
