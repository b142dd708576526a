"""Unit tests for the trainer's pure parts: config parsing, env contract, checkpoint discovery and retention,
the acceleration table, MFU, preflight, failure classification. Nothing is mocked except the clock and sleep of
the preflight's timeout test (a fake clock, so the test does not wait for real)."""

from __future__ import annotations

import json
import math
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from finetune_trainer import accel, checkpoints
from finetune_trainer.config import load_config, parse_config, schema, schema_path
from finetune_trainer.env import read_env
from finetune_trainer.errors import ConfigError, RendezvousTimeout, write_termination_log
from finetune_trainer.launcher import classify_failure, read_error_file
from finetune_trainer.preflight import wait_for_master

from tests.trainer.helpers import TINY, deep_merge, small_volume, tiny_config

pytestmark = pytest.mark.trainer


def valid(tmp_path: Path, **over: Any) -> dict[str, Any]:
    return tiny_config(tmp_path / "out", **over)


# --- config -------------------------------------------------------------------------------------------------------


def test_example_configs_parse_and_match_the_schema(tmp_path: Path) -> None:
    import jsonschema

    for name in ("config-seqcls.json", "config-causal-lm.json"):
        raw = json.loads((TINY / name).read_text())
        jsonschema.Draft202012Validator(schema()).validate(raw)
        cfg = parse_config(raw)
        assert cfg.config_version == "1.0" and cfg.metrics_port == 9400
    assert schema_path().endswith("finetune_trainer/config.schema.json")


def test_parse_maps_camel_case_to_typed_fields(tmp_path: Path) -> None:
    raw = valid(tmp_path, training={"lora": {"r": 8, "alpha": 16, "dropout": 0.1, "targetModules": ["query"]}})
    cfg = parse_config(raw)
    assert cfg.task == "sequence-classification"
    assert cfg.model.init_from_config is True and cfg.model.source.endswith("examples/tiny/bert")
    assert cfg.dataset.text_field == "text" and cfg.dataset.label_field == "label"
    assert cfg.training.max_steps == 30 and cfg.training.epochs is None
    assert cfg.training.lora is not None and cfg.training.lora.target_modules == ("query",)
    assert cfg.checkpoints_dir == str(tmp_path / "out" / "checkpoints")
    assert cfg.result_path == str(tmp_path / "out" / "result.json")


def test_minimal_config_gets_defaults(tmp_path: Path) -> None:
    raw = {
        "configVersion": "1.0",
        "job": {"name": "j", "namespace": "n"},
        "task": "causal-lm",
        "model": {"name": "gpt2"},
        "dataset": {"name": "wikitext", "textField": "text"},
        "training": {"epochs": 1},
        "output": {"path": str(tmp_path)},
    }
    cfg = parse_config(raw)
    assert (cfg.acceleration, cfg.metrics_port, cfg.preflight_timeout_seconds) == ("auto", 9400, 300)
    assert (cfg.training.keep_checkpoints, cfg.training.precision, cfg.dataset.split) == (2, "auto", "train")


def test_newer_minor_version_with_unknown_field_is_accepted(tmp_path: Path) -> None:
    raw = valid(tmp_path, configVersion="1.7", futureField={"x": 1})
    assert parse_config(raw).config_version == "1.7"


