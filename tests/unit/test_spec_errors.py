"""What a tenant gets wrong in a FineTuneJob is refused before any pod exists, all at once, each error naming its
field: wrong types, paths that would slip past the mount checks, and ``training.extraArgs`` that the trainer image's
TrainingArguments would refuse only after scheduling and an image pull."""

from __future__ import annotations

from typing import Any

import pytest
from finetune_operator import client, guardrails
from finetune_operator.builders import JobRef
from finetune_operator.settings import Settings
from finetune_operator.spec import TRAINING_ARGS, SpecError, normal_path, parse_spec

from tests.unit.factories import base_spec

pytestmark = pytest.mark.unit


def errors_of(spec: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as e:
        parse_spec(spec)
    return dict(e.value.errors)


def test_every_error_is_reported_at_once() -> None:
    """Three mistakes in one manifest: three errors in one answer, in the order of the fields."""
    found = errors_of(
        base_spec(
            nodes="two",
            training={"learningRate": "fast", "extraArgs": {"warmup_ratios": 0.1}},
            env=[{"name": "MASTER_ADDR", "value": "x"}],
        )
    )
    assert list(found) == [
        "spec.training.learningRate",
        "spec.env[0].name",
        "spec.nodes",
        "spec.training.extraArgs.warmup_ratios",
    ]
    assert found["spec.training.learningRate"] == "must be a number, got 'fast'"
    assert found["spec.nodes"] == "must be a whole number, got 'two'"


@pytest.mark.parametrize(
    ("spec", "field", "text"),
    [
        (base_spec(training={"maxSteps": 2.5}), "spec.training.maxSteps", "a whole number"),
        (base_spec(training={"packing": "yes"}), "spec.training.packing", "true or false"),
        (base_spec(training={"lora": {"alpha": 8}}), "spec.training.lora.r", "is required"),
        (base_spec(suspend="no"), "spec.suspend", "true or false"),
        (base_spec(training="fast"), "spec.training", "must be an object"),
        (base_spec(resources={"limits": {"memory": "lots"}}), "spec.resources.limits['memory']", "quantity"),
    ],
    ids=["float-steps", "string-bool", "lora-without-rank", "string-suspend", "training-not-object", "quantity"],
)
def test_wrong_types_name_the_field(spec, field, text) -> None:  # type: ignore[no-untyped-def]
    assert text in errors_of(spec)[field]


# Strings the container runtime cleans into a reserved or image path, which a prefix check on the raw string misses.
BYPASSES = ["//usr", "/data/../usr", "/./opt/venv", "//etc/finetune", "/opt/./venv", "/data/", "/data//x", "/", "data"]


@pytest.mark.parametrize("path", BYPASSES)
def test_mount_paths_not_in_normal_form_are_refused(path: str) -> None:
    assert not normal_path(path)
    found = errors_of(base_spec(podTemplate={"volumes": [{"name": "v", "mountPath": path, "emptyDir": {}}]}))
    assert "normal form" in found["spec.podTemplate.volumes[0].mountPath"]


def test_normal_mounts_pass_and_the_image_pin_still_holds() -> None:
    """A normal path outside the image's code passes; /usr under an image allowlist is still refused."""
    settings = Settings(allowed_image_prefixes=("registry.corp/ml",), default_image="registry.corp/ml/t:1")
    ok = parse_spec(base_spec(podTemplate={"volumes": [{"name": "v", "mountPath": "/data/in", "emptyDir": {}}]}))
    assert guardrails.check(JobRef("ft", "ns", "u"), ok, settings) is None
    usr = parse_spec(base_spec(podTemplate={"volumes": [{"name": "v", "mountPath": "/usr/lib", "emptyDir": {}}]}))
    violation = guardrails.check(JobRef("ft", "ns", "u"), usr, settings)
    assert violation is not None and violation.message.startswith("spec.podTemplate.volumes[0].mountPath")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"lr_scheduler_typ": "cosine"}, "did you mean lr_scheduler_type"),
        ({"max_grad_norm": "big"}, "must be a number, got 'big'"),
        ({"max_grad_norm": True}, "must be a number"),
        ({"label_names": "labels"}, "must be a list (or null)"),
        ({"deepspeed": "/etc/passwd"}, "DeepSpeed is not installed in the default trainer image"),
        ({"report_to": ["wandb"]}, "wandb: the default trainer image"),
        ({"report_to": "mlflow"}, "mlflow: the default trainer image"),
        ({"lr_scheduler_type": "cosine_annealing"}, "'cosine_annealing' is not a value the default trainer image"),
        ({"optim": "adamw_fast"}, "'adamw_fast' is not a value the default trainer image (transformers 5.24.0)"),
        ({"torch_compile_mode": "fastest"}, "one of: default, lite, max-autotune"),
        ({"log_level": "loud"}, "'loud' is not a value"),
        ({"hub_strategy": "every-save"}, "(did you mean every_save"),
    ],
    ids=[
        "unknown-name",
        "wrong-type",
        "bool-for-number",
        "string-for-list",
        "deepspeed",
        "report-to-list",
        "report-to-string",
        "unknown-scheduler",
        "unknown-optimizer",
        "compile-mode",
        "log-level",
        "strategy-typo",
    ],
)
def test_extra_args_are_checked_against_the_image(extra, message) -> None:  # type: ignore[no-untyped-def]
    found = errors_of(base_spec(training={"extraArgs": extra}))
    (key,) = extra
    assert message in found[f"spec.training.extraArgs.{key}"]


