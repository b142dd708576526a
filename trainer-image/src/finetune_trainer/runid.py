"""A run's identity on its output volume: ``run.json``, a digest of what decides the result (task, model, dataset and
the training settings that change the trained weights), written before the first step. A job whose output path holds
another run's checkpoints, model or result (a job re-created under a finished job's name with another dataset, say)
is refused before any work: it would resume that run's checkpoint, train nothing or the wrong thing, and overwrite
its model. Settings that may change between attempts of one run are not part of it: the accumulation (an elastic
job's size), the length (``maxSteps``/``epochs``: a run may be continued further), checkpointing and evaluation
cadence, kernels, precision (a runtime may set it between attempts) and the collective timeout. Two runs differ only in
a setting both record: a field that a newer trainer adds is not a reason to refuse the run's own checkpoints."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from typing import Any

from finetune_trainer.checkpoints import latest_complete
from finetune_trainer.config import Config
from finetune_trainer.errors import ConfigError

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
# Training settings that do not make another run (TrainingConfig's field names).
NOT_IDENTITY = (
    "epochs",
    "max_steps",
    "gradient_accumulation_steps",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "eval_strategy",
    "eval_every_steps",
    "kernels",
    "activation_checkpointing",
    "precision",
)
OPERATIONAL_ARGS = ("ddp_timeout",)  # extraArgs the operator sets from the job's deadline


def identity(config: Config) -> dict[str, Any]:
    """What decides the run's result, as plain JSON."""
    training = dataclasses.asdict(config.training)
    for key in NOT_IDENTITY:
        training.pop(key, None)
    training["extra_args"] = {k: v for k, v in training["extra_args"].items() if k not in OPERATIONAL_ARGS}
    if config.training.global_batch_size is None:  # not elastic: the accumulation is the job's own, and fixed
        training["gradient_accumulation_steps"] = config.training.gradient_accumulation_steps
    model = dataclasses.asdict(config.model)
    model.pop("trust_remote_code", None)
    ident = {"task": config.task, "model": model, "dataset": dataclasses.asdict(config.dataset), "training": training}
    normal: dict[str, Any] = json.loads(json.dumps(ident, default=str))  # as run.json records it: tuples are lists
    return normal


def run_id(config: Config) -> str:
    text = json.dumps(identity(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _describe(record: dict[str, Any]) -> str:
    ident = record.get("identity") or {}
    model, dataset = ident.get("model") or {}, ident.get("dataset") or {}
    what = model.get("name") or model.get("path") or "?"
    data = dataset.get("name") or dataset.get("path") or "?"
    job = record.get("job") or {}
    where = f"{job.get('namespace', '?')}/{job.get('name', '?')}"
    return f"job {where}, task {ident.get('task', '?')}, model {what}, data {data}"


def differences(recorded: Any, current: Any, path: str = "") -> list[str]:
    """The settings (dotted paths) that both identities record, with different values."""
    if isinstance(recorded, dict) and isinstance(current, dict):
        return [
            d
            for key in sorted(recorded.keys() & current.keys())
            for d in differences(recorded[key], current[key], f"{path}.{key}" if path else str(key))
        ]
    return [] if recorded == current else [path or "identity"]


def _held(config: Config) -> list[str]:
    """What of a run the output path holds."""
    held = []
    if (ckpt := latest_complete(config.checkpoints_dir)) is not None:
        held.append(f"checkpoints (newest: step {ckpt.step})")
    if os.path.isdir(config.model_dir):
        held.append("a trained model")
    if os.path.isfile(config.result_path):
        held.append("result.json")
    return held


def claim(config: Config) -> str:
    """The output path for this run (node rank 0's launcher, before training): ``run.json`` written if absent, or
    checked. Returns the run id. Raises :class:`ConfigError` (exit 78, never retried) when the path holds another
    run's work; nothing is removed. A path with checkpoints but no ``run.json`` (written before run ids) is adopted."""
    path = os.path.join(config.output_path, RUN_FILE)
    mine = run_id(config)
    theirs: Any = None
    try:
        with open(path, encoding="utf-8") as f:
            theirs = json.load(f)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as e:
        log.warning("%s unreadable (%s): the path is taken as this run's", path, e)
    if not isinstance(theirs, dict):
        theirs = None
    if theirs is not None and theirs.get("runId") == mine:
        return mine
    changed = differences(theirs.get("identity") or {}, identity(config)) if theirs is not None else []
    if changed and (held := _held(config)):
        raise ConfigError(
            "output.path",
            f"{config.output_path!r} holds {', '.join(held)} of another run (run {theirs.get('runId', '?')}: "
            f"{_describe(theirs)}); this job is run {mine}, with other {', '.join(changed)}. That run's checkpoints "
            "are never resumed nor its model overwritten: set spec.output.path to a new path, or delete that run's "
            "files to start over there",
        )
    record = _record(config, mine)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)
    return mine


def _record(config: Config, mine: str) -> dict[str, Any]:
    return {
        "runId": mine,
        "job": {"name": config.job.name, "namespace": config.job.namespace},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "identity": identity(config),
    }