def test_a_1_0_trainer_accepts_the_1_1_config_with_a_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older trainer image (contract 1.0) meets a 1.1 config that names the shared cache (added in 1.1): it runs,
    without the cache step, instead of failing on an unknown key."""
    from finetune_trainer import config as config_module

    monkeypatch.setattr(config_module, "SUPPORTED_MINOR", 0)
    raw = valid(tmp_path, configVersion="1.1", cache={"path": "/cache/huggingface"})
    assert parse_config(raw).config_version == "1.1"
    monkeypatch.setattr(config_module, "SUPPORTED_MINOR", 1)
    with pytest.raises(ConfigError):  # at its own minor, an unknown key is an error
        parse_config(valid(tmp_path, configVersion="1.1", cacheTypo={"path": "/c"}))


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"configVersion": "2.0"}, "configVersion"),
        ({"configVersion": "one"}, "configVersion"),
        ({"task": "summarization"}, "task"),
        ({"task": "token-classification"}, "task"),
        ({"acceleration": "tensorrt"}, "acceleration"),
        ({"training": {"maxSteps": 10, "epochs": 1}}, "training"),
        ({"training": {"maxSteps": None, "epochs": None}}, "training"),
        ({"training": {"perDeviceBatchSize": 0}}, "training.perDeviceBatchSize"),
        ({"training": {"extraArgs": {"output_dir": "/x"}}}, "training.extraArgs.output_dir"),
        ({"training": {"evaluation": {"strategy": "steps", "everySteps": 5}}}, "training.evaluation.strategy"),
        ({"dataset": {"labelField": None}}, "dataset.labelField"),
        ({"dataset": {"name": "imdb"}}, "dataset"),
        ({"model": {"path": None}}, "model"),
        ({"output": {"path": ""}}, "output.path"),
        ({"metrics": {"port": 70000}}, "metrics.port"),
        ({"unknownTopLevel": 1}, "(root)"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else v,
)
def test_invalid_config_names_the_field(tmp_path: Path, override: dict[str, Any], field: str) -> None:
    raw = valid(tmp_path)
    raw = deep_merge(raw, override)
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    assert err.value.field == field, str(err.value)


def test_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.json"))


def test_dataset_columns_checked_against_the_file(tmp_path: Path) -> None:
    from finetune_trainer import data

    cfg = parse_config(valid(tmp_path, dataset={"textField": "txt"}))
    with pytest.raises(ConfigError) as err:
        data.validate_local_dataset(cfg)
    assert str(err.value) == (
        "dataset.textField: column 'txt' not in dataset columns ['text', 'label']; set spec.dataset.textField"
    )
    csv_file = tmp_path / "d.csv"
    csv_file.write_text("sentence,label\nhello,1\n")
    cfg = parse_config(valid(tmp_path, dataset={"path": str(csv_file), "textField": "sentence"}))
    data.validate_local_dataset(cfg)  # no error


def test_label_mapping() -> None:
    from finetune_trainer.data import label_mapping

    assert label_mapping([1, 0, 1]) == ({0: 0, 1: 1}, ["0", "1"])
    assert label_mapping(["pos", "neg"]) == ({"neg": 0, "pos": 1}, ["neg", "pos"])


# --- env contract ---------------------------------------------------------------------------------------------------


def test_env_contract_prefers_pet_names() -> None:
    env = {
        "PET_NNODES": "2", "NNODES": "9", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "ft-node-0.ft", "PET_MASTER_PORT": "29500", "WORLD_SIZE": "8",
        "FINETUNE_JOB_NAME": "ft", "FINETUNE_NAMESPACE": "ns", "FINETUNE_ATTEMPT": "2",
    }  # fmt: skip
    run = read_env(env)
    assert (run.nnodes, run.nproc_per_node, run.node_rank, run.world_size) == (2, 4, 1, 8)
    assert (run.master_addr, run.master_port, run.job_name, run.namespace, run.attempt) == (
        "ft-node-0.ft",
        29500,
        "ft",
        "ns",
        2,
    )


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"PET_NNODES": "2", "PET_NODE_RANK": "2"}, "PET_NODE_RANK"),
        ({"PET_NNODES": "2", "WORLD_SIZE": "3"}, "WORLD_SIZE"),
     ({"PET_NPROC_PER_NODE": "gpu"}, "PET_NPROC_PER_NODE")],
    ids=["rank-out-of-range", "world-size-mismatch", "nproc-not-int"],
)  # fmt: skip
def test_env_contract_errors(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        read_env(env)
    assert err.value.field == field


# --- checkpoints ----------------------------------------------------------------------------------------------------


def make_ckpt(root: Path, step: int, complete: bool) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"x")
    if complete:
        checkpoints.mark_complete(str(path), step)
    return path


def test_latest_complete_skips_partial_and_sorts_numerically(tmp_path: Path) -> None:
    for step, complete in [(5, True), (10, True), (100, False), (9, True)]:
        make_ckpt(tmp_path, step, complete)
    (tmp_path / "checkpoint-x").mkdir()
    (tmp_path / "other").mkdir()
    latest = checkpoints.latest_complete(str(tmp_path))
    assert latest is not None and latest.step == 10
    assert [c.step for c in checkpoints.list_checkpoints(str(tmp_path))] == [5, 9, 10, 100]
    assert checkpoints.latest_complete(str(tmp_path / "missing")) is None


def test_retention_keeps_newest_k_complete_and_drops_old_partials(tmp_path: Path) -> None:
    for step, complete in [(1, True), (2, False), (3, True), (4, True), (5, False)]:
        make_ckpt(tmp_path, step, complete)
    removed = checkpoints.apply_retention(str(tmp_path), keep=2)
    assert sorted(c.step for c in removed) == [1, 2]
    # 5 is newer than the newest complete one: it may still be written by someone, so it stays.
    assert [c.step for c in checkpoints.list_checkpoints(str(tmp_path))] == [3, 4, 5]


def test_remove_incomplete(tmp_path: Path) -> None:
    make_ckpt(tmp_path, 1, True)
    make_ckpt(tmp_path, 2, False)
    assert [c.step for c in checkpoints.remove_incomplete(str(tmp_path))] == [2]
    assert [c.step for c in checkpoints.list_checkpoints(str(tmp_path))] == [1]


def test_retention_keeps_two_complete_checkpoints_until_the_run_ends(tmp_path: Path) -> None:
    """keepCheckpoints: 1 must not leave a run with only a newest checkpoint nobody has loaded yet: if it proves
    unloadable, the resume falls back to the one before. Once the run is over, keepCheckpoints applies exactly."""
    for step in (1, 2, 3):
        make_ckpt(tmp_path, step, True)
    assert [c.step for c in checkpoints.apply_retention(str(tmp_path), keep=1)] == [1]
    assert [c.step for c in checkpoints.list_checkpoints(str(tmp_path))] == [2, 3]
    assert [c.step for c in checkpoints.apply_retention(str(tmp_path), keep=1, finished=True)] == [2]
    assert [c.step for c in checkpoints.list_checkpoints(str(tmp_path))] == [3]


def test_a_planted_symlink_is_never_a_checkpoint(tmp_path: Path) -> None:
    """On a shared claim another job's code can plant ``checkpoint-999999 -> <someone else's directory>`` or a marker
    that links elsewhere: neither is resumed from, unmarked or deleted."""
    own, other = tmp_path / "run", tmp_path / "other-job"
    own.mkdir()
    make_ckpt(own, 5, True)
    make_ckpt(other, 7, True)
    (own / "checkpoint-999999").symlink_to(other / "checkpoint-7")
    make_ckpt(own, 6, False)
    (own / "checkpoint-6" / checkpoints.MARKER).symlink_to(other / "checkpoint-7" / checkpoints.MARKER)
    assert [(c.step, c.complete) for c in checkpoints.list_checkpoints(str(own))] == [(5, True), (6, False)]
    assert checkpoints.latest_complete(str(own)).step == 5  # type: ignore[union-attr]
    checkpoints.remove_incomplete(str(own))
    assert (other / "checkpoint-7" / checkpoints.MARKER).exists()


def test_every_rank_fsyncs_its_checkpoint_files_before_the_marker(tmp_path: Path, monkeypatch) -> None:
    """The libraries that write a checkpoint do not fsync; the marker must not reach the disk ahead of the files it
    vouches for. A crash cannot be staged here, so the fsyncs are observed (the real os.fsync still runs)."""
    import os
    from types import SimpleNamespace

    from finetune_trainer.callbacks import CheckpointCallback, StopFlag

    ckpt = tmp_path / "checkpoint-7"
    (ckpt / "pytorch_model_fsdp_0").mkdir(parents=True)
    written = [ckpt / "model.safetensors", ckpt / "optimizer.pt", ckpt / "rng_state_1.pth",
               ckpt / "pytorch_model_fsdp_0" / "__1_0.distcp"]  # fmt: skip
    for path in written:
        path.write_bytes(b"x" * 100)
    synced: list[tuple[str, bool]] = []  # (path, marker there yet)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), (ckpt / checkpoints.MARKER).exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    callback = CheckpointCallback(StopFlag(), root=str(tmp_path), keep=2, metrics=None, control_group=None)
    for is_rank_0 in (False, True):  # another rank's part of the save, then rank 0's
        synced.clear()
        callback.on_save(None, SimpleNamespace(global_step=7, is_world_process_zero=is_rank_0), None)
        before_marker = {path for path, marked in synced if not marked}
        expected = {str(p) for p in written} | {str(ckpt), str(ckpt / "pytorch_model_fsdp_0"), str(tmp_path)}
        assert before_marker >= expected, expected - before_marker
    assert checkpoints.latest_complete(str(tmp_path)) == checkpoints.Checkpoint(7, str(ckpt), True)


def test_make_room_deletes_the_oldest_complete_checkpoints_never_the_newest(tmp_path: Path) -> None:
    """On a nearly full volume (a real 1 MiB filesystem) the next save would not fit: the oldest complete
    checkpoints go first, until the newest's size is free; the newest always stays, and so does a lone one."""
    with small_volume(tmp_path / "vol", "1m") as root:
        for step, size in ((1, 240_000), (2, 240_000), (3, 400_000)):  # the newest grew (a bigger model state)
            (make_ckpt(root, step, True) / "model.safetensors").write_bytes(b"w" * size)
        (root / "filler").write_bytes(b"f" * (checkpoints.free_bytes(str(root)) - 10_000))
        assert [c.step for c in checkpoints.make_room(str(root))] == [1, 2]  # one alone would not free enough
        assert [c.step for c in checkpoints.list_checkpoints(str(root))] == [3]
        assert checkpoints.free_bytes(str(root)) >= checkpoints.size_of(str(root / "checkpoint-3"))

        (root / "filler").unlink()
        (root / "filler").write_bytes(b"f" * (checkpoints.free_bytes(str(root)) - 4096))
        assert checkpoints.make_room(str(root)) == []  # only the newest: nothing may go
        assert [c.step for c in checkpoints.list_checkpoints(str(root))] == [3]


# --- resuming from a checkpoint that loads --------------------------------------------------------------------------


