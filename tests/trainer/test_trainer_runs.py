"""The trainer for real: the ``finetune-trainer`` launcher as a subprocess with the env contract, real torchrun
rendezvous on 127.0.0.1 (gloo), the tiny BERT/GPT-2 built from config, the tiny dataset in the repo.

Nothing is mocked. Offline (HF_HUB_OFFLINE=1), CPU only. Ports are free ports; waits poll with timeouts.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.chart import metric_names as names
from tests.trainer.helpers import (
    TINY,
    Node,
    free_port,
    import_required,
    poll,
    read_json,
    refused_rows,
    scrape,
    small_volume,
    tiny_config,
)

pytestmark = pytest.mark.trainer

RUN_TIMEOUT = 420
STEPS = 30

# The one list of exported names (tests/chart/metric_names.py), as the text parser names families: counters
# without their _total suffix.
METRIC_NAMES = (  # a page of a run of any task but grpo
    {n.removesuffix("_total") for n in names.TRAINER_COUNTERS}
    | (names.TRAINER_GAUGES - names.TRAINER_GRPO_GAUGES - names.TRAINER_EVALUATION_GAUGES)
    | names.TRAINER_HISTOGRAMS
)


def complete_steps(output: Path) -> list[int]:
    root = output / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name.split("-")[1]) for p in root.glob("checkpoint-*") if (p / "COMPLETE").exists())


def killed_after_a_checkpoint(nodes: list[Node], output: Path, max_steps: int) -> tuple[int, list[dict]]:
    """Kill the gang once a checkpoint is complete, before the run's end: the checkpoint's step and its log history."""
    poll(lambda: complete_steps(output), timeout=RUN_TIMEOUT, what="a complete checkpoint", on_fail=nodes[-1].log)
    for node in nodes:
        node.kill()
    done = complete_steps(output)
    assert done and done[-1] < max_steps, f"the run finished before it could be killed: {done}"
    state = json.loads((output / "checkpoints" / f"checkpoint-{done[-1]}" / "trainer_state.json").read_text())
    return done[-1], state["log_history"]


def losses(result: dict) -> list[float]:
    return [loss for _, loss in result["loss_history"]]


@pytest.fixture(scope="module")
def eager_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One single-node eager run, scraped over HTTP while it trains. Shared by the tests that inspect it."""
    work = tmp_path_factory.mktemp("eager")
    port = free_port()
    cfg = tiny_config(
        work / "out",
        acceleration="none",
        metrics={"port": port},
        dataset={"evalSplit": "eval"},
        training={
            "maxSteps": STEPS,
            "checkpointEverySteps": 5,
            "keepCheckpoints": 2,
            "evaluation": {"strategy": "steps", "everySteps": 10},
            "extraArgs": {"logging_steps": 5},
        },
    )
    node = Node(work, cfg, attempt=3)
    scrapes: list[str] = []

    def trained_a_step() -> bool:
        text = scrape(port)
        if text and "finetune_train_steps_total{" in text:
            scrapes.append(text)
            return any(
                s.name == "finetune_train_steps_total" and s.value >= 2
                for fam in text_string_to_metric_families(text)
                for s in fam.samples
            )
        return False

    poll(trained_a_step, timeout=RUN_TIMEOUT, interval=0.05, what="metrics showing training steps", on_fail=node.log)
    rc = node.wait(RUN_TIMEOUT)
    assert rc == 0, node.log()
    return {
        "node": node,
        "output": work / "out",
        "result": read_json(work / "out" / "result.json"),
        "scrape": scrapes[-1],
    }


