"""The ONNX Runtime stack for real: Optimum's ORTTrainer trains, checkpoints, resumes and refuses what it cannot run.

These tests run in the development venv (the default stack) and start the trainer of the ORT venv as subprocesses,
exactly as a pod of the ORT image would run it: Python 3.11, torch 2.6, transformers 4.50.3, Optimum 1.27,
onnxruntime-training-cpu 1.19.2 with ORTModule's extensions compiled (`.ci/venv.sh --ort-path`, built by
`make setup`; `$FINETUNE_ORT_VENV` overrides it). A missing ORT venv fails the tests, it never skips them.

Nothing is mocked. Offline (HF_HUB_OFFLINE=1), CPU only, one process per node (see the rejection test).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.trainer.helpers import TINY, Node, ort_venv, ort_venv_problem, poll, read_json, tiny_config

pytestmark = [pytest.mark.trainer, pytest.mark.ort]

RUN_TIMEOUT = 420
STEPS = 20
# Absolute, per logged step (losses are logged to 4 decimals), fp32; the margin allows ORT's fused kernels to reorder
# float sums differently from eager PyTorch on other CPUs.
ORT_LOSS_TOLERANCE = 0.01


@pytest.fixture(scope="module")
def ort_trainer() -> list[str]:
    problem = ort_venv_problem()
    if problem:
        pytest.fail(problem)
    return [str(ort_venv() / "bin" / "finetune-trainer")]


def losses(result: dict) -> list[float]:
    return [loss for _, loss in result["loss_history"]]


def complete_steps(output: Path) -> list[int]:
    root = output / "checkpoints"
    return sorted(int(p.name.split("-")[1]) for p in root.glob("checkpoint-*") if (p / "COMPLETE").exists())


def run(tmp: Path, ort_trainer: list[str], acceleration: str, **extra_args: object) -> tuple[dict, Path]:
    out = tmp / "out"
    cfg = tiny_config(
        out,
        acceleration=acceleration,
        training={"maxSteps": STEPS, "checkpointEverySteps": 5, "keepCheckpoints": 2,
                  "extraArgs": {"logging_steps": 5, **extra_args}},
    )  # fmt: skip
    node = Node(tmp, cfg, launcher=ort_trainer)
    assert node.wait(RUN_TIMEOUT) == 0, node.log()
    return read_json(out / "result.json"), out


@pytest.fixture(scope="module")
def ort_run(tmp_path_factory: pytest.TempPathFactory, ort_trainer: list[str]) -> dict:
    result, out = run(tmp_path_factory.mktemp("ort"), ort_trainer, "ort")
    return {"result": result, "output": out}


def test_ort_matches_eager_loss_curve_on_its_stack(
    ort_run: dict, ort_trainer: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Like for like: the optimizer ORT runs (eager would pick fused AdamW); SDPA vs eager attention is the same math.
    eager, _ = run(tmp_path_factory.mktemp("eager"), ort_trainer, "none", optim="adamw_torch")
    ort = ort_run["result"]
    assert ort["acceleration"] == "ort" and ort["attention"] == "eager" and ort["optimizer"] == "adamw_torch"
    assert eager["acceleration"] == "none" and eager["optimizer"] == "adamw_torch"
    a, b = losses(ort), losses(eager)
    assert len(a) == len(b) == STEPS // 5
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]
    assert max(diffs) <= ORT_LOSS_TOLERANCE, f"ort {a} vs eager {b}"
    assert a[-1] < a[0]
    assert ort["warmup_seconds"] > 0 and ort["samples_per_second"] > 0  # the ONNX export is the warm-up


def test_ort_checkpoint_resumes_after_sigterm(ort_trainer: list[str], tmp_path: Path) -> None:
    """SIGTERM mid-run: the ranks agree, ORTTrainer saves a complete checkpoint and the launcher exits 143; the
    next attempt on the same output resumes from it (the gang-restart path, on the ORT stack)."""
    out = tmp_path / "out"
    cfg = tiny_config(
        out,
        acceleration="ort",
        training={"maxSteps": 200, "checkpointEverySteps": 1000, "extraArgs": {"logging_steps": 1}},
    )
    first = Node(tmp_path, cfg, launcher=ort_trainer)
    poll(lambda: "'loss'" in first.log(), timeout=RUN_TIMEOUT, what="a logged ORT step", on_fail=first.log)
    first.terminate()
    assert first.wait(RUN_TIMEOUT) == 143, first.log()
    saved = complete_steps(out)
    assert len(saved) == 1 and 0 < saved[0] < 200, saved

    resumed = tiny_config(
        out,
        acceleration="ort",
        training={"maxSteps": saved[0] + 5, "checkpointEverySteps": 1000, "extraArgs": {"logging_steps": 1}},
    )
    second = Node(tmp_path, resumed, attempt=1, launcher=ort_trainer)
    assert second.wait(RUN_TIMEOUT) == 0, second.log()
    result = read_json(out / "result.json")
    assert result["acceleration"] == "ort" and result["resumed_from_step"] == saved[0]
    assert result["steps"] == saved[0] + 5 and result["steps_this_attempt"] == 5
    assert all(math.isfinite(x) for x in losses(result))


def test_ort_refuses_two_processes_per_node_on_cpu(ort_trainer: list[str], tmp_path: Path) -> None:
    """Optimum's ORTTrainer calls torch.cuda.set_device for local ranks > 0: on CPU the launcher refuses the
    configuration with exit 78 before torchrun starts, naming the field to change."""
    cfg = tiny_config(tmp_path / "out", acceleration="ort")
    node = Node(
        tmp_path, cfg, launcher=ort_trainer,
        extra_env={"PET_NPROC_PER_NODE": "2", "NPROC_PER_NODE": "2", "WORLD_SIZE": "2"},
    )  # fmt: skip
    assert node.wait(120) == 78, node.log()
    term = node.termination()
    assert term is not None and term["reason"] == "ConfigError", term
    assert term["message"].startswith("acceleration") and "spec.procsPerNode" in term["message"], term
    assert "starting the workers" not in node.log()


def test_chat_data_is_refused_on_the_ort_image(ort_trainer: list[str], tmp_path: Path) -> None:
    """Chat data trains with TRL's SFTTrainer, which the ONNX Runtime image lacks: exit 78 before torchrun, naming
    the field and the default image."""
    cfg = tiny_config(
        tmp_path / "out",
        example="causal-lm",
        acceleration="none",
        model={"path": str(TINY / "gpt2-chat")},
        dataset={"path": str(TINY / "chat"), "messagesField": "messages"},
    )
    node = Node(tmp_path, cfg, launcher=ort_trainer)
    assert node.wait(120) == 78, node.log()
    term = node.termination()
    assert term is not None and term["message"].startswith("dataset.messagesField"), term
    assert "TRL" in term["message"] and "default trainer image" in term["message"], term
    assert "starting the workers" not in node.log()


def test_the_operator_knows_each_stacks_training_arguments(ort_trainer) -> None:  # type: ignore[no-untyped-def]
    """``operator/finetune_operator/training_args.json`` is what both stacks' locks install (the operator refuses
    ``extraArgs`` from it before any pod exists): regenerated from the default stack (this venv) and the ORT venv,
    it is unchanged. `make generate` rewrites it after a lock bump."""
    import json
    import os

    from hack import training_args

    os.environ.setdefault("FINETUNE_ORT_VENV", str(ort_venv()))
    fresh = training_args.generate()
    held = json.loads(training_args.OUT.read_text(encoding="utf-8"))
    for stack in ("default", "ort"):
        assert held[stack] == fresh[stack], f"the {stack} stack's TrainingArguments changed: run `make generate`"