def hf_like_checkpoint(root: Path, step: int) -> Path:
    """A checkpoint with the files the Trainer reads on resume, written by the libraries that write them."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    path = make_ckpt(root, step, complete=False)
    save_file({"w": torch.randn(64, 64)}, str(path / "model.safetensors"))
    model = torch.nn.Linear(8, 8)
    optim = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    optim.step()
    torch.save(optim.state_dict(), path / "optimizer.pt")
    torch.save(torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 1.0).state_dict(), path / "scheduler.pt")
    torch.save({"python": (3, (1, 2), None), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()},
               path / "rng_state.pth")  # fmt: skip
    torch.save({"an": object.__new__(checkpoints.Checkpoint)}, path / "training_args.bin")  # a pickled object
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    checkpoints.mark_complete(str(path), step)
    return path


@pytest.mark.parametrize(
    ("damage", "file"),
    [("truncate", "model.safetensors"), ("truncate", "optimizer.pt"), ("zero-tail", "scheduler.pt"),
     ("truncate", "trainer_state.json"), ("empty", "rng_state.pth")],
)  # fmt: skip
def test_a_damaged_checkpoint_file_is_found_before_resuming(tmp_path: Path, damage: str, file: str) -> None:
    from finetune_trainer import resumption

    path = hf_like_checkpoint(tmp_path, 10)
    assert resumption.problem(str(path)) is None  # numpy RNG state and pickled arguments are not damage
    target = path / file
    data = target.read_bytes()
    cut = {"truncate": data[: len(data) // 2], "zero-tail": data[:-64] + bytes(64), "empty": b""}[damage]
    target.write_bytes(cut)
    why = resumption.problem(str(path))
    assert why is not None and why.startswith(f"{file}: "), why


def test_a_cut_shard_of_a_sharded_checkpoint_is_found(tmp_path: Path) -> None:
    """FSDP checkpoints are torch.distributed.checkpoint directories: every shard must hold what the metadata says."""
    import torch
    import torch.distributed.checkpoint as dcp
    from finetune_trainer import resumption

    path = make_ckpt(tmp_path, 10, complete=False)
    (path / "model.safetensors").unlink()  # sharded: no full weights
    shard_dir = path / "pytorch_model_fsdp_0"
    dcp.save({"model": {"w": torch.randn(128, 128)}}, storage_writer=dcp.FileSystemWriter(str(shard_dir)))
    assert resumption.problem(str(path)) is None
    (shard,) = shard_dir.glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:1000])
    why = resumption.problem(str(path))
    assert why is not None and why.startswith("pytorch_model_fsdp_0: "), why


def test_an_io_error_while_checking_is_not_damage(tmp_path: Path, monkeypatch) -> None:
    """A read that fails (EIO, ESTALE on NFS) says nothing about the checkpoint: the check raises (the worker
    crashes, the gang restart tries again) and the checkpoint stays complete, instead of being unmarked and deleted.
    The I/O error is injected (monkeypatch), since a failing disk cannot be staged here."""
    import errno

    from finetune_trainer import resumption

    hf_like_checkpoint(tmp_path, 5)

    def failing_read(path: str, name: str) -> None:
        raise OSError(errno.EIO, "Input/output error", path)

    monkeypatch.setattr(resumption, "_check", failing_read)
    with pytest.raises(OSError):
        resumption.choose(str(tmp_path))
    assert checkpoints.latest_complete(str(tmp_path)) == checkpoints.Checkpoint(5, str(tmp_path / "checkpoint-5"), True)


def test_rank_0_falls_back_past_unloadable_checkpoints_and_unmarks_them(tmp_path: Path) -> None:
    from finetune_trainer import resumption

    for step in (5, 10, 15):
        hf_like_checkpoint(tmp_path, step)
    for step in (10, 15):
        optimizer = tmp_path / f"checkpoint-{step}" / "optimizer.pt"
        optimizer.write_bytes(optimizer.read_bytes()[:100])
    chosen, fallbacks = resumption.agree(str(tmp_path), rank=0, group=None)  # one process: no broadcast
    assert (chosen, fallbacks) == (checkpoints.Checkpoint(5, str(tmp_path / "checkpoint-5"), True), 2)
    assert [c.step for c in checkpoints.list_checkpoints(str(tmp_path))] == [5]  # unmarked, then removed

    optimizer = tmp_path / "checkpoint-5" / "optimizer.pt"
    optimizer.write_bytes(b"")
    assert resumption.agree(str(tmp_path), rank=0, group=None) == (None, 1)  # nothing loads: start from scratch


# --- acceleration ---------------------------------------------------------------------------------------------------


H200 = 989e12  # the dense bf16 peak of the device the built-in rows were measured on
EAGER_RATE = 0.30 * H200  # the causal-LM row's eager utilisation of it


def decoder(eager_seconds: float, fill: float = 1.0) -> accel.Workload:
    """The 0.82 B decoder of the GPU check (16 x 512-token rows a step) for as many steps as take ``eager_seconds``
    of eager training at the row's measured rate."""
    tokens = 16 * 512
    steps = round(eager_seconds * EAGER_RATE / (6 * 820_000_000 * tokens))
    return accel.Workload(params=820_000_000, total_steps=steps, tokens_per_step=tokens, fill=fill)


GPU_CHECK = accel.Workload(params=820_000_000, total_steps=120, tokens_per_step=16 * 512, fill=1.0)  # 4.8e15 FLOPs


@pytest.mark.parametrize(
    ("asked", "where", "load", "blocked", "expected"),
    [
        (("auto", "auto"), ("cpu", "causal-lm", "full"), GPU_CHECK, None, ("none", "none")),
        # 16 s of eager work: Liger (12 s) beats compile (11 s + 40 s of warm-up)
        (("auto", "auto"), ("cuda", "causal-lm", "full"), GPU_CHECK, None, ("none", "liger")),
        # nothing measured with a LoRA yet
        (("auto", "auto"), ("cuda", "causal-lm", "lora"), decoder(5000), None, ("none", "none")),
        # either side of the crossover (562 s of eager work): Liger, then compile; never both (not measured together)
        (("auto", "auto"), ("cuda", "causal-lm", "full"), decoder(500), None, ("none", "liger")),
        (("auto", "auto"), ("cuda", "causal-lm", "full"), decoder(650), None, ("compile", "none")),
        # compile's padding where rows fill half of maxSeqLength: Liger however long the run
        (("auto", "auto"), ("cuda", "causal-lm", "full"), decoder(5000, fill=0.5), None, ("none", "liger")),
        # a model type Liger does not patch: eager for a short run, compile once it pays
        (("auto", "auto"), ("cuda", "causal-lm", "full"), GPU_CHECK, "no kernels for gpt2", ("none", "none")),
        (("auto", "auto"), ("cuda", "causal-lm", "full"), decoder(650), "no kernels for gpt2", ("compile", "none")),
        # nothing measured for QLoRA or DPO
        (("auto", "auto"), ("cuda", "causal-lm", "qlora"), decoder(5000), None, ("none", "none")),
        (("auto", "auto"), ("cuda", "dpo", "lora"), None, None, ("none", "none")),
        # the workload not known: only what costs no warm-up
        (("auto", "auto"), ("cuda", "causal-lm", "full"), None, None, ("none", "liger")),
        # half of it requested: the other half from what was measured with it
        (("compile", "auto"), ("cuda", "causal-lm", "full"), decoder(50), None, ("compile", "none")),
        (("auto", "liger"), ("cuda", "causal-lm", "full"), decoder(5000), None, ("none", "liger")),
        (("auto", "none"), ("cuda", "causal-lm", "full"), GPU_CHECK, None, ("none", "none")),
        (("auto", "none"), ("cuda", "causal-lm", "full"), decoder(650), None, ("compile", "none")),
        (("none", "auto"), ("cuda", "causal-lm", "full"), decoder(5000), None, ("none", "liger")),
        (("ort", "auto"), ("cuda", "sequence-classification", "full"), None, None, ("ort", "none")),
        (("compile", "liger"), ("cuda", "causal-lm", "full"), None, None, ("compile", "liger")),
        # BERT: compile gains 1.05x after 21 s, so it pays from about 7 minutes of eager work
        (("auto", "auto"), ("cuda", "sequence-classification", "full"), decoder(120), None, ("none", "none")),
        (("auto", "auto"), ("cuda", "sequence-classification", "full"), decoder(3000), None, ("compile", "none")),
        (("auto", "auto"), ("tpu", "causal-lm", "full"), decoder(5000), None, ("none", "none")),
    ],
    ids=["cpu", "gpu-check", "lora", "before-crossover", "after-crossover", "padded", "gpt2-short",
         "gpt2-long", "qlora", "dpo", "unknown-workload", "compile-asked", "liger-asked", "none-asked-short",
         "none-asked-long", "eager-asked", "ort-asked", "both-asked", "bert-short", "bert-long", "no-row"],
)  # fmt: skip
def test_auto_takes_what_the_table_says_finishes_first(
    asked: tuple[str, str],
    where: tuple[str, str, str],
    load: accel.Workload | None,
    blocked: str | None,
    expected: tuple[str, str],
) -> None:
    """acceleration and kernels auto: of the measured options that can run here, the one whose estimated time
    (eager time / speedup + warm-up) is least; a combination only where it was measured itself."""
    (hardware, task, base) = where
    got = accel.choose(*asked, hardware, task, base=base, workload=load, liger_blocked=blocked, peak_flops=H200)
    assert (got.acceleration, got.kernels) == expected, got.why


