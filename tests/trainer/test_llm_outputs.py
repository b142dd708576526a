"""LLM fine-tuning outputs for real: FSDP (2 nodes x 1 process, gloo) with sharded checkpoints and a gang restart,
merging a LoRA adapter into its base, and the model pushed out of the volume.

The trainer runs as on a pod (the ``finetune-trainer`` launcher, torchrun, the tiny GPT-2 from the repo). The
Hugging Face Hub cannot be reached from the test machines, so ``tests/fakehub.py`` stands in for it (the real
``huggingface_hub`` client talks to it over HTTP); S3 is moto's server, a real S3-compatible endpoint on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import fakehub
from tests.trainer.helpers import TINY, Node, deep_merge, free_port, poll, read_json, tiny_config
from tests.trainer.test_trainer_runs import RUN_TIMEOUT, complete_steps, losses

pytestmark = pytest.mark.trainer

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "targetModules": ["all-linear"]}


def causal_config(out: Path, **over: Any) -> dict[str, Any]:
    base = tiny_config(
        out,
        example="causal-lm",
        acceleration="none",
        training={"maxSteps": 10, "checkpointEverySteps": 5, "extraArgs": {"logging_steps": 1}},
    )
    return deep_merge(base, over)


def saved_base(tmp_path: Path) -> Path:
    """The tiny GPT-2 with weights on disk (seeded random init), so a merged model can be checked against it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    path = tmp_path / "base"
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY / "gpt2")).save_pretrained(path)
    AutoTokenizer.from_pretrained(TINY / "gpt2").save_pretrained(path)
    return path


def logits(model: object, ids: list[int]) -> object:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits  # type: ignore[operator]


def run_gang(tmp_path: Path, cfg: dict, *, attempt: int) -> list[Node]:
    port = free_port()
    return [Node(tmp_path, cfg, node_rank=r, nnodes=2, master_port=port, attempt=attempt) for r in (1, 0)]


# --- FSDP -----------------------------------------------------------------------------------------------------------


def test_fsdp_shards_trains_and_resumes_after_a_gang_restart(tmp_path: Path) -> None:
    """Two nodes train with full sharding: checkpoints hold one shard per rank (DCP), no full weights; killed
    after a checkpoint, the restarted gang resumes from it and writes the gathered model."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    cfg = causal_config(
        out,
        training={"maxSteps": 60, "checkpointEverySteps": 10, "keepCheckpoints": 3, "sharding": "fsdp",
                  "activationCheckpointing": True, "extraArgs": {"logging_steps": 5}},
    )  # fmt: skip
    first = run_gang(tmp_path, cfg, attempt=0)
    poll(lambda: complete_steps(out), timeout=RUN_TIMEOUT, what="a complete checkpoint", on_fail=first[1].log)
    for node in first:
        node.kill()
    done = complete_steps(out)
    assert done and done[-1] < 60, f"the run finished before it could be killed: {done}"
    ckpt = out / "checkpoints" / f"checkpoint-{done[-1]}"
    assert (ckpt / "pytorch_model_fsdp_0").is_dir() and (ckpt / "optimizer_0").is_dir(), sorted(os.listdir(ckpt))
    shards = sorted(p.name for p in (ckpt / "pytorch_model_fsdp_0").iterdir())
    assert sum(name.endswith(".distcp") for name in shards) == 2, shards  # one shard file per rank
    assert not (ckpt / "model.safetensors").exists()

    second = run_gang(tmp_path, cfg, attempt=1)
    for node in second:
        assert node.wait(RUN_TIMEOUT) == 0, node.log()
    result = read_json(out / "result.json")
    assert result["sharding"] == "fsdp"
    assert result["resumed_from_step"] == done[-1] and result["steps"] == 60
    assert losses(result)[-1] < losses(result)[0]
    rank0 = read_json(out / "ranks" / "rank-0.json")
    assert rank0["params_sha256"] == result["params_sha256"] is not None
    model = AutoModelForCausalLM.from_pretrained(out / "model")  # the gathered, unsharded weights
    assert sum(p.numel() for p in model.parameters()) == result["params"]


# --- merging ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_lora_merge_writes_base_plus_adapter(tmp_path: Path, sharding: str) -> None:
    """With lora.merge, model/ is a plain transformers model (safetensors) equal to base + adapter: its logits
    match the base with the saved adapter applied by PEFT; adapter/ holds the adapter; the result says what went
    in. Under FSDP the adapter and the merge come from the gathered shards."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = saved_base(tmp_path)
    out = tmp_path / "out"
    cfg = causal_config(
        out,
        model={"path": str(base), "initFromConfig": False},
        training={"lora": {**LORA, "merge": True}, "sharding": sharding},
    )
    nodes = run_gang(tmp_path, cfg, attempt=0) if sharding == "fsdp" else [Node(tmp_path, cfg)]
    for node in nodes:
        assert node.wait(RUN_TIMEOUT) == 0, node.log()

    model_files = sorted(p.name for p in (out / "model").iterdir())
    assert "model.safetensors" in model_files and "adapter_config.json" not in model_files, model_files
    assert (out / "adapter" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out / "model")
    assert not any("lora" in name for name, _ in merged.named_parameters())
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out / "adapter")
    untrained = AutoModelForCausalLM.from_pretrained(base)
    ids = [5, 17, 40, 8, 30, 3]
    assert torch.allclose(logits(merged, ids), logits(reference, ids), atol=1e-4)
    assert not torch.allclose(logits(merged, ids), logits(untrained, ids), atol=1e-4)  # the adapter trained

    info = read_json(out / "result.json")["model"]
    assert info["base"] == str(base) and info["merged"] is True
    assert info["adapter"]["method"] == "lora" and info["adapter"]["r"] == 4
    assert {n.rsplit(".", 1)[-1] for n in info["adapter"]["target_modules"]} == {"c_attn", "c_proj", "c_fc"}
    assert info["adapter_path"] == str(out / "adapter")