def test_extra_args_follow_the_stack_the_job_runs() -> None:
    """Each image has its own transformers: a field one has and the other lacks is judged by the job's image; a job
    with its own image is left to its trainer."""
    only_ort = sorted(set(TRAINING_ARGS["ort"]["fields"]) - set(TRAINING_ARGS["default"]["fields"]))
    assert only_ort, "the two stacks' TrainingArguments differ (transformers 4.x and 5.x)"
    sample = {"boolean": True, "integer": 1, "number": 1.0, "string": "x", "array": [], "object": {}, "null": None}
    kind = TRAINING_ARGS["ort"]["fields"][only_ort[0]]["type"][0]
    extra = {"training": {"extraArgs": {only_ort[0]: sample.get(kind)}}}
    assert f"spec.training.extraArgs.{only_ort[0]}" in errors_of(base_spec(**extra))
    parse_spec(base_spec(acceleration="ort", **extra))
    parse_spec(base_spec(image="registry.corp/ml/own:1", **extra))
    good = {
        "training": {
            "extraArgs": {
                "max_grad_norm": 1,
                "weight_decay": 0.01,
                "label_names": ["labels"],
                "report_to": "none",
                "lr_scheduler_type": "cosine",
            }
        }
    }
    parse_spec(base_spec(**good))
    parse_spec(base_spec(acceleration="ort", **good))


def test_the_condition_message_holds_every_error() -> None:
    """What becomes the InvalidSpec condition: every error, each with its field."""
    with pytest.raises(SpecError) as e:
        parse_spec(base_spec(nodes=0.5, training={"seed": "x"}))
    assert (
        str(e.value) == "spec.training.seed: must be a whole number, got 'x'; "
        "spec.nodes: must be a whole number, got 0.5"
    )


@pytest.mark.parametrize(
    "message, lines",
    [
        (
            "failed to create typed patch object (t/bad; finetune.dev/v1alpha1, Kind=FineTuneJob): "
            ".spec.training.maxStep: field not declared in schema",
            [".spec.training.maxStep: field not declared in schema"],
        ),
        (
            "failed to create typed patch object (t/bad; finetune.dev/v1alpha1, Kind=FineTuneJob): errors:\n"
            "  .spec.training.learningRate: expected numeric (int or float), got string\n"
            "  .spec.training.maxStep: field not declared in schema",
            [
                ".spec.training.learningRate: expected numeric (int or float), got string",
                ".spec.training.maxStep: field not declared in schema",
            ],
        ),
    ],
)
def test_server_side_apply_errors_become_one_line_per_field(message: str, lines: list[str]) -> None:
    """The API server's 500 for a manifest server-side apply cannot type names one field inline or lists several
    after "errors:"; `finetune validate` reports each as its own field, like the typed spec's errors."""
    assert client.typed_patch_errors(message) == lines
    assert client.merged_errors(["spec.training.learningRate: must be a number, got 'fast'"], lines) == [
        "spec.training.learningRate: must be a number, got 'fast'",
        lines[-1],
    ]