def test_auto_says_what_it_estimated_and_what_it_set_aside() -> None:
    short = accel.choose("auto", "auto", "cuda", "causal-lm", workload=GPU_CHECK, peak_flops=H200)
    assert GPU_CHECK.flops == pytest.approx(6 * 820e6 * 120 * 8192)
    assert short.why.startswith("auto: liger, estimated 12.2 s") and "eager 16.3 s" in short.why, short.why
    assert "compile 50.7 s" in short.why and "0.82 B Llama" in short.why, short.why
    padded = accel.choose("auto", "auto", "cuda", "causal-lm", workload=decoder(5000, fill=0.5), peak_flops=H200)
    assert "set aside: compile: rows fill 50% of maxSeqLength < 95%" in padded.why, padded.why
    gpt2 = accel.choose("auto", "auto", "cuda", "causal-lm", workload=GPU_CHECK, liger_blocked="no kernels for gpt2")
    assert gpt2.why.startswith("auto: eager") and "liger: no kernels for gpt2" in gpt2.why, gpt2.why
    asked = accel.choose("compile", "auto", "cuda", "causal-lm", workload=None)
    assert asked.why.startswith("auto: compile (1.48x eager after 39.7 s of warm-up;"), asked.why
    lora = accel.choose("auto", "auto", "cuda", "causal-lm", base="lora", workload=GPU_CHECK)
    assert "compile: not measured with lora" in lora.why and "liger: not measured with lora" in lora.why, lora.why
    cpu = accel.choose("auto", "auto", "cpu", "sequence-classification")
    assert cpu.why == "auto: no option faster than eager measured for sequence-classification on cpu", cpu.why
    assert accel.choose("none", "none", "cuda", "causal-lm").why == "requested acceleration none, kernels none"


def test_an_unknown_gpu_is_weighed_at_the_measured_devices_peak() -> None:
    """Eager time is the work over the row's utilisation of the device's peak; a GPU the peak table does not know
    is taken at the peak of the device the rows were measured on."""
    for peak in (math.nan, H200):
        assert (
            accel.choose("auto", "auto", "cuda", "causal-lm", workload=decoder(650), peak_flops=peak).acceleration
            == "compile"
        )
    slower = accel.choose("auto", "auto", "cuda", "causal-lm", workload=decoder(650), peak_flops=H200 * 4)
    assert (slower.acceleration, slower.kernels) == ("none", "liger")  # a 4x faster GPU: 162 s of eager work


def test_liger_is_asked_about_only_where_it_may_run() -> None:
    """Importing liger_kernel costs Triton and its model patches: only a request for it, or an option auto may pick,
    asks whether it can run here."""
    assert accel.liger_considered("auto", "auto", "cuda", "causal-lm")
    assert accel.liger_considered("none", "auto", "cuda", "causal-lm")
    assert accel.liger_considered("auto", "liger", "cpu", "dpo")  # asked for: checked (and refused) wherever
    for acceleration, kernels, hardware, task, base in [
        ("auto", "auto", "cuda", "dpo", "lora"),  # no row
        ("auto", "auto", "cuda", "causal-lm", "lora"),  # not measured with a LoRA
        ("compile", "auto", "cuda", "causal-lm", "full"),  # the pair was not measured
        ("auto", "auto", "cpu", "causal-lm", "full"),
        ("auto", "none", "cuda", "causal-lm", "full"),
    ]:
        assert not accel.liger_considered(acceleration, kernels, hardware, task, base=base), (acceleration, task)


def test_weighing_the_workload_only_where_an_option_needs_it() -> None:
    assert accel.weighs_workload("cuda", "causal-lm") and accel.weighs_workload("cuda", "sequence-classification")
    assert not accel.weighs_workload("cuda", "dpo") and not accel.weighs_workload("cpu", "causal-lm")
    assert accel.resolve_acceleration("auto") == "none" and accel.resolve_acceleration("ort") == "ort"


def test_workload_is_one_devices_share(tmp_path: Path) -> None:
    """auto weighs what one GPU trains (each compiles on its own): 16 ranks on the same epochs do 1/16 of the steps."""
    from finetune_trainer.worker import Identity, workload

    cfg = parse_config(valid(tmp_path, training={"maxSteps": None, "epochs": 2, "perDeviceBatchSize": 8,
                                                 "gradientAccumulationSteps": 2, "maxSeqLength": 512}))  # fmt: skip
    one = Identity(rank=0, local_rank=0, world_size=1, node_rank=0, nproc_per_node=1, nnodes=1, attempt=0)
    many = Identity(rank=0, local_rank=0, world_size=16, node_rank=0, nproc_per_node=8, nnodes=2, attempt=0)
    w1 = workload(cfg, one, params=1000, train_rows=32_000, mean_row_tokens=256)
    w16 = workload(cfg, many, params=1000, train_rows=32_000, mean_row_tokens=256)
    assert (w1.total_steps, w1.tokens_per_step, w1.fill) == (4000, 8 * 2 * 512, 0.5)
    assert (w16.total_steps, w16.tokens_per_step) == (250, 8 * 2 * 512)
    assert w16.flops == pytest.approx(w1.flops / 16)


def test_auto_table_rows_can_be_replaced_for_measured_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    """A platform team that measured its own hardware replaces a class's rows, combinations included; a row that
    could not be weighed is refused naming the variable."""
    both = {"acceleration": "compile", "kernels": "liger", "speedup": 1.9, "warmupSeconds": 40, "minFill": 0.9}
    monkeypatch.setenv(accel.AUTO_TABLE_ENV, json.dumps({"cuda": {"*": {"eagerMfu": 0.3, "options": [both]}}}))
    long_run = accel.choose("auto", "auto", "cuda", "causal-lm", workload=decoder(650), peak_flops=H200)
    assert (long_run.acceleration, long_run.kernels) == ("compile", "liger") and "FINETUNE_AUTO_TABLE" in long_run.why
    assert accel.choose("auto", "auto", "cuda", "causal-lm", workload=GPU_CHECK, peak_flops=H200).acceleration == "none"
    # DPO's padded rows are TRL's: their fill is not known, so an option bound to it is set aside
    pairs = accel.Workload(params=820_000_000, total_steps=50_000, tokens_per_step=8192, fill=None)
    dpo = accel.choose("auto", "auto", "cuda", "dpo", workload=pairs, peak_flops=H200)
    assert (dpo.acceleration, dpo.kernels) == ("none", "none") and "is not known for dpo" in dpo.why, dpo.why
    assert accel.choose("auto", "auto", "cpu", "dpo", workload=decoder(650)).acceleration == "none"  # cpu unchanged
    for bad, words in [
        ({"cuda": {"*": {"options": [{"acceleration": "ort"}]}}}, "'none' or 'compile'"),
        ({"cuda": {"*": {"options": [{"kernels": "unsloth"}]}}}, "'none' or 'liger'"),
        ({"cuda": {"*": {"eagerMfu": 0.3, "options": [{"speedup": 0}]}}}, "above 0"),
        ({"cuda": {"*": {"eagerMfu": 0.3, "options": [{"speedup": "NaN"}]}}}, "above 0"),
        ({"cuda": {"*": {"eagerMfu": 0.3, "options": [{"warmupSeconds": -1}]}}}, "at least 0"),
        ({"cuda": {"*": {"options": [{"acceleration": "compile", "warmupSeconds": 600}]}}}, "needs eagerMfu"),
        ({"cuda": {"acceleration": "compile"}}, "AttributeError"),  # the rows of an older image's format
    ]:
        monkeypatch.setenv(accel.AUTO_TABLE_ENV, json.dumps(bad))
        with pytest.raises(ConfigError) as e:
            accel.choose("auto", "auto", "cuda", "causal-lm")
        assert e.value.field == "env.FINETUNE_AUTO_TABLE" and words in str(e.value), e.value