def test_single_node_trains_loss_goes_down(eager_run: dict) -> None:
    result = eager_run["result"]
    assert result["steps"] == STEPS
    assert result["resumed_from_step"] == 0
    history = losses(result)
    assert len(history) == STEPS // 5
    assert history[-1] < history[0] - 0.1, history
    assert result["samples_per_second"] > 0 and result["tokens_per_second"] > 0
    # The current stack's defaults: SDPA attention and fused AdamW; start-up reported apart from the rates.
    assert result["attention"] == "sdpa" and result["optimizer"] == "adamw_torch_fused"
    assert result["acceleration"] == result["acceleration_requested"] == "none"
    assert result["samples"] == STEPS * 16  # trained rows only: the 3 evaluations' 80 rows each are not counted
    assert 0 < result["warmup_seconds"] < result["time_to_first_step_seconds"]
    assert set(result["startup"]) == {"launcher_seconds", "rendezvous_seconds", "data_seconds", "model_seconds"}
    assert all(v >= 0 for v in result["startup"].values()), result["startup"]
    assert sum(result["startup"].values()) < result["time_to_first_step_seconds"]
    # Evaluations every 10 steps (the last one at the final step: no extra final evaluation), trained rows only above.
    evals = result["eval_history"]
    assert [e["step"] for e in evals] == [10, 20, 30] and result["final_eval"] == evals[-1]
    assert all(set(e) == {"step", "loss", "accuracy", "f1"} for e in evals), evals
    assert all(0 <= e["accuracy"] <= 1 and 0 <= e["f1"] <= 1 and math.isfinite(e["loss"]) for e in evals), evals
    assert (eager_run["output"] / "model" / "config.json").exists()
    # On success rank 0's termination message carries the end of its curves (the operator's status.history).
    completed = eager_run["node"].termination()
    assert completed["reason"] == "Completed" and completed["result"]["steps"] == STEPS, completed
    assert completed["result"]["loss"] == [[s, float(f"{v:.6g}")] for s, v in result["loss_history"]]
    assert completed["result"]["eval"] == [[e["step"], float(f"{e['loss']:.6g}")] for e in evals]


def test_retention_keeps_newest_k_complete(eager_run: dict) -> None:
    assert complete_steps(eager_run["output"]) == [STEPS - 5, STEPS]
    assert sorted(p.name for p in (eager_run["output"] / "checkpoints").iterdir()) == [
        f"checkpoint-{STEPS - 5}",
        f"checkpoint-{STEPS}",
    ]


def test_metrics_scraped_during_run_are_prometheus_text(eager_run: dict) -> None:
    families = {f.name: f for f in text_string_to_metric_families(eager_run["scrape"])}
    assert set(families) >= METRIC_NAMES, METRIC_NAMES - set(families)
    only_some = names.TRAINER_GRPO_GAUGES | names.TRAINER_EVALUATION_GAUGES  # a GRPO run, a run with an evaluation
    assert not set(families) & only_some, set(families) & only_some
    for name in METRIC_NAMES:
        for sample in families[name].samples:
            own = names.TRAINER_CHOICE_LABELS if name == "finetune_train_choice_info" else set()
            labels = {k: v for k, v in sample.labels.items() if k not in ("le", *own)}
            assert labels == {"finetune_namespace": "default", "finetune_job": "tiny-seqcls", "node_rank": "0"}, sample
    [choice] = families["finetune_train_choice_info"].samples  # what auto settled, once the model was loaded
    assert (choice.labels["acceleration"], choice.labels["kernels"], choice.value) == ("none", "none", 1)
    assert choice.labels["reason"].startswith("auto: no option faster than eager measured"), choice
    value = {
        s.name: s.value for f in families.values() for s in f.samples if not s.name.endswith(("_bucket", "_created"))
    }
    assert value["finetune_train_steps_total"] >= 2
    assert value["finetune_train_total_steps"] == STEPS
    assert value["finetune_attempt"] == 3
    assert value["finetune_train_samples_total"] >= 2 * 16
    assert value["finetune_train_tokens_total"] > value["finetune_train_samples_total"]
    assert value["finetune_rendezvous_duration_seconds"] > 0
    # the start-up's parts, as result.json's startup has them
    assert value["finetune_startup_launcher_seconds"] > 0 and value["finetune_startup_model_seconds"] > 0
    assert value["finetune_startup_data_seconds"] > 0
    assert value["finetune_time_to_first_step_seconds"] > 0
    assert math.isnan(value["finetune_train_mfu_ratio"])  # CPU: no peak FLOPs, documented as NaN
    assert math.isnan(value["finetune_train_mfu"])  # the deprecated name, the same value


