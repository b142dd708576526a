"""GRPO (task grpo, TRL's GRPOTrainer) for real: the tiny Llama-architecture model built from its config
(examples/tiny/llama-chat) learns the toy sentiment task from rewards alone (examples/tiny/prompts: a review as the
prompt, the right answer in a reference column), generating its completions with transformers on two nodes under
torchrun (gloo), as on two pods.

Checked from the trainer's own records (result.json, the checkpoints, the Prometheus page): the mean reward rises
against the first logged steps, each reward's own mean and the rollout rate are recorded, a gang killed after a
checkpoint resumes it, and every bad reward or setting is refused (exit 78) naming the field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.helpers import TINY, Node, deep_merge, free_port, read_json, refused_rows, tiny_config
from tests.trainer.test_trainer_runs import RUN_TIMEOUT, killed_after_a_checkpoint

pytestmark = pytest.mark.trainer

REWARDS = [
    {"type": "regex", "name": "format", "pattern": "^(positive|negative)$"},
    {"type": "exactMatch", "name": "correct", "column": "answer"},
]


def grpo_config(out: Path, **over: Any) -> dict[str, Any]:
    cfg = tiny_config(
        out,
        example="causal-lm",
        task="grpo",
        acceleration="none",
        model={"path": str(TINY / "llama-chat")},
        dataset={"path": str(TINY / "prompts"), "promptField": "prompt"},
        training={
            "maxSteps": 40,
            "perDeviceBatchSize": 8,
            "learningRate": 0.01,
            "checkpointEverySteps": 20,
            "extraArgs": {"logging_steps": 4},
            # one word per completion: the answer, which the two rewards check for its form and its truth
            "grpo": {"numGenerations": 8, "maxCompletionLength": 1, "rewards": REWARDS},
        },
    )
    cfg["configVersion"] = "1.5"
    return deep_merge(cfg, over)


def run_gang(work: Path, cfg: dict[str, Any], *, attempt: int = 0) -> list[Node]:
    port = free_port()
    return [Node(work, cfg, node_rank=r, nnodes=2, master_port=port, attempt=attempt) for r in (1, 0)]


def test_grpo_on_two_nodes_raises_the_reward_and_resumes_after_a_kill(tmp_path: Path) -> None:
    """Killed after its first checkpoint, the restarted gang resumes from it and finishes; over the run the mean
    reward of the last logs is well above the first log's (a random policy names the answer one time in 47 words),
    and both rewards are recorded with their own means."""
    out = tmp_path / "out"
    cfg = grpo_config(out)
    done, logs = killed_after_a_checkpoint(run_gang(tmp_path, cfg), out, 40)
    before = [h["reward"] for h in logs if "reward" in h]

    for node in run_gang(tmp_path, cfg, attempt=1):
        assert node.wait(RUN_TIMEOUT) == 0, node.log()
    result = read_json(out / "result.json")
    assert result["resumed_from_step"] == done and result["steps"] == 40 and result["world_size"] == 2
    grpo = result["grpo"]
    assert grpo["prompts"] == "conversational" and grpo["num_generations"] == 8 and grpo["loss_type"] == "dapo"
    assert set(grpo["rewards"]) == {"format", "correct"}
    history = grpo["history"]
    assert history and all(h["step"] > done for h in history), history  # this attempt's logs
    tail = history[-3:]
    late = sum(h["reward"] for h in tail) / len(tail)
    assert before and late > before[0] + 0.5, (before, history)
    assert all(set(h["rewards"]) == {"format", "correct"} for h in history), history
    assert sum(h["rewards"]["format"] for h in tail) / len(tail) > 0.5, history
    assert grpo["rollout_tokens"] > 0 and grpo["rollout_tokens_per_second"] > 0, grpo
    assert result["samples"] > 0 and result["tokens"] > result["samples"], result  # prompts and completions counted


BAD = [
    ({"rewards": []}, "training.grpo.rewards"),
    ({"rewards": [{"type": "regex"}]}, "training.grpo.rewards[0].pattern"),
    ({"rewards": [{"type": "regex", "pattern": "([a-z"}]}, "training.grpo.rewards[0].pattern"),
    ({"rewards": [{"type": "exactMatch"}]}, "training.grpo.rewards[0].column"),
    ({"rewards": [{"type": "python", "function": "os.path:join"}, {"type": "bogus"}]}, "training.grpo.rewards.1.type"),
    ({"numGenerations": 1, "rewards": REWARDS}, "training.grpo.numGenerations"),
    ({"rewards": [{"type": "exactMatch", "column": "completions"}]}, "training.grpo.rewards[0].column"),
    ({"rewards": [{"type": "regex", "name": "a", "pattern": "x"}, {"type": "length", "name": "a", "maxTokens": 2}]},
     "training.grpo.rewards[1].name"),
]  # fmt: skip


@pytest.mark.parametrize(("grpo", "field"), BAD, ids=[b[1] + f"-{i}" for i, b in enumerate(BAD)])
def test_a_bad_grpo_setting_is_refused_naming_the_field(tmp_path: Path, grpo: dict[str, Any], field: str) -> None:
    from finetune_trainer.config import parse_config
    from finetune_trainer.errors import ConfigError

    cfg = grpo_config(tmp_path / "out")
    cfg["training"]["grpo"] = {"numGenerations": 4, **grpo}
    with pytest.raises(ConfigError) as refused:
        parse_config(cfg)
    assert refused.value.field == field, refused.value


@pytest.mark.parametrize(
    ("training", "field"),
    [
        ({"sharding": "fsdp"}, "training.sharding"),
        ({"packing": True}, "training.packing"),
        ({"extraArgs": {"steps_per_generation": 2}}, "training.extraArgs.steps_per_generation"),
        ({"extraArgs": {"trust_remote_code": True}}, "training.extraArgs.trust_remote_code"),
    ],
    ids=["fsdp", "packing", "steps-per-generation", "remote-code"],
)
def test_a_training_setting_grpo_cannot_run_is_refused(tmp_path: Path, training: dict[str, Any], field: str) -> None:
    from finetune_trainer.config import parse_config
    from finetune_trainer.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        parse_config(grpo_config(tmp_path / "out", training=training))
    assert refused.value.field == field, refused.value


def test_a_reward_column_missing_from_the_data_is_refused(tmp_path: Path) -> None:
    cfg = grpo_config(tmp_path / "out")
    cfg["training"]["grpo"]["rewards"] = [{"type": "numericMatch", "column": "score"}]
    refused = refused_rows(cfg)
    assert refused.field == "training.grpo.rewards[0].column" and "'score'" in str(refused), refused


def test_a_python_reward_from_outside_the_image_exits_78(tmp_path: Path) -> None:
    """A module found on a path the job could bring (here: a directory on PYTHONPATH, as a mounted volume would be)
    is refused before any worker starts, naming the field; so is a batch that is not whole groups."""
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "my_rewards.py").write_text(
        "def score(prompts, completions, **kw):\n    return [1.0] * len(completions)\n"
    )
    cfg = grpo_config(tmp_path / "out")
    cfg["training"]["grpo"]["rewards"] = [{"type": "python", "function": "my_rewards:score"}]
    node = Node(
        tmp_path, cfg, extra_env={"PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")])}
    )
    assert node.wait(RUN_TIMEOUT) == 78, node.log()
    message = (node.termination() or {}).get("message", "")
    assert "training.grpo.rewards[0].function" in message and "not installed in this image" in message, message

    cfg = grpo_config(tmp_path / "out2", training={"perDeviceBatchSize": 3})
    node = Node(tmp_path / "b", cfg)
    assert node.wait(RUN_TIMEOUT) == 78, node.log()
    assert "training.grpo.numGenerations" in (node.termination() or {}).get("message", "")


def test_finding_a_python_reward_runs_no_code_from_outside_the_image(tmp_path: Path, monkeypatch: Any) -> None:
    """A package on a path a job could write to (the working directory is the first entry of sys.path under
    ``python -m``) is never imported, not even its parent package's __init__ while the module is looked up; an
    async function of the image stays async under the job's name (TRL awaits it)."""
    import asyncio

    from finetune_trainer import rewards
    from finetune_trainer.config import Reward
    from finetune_trainer.errors import ConfigError

    marker = tmp_path / "ran"
    (tmp_path / "planted").mkdir()
    (tmp_path / "planted" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (tmp_path / "planted" / "scores.py").write_text("def score(prompts, completions, **kw):\n    return [1.0]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as refused:
        rewards.python_function(Reward("python", "p", function="planted.scores:score"), "f")
    assert not marker.exists() and "not installed in this image" in str(refused.value), refused.value

    async def judged(prompts: list[Any], completions: list[Any], **kw: Any) -> list[float]:
        return [0.5 for _ in completions]

    wrapped = rewards._named(judged)
    assert asyncio.iscoroutinefunction(wrapped) and asyncio.run(wrapped([], ["a"])) == [0.5]


def test_built_in_rewards_score_by_hand() -> None:
    """Each kind against scores worked out by hand, on plain and conversational completions."""
    from finetune_trainer import rewards
    from finetune_trainer.config import Reward

    answer = [{"role": "assistant", "content": " Positive "}]
    completions = ["positive", "negative", [*answer], "the answer is 1,204.0", "no number"]
    refs = ["positive", "positive", "positive", "1204", "3"]
    exact = rewards.exact_match(Reward("exactMatch", "e", column="answer"))
    assert exact([], completions, answer=refs) == [1.0, 0.0, 0.0, 0.0, 0.0]
    folded = rewards.exact_match(Reward("exactMatch", "e", column="answer", case_sensitive=False))
    assert folded([], completions, answer=refs) == [1.0, 0.0, 1.0, 0.0, 0.0]
    numeric = rewards.numeric_match(Reward("numericMatch", "n", column="answer", tolerance=0.01))
    assert numeric([], completions, answer=refs) == [0.0, 0.0, 0.0, 1.0, 0.0]
    # the last number: a range's hyphen is no minus sign, commas group thousands only, GSM8K's "#### 72" is 72
    said = ["from 2023-2024", "lists 1,2,3", "x = -3.5.", "so 1,000,000", "no"]
    assert numeric([], said, answer=["2024", "3", "-3.5", "1000000", "#### 0"]) == [1.0, 1.0, 1.0, 1.0, 0.0]
    fmt = rewards.regex(Reward("regex", "r", pattern="^(positive|negative)$"))
    assert fmt([], completions) == [1.0, 1.0, 0.0, 0.0, 0.0]
    short = rewards.length(Reward("length", "l", max_tokens=4))
    assert short([], completions[:3], completion_ids=[[1] * 2, [1] * 6, [1] * 8]) == [0.0, -0.5, -1.0]