def test_fused_adamw_is_known_for_the_installed_torch() -> None:
    """The default stack's torch has fused AdamW kernels for CPU and CUDA (torch >= 2.4)."""
    assert accel.fused_adamw_supported("cuda") and accel.fused_adamw_supported("cpu")


def test_backends() -> None:
    ort = accel.make_backend("ort")
    assert ort.attn_implementation == "eager" and ort.extra_args == {"optim": "adamw_torch"}
    assert accel.make_backend("compile").extra_args == {"torch_compile": True}
    with pytest.raises(ConfigError):
        accel.make_backend("tensorrt")


# --- metrics --------------------------------------------------------------------------------------------------------


def test_mfu_formula_and_peak_table() -> None:
    from finetune_trainer.metrics import mfu, peak_flops, training_flops

    assert training_flops(1_000_000, 1000) == 6e9
    assert peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert math.isnan(peak_flops(None, "fp32")) and math.isnan(peak_flops("Some NPU", "bf16"))
    # 7B params at 3000 tokens/s on 8 A100s: 6*7e9*3000 / (8*312e12) = 0.0505
    assert mfu(7_000_000_000, 3000, 312e12, 8) == pytest.approx(0.05048, rel=1e-3)
    assert math.isnan(mfu(1, 1.0, math.nan, 1))


def test_metric_labels_are_exact() -> None:
    from finetune_trainer.metrics import TrainerMetrics
    from prometheus_client import generate_latest

    m = TrainerMetrics(namespace="ns", job="ft", node_rank=1)
    m.steps.inc()
    text = generate_latest(m.registry).decode()
    assert 'finetune_train_steps_total{finetune_job="ft",finetune_namespace="ns",node_rank="1"} 1.0' in text
    assert 'job="' not in text.replace("finetune_job=", "") and 'namespace="' not in text.replace(
        "finetune_namespace=", ""
    )


def test_steady_rates_leave_the_warmup_step_out_and_match_the_gauge(monkeypatch: pytest.MonkeyPatch) -> None:
    """result.json's throughput and the Prometheus gauge describe the same steps: a 30 s first step (compilation)
    and the time between steps are left out of both. The clock is the only fake (a step of known length)."""
    from finetune_trainer import metrics as metrics_module
    from finetune_trainer.metrics import BatchCounter, MetricsCallback, TrainerMetrics
    from transformers import TrainerControl, TrainerState

    clock = [0.0]
    monkeypatch.setattr(metrics_module.time, "perf_counter", lambda: clock[0])
    m = TrainerMetrics(namespace="ns", job="ft", node_rank=0)
    import torch

    counter = BatchCounter(lambda features: {"input_ids": torch.ones(len(features), 100, dtype=torch.long)})
    cb = MetricsCallback(m, counter, nproc_per_node=2, launch_time=0.0, params=1000, peak_flops_per_device=1e12)
    state, control = TrainerState(), TrainerControl()
    state.max_steps = 20
    for step, seconds in enumerate([30.0] + [0.5] * 19, start=1):
        counter([{}] * 8)  # 8 rows of 100 tokens per process, 2 processes on the node
        cb.on_step_begin(None, state, control)
        clock[0] += seconds
        state.global_step = step
        cb.on_step_end(None, state, control)
        clock[0] += 2.0  # data loading, logging, a checkpoint: not a training step
    samples_per_s, tokens_per_s = cb.steady_rates()
    assert (samples_per_s, tokens_per_s) == (32.0, 3200.0)  # 16 rows / 0.5 s, first step excluded
    assert m.samples_per_second._value.get() == pytest.approx(32.0)
    assert m.tokens_per_second._value.get() == pytest.approx(3200.0)
    assert cb.first_step_seconds == 30.0 and m.warmup._value.get() == 30.0
    assert cb.total_samples == 20 * 16  # counters keep every step


@pytest.mark.parametrize(
    ("preds", "labels", "accuracy", "f1"),
    [([0, 1, 1, 0], [0, 1, 1, 0], 1.0, 1.0),
     ([1, 1, 1, 1], [0, 1, 1, 0], 0.5, (0 + 2 * 2 / (2 * 2 + 2)) / 2),
     ([0, 2, 1, 1], [0, 1, 1, 2], 0.5, (1.0 + 0.5 + 0.0) / 3)],
    ids=["perfect", "one-class", "three-classes"],
)  # fmt: skip
def test_classification_metrics_accuracy_and_macro_f1(preds: list, labels: list, accuracy: float, f1: float) -> None:
    from finetune_trainer.evaluation import classification_metrics
    from transformers import EvalPrediction

    m = classification_metrics(EvalPrediction(predictions=preds, label_ids=labels))
    assert m["accuracy"] == pytest.approx(accuracy) and m["f1"] == pytest.approx(f1)


def test_evaluations_reach_the_gauges_and_the_history() -> None:
    from finetune_trainer.metrics import BatchCounter, MetricsCallback, TrainerMetrics
    from transformers import TrainerControl, TrainerState

    m = TrainerMetrics(namespace="ns", job="ft", node_rank=0)
    assert math.isnan(m.eval_loss._value.get()) and math.isnan(m.eval_accuracy._value.get())
    lm = MetricsCallback(m, BatchCounter(lambda f: f), nproc_per_node=1, launch_time=0.0, params=1,
                         peak_flops_per_device=1.0, task="causal-lm")  # fmt: skip
    state = TrainerState()
    state.global_step = 20
    lm.on_evaluate(None, state, TrainerControl(), metrics={"eval_loss": 2.0, "eval_runtime": 1.5, "epoch": 1.0})
    assert lm.eval_history == [{"step": 20, "loss": 2.0, "perplexity": pytest.approx(math.exp(2.0))}]
    assert m.eval_loss._value.get() == 2.0 and m.eval_perplexity._value.get() == pytest.approx(math.exp(2.0))
    cls = MetricsCallback(m, BatchCounter(lambda f: f), nproc_per_node=1, launch_time=0.0, params=1,
                          peak_flops_per_device=1.0, task="sequence-classification")  # fmt: skip
    cls.on_evaluate(None, state, TrainerControl(), metrics={"eval_loss": 0.5, "eval_accuracy": 0.8, "eval_f1": 0.7})
    assert cls.eval_history == [{"step": 20, "loss": 0.5, "accuracy": 0.8, "f1": 0.7}]
    assert (m.eval_accuracy._value.get(), m.eval_f1._value.get()) == (0.8, 0.7)


# --- preflight ------------------------------------------------------------------------------------------------------


def test_preflight_connects_to_a_listening_master() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert wait_for_master("127.0.0.1", port, connect=True, timeout_s=5) >= 0


def test_preflight_times_out_naming_the_address() -> None:
    now = [0.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RendezvousTimeout, match=f"127.0.0.1:{port}"):
        wait_for_master("127.0.0.1", port, connect=True, timeout_s=10, clock=lambda: now[0], sleep=sleep)
    assert sleeps[:4] == [0.2, 0.4, 0.8, 1.6]  # exponential backoff
    assert sum(sleeps) == pytest.approx(10)


# --- failure reporting ----------------------------------------------------------------------------------------------