def test_a_field_server_side_apply_cannot_type_is_left_out_of_the_next_dry_run() -> None:
    """Server-side apply stops at the fields it cannot type; `finetune validate` drops those and dry-runs again, so the
    schema and CEL errors of the rest come in the same run. Only plain paths of map keys are dropped."""
    job = {"spec": {"nodes": 0, "training": {"learningRate": "fast", "maxSteps": 5}}}
    smaller = client.without_field(job, ".spec.training.learningRate: expected numeric (int or float), got string")
    assert smaller == {"spec": {"nodes": 0, "training": {"maxSteps": 5}}}
    assert job["spec"]["training"]["learningRate"] == "fast"  # the manifest itself is untouched
    assert client.without_field(job, '.spec.env[name="X"].value: expected string') is None
    assert client.without_field(job, ".spec.training.nothing: field not declared in schema") is None
    assert client.without_field(job, "not a field path at all") is None


def test_task_dpo_defaults_its_columns_and_settings() -> None:
    spec = parse_spec(base_spec(task="dpo", training={"maxSteps": 5}))
    d = spec.dataset
    assert (d.prompt_field, d.chosen_field, d.rejected_field) == ("prompt", "chosen", "rejected")
    assert spec.training.dpo is not None and (spec.training.dpo.beta, spec.training.dpo.loss_type) == (0.1, "sigmoid")
    assert parse_spec(base_spec(training={"maxSteps": 5})).training.dpo is None  # other tasks: no DPO settings


@pytest.mark.parametrize(
    ("over", "field", "words"),
    [
        ({"task": "dpo", "acceleration": "ort"}, "spec.acceleration", ["dpo", "ort"]),
        ({"task": "causal-lm", "training": {"maxSteps": 5, "dpo": {"beta": 0.2}}}, "spec.training.dpo", ["task dpo"]),
        (
            {"task": "dpo", "training": {"maxSteps": 5, "dpo": {"beta": 0}}},
            "spec.training.dpo.beta",
            ["greater than 0"],
        ),
        (
            {"task": "dpo", "training": {"maxSteps": 5, "dpo": {"lossType": "kto"}}},
            "spec.training.dpo.lossType",
            ["sigmoid", "'kto'"],
        ),
        ({"task": "dpo", "dataset": {"path": "/d", "messagesField": "m"}}, "spec.dataset.messagesField", ["pairs"]),
        ({"task": "dpo", "training": {"maxSteps": 5, "packing": True}}, "spec.training.packing", ["dpo"]),
        ({"task": "causal-lm", "dataset": {"path": "/d", "chosenField": "c"}}, "spec.dataset.chosenField", ["dpo"]),
    ],
    ids=["ort", "dpo-on-causal-lm", "beta", "loss-type", "chat-column", "packing", "chosen-on-causal-lm"],
)
def test_task_dpo_mistakes_name_their_field(over: dict[str, Any], field: str, words: list[str]) -> None:
    found = errors_of(base_spec(**over))
    assert field in found, found
    assert all(w in found[field] for w in words), found[field]


GRPO_REWARDS = [{"type": "regex", "pattern": "^(yes|no)$"}, {"type": "exactMatch", "name": "right", "column": "answer"}]


def grpo(**training: Any) -> dict[str, Any]:
    return {"maxSteps": 5, "perDeviceBatchSize": 4, **training}