def test_two_nodes_rendezvous_and_agree(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "out"
    cfg = tiny_config(
        out,
        acceleration="auto",
        training={"maxSteps": 20, "checkpointEverySteps": 10, "extraArgs": {"logging_steps": 5}},
    )
    nodes = [
        Node(tmp_path, cfg, node_rank=r, nnodes=2, master_port=port) for r in (1, 0)
    ]  # rank 1 first: preflight waits
    for node in nodes:
        assert node.wait(RUN_TIMEOUT) == 0, node.log()
    ranks = [read_json(out / "ranks" / f"rank-{r}.json") for r in (0, 1)]
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]  # DDP kept the weights identical
    assert ranks[0]["final_loss"] == ranks[1]["final_loss"]
    result = read_json(out / "result.json")
    assert result["world_size"] == 2
    assert result["acceleration"] == "none" and result["kernels"] == "none"
    reason = result["acceleration_reason"]
    assert reason == "auto: no option faster than eager measured for sequence-classification on cpu", reason
    assert losses(result)[-1] < losses(result)[0]
    assert complete_steps(out) == [10, 20]


def test_kill_mid_run_then_resume_skips_partial_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = tiny_config(
        out, acceleration="none", training={"maxSteps": 60, "checkpointEverySteps": 10, "keepCheckpoints": 3}
    )
    first = Node(tmp_path, cfg, attempt=0)
    poll(lambda: complete_steps(out), timeout=RUN_TIMEOUT, what="a complete checkpoint", on_fail=first.log)
    first.kill()
    done = complete_steps(out)
    assert done and done[-1] < 60, f"the run finished before it could be killed: {done}"
    last = done[-1]
    # A newer checkpoint cut off mid-write: files but no marker. It must never be resumed from.
    partial = out / "checkpoints" / f"checkpoint-{last + 5}"
    partial.mkdir(exist_ok=True)
    (partial / "model.safetensors").write_bytes(b"truncated")

    second = Node(tmp_path, cfg, attempt=1)
    assert second.wait(RUN_TIMEOUT) == 0, second.log()
    result = read_json(out / "result.json")
    assert result["resumed_from_step"] == last
    assert result["steps"] == 60
    assert result["steps_this_attempt"] == 60 - last
    assert not partial.exists()


def test_sigterm_to_one_node_stops_every_node_with_143(tmp_path: Path) -> None:
    """The kubelet SIGTERMs one pod (an eviction, a preemption): the ranks agree, save one checkpoint together, and
    every launcher exits 143 (Terminated), not only the one that got the signal. The others' workers end by the
    agreement, which torchrun would report as a plain failure: a training error if the operator read those pods
    first."""
    out = tmp_path / "out"
    cfg = tiny_config(
        out,
        acceleration="none",
        training={"maxSteps": 400, "checkpointEverySteps": 1000, "extraArgs": {"logging_steps": 1}},
    )
    port = free_port()
    nodes = [Node(tmp_path, cfg, node_rank=r, nnodes=2, master_port=port) for r in (1, 0)]
    rank1, rank0 = nodes
    poll(lambda: "'loss'" in rank0.log(), timeout=RUN_TIMEOUT, what="a logged training step", on_fail=rank0.log)
    rank1.terminate()
    for node in nodes:
        assert node.wait(RUN_TIMEOUT) == 143, node.log()
        term = node.termination()
        assert term is not None and term["reason"] == "Terminated", term
    assert rank1.termination()["message"].startswith("stopped by SIGTERM (newest complete checkpoint: step ")
    assert "after a SIGTERM to another pod" in rank0.termination()["message"]
    saved = complete_steps(out)
    assert len(saved) == 1 and 0 < saved[0] < 400, saved  # saved at the agreed step, not a periodic one
    for r in (0, 1):
        rank = read_json(out / "ranks" / f"rank-{r}.json")
        assert rank["stopped_by_signal"] and rank["step"] == saved[0], rank
    assert not (out / "result.json").exists()