def test_classify_failure() -> None:
    assert classify_failure("ConfigError: dataset.textField: nope") == (78, "dataset.textField: nope")
    assert classify_failure("OutputFull: no space left") == (73, "no space left")
    assert (
        classify_failure("DistStoreError: Timed out after 300 seconds waiting for clients. 1/2 clients joined.")[0]
        == 75
    )
    assert classify_failure("RuntimeError: CUDA out of memory")[0] == 1
    assert classify_failure("")[0] == 1


def test_error_file_and_termination_log(tmp_path: Path) -> None:
    err = tmp_path / "error.json"
    err.write_text(json.dumps({"message": {"message": "ValueError: boom", "extraInfo": {}}}))
    assert read_error_file(str(err)) == "ValueError: boom"
    assert read_error_file(str(tmp_path / "missing.json")) == ""
    log = tmp_path / "termination-log"
    write_termination_log("TrainingError", "x" * 5000, str(log))
    payload = json.loads(log.read_text())
    assert payload["reason"] == "TrainingError" and len(payload["message"]) <= 3000
    write_termination_log("TrainingError", "ignored", str(tmp_path / "no" / "such" / "dir"))  # silently skipped


# -- failures another attempt would repeat -------------------------------------------------------------------------


def test_cuda_oom_is_its_own_failure_with_the_fix() -> None:
    import torch
    from finetune_trainer.diagnose import classify
    from finetune_trainer.errors import CUDAOutOfMemory

    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has 79 GiB")
        except torch.OutOfMemoryError as inner:
            raise RuntimeError("step failed") from inner  # wrapped, as Accelerate and DDP do
    except RuntimeError as e:
        mapped = classify(e)
    assert isinstance(mapped, CUDAOutOfMemory)
    assert "Tried to allocate 2.00 GiB" in str(mapped) and "perDeviceBatchSize" in str(mapped)
    assert "sharding: fsdp" in str(mapped)
    code, text = classify_failure(f"CUDAOutOfMemory: {mapped}")
    assert code == 77 and text.startswith("the GPU ran out of memory")


def test_hub_refusals_name_the_model_or_the_dataset(tmp_path: Path) -> None:
    import httpx2 as httpx  # huggingface_hub's HTTP client
    from finetune_trainer.diagnose import classify
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    def response(code: int) -> httpx.Response:
        return httpx.Response(code, request=httpx.Request("GET", "https://huggingface.co/api/x"))

    config = parse_config(tiny_config(tmp_path, example="causal-lm", dataset={"path": None, "name": "org/data"}))
    for exc, field in (
        (RepositoryNotFoundError("404 for org/data", response=response(404)), "dataset.name"),
        (GatedRepoError("403: meta-llama/Llama-3.1-8B is gated", response=response(403)), "model.name"),
    ):
        try:
            raise OSError("could not load") from exc
        except OSError as e:
            mapped = classify(e, config)
        assert isinstance(mapped, ConfigError) and mapped.field == field, mapped


def test_crashes_stay_crashes() -> None:
    from finetune_trainer.diagnose import classify

    assert classify(RuntimeError("NCCL watchdog: collective timed out")) is None
    assert classify(ValueError("loss is nan")) is None


def test_a_full_volume_is_output_full_not_a_crash(tmp_path: Path) -> None:
    """Real writes that fail for want of space: an OSError with errno ENOSPC (/dev/full), safetensors' error (it keeps
    only the text), and torch.save's, which names no cause at all and counts only while the output volume is full."""
    import torch
    from finetune_trainer.diagnose import classify
    from finetune_trainer.errors import OutputFull
    from safetensors.torch import save_file

    def write_dev_full() -> None:
        with open("/dev/full", "wb", buffering=0) as f:
            f.write(b"x")

    with small_volume(tmp_path / "out", "64k") as out:
        config = parse_config(tiny_config(out))
        failures = []
        for write in (
            write_dev_full,
            lambda: save_file({"w": torch.zeros(100_000)}, str(out / "model.safetensors")),
            lambda: torch.save({"w": torch.zeros(100_000)}, out / "optimizer.pt"),
        ):
            with pytest.raises(Exception) as e:
                write()
            failures.append(e.value)
        mapped = [classify(e, config) for e in failures]
    assert all(isinstance(m, OutputFull) for m in mapped), mapped
    assert "Errno 28" in str(mapped[0]) and "os error 28" in str(mapped[1]) and str(out) in str(mapped[2])
    assert all("spec.output" in str(m) and "spec.training.keepCheckpoints" in str(m) for m in mapped), mapped
    assert classify_failure(f"OutputFull: {mapped[2]}")[0] == 73
    roomy = parse_config(tiny_config(tmp_path))
    assert classify(failures[2], roomy) is None  # the same torch error with room on the volume: a crash
    # ENOSPC that is not the output volume's: /dev/shm of the DataLoader's workers, inotify's watch limit
    assert classify(OSError(28, "No space left on device", "/dev/shm/torch_123_456"), roomy) is None
    assert classify(OSError(28, "inotify watch limit reached"), roomy) is None
    assert classify(failures[0], roomy) is None  # /dev/full names no path, and the output volume has room
    assert classify(OSError(5, "Input/output error")) is None