def test_task_grpo_defaults_its_column_and_settings_and_writes_them_for_the_trainer() -> None:
    from finetune_operator.grpo import Grpo

    spec = parse_spec(base_spec(task="grpo", training=grpo(grpo={"rewards": GRPO_REWARDS})))
    assert spec.dataset.prompt_field == "prompt"
    g = spec.training.grpo
    assert g is not None and (g.num_generations, g.max_completion_length, g.loss_type, g.beta) == (4, 64, "dapo", 0)
    assert [r["name"] for r in g.rewards] == ["regex-0", "right"] and g.rewards[0]["weight"] == 1.0
    assert Grpo().config()["rewards"] == [] and parse_spec(base_spec()).training.grpo is None


@pytest.mark.parametrize(
    ("over", "field", "words"),
    [
        ({"training": grpo()}, "spec.training.grpo.rewards", ["at least one reward"]),
        ({"training": grpo(grpo={"rewards": [{"type": "regex"}]})}, "spec.training.grpo.rewards[0].pattern", ["needs"]),
        (
            {"training": grpo(grpo={"rewards": [{"type": "regex", "pattern": "(a"}]})},
            "spec.training.grpo.rewards[0].pattern",
            ["regular expression"],
        ),
        (
            {"training": grpo(grpo={"rewards": [{"type": "python", "function": "os.system('x')"}]})},
            "spec.training.grpo.rewards[0].function",
            ["package.module:function"],
        ),
        ({"training": grpo(grpo={"rewards": [{"type": "bleu"}]})}, "spec.training.grpo.rewards[0].type", ["regex"]),
        (
            {"training": grpo(grpo={"rewards": [*GRPO_REWARDS, {"type": "length", "name": "right", "maxTokens": 9}]})},
            "spec.training.grpo.rewards[2].name",
            ["twice"],
        ),
        (
            {"training": grpo(grpo={"numGenerations": 3, "rewards": GRPO_REWARDS})},
            "spec.training.grpo.numGenerations",
            ["4 completions", "groups of 3"],
        ),
        (
            {"training": grpo(grpo={"lossType": "ppo", "rewards": GRPO_REWARDS})},
            "spec.training.grpo.lossType",
            ["dapo", "'ppo'"],
        ),
        (
            {"training": grpo(grpo={"rewards": GRPO_REWARDS}), "nodes": 2, "elastic": {"minNodes": 1}},
            "spec.elastic",
            ["does not resize"],
        ),
        (
            {"training": grpo(grpo={"rewards": GRPO_REWARDS}), "dataset": {"path": "/d", "evalSplit": "eval"}},
            "spec.dataset.evalSplit",
            ["grpo"],
        ),
        ({"training": grpo(grpo={"rewards": GRPO_REWARDS}), "acceleration": "ort"}, "spec.acceleration", ["grpo"]),
        (
            {
                "training": grpo(grpo={"beta": 0.04, "rewards": GRPO_REWARDS}),
                "model": {"path": "/m", "initFromConfig": True},
            },
            "spec.training.grpo.beta",
            ["reference model"],
        ),
        (
            {"training": grpo(grpo={"rewards": GRPO_REWARDS}), "dataset": {"path": "/d", "completionField": "c"}},
            "spec.dataset.completionField",
            ["generates"],
        ),
        ({"task": "causal-lm", "training": grpo(grpo={"rewards": GRPO_REWARDS})}, "spec.training.grpo", ["task grpo"]),
        ({"training": grpo(sharding="fsdp", grpo={"rewards": GRPO_REWARDS})}, "spec.training.sharding", ["DDP"]),
        (
            {"training": grpo(grpo={"rewards": [{"type": "exactMatch", "column": "completions"}]})},
            "spec.training.grpo.rewards[0].column",
            ["own arguments", "trainer_state"],
        ),
        (
            {"training": grpo(grpo={"rewards": [{"type": "rewardModel"}]})},
            "spec.training.grpo.rewards[0].model",
            ["needs model"],
        ),
        (
            {"training": grpo(grpo={"rewards": [{"type": "rewardModel", "model": "models/rm"}]})},
            "spec.training.grpo.rewards[0].model",
            ["absolute path"],
        ),
        (
            {"training": grpo(extraArgs={"num_iterations": 2}, grpo={"rewards": GRPO_REWARDS})},
            "spec.training.extraArgs.num_iterations",
            ["grpo sets it"],
        ),
        (
            {"training": grpo(extraArgs={"trust_remote_code": True}, grpo={"rewards": GRPO_REWARDS})},
            "spec.training.extraArgs.trust_remote_code",
            ["spec.model.trustRemoteCode"],
        ),
    ],
    ids=[
        "no-reward",
        "regex-without-pattern",
        "bad-pattern",
        "python-not-a-name",
        "unknown-kind",
        "duplicate-name",
        "partial-groups",
        "loss-type",
        "elastic",
        "evaluation",
        "ort",
        "beta-without-weights",
        "completion-column",
        "grpo-on-causal-lm",
        "fsdp",
        "reserved-column",
        "reward-model-without-model",
        "reward-model-relative",
        "fixed-arg",
        "remote-code-through-extra-args",
    ],
)
def test_task_grpo_mistakes_name_their_field(over: dict[str, Any], field: str, words: list[str]) -> None:
    found = errors_of(base_spec(**{"task": "grpo", **over}))
    assert field in found, found
    assert all(w in found[field] for w in words), found[field]


