"""Preference tuning (task dpo, TRL's DPOTrainer) for real: a tiny Llama-architecture model built from its config
(examples/tiny/llama-chat) trained on preference pairs (examples/tiny/preference: the sentiment task, the right
answer chosen and the wrong one rejected) by two nodes under torchrun (gloo), as on two pods.

Checked from the trainer's own records (result.json, the ranks' records, the Prometheus page): the DPO loss falls,
the policy rewards the chosen answers above the rejected ones, a gang killed after a checkpoint resumes and continues
the curve, LoRA trains without a second copy of the model, and bad pairs are refused (exit 78) naming the field and
the row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.helpers import TINY, Node, deep_merge, free_port, read_json, refused_rows, tiny_config
from tests.trainer.test_trainer_runs import RUN_TIMEOUT, complete_steps, killed_after_a_checkpoint, losses

pytestmark = pytest.mark.trainer

LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "targetModules": ["all-linear"]}


def dpo_config(out: Path, *, data: str = "preference", **over: Any) -> dict[str, Any]:
    cfg = tiny_config(
        out,
        example="causal-lm",
        task="dpo",
        acceleration="none",
        model={"path": str(TINY / "llama-chat")},
        dataset={
            "path": str(TINY / data),
            "promptField": "prompt",
            "chosenField": "chosen",
            "rejectedField": "rejected",
        },
        training={
            "maxSteps": 30,
            "perDeviceBatchSize": 8,
            "learningRate": 0.005,
            "checkpointEverySteps": 10,
            "dpo": {"beta": 0.1, "lossType": "sigmoid"},
            "extraArgs": {"logging_steps": 2},
        },
    )
    cfg["configVersion"] = "1.4"
    return deep_merge(cfg, over)


def run_gang(work: Path, cfg: dict[str, Any], *, attempt: int = 0) -> list[Node]:
    port = free_port()
    return [Node(work, cfg, node_rank=r, nnodes=2, master_port=port, attempt=attempt) for r in (1, 0)]


def finish(nodes: list[Node]) -> None:
    for node in nodes:
        assert node.wait(RUN_TIMEOUT) == 0, node.log()


def rewards_rise(result: dict[str, Any]) -> None:
    """Over the last third of the logs (each log a mean over its batches: a single one is noisy), the policy
    rewards the chosen responses above the rejected ones for most pairs, and the DPO loss is below where it began."""
    dpo = result["dpo"]
    history = dpo["reward_history"]
    assert dpo["beta"] == 0.1 and dpo["loss_type"] == "sigmoid" and history, dpo
    assert dpo["rewards"] == history[-1]
    tail = history[-max(3, len(history) // 3) :]
    mean = {k: sum(h[k] for h in tail) / len(tail) for k in ("accuracy", "margin", "chosen", "rejected")}
    assert mean["chosen"] > mean["rejected"] and mean["margin"] > 0, mean
    assert mean["accuracy"] >= 0.7, mean
    curve = losses(result)
    assert sum(curve[-3:]) / 3 < curve[0], result["loss_history"]


def test_dpo_on_two_nodes_prefers_the_chosen_answers_and_resumes_after_a_kill(tmp_path: Path) -> None:
    """Conversational pairs, full-parameter DPO (the reference is a frozen copy of the model as loaded) on two
    nodes: killed after a checkpoint, the restarted gang resumes from it, its loss continues from where the curve
    was (no jump back to the start), and rank 0 ends with rewards of chosen above rejected."""
    out = tmp_path / "out"
    cfg = dpo_config(out, training={"maxSteps": 40})
    done, logs = killed_after_a_checkpoint(run_gang(tmp_path, cfg), out, 40)
    before = [h["loss"] for h in logs if "loss" in h]

    finish(run_gang(tmp_path, cfg, attempt=1))
    result = read_json(out / "result.json")
    assert result["resumed_from_step"] == done and result["steps"] == 40
    assert result["world_size"] == 2 and result["dpo"]["pairs"] == "conversational"
    rewards_rise(result)
    after = [loss for step, loss in result["loss_history"] if step > done]  # logged by the second attempt
    assert after and after[0] < before[0], (before, after)  # resumed: the curve goes on, it does not start again
    ranks = [read_json(out / "ranks" / f"rank-{r}.json") for r in (0, 1)]
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]  # DDP kept both replicas equal


def test_dpo_with_lora_on_plain_pairs(tmp_path: Path) -> None:
    """Plain string pairs, LoRA, evaluated every 15 steps on held-out pairs: the reference is the model with its
    adapter disabled (no second copy), the evaluations report the rewards on the evaluation pairs, and the adapter is
    what is saved."""
    out = tmp_path / "out"
    cfg = dpo_config(
        out,
        data="preference-plain",
        dataset={"evalSplit": "eval"},
        training={"lora": LORA, "learningRate": 0.01, "evaluation": {"strategy": "steps", "everySteps": 15}},
    )
    finish(run_gang(tmp_path, cfg))
    result = read_json(out / "result.json")
    assert result["dpo"]["pairs"] == "plain"
    rewards_rise(result)
    assert [e["step"] for e in result["eval_history"]] == [15, 30], result["eval_history"]
    final = result["final_eval"]
    assert final["reward_margin"] > 0 and 0.5 < final["reward_accuracy"] <= 1, final
    assert (out / "model" / "adapter_config.json").exists(), sorted(p.name for p in (out / "model").iterdir())


def test_dpo_with_fsdp_shards_the_policy_and_its_reference(tmp_path: Path) -> None:
    """Full sharding on two nodes: the policy and the frozen reference are both sharded (FSDP), the checkpoint holds
    one shard per rank, and the rewards still separate chosen from rejected."""
    out = tmp_path / "out"
    cfg = dpo_config(out, training={"sharding": "fsdp", "checkpointEverySteps": 15, "maxSteps": 30})
    finish(run_gang(tmp_path, cfg))
    result = read_json(out / "result.json")
    assert result["sharding"] == "fsdp" and result["world_size"] == 2
    rewards_rise(result)
    ckpt = out / "checkpoints" / f"checkpoint-{complete_steps(out)[-1]}"
    assert (ckpt / "pytorch_model_fsdp_0").is_dir(), sorted(p.name for p in ckpt.iterdir())


def _bad_rows(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    data = tmp_path / "pairs"
    data.mkdir()
    good = (TINY / "preference-plain" / "train.jsonl").read_text().splitlines()[:20]
    lines = good[:5] + [json.dumps(r) for r in rows] + good[5:]
    (data / "train.jsonl").write_text("\n".join(lines) + "\n")
    return data


BAD_PAIRS = [
    ([{"prompt": "a film", "chosen": "", "rejected": "negative"}], "dataset.chosenField", ["row 5", "'chosen'"]),
    (
        [{"prompt": "a film", "chosen": "positive", "rejected": None}],
        "dataset.rejectedField",
        ["row 5", "'rejected'", "missing"],
    ),
    (
        [{"prompt": "a film", "chosen": [{"role": "assistant", "content": "x"}], "rejected": "negative"}],
        "dataset.promptField",
        ["row 5", "mixes"],
    ),
    ([{"prompt": "a film", "chosen": "positive", "rejected": "positive"}], "dataset.rejectedField", ["same"]),
]


def _bad_pairs_config(tmp_path: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    cfg = dpo_config(tmp_path / "out", data="preference-plain")
    cfg["dataset"]["path"] = str(_bad_rows(tmp_path, rows))
    return cfg


@pytest.mark.parametrize(
    ("rows", "field", "words"), BAD_PAIRS, ids=["empty-chosen", "missing-rejected", "mixed-kinds", "same-responses"]
)
def test_a_bad_pair_is_refused_naming_the_field_and_row(
    tmp_path: Path, rows: list[dict[str, Any]], field: str, words: list[str]
) -> None:
    refused = refused_rows(_bad_pairs_config(tmp_path, rows))
    assert refused.field == field and all(w in str(refused) for w in words), refused


def test_a_bad_pair_exits_78_naming_the_field_and_row(tmp_path: Path) -> None:
    """A launch: the worker's refusal of a pair is the launcher's exit 78 with the field and the row in the
    termination message."""
    rows, field, words = BAD_PAIRS[0]
    node = Node(tmp_path, _bad_pairs_config(tmp_path, rows))
    assert node.wait(RUN_TIMEOUT) == 78, node.log()
    message = (node.termination() or {}).get("message", "")
    assert field in message and all(w in message for w in words), message


def test_dpo_settings_on_another_task_are_refused(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "out", example="causal-lm", acceleration="none")
    cfg["configVersion"] = "1.4"
    cfg["training"]["dpo"] = {"beta": 0.5}
    node = Node(tmp_path, cfg)
    assert node.wait(RUN_TIMEOUT) == 78, node.log()
    assert "training.dpo" in (node.termination() or {}).get("message", "")


def test_the_tiny_llama_fixture_matches_its_tokenizer() -> None:
    """A Llama config (grouped-query attention) over gpt2-chat's tokenizer, written by make_fixtures.py."""
    config = json.loads((TINY / "llama-chat" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] < config["num_attention_heads"]
    vocab = json.loads((TINY / "llama-chat" / "tokenizer.json").read_text())["model"]["vocab"]
    assert config["vocab_size"] == len(vocab)  # every token id has an embedding
