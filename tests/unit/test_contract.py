"""The operator <-> trainer contract from both sides: every config the operator's builder writes goes through the
trainer's own parser (``finetune_trainer.config.parse_config``), and the values a user set arrive unchanged."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from finetune_operator import spec as op_spec
from finetune_operator.builders import JobRef, build_config_map, build_pods, trainer_config
from finetune_operator.settings import CONFIG_FILE, Settings
from finetune_operator.spec import parse_spec
from finetune_trainer import config as tr_config

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "finetune.dev_finetunejobs.yaml").read_text())
SPEC_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
REF = JobRef(name="ft", namespace="ns", uid="uid-1")
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

SPECS: dict[str, dict[str, Any]] = {
    "minimal": {"model": {"path": "/m"}, "dataset": {"path": "/d.jsonl"}, "output": {"claimName": "o"}},
    "lora-everything": {
        "task": "causal-lm",
        "model": {"name": "org/m", "revision": "v1"},
        "dataset": {"name": "org/d", "split": "train", "evalSplit": "test", "messagesField": "messages"},
        "training": {
            "maxSteps": 7,
            "lora": {"r": 8, "targetModules": ["all-linear"], "merge": True},
            "packing": True,
            "lossOn": "all",
            "sharding": "fsdp",
            "activationCheckpointing": True,
            "evaluation": {"strategy": "steps", "everySteps": 3},
            "extraArgs": {"warmup_steps": 0.1},
        },
        "output": {
            "claimName": "o",
            "pushToHub": {"repo": "a/b", "secretRef": {"name": "s"}},
            "s3": {"uri": "s3://bucket/p", "region": "eu-west-1"},
        },
    },
    "qlora": {
        "task": "causal-lm",
        "model": {"name": "org/m"},
        "dataset": {"path": "/d", "promptField": "p", "completionField": "c"},
        "resources": {"limits": {"nvidia.com/gpu": 2}},
        "training": {"epochs": 2, "lora": {"r": 16, "alpha": 64, "quantization": "4bit"}, "kernels": "liger"},
        "output": {"claimName": "o"},
    },
    "dpo-defaults": {
        "task": "dpo",
        "model": {"path": "/m"},
        "dataset": {"path": "/pairs"},
        "training": {"maxSteps": 5, "lora": {"r": 4}},
        "output": {"claimName": "o"},
    },
    "dpo-named": {
        "task": "dpo",
        "model": {"path": "/m"},
        "dataset": {"path": "/pairs", "promptField": "q", "chosenField": "good", "rejectedField": "bad"},
        "training": {"maxSteps": 5, "dpo": {"beta": 0.5, "lossType": "ipo"}},
        "output": {"claimName": "o"},
    },
}


def cases() -> list[tuple[str, dict[str, Any]]]:
    out = [(name, s) for name, s in SPECS.items()]
    out += [(p.name, yaml.safe_load(p.read_text())["spec"]) for p in EXAMPLES]
    return out


@pytest.mark.parametrize(("name", "raw"), cases(), ids=[c[0] for c in cases()])
def test_every_builder_output_parses_in_the_trainer(name: str, raw: dict[str, Any]) -> None:
    spec = parse_spec(raw)
    cfg = tr_config.parse_config(trainer_config(REF, spec))
    t, ct = spec.training, cfg.training
    assert cfg.task == spec.task and cfg.acceleration == spec.acceleration
    assert (ct.epochs, ct.max_steps) == (t.epochs, t.max_steps)
    assert (ct.per_device_batch_size, ct.learning_rate, ct.max_seq_length, ct.seed) == (
        t.per_device_batch_size,
        t.learning_rate,
        t.max_seq_length,
        t.seed,
    )
    assert (ct.packing, ct.loss_on, ct.sharding, ct.activation_checkpointing, ct.kernels) == (
        t.packing,
        t.loss_on,
        t.sharding,
        t.activation_checkpointing,
        t.kernels,
    )
    d = spec.dataset
    sft = "chat" if d.messages_field else "prompt-completion" if d.prompt_field else None
    assert cfg.dataset.sft_format == (None if spec.task in ("dpo", "grpo") else sft)
    if spec.task == "dpo":  # the columns (named prompt, chosen, rejected unless set) and beta / loss type arrive
        assert t.dpo is not None
        assert (cfg.dataset.prompt_field, cfg.dataset.chosen_field, cfg.dataset.rejected_field) == (
            d.prompt_field,
            d.chosen_field,
            d.rejected_field,
        )
        assert None not in (d.prompt_field, d.chosen_field, d.rejected_field)
        assert (ct.dpo.beta, ct.dpo.loss_type) == (t.dpo.beta, t.dpo.loss_type)
    if spec.task == "grpo":  # the prompt column (prompt unless set), the settings and every reward arrive
        assert t.grpo is not None and cfg.dataset.prompt_field == d.prompt_field
        g = ct.grpo
        assert (g.num_generations, g.max_completion_length, g.temperature, g.loss_type, g.beta) == (
            t.grpo.num_generations,
            t.grpo.max_completion_length,
            t.grpo.temperature,
            t.grpo.loss_type,
            t.grpo.beta,
        )
        assert [(r.type, r.name, r.weight, r.column, r.pattern) for r in g.rewards] == [
            (r["type"], r["name"], r["weight"], r.get("column"), r.get("pattern")) for r in t.grpo.rewards
        ]
    assert (cfg.dataset.name, cfg.dataset.path, cfg.dataset.split, cfg.dataset.eval_split) == (
        d.name,
        d.path,
        d.split,
        d.eval_split,
    )
    if t.lora is None:
        assert ct.lora is None
    else:
        assert ct.lora is not None
        assert ct.lora.alpha == (t.lora.alpha if t.lora.alpha is not None else 2 * t.lora.r)
        assert (ct.lora.r, ct.lora.target_modules, ct.lora.quantization, ct.lora.merge) == (
            t.lora.r,
            t.lora.target_modules,
            t.lora.quantization,
            t.lora.merge,
        )
    hub, s3 = spec.output.push_to_hub, spec.output.s3
    assert (cfg.push_to_hub.repo if cfg.push_to_hub else None) == (hub.repo if hub else None)
    assert (cfg.s3.uri if cfg.s3 else None) == (s3.uri if s3 else None)


def test_both_sides_manage_the_same_training_arguments() -> None:
    """A key one side lets through extraArgs and the other refuses would pass admission and fail in the pod: both read
    the list from the trainer's schema (the operator from its generated copy, which must not drift)."""
    from hack import contract

    assert contract.main(["--check"]) == 0, "operator/finetune_operator/contract.schema.json drifted: make generate"
    assert tr_config.managed_training_args() == op_spec.MANAGED_TRAINING_ARGS
    assert set(op_spec.MANAGED_TRAINING_ARGS) >= {"output_dir", "push_to_hub", "fsdp", "learning_rate"}