# --- exports ----------------------------------------------------------------------------------------------------------


@pytest.fixture
def s3_endpoint(tmp_path: Path) -> Iterator[str]:
    """moto's S3-compatible server on 127.0.0.1, with a bucket ``models``."""
    import boto3

    port = free_port()
    log = open(tmp_path / "moto.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                boto3.client("s3", endpoint_url=url, **AWS).list_buckets()
                return True
            except Exception:
                return False

        poll(up, timeout=60, interval=0.2, what="moto's S3 server", on_fail=lambda: (tmp_path / "moto.log").read_text())
        boto3.client("s3", endpoint_url=url, **AWS).create_bucket(Bucket="models")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


AWS = {"aws_access_key_id": "test-key", "aws_secret_access_key": "test-secret", "region_name": "us-east-1"}
AWS_ENV = {"AWS_ACCESS_KEY_ID": "test-key", "AWS_SECRET_ACCESS_KEY": "test-secret", "AWS_DEFAULT_REGION": "us-east-1"}


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_model_is_pushed_to_the_hub_and_copied_to_s3(tmp_path: Path, s3_endpoint: str) -> None:
    import boto3

    out = tmp_path / "out"
    with fakehub.serve(tmp_path / "hub", token="hf_write") as hub:
        cfg = causal_config(
            out,
            training={"lora": LORA},
            output={
                "pushToHub": {"repo": "acme/tiny-chat", "private": True, "endpoint": hub.url},
                "s3": {"uri": "s3://models/runs/tiny", "endpoint": s3_endpoint},
            },
        )
        node = Node(tmp_path, cfg, extra_env={"FINETUNE_HUB_TOKEN": "hf_write", "HF_HUB_OFFLINE": "0", **AWS_ENV})
        assert node.wait(RUN_TIMEOUT) == 0, node.log()
        model = files(out / "model")
        assert "adapter_model.safetensors" in model
        assert files(hub.root / "acme" / "tiny-chat") == model  # every file, byte for byte
        assert hub.repos["acme/tiny-chat"]["private"] is True
        assert hub.repos["acme/tiny-chat"]["commits"] == ["finetune-operator: default/tiny-causal-lm"]
        assert set(hub.tokens_seen) == {"hf_write"}

    s3 = boto3.client("s3", endpoint_url=s3_endpoint, **AWS)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="models", Prefix="runs/tiny/")["Contents"])
    assert keys == sorted([f"runs/tiny/{name}" for name in model] + ["runs/tiny/finetune-export.json"])
    manifest = json.loads(s3.get_object(Bucket="models", Key="runs/tiny/finetune-export.json")["Body"].read())
    assert manifest["complete"] is True and manifest["bytes"] == sum(len(d) for d in model.values())
    assert sorted(o["key"] for o in manifest["objects"]) == sorted(f"runs/tiny/{name}" for name in model)
    for name, data in model.items():
        assert s3.get_object(Bucket="models", Key=f"runs/tiny/{name}")["Body"].read() == data

    exports = read_json(out / "result.json")["export"]
    assert [e["destination"] for e in exports] == ["hf://acme/tiny-chat", "s3://models/runs/tiny"]
    assert exports[0]["commit"] and exports[1]["objects"] == len(model)
    assert exports[1]["bytes"] == sum(len(d) for d in model.values())


def test_a_failed_push_exits_74_and_keeps_the_trained_model(tmp_path: Path) -> None:
    """A token the Hub refuses: training is not lost (model and result on the volume), the failure is its own
    reason (ExportFailed, exit 74) and says where the model is."""
    out = tmp_path / "out"
    with fakehub.serve(tmp_path / "hub", token="hf_right") as hub:
        cfg = causal_config(out, output={"pushToHub": {"repo": "acme/tiny", "endpoint": hub.url}})
        node = Node(tmp_path, cfg, extra_env={"FINETUNE_HUB_TOKEN": "hf_wrong", "HF_HUB_OFFLINE": "0"})
        assert node.wait(RUN_TIMEOUT) == 74, node.log()
        assert not (hub.root / "acme" / "tiny").exists()
    term = node.termination()
    assert term is not None and term["reason"] == "ExportFailed", term
    assert "acme/tiny" in term["message"] and str(out / "model") in term["message"], term
    assert "401" in term["message"], term
    result = read_json(out / "result.json")
    assert result["steps"] == 10 and (out / "model" / "model.safetensors").exists()
    (failed,) = result["export"]
    assert failed["destination"] == "hf://acme/tiny" and "401" in failed["error"]