@pytest.mark.parametrize("phase", ["preflight", "shared cache"])
def test_sigterm_before_training_exits_143_at_once(tmp_path: Path, phase: str) -> None:
    """The launcher is the pod's PID 1 and can wait long before torchrun starts: for rank 0 to come up (preflight),
    for node rank 0 to fill the shared cache. A gang restart's SIGTERM there ends it (143, Terminated, the phase
    named) instead of leaving it to the grace period's SIGKILL."""
    over: dict = {"preflight": {"timeoutSeconds": 3600}}
    waiting = "preflight: waiting for"
    if phase == "shared cache":  # a Hub model: node rank 1 waits for node rank 0's ready marker, which never comes
        over["model"] = {"name": "tiny-org/tiny-bert", "path": None, "initFromConfig": False}
        over["cache"] = {"path": str(tmp_path / "cache")}
        waiting = "hfcache: waiting for node rank 0"
    node = Node(tmp_path, tiny_config(tmp_path / "out", **over), node_rank=1, nnodes=2, master_port=free_port())
    poll(lambda: waiting in node.log(), timeout=120, what=f"the launcher waiting in {phase}", on_fail=node.log)
    node.terminate()
    assert node.wait(timeout=60) == 143, node.log()
    term = node.termination()
    assert term == {"reason": "Terminated", "message": f"stopped by SIGTERM before training started (phase: {phase})"}


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    """Two nodes train with keepCheckpoints: 1, which keeps two complete checkpoints while the run goes on. Both are
    killed and the newest checkpoint's optimizer state is cut in half (a save the volume lost). The next gang
    resumes from the previous checkpoint, instead of failing the same load on every restart, reports the fallback,
    and the damaged checkpoint is never complete again. (The second attempt ends before the damaged step, so nothing
    writes that directory anew.)"""
    out = tmp_path / "out"
    cfg = tiny_config(
        out, acceleration="none", training={"maxSteps": 200, "checkpointEverySteps": 5, "keepCheckpoints": 1}
    )
    port = free_port()
    first = [Node(tmp_path, cfg, node_rank=r, nnodes=2, master_port=port) for r in (1, 0)]
    poll(lambda: len(complete_steps(out)) >= 2, timeout=RUN_TIMEOUT, what="two complete checkpoints",
         on_fail=first[1].log)  # fmt: skip
    for node in first:
        node.kill()
    done = complete_steps(out)
    assert len(done) == 2 and done[-1] < 200, done
    previous, newest = done
    optimizer = out / "checkpoints" / f"checkpoint-{newest}" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[: optimizer.stat().st_size // 2])

    cfg["training"]["maxSteps"] = newest - 1
    port = free_port()
    second = [Node(tmp_path, cfg, node_rank=r, nnodes=2, master_port=port, attempt=1) for r in (1, 0)]
    for node in second:
        assert node.wait(RUN_TIMEOUT) == 0, node.log()
    result = read_json(out / "result.json")
    assert (result["resumed_from_step"], result["resume_fallbacks"]) == (previous, 1), result
    assert result["steps"] == newest - 1
    assert f"checkpoint-{newest} cannot be loaded (optimizer.pt: " in second[1].log_path.read_text()
    assert not (out / "checkpoints" / f"checkpoint-{newest}").exists()
    assert complete_steps(out) == [newest - 1]  # the run is over: keepCheckpoints 1 applies again


@pytest.mark.parametrize("size", ["256k", "640k"], ids=["weights-do-not-fit", "optimizer-state-does-not-fit"])
def test_a_full_output_volume_fails_with_73_output_full(tmp_path: Path, size: str) -> None:
    """The output claim fills up during a checkpoint save (a real size-limited filesystem): exit 73 (OutputFull,
    never retried) with the fix in the message, not exit 1 and gang restarts that would resume and fail at the same
    save. safetensors reports the weights' ENOSPC; torch.save reports the optimizer's without any errno."""
    with small_volume(tmp_path / "out", size) as out:
        cfg = tiny_config(out, acceleration="none", training={"maxSteps": 10, "checkpointEverySteps": 5})
        node = Node(tmp_path / "work", cfg)
        rc = node.wait(RUN_TIMEOUT)
    assert rc == 73, node.log()
    term = node.termination()
    assert term is not None and term["reason"] == "OutputFull", term
    assert "spec.output" in term["message"] and "spec.training.keepCheckpoints" in term["message"], term
    torch_save = "inline_container" in term["message"]  # torch's writer, as opposed to safetensors' ENOSPC
    assert torch_save == (size == "640k"), term


def test_auto_switches_to_compile_once_the_workload_is_known(tmp_path: Path) -> None:
    """auto settles after model and data are loaded: with a row that compiles on this hardware (the override a
    platform team uses for hardware it measured) the worker rebuilds its arguments and trains compiled, with batches
    padded to maxSeqLength (one graph)."""
    out = tmp_path / "out"
    cfg = tiny_config(
        out,
        acceleration="auto",
        training={"maxSteps": 10, "checkpointEverySteps": 10, "extraArgs": {"logging_steps": 5}},
    )
    # eager at 1 MFLOP/s makes the tiny run long enough for a 2x compile with no warm-up to finish first
    row = {"eagerFlopsPerSecond": 1e6, "options": [{"acceleration": "compile", "speedup": 2, "minFill": 0.1}]}
    node = Node(tmp_path, cfg, extra_env={"FINETUNE_AUTO_TABLE": json.dumps({"cpu": {"*": row}})})
    assert node.wait(RUN_TIMEOUT) == 0, node.log()
    result = read_json(out / "result.json")
    assert result["acceleration"] == "compile" and result["acceleration_requested"] == "auto"
    reason = result["acceleration_reason"]
    assert reason.startswith("auto: compile, estimated") and "against eager" in reason, reason
    assert 0 < result["tokens"] <= 10 * 16 * 64  # non-padding tokens of rows padded to maxSeqLength (64)
    assert result["steps"] == 10 and all(math.isfinite(x) for x in losses(result))


@pytest.mark.parametrize(
    ("override", "field", "words"),
    [
        ({"dataset": {"textField": "txt"}}, "dataset.textField", ["'txt'", "'text'", "spec.dataset.textField"]),
        ({"task": "summarization"}, "task", ["summarization"]),
        ({"task": "seq2seq"}, "task", ["not supported"]),
        ({"training": {"extraArgs": {"warmup_stepz": 3}}}, "training.extraArgs.warmup_stepz", ["TrainingArguments"]),
        ({"configVersion": "2.0"}, "configVersion", ["newer"]),
        ({"dataset": {"path": "/nonexistent/data.jsonl"}}, "dataset.path", ["does not exist"]),
        ({"acceleration": "ort"}, "acceleration", ["ONNX Runtime trainer image", "trainer.ortImage", "spec.image"]),
        (
            {"task": "causal-lm", "training": {"lora": {"r": 4, "quantization": "4bit"}}},
            "training.lora.quantization",
            ["QLoRA", "bitsandbytes", "CUDA GPU", "nvidia.com/gpu", "plain LoRA"],
        ),
        (
            {"output": {"pushToHub": {"repo": "org/model"}}},
            "output.pushToHub.secretRef",
            ["write access", "spec.output.pushToHub.secretRef"],
        ),
        (
            {"configVersion": "1.4", "task": "causal-lm", "training": {"kernels": "liger"}},
            "training.kernels",
            ["Triton GPU kernels", "no GPU", "nvidia.com/gpu"],
        ),
        (
            {"configVersion": "1.4", "training": {"kernels": "liger"}},
            "training.kernels",
            ["language-model heads", "sequence-classification"],
        ),
    ],
    ids=[
        "missing-dataset-field",
        "unknown-task",
        "unsupported-task",
        "unknown-extra-arg",
        "newer-major",
        "missing-file",
        "ort-on-the-default-image",
        "qlora-on-cpu",
        "push-without-a-token",
        "liger-on-cpu",
        "liger-on-classification",
    ],
)
def test_bad_config_exits_78_naming_the_field(tmp_path: Path, override: dict, field: str, words: list[str]) -> None:
    cfg = tiny_config(tmp_path / "out", **override)
    node = Node(tmp_path, cfg)
    rc = node.wait(120)
    assert rc == 78, node.log()
    term = node.termination()
    assert term is not None and term["reason"] == "ConfigError"
    assert term["message"].startswith(field), term
    for word in words:
        assert word in term["message"], term
    assert "starting the workers" not in node.log()  # failed before training started


def test_unreachable_master_exits_75(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "out", preflight={"timeoutSeconds": 2})
    node = Node(tmp_path, cfg, node_rank=1, nnodes=2, master_port=free_port())  # nobody listens there
    assert node.wait(120) == 75, node.log()
    term = node.termination()
    assert term["reason"] == "RendezvousTimeout" and "127.0.0.1:" in term["message"]
    assert "spec.rendezvousTimeoutSeconds" in term["message"], term


def test_a_config_changed_after_admission_exits_78_before_training(tmp_path: Path) -> None:
    """The pod's env carries the digest of the config the operator admitted; the file the launcher finds (a tenant
    rewrote the ConfigMap) differs and stays so for the settle time: exit 78 naming the file, no worker started."""
    cfg = tiny_config(tmp_path / "out")
    admitted = hashlib.sha256(json.dumps({**cfg, "acceleration": "none"}).encode()).hexdigest()
    extra = {"FINETUNE_CONFIG_SHA256": admitted, "FINETUNE_CONFIG_SETTLE_SECONDS": "2"}
    node = Node(tmp_path, cfg, extra_env=extra)
    assert node.wait(120) == 78, node.log()
    term = node.termination()
    assert term is not None and term["reason"] == "ConfigError", term
    assert term["message"].startswith("FINETUNE_CONFIG: ") and "not the one the operator admitted" in term["message"]
    assert "reading it again for up to 2s" in node.log()
    assert "starting the workers" not in node.log()
    assert not (tmp_path / "out" / "checkpoints").exists()


@pytest.mark.parametrize(
    ("case", "field", "words"),
    [
        ("unknown-model-type", "model", ["not-a-model", "newer trainer image"]),
        ("report-to-missing-package", "training.extraArgs.report_to", ["'wandb'", "lacks"]),
        ("hub-repo-offline", "model.name", ["org/does-not-exist", "HF_HUB_OFFLINE=1"]),
    ],
)
def test_failures_a_restart_would_repeat_exit_78(tmp_path: Path, case: str, field: str, words: list[str]) -> None:
    """Found only once the worker runs (model load, Trainer set-up), yet deterministic: exit 78 naming the field,
    not exit 1 and a gang restart."""
    over: dict = {"training": {"maxSteps": 5}}
    if case == "unknown-model-type":
        model = tmp_path / "model"
        shutil.copytree(TINY / "gpt2", model)
        cfg = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**cfg, "model_type": "not-a-model"}))
        over["model"] = {"path": str(model)}
    elif case == "report-to-missing-package":
        over["training"]["extraArgs"] = {"report_to": ["wandb"]}
    else:
        over["model"] = {"path": None, "name": "org/does-not-exist", "initFromConfig": False}
    node = Node(tmp_path, tiny_config(tmp_path / "out", example="causal-lm", acceleration="none", **over))
    assert node.wait(RUN_TIMEOUT) == 78, node.log()
    term = node.termination()
    assert term is not None and term["reason"] == "ConfigError", term
    assert term["message"].startswith(field), term
    for word in words:
        assert word in term["message"], term


