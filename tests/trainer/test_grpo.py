"""GRPO (task grpo, TRL's GRPOTrainer) for real: the tiny Llama-architecture model built from its config
(examples/tiny/llama-chat) learns the toy sentiment task from rewards alone (examples/tiny/prompts: a review as the
prompt, the right answer in a reference column), generating its completions with transformers on two nodes under
torchrun (gloo), as on two pods.

Checked from the trainer's own records (result.json, the checkpoints, the Prometheus page): the mean reward rises
against the first logged steps, each reward's own mean and the rollout rate are recorded, a gang killed after a
checkpoint resumes it, and every bad reward or setting is refused (exit 78) naming the field.
"""

from __future__ import annotations

import json
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
    stage = {**EVALUATION, "maxSamples": 40, "maxNewTokens": 1}  # as trained: one word
    cfg = grpo_config(out, configVersion="1.6", evaluation=stage)
    # a reward model scores every completion on every rank too, with no weight in what is learned
    judge = {"type": "rewardModel", "name": "judge", "model": str(tiny_reward_model(tmp_path / "rm")), "weight": 0}
    cfg["training"]["grpo"]["rewards"] = [*REWARDS, judge]
    done, logs = killed_after_a_checkpoint(run_gang(tmp_path, cfg), out, 40)
    before = [h["reward"] for h in logs if "reward" in h]

    gang = run_gang(tmp_path, cfg, attempt=1)
    for node in gang:
        assert node.wait(RUN_TIMEOUT) == 0, node.log()
    result = read_json(out / "result.json")
    # the evaluation stage, on rank 0 after the model was saved: the trained policy's greedy answers to 40 held-out
    # prompts, each score the share a hand count of the written samples finds
    assert (out / "model" / "config.json").exists()
    evaluation = result["evaluation"]
    assert evaluation["state"] == "Succeeded" and evaluation["samples"] == 40, evaluation
    samples = [json.loads(line) for line in (out / "evaluation" / "samples.jsonl").read_text().splitlines()]
    answers = [json.loads(line)["answer"] for line in (TINY / "prompts" / "eval.jsonl").read_text().splitlines()]
    assert [s["references"]["answer"] for s in samples] == answers[:40]
    correct = sum(s["completion"].strip().casefold() == a.casefold() for s, a in zip(samples, answers, strict=False))
    assert evaluation["scores"]["correct"] == correct / 40, (evaluation, samples)
    assert evaluation["scores"]["format"] > 0.5, (evaluation, samples)  # a random policy: one word in 47
    summary = json.loads(gang[1].termination_log.read_text())["result"]["evaluation"]
    assert summary["state"] == "Succeeded" and summary["scores"] == evaluation["scores"], summary
    assert result["resumed_from_step"] == done and result["steps"] == 40 and result["world_size"] == 2
    grpo = result["grpo"]
    assert grpo["prompts"] == "conversational" and grpo["num_generations"] == 8 and grpo["loss_type"] == "dapo"
    assert set(grpo["rewards"]) == {"format", "correct", "judge"}
    history = grpo["history"]
    assert history and all(h["step"] > done for h in history), history  # this attempt's logs
    tail = history[-3:]
    late = sum(h["reward"] for h in tail) / len(tail)
    assert before and late > before[0] + 0.5, (before, history)
    assert all(set(h["rewards"]) == {"format", "correct", "judge"} for h in history), history
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


EVALUATION = {
    "split": "eval",
    "maxSamples": 6,
    "maxNewTokens": 3,
    "batchSize": 4,
    "metrics": [{"type": "regex", "name": "format", "pattern": "^(positive|negative)$"},
                {"type": "exactMatch", "name": "correct", "column": "answer", "caseSensitive": False}],
}  # fmt: skip


def _evaluation_setup(tmp_path: Path, **evaluation: Any) -> tuple[Any, Any, Any, Any]:
    """The parsed config of a grpo job with an evaluation stage, the tiny model built from its config, its
    tokenizer, and a metrics registry with the stage's gauges."""
    import torch
    from finetune_trainer.config import parse_config
    from finetune_trainer.metrics import TrainerMetrics
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = grpo_config(tmp_path / "out", evaluation={**EVALUATION, **evaluation})
    config = parse_config(cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY / "llama-chat"))
    tokenizer = AutoTokenizer.from_pretrained(TINY / "llama-chat")
    metrics = TrainerMetrics(namespace="ns", job="j", node_rank=0, evaluation=True)
    return config, model, tokenizer, metrics