@pytest.mark.parametrize(
    ("crd_path", "trainer_field"),
    [
        (["training", "perDeviceBatchSize"], "per_device_batch_size"),
        (["training", "gradientAccumulationSteps"], "gradient_accumulation_steps"),
        (["training", "learningRate"], "learning_rate"),
        (["training", "maxSeqLength"], "max_seq_length"),
        (["training", "precision"], "precision"),
        (["training", "seed"], "seed"),
        (["training", "checkpointEverySteps"], "checkpoint_every_steps"),
        (["training", "keepCheckpoints"], "keep_checkpoints"),
        (["training", "packing"], "packing"),
        (["training", "lossOn"], "loss_on"),
        (["training", "sharding"], "sharding"),
        (["training", "activationCheckpointing"], "activation_checkpointing"),
    ],
    ids=lambda x: ".".join(x) if isinstance(x, list) else "",
)
def test_crd_defaults_are_the_trainers(crd_path: list[str], trainer_field: str) -> None:
    node = SPEC_SCHEMA
    for p in crd_path:
        node = node["properties"][p]
    defaults = {f.name: f.default for f in dataclasses.fields(tr_config.TrainingConfig)}
    documented = re.search(r"Default `([^`]+)` unless the job's runtime sets one", node.get("description", ""))
    default = node["default"] if "default" in node else yaml.safe_load(documented.group(1)) if documented else None
    assert default == defaults[trainer_field]


@pytest.mark.parametrize(("name", "raw"), cases()[:2], ids=[c[0] for c in cases()[:2]])
def test_the_config_a_pod_reads_is_the_one_admitted(
    name: str, raw: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pod carries the digest of the ConfigMap's file in its (immutable) env; the trainer reads that file, and
    refuses the same file with one setting changed, as a tenant with the ``edit`` role could change it after admission,
    naming the file and what to do instead."""
    spec = parse_spec(raw)
    data = build_config_map(REF, spec)["data"]
    (path := tmp_path / "config.json").write_text(data[CONFIG_FILE])
    for pod in build_pods(REF, spec, attempt=0, settings=Settings()):
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        monkeypatch.setenv(tr_config.CONFIG_DIGEST_ENV, env[tr_config.CONFIG_DIGEST_ENV])
        assert tr_config.load_config(str(path)).job.name == REF.name
    path.write_text(data[CONFIG_FILE].replace('"trustRemoteCode": false', '"trustRemoteCode": true'))
    assert path.read_text() != data[CONFIG_FILE]
    with pytest.raises(tr_config.ConfigError) as e:
        tr_config.load_config(str(path))
    assert e.value.field == "FINETUNE_CONFIG"
    assert "not the one the operator admitted" in e.value.message and "change the FineTuneJob" in e.value.message


def test_a_config_file_brought_up_to_date_within_the_settle_time_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubelet may still hold an attempt's previous file when its pod starts: the launcher reads it again until it
    is the admitted one (here it changes half a second in)."""
    spec = parse_spec(cases()[0][1])
    admitted = build_config_map(REF, spec)["data"][CONFIG_FILE]
    path = tmp_path / "config.json"
    path.write_text(admitted.replace('"seed": ', '"seed": 1'))
    monkeypatch.setenv(tr_config.CONFIG_DIGEST_ENV, hashlib.sha256(admitted.encode()).hexdigest())
    timer = threading.Timer(0.5, path.write_text, args=(admitted,))
    timer.start()
    try:
        assert tr_config.load_config(str(path), settle_seconds=30).job.name == REF.name
    finally:
        timer.cancel()