def test_worker_config_error_travels_through_error_file(tmp_path: Path) -> None:
    """A config error only a worker can see (a LoRA target module the model lacks) still exits 78: the worker's
    ConfigError travels through torchelastic's error file to the launcher."""
    import_required("peft")
    cfg = tiny_config(
        tmp_path / "out", training={"lora": {"r": 4, "alpha": 8, "dropout": 0.0, "targetModules": ["no_such_module"]}}
    )
    node = Node(tmp_path, cfg)
    assert node.wait(RUN_TIMEOUT) == 78, node.log()
    term = node.termination()
    assert term["reason"] == "ConfigError" and term["message"].startswith("training.lora.targetModules"), term


def test_causal_lm_with_lora_trains(tmp_path: Path) -> None:
    import_required("peft")
    out = tmp_path / "out"
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "targetModules": ["all-linear"]}
    cfg = tiny_config(
        out,
        example="causal-lm",
        acceleration="none",
        dataset={"path": str(TINY / "data"), "evalSplit": "eval"},
        training={"maxSteps": 10, "checkpointEverySteps": 5, "lora": lora, "evaluation": {"strategy": "epoch"}},
    )
    node = Node(tmp_path, cfg)
    assert node.wait(RUN_TIMEOUT) == 0, node.log()
    result = read_json(out / "result.json")
    assert result["steps"] == 10 and all(math.isfinite(x) for x in losses(result))
    # 10 steps end before the first epoch does: only the final model's evaluation, with perplexity = exp(loss).
    (final,) = result["eval_history"]
    assert final["step"] == 10 and final["perplexity"] == pytest.approx(math.exp(final["loss"]))
    adapter = read_json(out / "model" / "adapter_config.json")  # PEFT saves the adapter
    # all-linear: every linear layer of the GPT-2 blocks (attention and MLP), not the output head
    assert {n.rsplit(".", 1)[-1] for n in adapter["target_modules"]} == {"c_attn", "c_proj", "c_fc"}, adapter