def test_the_evaluation_stage_scores_greedy_completions_as_a_hand_count_does(tmp_path: Path) -> None:
    """The stage generates for the split's first maxSamples prompts (conversational, through the chat template) and
    each metric's score is the share of completions it matches, counted here by hand from the samples it wrote; the
    gauges say the same. Greedy decoding: the same model gives the same completions twice."""
    import re

    from finetune_trainer import scoring
    from finetune_trainer.callbacks import StopFlag

    config, model, tokenizer, metrics = _evaluation_setup(tmp_path)
    record = scoring.run(config, model, tokenizer, StopFlag(), metrics)
    assert record["state"] == "Succeeded" and record["samples"] == 6 and record["split"] == "eval", record
    samples = [json.loads(line) for line in (tmp_path / "out" / scoring.SAMPLES_FILE).read_text().splitlines()]
    rows = [json.loads(line) for line in (TINY / "prompts" / "eval.jsonl").read_text().splitlines()[:6]]
    assert [s["prompt"] for s in samples] == [r["prompt"] for r in rows]
    assert [s["references"]["answer"] for s in samples] == [r["answer"] for r in rows]
    fmt = [float(re.search("^(positive|negative)$", s["completion"], re.DOTALL) is not None) for s in samples]
    correct = [float(s["completion"].strip().casefold() == s["references"]["answer"].casefold()) for s in samples]
    assert [s["scores"] for s in samples] == [{"format": f, "correct": c} for f, c in zip(fmt, correct, strict=True)]
    assert record["scores"] == {"format": sum(fmt) / 6, "correct": sum(correct) / 6}
    assert all(0 <= s["completion_tokens"] <= 3 for s in samples), samples
    node = {"finetune_namespace": "ns", "finetune_job": "j", "node_rank": "0"}
    assert metrics.registry.get_sample_value("finetune_evaluation_samples", node) == 6
    score = metrics.registry.get_sample_value("finetune_evaluation_score", {**node, "metric": "correct"})
    assert score == record["scores"]["correct"]
    again = scoring.run(config, model, tokenizer, StopFlag(), metrics)
    assert again["scores"] == record["scores"]


def test_a_stopped_or_failing_evaluation_is_recorded_not_raised(tmp_path: Path) -> None:
    """SIGTERM before the first batch: state Stopped with the samples done. A metric that raises when called (a
    function of the image's that does not take a reward's arguments): state Failed, naming the error."""
    from finetune_trainer import scoring
    from finetune_trainer.callbacks import StopFlag

    config, model, tokenizer, metrics = _evaluation_setup(tmp_path)
    stop = StopFlag()
    stop.requested = True
    stopped = scoring.run_safely(config, model, tokenizer, stop, metrics)
    assert stopped["state"] == "Stopped" and stopped["samples"] == 0 and "after 0 of 6" in stopped["message"]
    broken = [{"type": "python", "name": "broken", "function": "finetune_trainer.rewards:last_number"}]
    config, model, tokenizer, metrics = _evaluation_setup(tmp_path, metrics=broken)
    failed = scoring.run_safely(config, model, tokenizer, StopFlag(), metrics)
    assert failed["state"] == "Failed" and "TypeError" in failed["message"] and failed["split"] == "eval", failed
    with pytest.raises(ValueError, match="mixes plain and conversational"):
        scoring.prompt_kind(["a review", [{"role": "user", "content": "another"}]])
    with pytest.raises(ValueError, match="row 1"):
        scoring.prompt_kind(["a review", None])


EVAL_BAD = [
    ({"metrics": [{"type": "length", "maxTokens": 3}]}, "evaluation.metrics[0].type"),
    ({"metrics": [{"type": "regex", "pattern": "x", "weight": 2}]}, "evaluation.metrics[0].weight"),
    ({"metrics": [{"type": "exactMatch"}]}, "evaluation.metrics[0].column"),
    ({"metrics": [{"type": "exactMatch", "column": "prompt"}]}, "evaluation.metrics[0].column"),
    ({"metrics": [{"type": "regex", "name": "a", "pattern": "x"}, {"type": "regex", "name": "a", "pattern": "y"}]},
     "evaluation.metrics[1].name"),
    ({"metrics": [{"type": "regex", "pattern": "([a-z"}]}, "evaluation.metrics[0].pattern"),
]  # fmt: skip


@pytest.mark.parametrize(("evaluation", "field"), EVAL_BAD, ids=[b[1] + f"-{i}" for i, b in enumerate(EVAL_BAD)])
def test_a_bad_evaluation_setting_is_refused_naming_the_field(
    tmp_path: Path, evaluation: dict[str, Any], field: str
) -> None:
    from finetune_trainer.config import parse_config
    from finetune_trainer.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        parse_config(grpo_config(tmp_path / "out", evaluation={**EVALUATION, **evaluation}))
    assert refused.value.field == field, refused.value