STAGE = {"split": "test", "metrics": [{"type": "numericMatch", "name": "answer", "column": "answer"}]}


def test_the_evaluation_stage_defaults_its_settings_and_writes_them_for_the_trainer() -> None:
    """spec.evaluation as the trainer's config takes it: the contract's defaults, a metric's name, no weight."""
    from finetune_operator.builders import trainer_config

    data = {"path": "/d", "promptField": "q", "completionField": "answer"}
    spec = parse_spec(base_spec(task="causal-lm", evaluation=STAGE, dataset=data))
    written = trainer_config(JobRef("ft", "ns", "u"), spec)["evaluation"]
    assert written == {
        "split": "test",
        "promptField": None,
        "maxSamples": 200,
        "maxNewTokens": 64,
        "batchSize": 8,
        "metrics": [{"type": "numericMatch", "name": "answer", "column": "answer"}],
    }
    assert "evaluation" not in trainer_config(JobRef("ft", "ns", "u"), parse_spec(base_spec()))


@pytest.mark.parametrize(
    ("over", "field", "words"),
    [
        ({"task": "sequence-classification"}, "spec.evaluation", ["causal-lm, dpo, grpo", "spec.training.evaluation"]),
        ({"acceleration": "ort"}, "spec.evaluation", ["ort"]),
        ({"training": {"maxSteps": 5, "sharding": "fsdp"}}, "spec.evaluation", ["FSDP"]),
        ({"evaluation": {"metrics": STAGE["metrics"]}}, "spec.evaluation.split", ["required"]),
        ({"evaluation": {"split": "test"}}, "spec.evaluation.metrics", ["at least one"]),
        ({"evaluation": {**STAGE, "maxSamples": 0}}, "spec.evaluation.maxSamples", ["between 1 and 100000"]),
        ({"evaluation": {**STAGE, "topK": 5}}, "spec.evaluation.topK", ["not an evaluation setting"]),
        ({"evaluation": {**STAGE, "metrics": [{"type": "length", "maxTokens": 4}]}}, "spec.evaluation.metrics[0].type",
         ["a matcher"]),
        ({"evaluation": {**STAGE, "metrics": [{"type": "regex", "pattern": "x", "weight": 2}]}},
         "spec.evaluation.metrics[0].weight", ["GRPO's rewards"]),
        ({"evaluation": {**STAGE, "metrics": [{"type": "regex", "pattern": "(x"}]}},
         "spec.evaluation.metrics[0].pattern", ["regular expression"]),
        ({"evaluation": {**STAGE, "metrics": [{"type": "exactMatch", "column": "completions"}]}},
         "spec.evaluation.metrics[0].column", ["own arguments"]),
        ({"evaluation": {**STAGE, "metrics": [{"type": "exactMatch", "column": "q"}]}},
         "spec.evaluation.metrics[0].column", ["prompt column"]),
        ({"evaluation": {**STAGE, "metrics": [*STAGE["metrics"], *STAGE["metrics"]]}},
         "spec.evaluation.metrics[1].name", ["used twice"]),
        ({"evaluation": {**STAGE, "metrics": [{"type": "python", "function": "exec('x')"}]}},
         "spec.evaluation.metrics[0].function", ["package.module:function"]),
        ({"evaluation": {**STAGE, "metrics": [{"type": "exactMatch"}]}}, "spec.evaluation.metrics[0].column",
         ["exactMatch metric needs column"]),
        ({"evaluation": {**STAGE, "metrics": [{"type": "regex", "pattern": "x", "ref": "a"}]}},
         "spec.evaluation.metrics[0].ref", ["not a metric setting", "column"]),
    ],
    ids=["task", "ort", "fsdp", "no-split", "no-metric", "samples", "unknown", "length", "weight", "regex",
         "reserved", "prompt-column", "duplicate", "python", "needs", "unknown-metric-key"],
)  # fmt: skip
def test_evaluation_stage_mistakes_name_their_field(over: dict[str, Any], field: str, words: list[str]) -> None:
    job = {"task": "causal-lm", "evaluation": STAGE, "dataset": {"path": "/d", "promptField": "q",
                                                                  "completionField": "answer"}, **over}  # fmt: skip
    found = errors_of(base_spec(**job))
    assert field in found, found
    assert all(w in found[field] for w in words), found[field]