# --- chat and prompt/completion data (TRL's SFTTrainer) ------------------------------------------------------------


def sft_config(out: Path, data: str, **over: object) -> dict:
    """The tiny causal-lm config on the chat-capable tokenizer (role tokens, a template marking assistant turns)."""
    base = tiny_config(
        out,
        example="causal-lm",
        acceleration="none",
        model={"path": str(TINY / "gpt2-chat")},
        dataset={"path": str(TINY / data), "evalSplit": "eval"},
        training={"maxSteps": 20, "checkpointEverySteps": 10, "evaluation": {"strategy": "steps", "everySteps": 10},
                  "extraArgs": {"logging_steps": 5}},
    )  # fmt: skip
    from tests.trainer.helpers import deep_merge

    return deep_merge(base, over)


def test_chat_sft_trains_on_the_assistant_turns_only(tmp_path: Path) -> None:
    """Conversations rendered with the chat template; with lossOn: completion the loss covers the assistant's answer
    (one word + eos, learnable from the user's sentence), with lossOn: all also the user's random words: the same
    model and data evaluate far lower on the answers alone."""
    results = {}
    for loss_on in ("completion", "all"):
        out = tmp_path / loss_on
        cfg = sft_config(out, "chat", dataset={"messagesField": "messages"}, training={"lossOn": loss_on})
        node = Node(tmp_path / f"w-{loss_on}", cfg)
        assert node.wait(RUN_TIMEOUT) == 0, node.log()
        results[loss_on] = read_json(out / "result.json")
    answers, everything = results["completion"]["final_eval"], results["all"]["final_eval"]
    assert answers["loss"] < everything["loss"] - 0.5, (answers, everything)
    assert [e["step"] for e in results["completion"]["eval_history"]] == [10, 20]
    assert losses(results["completion"])[-1] < losses(results["completion"])[0]
    assert (tmp_path / "completion" / "model" / "chat_template.jinja").exists()  # the tokenizer goes with the model