def test_the_launcher_refuses_what_the_stage_would_fail_on_before_training(tmp_path: Path) -> None:
    """Before any worker: a key the 1.6 contract does not have (read strictly: it is this trainer's own version), a
    python metric whose module is not in the image, and a local split file that does not exist, each naming its
    field."""
    from finetune_trainer import launcher
    from finetune_trainer.config import parse_config
    from finetune_trainer.env import RunEnv
    from finetune_trainer.errors import ConfigError

    run = RunEnv(nnodes=1, nproc_per_node=1, node_rank=0, master_addr="127.0.0.1", master_port=1, job_name="j",
                 namespace="n", attempt=0)  # fmt: skip
    cases = [
        ({"topK": 5}, "evaluation"),
        ({"metrics": [{"type": "python", "function": "not_installed_anywhere.mod:score"}]},
         "evaluation.metrics[0].function"),
        ({"split": "holdout"}, "evaluation.split"),
    ]  # fmt: skip
    for over, field in cases:
        cfg = grpo_config(tmp_path / "out", configVersion="1.6", evaluation={**EVALUATION, **over})
        with pytest.raises(ConfigError) as refused:
            launcher.validate(parse_config(cfg), run, cuda_available=False)
        assert refused.value.field == field, (over, refused.value)


def test_an_evaluation_for_a_task_without_text_or_a_missing_column_is_refused(tmp_path: Path) -> None:
    """Sequence classification writes no text (exit 78 from the config); a metric's column missing from the
    evaluation split is found by the launcher's column check, before any worker."""
    from finetune_trainer.config import parse_config
    from finetune_trainer.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        parse_config(tiny_config(tmp_path / "out", evaluation=EVALUATION))
    assert refused.value.field == "evaluation" and "causal-lm" in str(refused.value)
    from finetune_trainer import data

    cfg = grpo_config(
        tmp_path / "out", evaluation={**EVALUATION, "metrics": [{"type": "exactMatch", "column": "gold"}]}
    )
    with pytest.raises(ConfigError) as refused:
        data.validate_local_dataset(parse_config(cfg))
    missing = refused.value
    assert missing.field == "evaluation.metrics[0].column" and "'gold'" in str(missing), missing


def tiny_reward_model(where: Path, *, safetensors: bool = True) -> Path:
    """A reward model as users bring one: a one-label sequence-classification head on the tiny Llama-architecture
    model (random weights: its scores mean nothing, their bookkeeping does), saved with its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(1)
    model = AutoModelForSequenceClassification.from_config(
        AutoConfig.from_pretrained(TINY / "llama-chat", num_labels=1)
    )
    model.save_pretrained(where)
    if not safetensors:  # a pickled checkpoint, as older tools wrote them
        (where / "model.safetensors").unlink()
        torch.save(model.state_dict(), where / "pytorch_model.bin")
    AutoTokenizer.from_pretrained(TINY / "llama-chat").save_pretrained(where)
    return where


def _with_adapter(where: Path) -> Path:
    """A reward model's directory that also holds a PEFT adapter's config (which would load a base from elsewhere)."""
    tiny_reward_model(where)
    (where / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "someone/else"}))
    return where


def test_a_reward_model_scores_each_completion_as_it_would_alone(tmp_path: Path) -> None:
    """Scores in a padded batch equal each row's score on its own (the head reads each row's last real token), a
    conversation is scored through the reward model's chat template, and only a saved model with safetensors
    weights is accepted, naming the field."""
    from finetune_trainer import rewards
    from finetune_trainer.config import Reward
    from finetune_trainer.errors import ConfigError

    judge = Reward("rewardModel", "judge", model=str(tiny_reward_model(tmp_path / "rm")))
    [score] = rewards.scorers((judge,), "training.grpo.rewards")
    prompts = [[{"role": "user", "content": "a great film"}], [{"role": "user", "content": "dull and far too long"}]]
    completions = ["positive", [{"role": "assistant", "content": "negative, without a doubt"}]]
    together = score(prompts=prompts, completions=completions)
    alone = [score(prompts=[p], completions=[c])[0] for p, c in zip(prompts, completions, strict=True)]
    assert len(together) == 2 and together == pytest.approx(alone, abs=1e-5), (together, alone)
    assert together[0] != together[1]
    plain = score(prompts=["a great film. "], completions=["positive"])
    assert plain != pytest.approx(together[:1], abs=1e-9)  # the conversation went through the template
    for bad, words in (
        (tmp_path / "missing", "not a directory"),
        (tiny_reward_model(tmp_path / "pickled", safetensors=False), "safetensors"),
        (TINY / "prompts", "no config.json"),
        (_with_adapter(tmp_path / "adapter"), "holds an adapter"),
    ):
        with pytest.raises(ConfigError) as refused:
            rewards.scorers((Reward("rewardModel", "judge", model=str(bad)),), "training.grpo.rewards")
        assert refused.value.field == "training.grpo.rewards[0].model" and words in str(refused.value)