def test_a_job_cannot_turn_the_node_role_back_on_through_its_env() -> None:
    """The operator sets AWS_EC2_METADATA_DISABLED unless spec.output.s3.allowInstanceMetadata opts in; a job's own
    value would override it (the node's IAM role, shared by every job on the node)."""
    found = errors_of(base_spec(env=[{"name": "AWS_EC2_METADATA_DISABLED", "value": "false"}]))
    assert "allowInstanceMetadata" in found["spec.env[0].name"], found


@pytest.mark.parametrize(
    ("over", "words"),
    [
        (
            {"task": "causal-lm", "training": {"maxSteps": 5, "kernels": "liger"}},
            ["Triton GPU kernels", "nvidia.com/gpu"],
        ),
        (
            {
                "task": "causal-lm",
                "training": {"maxSteps": 5, "kernels": "liger"},
                "resources": {"limits": {"nvidia.com/gpu": 1}},
                "acceleration": "ort",
            },
            ["acceleration ort"],
        ),
        ({"training": {"maxSteps": 5, "kernels": "unsloth"}}, ["auto, liger, none", "'unsloth'"]),
    ],
    ids=["liger-on-cpu", "liger-with-ort", "unknown"],
)
def test_kernels_that_cannot_run_are_refused_before_any_pod(over: dict[str, Any], words: list[str]) -> None:
    found = errors_of(base_spec(**over))
    assert all(w in found["spec.training.kernels"] for w in words), found


def test_kernels_default_to_auto_and_liger_is_accepted_on_gpus() -> None:
    assert parse_spec(base_spec(training={"maxSteps": 5})).training.kernels == "auto"
    gpu = base_spec(
        task="causal-lm", training={"maxSteps": 5, "kernels": "liger"}, resources={"limits": {"nvidia.com/gpu": 1}}
    )
    assert parse_spec(gpu).training.kernels == "liger"
    classify = base_spec(training={"maxSteps": 5, "kernels": "liger"}, resources={"limits": {"nvidia.com/gpu": 1}})
    assert "language-model heads" in errors_of(classify)["spec.training.kernels"]  # Liger patches causal LMs only