def test_prompt_completion_sft_with_packing_trains_and_a_failed_evaluation_keeps_the_model(tmp_path: Path) -> None:
    """Packed prompt/completion SFT trains; its evaluation stage fails (a metric, a function of the image's, raises
    when called) and the run still succeeds with its model saved, the failure recorded in result.json and in the
    summary the operator reads (with the final held-out perplexity)."""
    out = tmp_path / "out"
    broken = {"type": "python", "name": "broken", "function": "finetune_trainer.rewards:last_number"}
    stage = {
        "split": "eval",
        "maxSamples": 4,
        "maxNewTokens": 2,
        "metrics": [{"type": "exactMatch", "name": "same", "column": "completion"}, broken],
    }
    cfg = sft_config(out, "prompt-completion", dataset={"promptField": "prompt", "completionField": "completion"},
                     training={"packing": True, "maxSeqLength": 64}, configVersion="1.6", evaluation=stage)  # fmt: skip
    node = Node(tmp_path, cfg)
    assert node.wait(RUN_TIMEOUT) == 0, node.log()
    result = read_json(out / "result.json")
    assert result["steps"] == 20 and all(math.isfinite(x) for x in losses(result))
    # packed: every sample is one 64-token sequence of several rows, so far fewer samples than 20 x 16 rows
    assert result["tokens"] > 0 and result["samples"] < 20 * 16
    assert math.isfinite(result["final_eval"]["perplexity"])
    assert (out / "model" / "config.json").exists() and (out / "model" / "model.safetensors").exists()
    failed = result["evaluation"]
    assert failed["state"] == "Failed" and "TypeError" in failed["message"], failed
    summary = read_json(node.termination_log)["result"]["evaluation"]
    assert summary["state"] == "Failed" and "TypeError" in summary["message"], summary
    assert summary["perplexity"] == pytest.approx(result["final_eval"]["perplexity"], rel=1e-5), summary


def _bad_chat(tmp: Path, rows: list[object]) -> str:
    d = tmp / "bad-chat"
    d.mkdir()
    good = (TINY / "chat" / "train.jsonl").read_text().splitlines()[:3]
    (d / "train.jsonl").write_text("\n".join([*good, *(json.dumps(r) for r in rows)]) + "\n")
    return str(d)


def _no_generation_markers(tmp: Path) -> str:
    d = tmp / "tok"
    shutil.copytree(TINY / "gpt2-chat", d)
    template = (d / "chat_template.jinja").read_text()
    (d / "chat_template.jinja").write_text(template.replace("{% generation %}", "").replace("{% endgeneration %}", ""))
    return str(d)