def test_every_trainer_exit_code_means_the_same_to_the_operator() -> None:
    """The exit-code contract (trainer-image/README.md) seen from both sides: the reason the trainer writes is the
    reason the operator classifies the exit code as; OutputFull, like CUDAOutOfMemory, is never retried."""
    from finetune_operator.failures import classify_pod
    from finetune_trainer import errors

    def failed_pod(code: int) -> dict[str, Any]:
        state = {"terminated": {"exitCode": code, "message": json.dumps({"reason": "x", "message": "why"})}}
        return {"metadata": {"name": "j-node-0"},
                "status": {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": state}]}}  # fmt: skip

    for code, reason in errors.REASON_BY_EXIT.items():
        failure = classify_pod(failed_pod(code))
        assert failure is not None and failure.reason == reason, (code, failure)
    full = classify_pod(failed_pod(errors.EXIT_OUTPUT_FULL))
    assert full is not None and full.permanent and not full.disruption


def test_the_trainer_command_answers_help_and_version_and_refuses_arguments(tmp_path: Path) -> None:
    """What ``docker run IMAGE --help`` shows: the contract (no arguments, $FINETUNE_CONFIG, exit codes), without a
    config file; an argument it does not know is an error, never ignored."""
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("finetune-trainer")
    env = {"FINETUNE_CONFIG": str(tmp_path / "missing.json"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: finetune-trainer") and "$FINETUNE_CONFIG" in out.stdout
    assert "78 configuration or data error" in out.stdout
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("finetune-trainer "), version
    bad = subprocess.run([str(exe), "--config", "x.json"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "unrecognized arguments: --config x.json" in bad.stderr, bad


def test_export_credentials_never_reach_the_training_processes(tmp_path: Path) -> None:
    """Rank 0's launcher holds the export's write credentials; the training processes (whose code may come from a
    model repository) run as the same user. They get an environment without the credentials, and the launcher makes
    itself non-dumpable, so reading its /proc/<pid>/environ fails for them. Run as an unprivileged user (root reads any
    /proc entry), in both roles."""
    import os
    import subprocess
    import sys

    from finetune_trainer.env import RunEnv
    from finetune_trainer.launcher import worker_env

    if os.geteuid() != 0:
        pytest.fail("this test drops to an unprivileged user, so it runs as root (as CI does)")
    secret = {"FINETUNE_HUB_TOKEN": "hf_write", "AWS_SECRET_ACCESS_KEY": "aws_secret", "HF_HOME": "/x"}
    run = RunEnv(
        nnodes=1, nproc_per_node=1, node_rank=0, master_addr="a", master_port=1, attempt=0, job_name="j", namespace="n"
    )
    os.environ.update(secret)
    try:
        env = worker_env(run, 0.0, str(tmp_path / "err"))
    finally:
        for k in secret:
            os.environ.pop(k)
    assert "FINETUNE_HUB_TOKEN" not in env and "AWS_SECRET_ACCESS_KEY" not in env and env["HF_HOME"] == "/x"

    nobody: dict[str, Any] = {"user": 65534, "group": 65534, "extra_groups": []}

    # The unprivileged user cannot enter root's venv: the system Python runs a copy of the (standard-library only)
    # module.
    import shutil
    import tempfile

    from finetune_trainer import credentials

    shared = Path(tempfile.mkdtemp(prefix="credentials-"))  # pytest's tmp_path sits under a root-only directory
    pkg = shared / "src" / "finetune_trainer"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy(credentials.__file__, pkg / "credentials.py")
    for p in (shared, shared / "src", pkg, *pkg.iterdir()):
        p.chmod(0o755)
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable

    def environ_readable(hide: bool) -> bool:
        holder = subprocess.Popen(
            [
                python,
                "-c",
                f"import sys, time; sys.path.insert(0, {str(shared / 'src')!r}); "
                "from finetune_trainer import credentials; "
                f"print(credentials.hide_secrets() if {hide} else False, flush=True); time.sleep(30)",
            ],
            env={"PATH": "/usr/bin:/bin", **secret},
            stdout=subprocess.PIPE,
            text=True,
            **nobody,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == str(hide)
            reader = subprocess.run(
                [python, "-c", f"open('/proc/{holder.pid}/environ', 'rb').read()"],
                capture_output=True,
                env={"PATH": "/usr/bin:/bin"},
                **nobody,
            )
            return reader.returncode == 0
        finally:
            holder.kill()
            holder.wait()

    try:
        assert environ_readable(hide=False)  # the same user reads an ordinary process's environment
        assert not environ_readable(hide=True)
    finally:
        shutil.rmtree(shared)


def test_export_retries_span_minutes_with_jitter() -> None:
    """Six tries; the waits double from 5 s up to 60 s, each drawn uniformly below its bound (full jitter), so an
    outage of a few minutes is ridden out and jobs that end together do not retry in step; a permanent error (denied,
    no such bucket) is not retried."""
    from finetune_trainer import export

    bounds = [export.backoff(a, draw=lambda: 1.0) for a in range(1, export.ATTEMPTS)]
    assert bounds == [5.0, 10.0, 20.0, 40.0, 60.0] and sum(bounds) >= 120
    assert export.backoff(3, draw=lambda: 0.25) == 5.0
    slept: list[float] = []
    calls = []

    def flaky() -> dict[str, Any]:
        calls.append(1)
        if len(calls) < 4:
            raise ConnectionError("reset")
        return {"ok": True}

    assert export._retrying("copy", flaky, sleep=slept.append) == {"ok": True}
    assert len(calls) == 4 and len(slept) == 3

    class Denied(Exception):
        response = {"Error": {"Code": "AccessDenied"}}

    def denied() -> dict[str, Any]:
        raise Denied("no")

    with pytest.raises(export.ExportError, match="copy: Denied"):
        export._retrying("copy", denied, sleep=slept.append)
    assert len(slept) == 3  # no wait: not retried


def test_an_export_sends_no_symbolic_link_and_reads_no_aws_config_under_home(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """model/ is written by the training code: a link there to the launcher's environment (its credentials) or to a
    mounted Secret is never exported, nor a linked directory; boto3 reads no ~/.aws files the training could plant."""
    from finetune_trainer import export

    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "weights.bin").write_bytes(b"w")
    (model / "environ").symlink_to("/proc/self/environ")
    (model / "secret-dir").symlink_to(tmp_path)
    (model / "sub" / "token").symlink_to(model / "config.json")
    assert export.files_under(str(model)) == ["config.json", os.path.join("sub", "weights.bin")]
    monkeypatch.delenv("AWS_CONFIG_FILE", raising=False)
    monkeypatch.delenv("AWS_SHARED_CREDENTIALS_FILE", raising=False)
    export._no_shared_aws_config()
    assert os.environ["AWS_CONFIG_FILE"] == os.environ["AWS_SHARED_CREDENTIALS_FILE"] == os.devnull


def test_kernels_liger_only_where_it_can_run() -> None:
    """training.kernels: liger is refused for a task without a language-model head, without a GPU and for a model
    type Liger does not patch, each naming the field and the fix; auto sets Liger aside for the same reasons."""
    from finetune_trainer import accel
    from finetune_trainer.errors import ConfigError

    patched = frozenset({"llama", "qwen2"})
    assert accel.liger_unavailable("cuda", "llama", task="causal-lm", supported=patched) is None
    assert accel.liger_unavailable("cuda", None, task="dpo", supported=patched) is None  # the model type waits
    for hardware, model_type, task, words in [
        ("cpu", "llama", "causal-lm", "no GPU"),
        ("cuda", "gpt2", "causal-lm", r"model type 'gpt2'.*llama, qwen2"),
        ("cuda", "bert", "sequence-classification", "not sequence-classification"),
    ]:
        with pytest.raises(ConfigError, match=words) as e:
            accel.require_liger(hardware, model_type, task=task, supported=patched)
        assert e.value.field == "training.kernels" and "spec.training.kernels" in e.value.message
    short, _ = accel.liger_unavailable("cuda", "gpt2", task="causal-lm", supported=patched) or ("", "")
    assert short == "Liger has no kernels for model type 'gpt2'"


def test_liger_knows_the_tiny_llama_and_not_the_tiny_gpt2() -> None:
    """The real liger-kernel package of the default stack (imported on CPU: its kernels need a GPU only to run)."""
    from finetune_trainer import accel

    types = accel.liger_model_types()
    assert "llama" in types and "gpt2" not in types


@pytest.mark.parametrize(
    ("over", "cls"),
    [
        ({"task": "dpo", "dataset": {"path": str(TINY / "preference"), "promptField": "prompt",
          "chosenField": "chosen", "rejectedField": "rejected"}, "training": {"dpo": {"beta": 0.3, "lossType": "ipo"}}},
         "DPOConfig"),
        ({"task": "causal-lm", "dataset": {"path": str(TINY / "chat"), "messagesField": "messages"}}, "SFTConfig"),
        ({}, "TrainingArguments"),
    ],
    ids=["dpo", "sft", "plain"],
)  # fmt: skip
def test_training_arguments_carry_the_typed_fields_and_recompute_nothing_unasked(
    tmp_path: Path, over: dict[str, Any], cls: str
) -> None:
    """What each task's arguments class gets from the typed fields: DPO's beta, loss type and max_length; Liger's
    kernels as use_liger_kernel; and activation checkpointing off unless asked (TRL's configs default it on)."""
    from finetune_trainer import accel
    from finetune_trainer.worker import Identity, build_training_args

    cfg = parse_config(deep_merge(tiny_config(tmp_path / "out", configVersion="1.4"), over))
    ident = Identity(rank=0, local_rank=0, world_size=1, node_rank=0, nproc_per_node=1, nnodes=1, attempt=0)
    backend = accel.make_backend("none")
    args = build_training_args(cfg, backend, ident, cuda=False, precision="fp32")
    assert type(args).__name__ == cls and args.gradient_checkpointing is False
    assert not getattr(args, "use_liger_kernel", False)
    if cls == "DPOConfig":
        assert (args.beta, args.loss_type, args.max_length) == (0.3, ["ipo"], cfg.training.max_seq_length)
    liger = build_training_args(cfg, backend, ident, cuda=False, precision="fp32", kernels="liger")
    assert liger.use_liger_kernel is True
    asked = parse_config(deep_merge(tiny_config(tmp_path / "out", configVersion="1.4"),
                                    deep_merge(over, {"training": {"activationCheckpointing": True}})))  # fmt: skip
    assert build_training_args(asked, backend, ident, cuda=False, precision="fp32").gradient_checkpointing is True


@pytest.mark.parametrize(
    ("over", "same"),
    [
        ({"training": {"maxSteps": 90}}, True),  # a run continued further
        ({"training": {"gradientAccumulationSteps": 4, "globalBatchSize": 64}}, False),  # another global batch
        ({"training": {"checkpointEverySteps": 3, "keepCheckpoints": 5, "kernels": "none"}}, True),
        ({"training": {"extraArgs": {"logging_steps": 5, "ddp_timeout": 60}}}, True),  # the operator's, from a deadline
        ({"training": {"learningRate": 0.001}}, False),
        ({"training": {"extraArgs": {"logging_steps": 5, "weight_decay": 0.1}}}, False),
        ({"dataset": {"textField": "label"}}, False),
        ({"model": {"revision": "v2"}}, False),
        ({"task": "causal-lm"}, False),
    ],
    ids=["longer", "batch", "cadence", "ddp-timeout", "lr", "extra-arg", "data", "model", "task"],
)
def test_a_run_is_what_decides_its_result(tmp_path: Path, over: dict[str, Any], same: bool) -> None:
    """runid: the settings an elastic resize, a continuation or an edited deadline change keep the run; what changes
    the trained weights makes another one."""
    from finetune_trainer import runid

    base = {"training": {"globalBatchSize": 32, "gradientAccumulationSteps": 2}}
    one = parse_config(valid(tmp_path, **base))
    other = parse_config(valid(tmp_path, **deep_merge(base, over)))
    assert (runid.run_id(one) == runid.run_id(other)) is same


def test_the_runs_result_adds_up_every_attempt_and_estimates_one_that_crashed(tmp_path: Path) -> None:
    """worker.run_totals over attempts/attempt-<n>.json: attempt 0 crashed (only its start record) after a checkpoint
    at step 200, which attempt 1 resumed from; attempt 1 ended with its figures."""
    from finetune_trainer.worker import Identity, run_totals

    config = parse_config(valid(tmp_path))
    attempts = tmp_path / "out" / "attempts"
    attempts.mkdir(parents=True)
    (attempts / "attempt-0.json").write_text(
        json.dumps({"attempt": 0, "resumed_from_step": 0, "global_batch_size": 32})
    )
    end = {"steps_trained": 50, "samples": 1600, "tokens": 9000, "steady_samples": 1568, "steady_seconds": 4.9}
    (attempts / "attempt-1.json").write_text(
        json.dumps({"attempt": 1, "resumed_from_step": 200, "global_batch_size": 32, **end})
    )
    ident = Identity(rank=0, local_rank=0, world_size=2, node_rank=0, nproc_per_node=1, nnodes=2, attempt=1)
    totals = run_totals(config, ident)
    assert [(a["attempt"], a["steps_trained"], a.get("estimated")) for a in totals["attempts"]] == [
        (0, 200, True),
        (1, 50, None),
    ]
    assert totals["samples"] == 200 * 32 + 1600 and totals["tokens"] == 9000
    assert totals["samples_per_second"] == pytest.approx(1568 / 4.9)


def test_a_run_recorded_by_another_trainer_version_is_the_same_run(tmp_path: Path) -> None:
    """run.json compares only the settings both identities record: a field a newer trainer adds never makes the run
    refuse its own checkpoints; an unreadable run.json is taken as this run's."""
    from finetune_trainer import runid

    config = parse_config(valid(tmp_path))
    out = tmp_path / "out"
    (out / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    checkpoints.mark_complete(str(out / "checkpoints" / "checkpoint-2"), 2)
    older = runid.identity(config)
    del older["training"]["packing"]  # a setting the trainer that wrote it did not have
    (out / "run.json").write_text(json.dumps({"runId": "0123456789abcdef", "identity": older}))
    assert runid.claim(config) == runid.run_id(config)
    (out / "run.json").write_text("[not an object]")
    assert runid.claim(config) == runid.run_id(config)
    other = runid.identity(config)
    other["dataset"]["text_field"] = "body"
    (out / "run.json").write_text(json.dumps({"runId": "fedcba9876543210", "identity": other}))
    with pytest.raises(ConfigError) as e:
        runid.claim(config)
    assert "dataset.text_field" in str(e.value) and "spec.output.path" in str(e.value)


def test_what_is_never_restarted_in_place() -> None:
    """A failed round restarts in place only for a failure another round may not repeat, with a restart left, while
    nothing is stopping the pod; the cause reported is the rank that failed, not its peers that saw it go."""
    from finetune_trainer import errors, rounds

    crash = ["RuntimeError: boom"]
    assert rounds.why_not_in_place(crash, [1], left=1, stop=False) is None
    assert rounds.why_not_in_place(["Signal 9 (SIGKILL) received by PID 7"], [-9], left=2, stop=False) is None
    assert rounds.why_not_in_place(crash, [1], left=0, stop=False) == "no restart left in place"
    assert "SIGTERM" in str(rounds.why_not_in_place(crash, [1], left=1, stop=True))
    assert "SIGTERM" in str(rounds.why_not_in_place([""], [143], left=1, stop=False))
    for prefix in (errors.CONFIG_ERROR_PREFIX, errors.CUDA_OOM_PREFIX, errors.OUTPUT_FULL_PREFIX):
        assert (
            rounds.why_not_in_place([prefix + "x"], [1], left=3, stop=False) == "a failure another round would repeat"
        )
    assert "rendezvous" in str(
        rounds.why_not_in_place(["torch.distributed.DistStoreError: wait"], [1], left=3, stop=False)
    )
    peer = "node 0, local rank 0: RuntimeError: [gloo/transport/tcp/pair.cc:545] Read error: Connection reset by peer"
    root = "node 1, local rank 0: Signal 9 (SIGKILL) received by PID 7"
    assert rounds.root_cause([peer, root]) == root and rounds.root_cause([peer]) == peer
    assert rounds.budget({"FINETUNE_RESTARTS_IN_PLACE": "2"}) == 2
    assert rounds.budget({"FINETUNE_RESTARTS_IN_PLACE": "x"}) == rounds.budget({}) == 0


def test_a_job_without_adapters_never_runs_bitsandbytes_in_the_agent() -> None:
    """peft imports bitsandbytes as it loads (with torch's inductor: over a second of the agent's start-up, and on a
    GPU possibly CUDA's initialisation, which would make the workers spawned). While the agent imports the stack a
    stand-in answers; afterwards the real module loads whole for whoever imports it (a worker that needs it)."""
    import subprocess
    import sys

    code = (
        "import importlib.util, sys\n"
        "from finetune_trainer.agent import stand_in\n"
        "with stand_in('bitsandbytes') as stood:\n"
        "    from finetune_trainer import worker\n"
        "    assert stood and importlib.util.find_spec('bitsandbytes') is not None\n"
        "assert 'bitsandbytes.backends.default.ops' not in sys.modules and 'bitsandbytes' not in sys.modules\n"
        "import bitsandbytes\n"
        "assert bitsandbytes.nn.Linear4bit\n"
        "assert 'bitsandbytes.functional' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_malformed_auto_table_is_refused_before_any_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's checks (run before the workers start) read FINETUNE_AUTO_TABLE even when the job asks for
    every setting outright, so a bad image ENV fails the job naming it instead of passing unnoticed."""
    from finetune_trainer.launcher import validate

    config = parse_config(valid(tmp_path, acceleration="none", training={"kernels": "none"}))
    validate(config, read_env({}), cuda_available=False)
    monkeypatch.setenv(accel.AUTO_TABLE_ENV, '{"cuda": {"*": {"options": [{"speedup": 0}]}}}')
    with pytest.raises(ConfigError) as e:
        validate(config, read_env({}), cuda_available=False)
    assert e.value.field == "env.FINETUNE_AUTO_TABLE" and "above 0" in e.value.message