CHAT_CASES = [
    ("missing-field", "dataset.messagesField", ["row 3 of split 'train'", "non-empty list"]),
    ("rejected-role", "dataset.messagesField", ["row 3 of split 'train'", "unsupported role tool"]),
    ("no-template", "dataset.messagesField", ["no chat template", "promptField"]),
    ("no-generation-markers", "training.lossOn", ["{% generation %}", "lossOn: all"]),
]


def _bad_chat_config(tmp_path: Path, case: str) -> dict:
    over: dict = {"dataset": {"messagesField": "messages", "evalSplit": None},
                  "training": {"evaluation": {"strategy": "no"}}}  # fmt: skip
    if case == "missing-field":
        over["dataset"]["path"] = _bad_chat(tmp_path, [{"other": 1}])
    elif case == "rejected-role":
        over["dataset"]["path"] = _bad_chat(tmp_path, [{"messages": [{"role": "tool", "content": "good"}]}])
    elif case == "no-template":
        over["model"] = {"path": str(TINY / "gpt2")}
    else:
        over["model"] = {"path": _no_generation_markers(tmp_path)}
    return sft_config(tmp_path / "out", "chat", **over)


@pytest.mark.parametrize(("case", "field", "words"), CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_bad_chat_data_is_refused_naming_the_field_and_row(tmp_path: Path, case: str, field: str, words: list) -> None:
    refused = refused_rows(_bad_chat_config(tmp_path, case))
    assert refused.field == field and all(w in str(refused) for w in words), refused


def test_bad_chat_data_exits_78_naming_the_field_and_row(tmp_path: Path) -> None:
    """A launch: the worker's refusal of a row is the launcher's exit 78 (never retried) with the field and the row in
    the termination message."""
    case, field, words = CHAT_CASES[0]
    node = Node(tmp_path, _bad_chat_config(tmp_path, case))
    assert node.wait(RUN_TIMEOUT) == 78, node.log()
    term = node.termination()
    assert term is not None and term["reason"] == "ConfigError" and term["message"].startswith(field), term
    for word in words:
        assert word in term["message"], term


def _worker_of(node: Node) -> int:
    """The pid of the node's training worker: the launcher's agent's child."""
    import psutil

    agent = psutil.Process(node.proc.pid).children()[0]
    return agent.children()[0].pid


def test_a_killed_rank_restarts_every_rank_in_place_and_the_run_stays_exact(tmp_path: Path) -> None:
    """One rank's process is SIGKILLed mid-run (an OOM kill, a crash) while both "pods" are there: the agents agree,
    stop every worker and fork new ones, which resume from the newest checkpoint. The launchers never exit in
    between; the run ends at exactly maxSteps with one result.json listing both rounds, the second with its cause, and
    rank 0's termination message counts the restart for the operator."""
    import os
    import signal

    out = tmp_path / "out"
    cfg = tiny_config(out, acceleration="none", training={"maxSteps": 60, "checkpointEverySteps": 10})
    port = free_port()
    env = {"FINETUNE_RESTARTS_IN_PLACE": "1"}
    nodes = [Node(tmp_path, cfg, node_rank=r, nnodes=2, master_port=port, extra_env=env) for r in (1, 0)]
    rank1, rank0 = nodes
    poll(lambda: complete_steps(out), timeout=RUN_TIMEOUT, what="a complete checkpoint", on_fail=rank0.log)
    launchers = [n.proc.pid for n in nodes]
    first_worker = _worker_of(rank1)
    os.kill(first_worker, signal.SIGKILL)
    poll(lambda: "restarting every rank in place (round 1" in rank0.log(), timeout=60, what="the restart in place",
         on_fail=rank0.log)  # fmt: skip
    for node in nodes:
        assert node.wait(RUN_TIMEOUT) == 0, node.log()
    assert [n.proc.pid for n in nodes] == launchers
    result = read_json(out / "result.json")
    assert result["steps"] == 60, result
    rounds = [(a["attempt"], a.get("round", 0)) for a in result["attempts"]]
    assert rounds == [(0, 0), (0, 1)], result["attempts"]
    second = result["attempts"][1]
    assert second["resumed_from_step"] >= 10 and second["restart_cause"].startswith(
        "node 1, local rank 0: Signal 9 (SIGKILL)"
    ), second
    term = rank0.termination()
    assert term is not None and term["reason"] == "Completed" and term["restartsInPlace"] == 1, term
    assert "process group: gloo in round 1 restarted in place" in rank1.log()
