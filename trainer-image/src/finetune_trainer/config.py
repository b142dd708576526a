"""The config contract: parse the operator's JSON once into typed, frozen objects.

Validation order: ``configVersion`` (a newer major is refused), then the JSON Schema in ``config.schema.json``
(the same file the operator's tests validate the builder's output against), then cross-field rules. Every error is
a :class:`ConfigError` naming the field and the fix.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

from finetune_trainer.errors import ConfigError

log = logging.getLogger(__name__)

CONFIG_VERSION = "1.6"
# the contract this trainer implements; a newer minor is read leniently (its new fields ignored)
SUPPORTED_MAJOR, SUPPORTED_MINOR = (int(part) for part in CONFIG_VERSION.split("."))
DEFAULT_CONFIG_PATH = "/etc/finetune/config.json"
CONFIG_DIGEST_ENV = "FINETUNE_CONFIG_SHA256"  # the operator's digest of the file it wrote (immutable pod env)
CONFIG_SETTLE_SECONDS = 120.0  # the launcher waits this long for the kubelet to bring a changed file up to date

Task = Literal[
    "sequence-classification", "token-classification", "question-answering", "causal-lm", "seq2seq", "dpo", "grpo"
]
SUPPORTED_TASKS = ("sequence-classification", "causal-lm", "dpo", "grpo")
Acceleration = Literal["auto", "ort", "compile", "none"]
Precision = Literal["auto", "bf16", "fp16", "fp32"]
FORMAT_BY_EXTENSION = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}


@dataclass(frozen=True)
class JobRef:
    name: str
    namespace: str


@dataclass(frozen=True)
class ModelConfig:
    name: str | None = None
    path: str | None = None
    revision: str | None = None
    init_from_config: bool = False
    trust_remote_code: bool = False

    @property
    def source(self) -> str:
        """Where to load from: the local path wins over the Hub id."""
        return self.path or self.name or ""


@dataclass(frozen=True)
class DatasetConfig:
    text_field: str
    name: str | None = None
    config: str | None = None
    split: str = "train"
    eval_split: str | None = None
    path: str | None = None
    format: str | None = None
    text_pair_field: str | None = None
    label_field: str | None = None
    messages_field: str | None = None  # chat data (causal-lm)
    prompt_field: str | None = None  # prompt/completion data (causal-lm), with completion_field
    completion_field: str | None = None
    chosen_field: str | None = None  # preference data (dpo), with prompt_field and rejected_field
    rejected_field: str | None = None
    prompts_only: bool = False  # grpo: prompts (with prompt_field), the model writes the completions

    @property
    def sft_format(self) -> str | None:
        """'chat', 'prompt-completion', or None for plain text (and for preference data and GRPO's prompts, which
        are not SFT)."""
        if self.chosen_field or self.prompts_only:
            return None
        if self.messages_field:
            return "chat"
        if self.prompt_field or self.completion_field:
            return "prompt-completion"
        return None

    def resolved_format(self) -> str:
        if self.format:
            return self.format
        assert self.path is not None
        if os.path.isdir(self.path):
            for name in sorted(os.listdir(self.path)):
                stem, ext = os.path.splitext(name)
                if stem == self.split and ext in FORMAT_BY_EXTENSION:
                    return FORMAT_BY_EXTENSION[ext]
            raise ConfigError(
                "dataset.path",
                f"directory {self.path!r} has no {self.split}.jsonl/.csv/.parquet file for split {self.split!r}",
            )
        ext = os.path.splitext(self.path)[1].lower()
        if ext not in FORMAT_BY_EXTENSION:
            raise ConfigError(
                "dataset.format", f"cannot tell the format of {self.path!r} from its extension; set spec.dataset.format"
            )
        return FORMAT_BY_EXTENSION[ext]

    def split_file(self, split: str) -> str:
        """The file holding ``split`` for a local dataset: the file itself, or ``<dir>/<split>.<ext>``."""
        assert self.path is not None
        if not os.path.isdir(self.path):
            return self.path
        fmt = self.resolved_format()
        exts = [e for e, f in FORMAT_BY_EXTENSION.items() if f == fmt]
        for ext in exts:
            candidate = os.path.join(self.path, split + ext)
            if os.path.exists(candidate):
                return candidate
        raise ConfigError("dataset.path", f"no file for split {split!r} in {self.path!r} (expected {split}{exts[0]})")


@dataclass(frozen=True)
class LoraConfig:
    r: int
    alpha: int = 16
    dropout: float = 0.05
    target_modules: tuple[str, ...] = ()
    quantization: str | None = None  # "4bit": QLoRA (NF4 base via bitsandbytes, CUDA only)
    merge: bool = False  # merge the adapter into the base at the end


@dataclass(frozen=True)
class DpoConfig:
    beta: float = 0.1  # how far the policy may move from the reference (TRL's DPOConfig.beta)
    loss_type: str = "sigmoid"


@dataclass(frozen=True)
class Reward:
    """One of GRPO's reward functions (``finetune_trainer.rewards``): its kind, the name its metrics carry, its weight
    in the sum, and the settings its kind reads."""

    type: str  # exactMatch, numericMatch, regex, length, python
    name: str
    weight: float = 1.0
    column: str | None = None  # exactMatch, numericMatch: the reference column
    case_sensitive: bool = True  # exactMatch
    tolerance: float = 1e-6  # numericMatch
    pattern: str | None = None  # regex
    max_tokens: int | None = None  # length
    function: str | None = None  # python: "package.module:callable", in the image
    model: str | None = None  # rewardModel: a sequence-classification model's directory (safetensors)


@dataclass(frozen=True)
class GrpoConfig:
    num_generations: int = 4  # completions per prompt: the group each one's advantage is relative to
    max_completion_length: int = 64
    temperature: float = 1.0
    loss_type: str = "dapo"
    beta: float = 0.0  # KL to the reference model; 0: no reference model (TRL's default)
    rewards: tuple[Reward, ...] = ()


@dataclass(frozen=True)
class EvaluationConfig:
    """The evaluation stage after training (``evaluation``; ``finetune_trainer.scoring``): greedy completions of a
    held-out split's prompts, scored by GRPO's matchers."""

    split: str
    prompt_field: str
    metrics: tuple[Reward, ...]
    max_samples: int = 200
    max_new_tokens: int = 64
    batch_size: int = 8


@dataclass(frozen=True)
class TrainingConfig:
    epochs: float | None = None
    max_steps: int | None = None
    per_device_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-5
    max_seq_length: int = 512
    precision: Precision = "auto"
    seed: int = 42
    checkpoint_every_steps: int = 500
    keep_checkpoints: int = 2
    eval_strategy: str = "no"
    eval_every_steps: int | None = None
    extra_args: dict[str, Any] = field(default_factory=dict)
    lora: LoraConfig | None = None
    packing: bool = False
    loss_on: str = "completion"  # chat / prompt-completion: assistant turns or completions only, or "all"
    sharding: str = "none"  # "fsdp": fully sharded data parallel
    activation_checkpointing: bool = False
    dpo: DpoConfig = field(default_factory=DpoConfig)
    grpo: GrpoConfig = field(default_factory=GrpoConfig)
    kernels: str = "auto"  # "liger": Liger's Triton kernels (CUDA only); "auto": where a measurement says so
    global_batch_size: int | None = None  # elastic: the global batch asked at full size (the accumulation is adapted)


@dataclass(frozen=True)
class HubPush:
    repo: str
    private: bool = True
    endpoint: str | None = None


@dataclass(frozen=True)
class S3Export:
    uri: str
    endpoint: str | None = None
    region: str | None = None

    @property
    def bucket(self) -> str:
        return self.uri[len("s3://") :].split("/", 1)[0]

    @property
    def prefix(self) -> str:
        """The key prefix, without surrounding slashes ('' for the bucket's root)."""
        rest = self.uri[len("s3://") :].split("/", 1)
        return rest[1].strip("/") if len(rest) > 1 else ""


@dataclass(frozen=True)
class Config:
    config_version: str
    job: JobRef
    task: Task
    model: ModelConfig
    dataset: DatasetConfig
    training: TrainingConfig
    output_path: str
    acceleration: Acceleration = "auto"
    metrics_port: int = 9400
    preflight_timeout_seconds: int = 300
    cache_path: str | None = None  # the shared Hugging Face cache (HF_HOME); None: each pod downloads on its own
    push_to_hub: HubPush | None = None
    s3: S3Export | None = None
    evaluation: EvaluationConfig | None = None

    @property
    def checkpoints_dir(self) -> str:
        return os.path.join(self.output_path, "checkpoints")

    @property
    def model_dir(self) -> str:
        return os.path.join(self.output_path, "model")

    @property
    def adapter_dir(self) -> str:
        """Where the adapter goes when it is merged into model/."""
        return os.path.join(self.output_path, "adapter")

    @property
    def result_path(self) -> str:
        return os.path.join(self.output_path, "result.json")


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The JSON Schema of the config contract (``config.schema.json`` next to this module)."""
    text = resources.files("finetune_trainer").joinpath("config.schema.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def schema_path() -> str:
    return str(resources.files("finetune_trainer").joinpath("config.schema.json"))


def managed_training_args() -> dict[str, str]:
    """TrainingArguments fields the trainer sets from typed fields (name → the FineTuneJob field that sets it), so
    extraArgs may not: ``x-managedBy`` of ``training.extraArgs`` in the schema, the one list both the trainer and the
    operator (its copy of this schema) read."""
    return dict(schema()["properties"]["training"]["properties"]["extraArgs"]["x-managedBy"])


def _relaxed(node: Any) -> Any:
    """The schema without ``additionalProperties: false``: accepts fields added by a newer minor version."""
    if isinstance(node, dict):
        return {k: _relaxed(v) for k, v in node.items() if not (k == "additionalProperties" and v is False)}
    if isinstance(node, list):
        return [_relaxed(v) for v in node]
    return node


def _field_path(path: Any) -> str:
    parts = [str(p) for p in path]
    return ".".join(parts) if parts else "(root)"


def check_version(raw: dict[str, Any]) -> tuple[int, int]:
    version = raw.get("configVersion")
    if not isinstance(version, str) or version.count(".") != 1 or not all(p.isdigit() for p in version.split(".")):
        raise ConfigError(
            "configVersion", f"must be a 'major.minor' string such as {CONFIG_VERSION!r}, got {version!r}"
        )
    major, minor = (int(p) for p in version.split("."))
    if major > SUPPORTED_MAJOR:
        raise ConfigError(
            "configVersion",
            f"config version {version} is newer than this trainer supports ({SUPPORTED_MAJOR}.x); "
            "use a trainer image that matches the operator's version",
        )
    if major < SUPPORTED_MAJOR:
        raise ConfigError(
            "configVersion", f"config version {version} is older than {SUPPORTED_MAJOR}.x; upgrade the operator"
        )
    return major, minor


def validate_schema(raw: dict[str, Any]) -> None:
    """Validate against the JSON Schema; a newer minor version is validated without rejecting unknown fields."""
    import jsonschema

    _, minor = check_version(raw)
    the_schema = schema() if minor <= SUPPORTED_MINOR else _relaxed(copy.deepcopy(schema()))
    validator = jsonschema.Draft202012Validator(the_schema)
    errors = sorted(validator.iter_errors(raw), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        err = errors[0]
        where = _field_path(err.absolute_path)
        raise ConfigError(where, err.message)


def model_head(task: str) -> str:
    """The head a task trains, which decides the model class and the adapter's task type: dpo and grpo tune a causal
    LM."""
    return "causal-lm" if task in ("dpo", "grpo") else task


def _check_preference_fields(d: dict[str, Any]) -> None:
    """Task dpo reads one prompt, one chosen and one rejected column; chat and completion columns are not its."""
    for key in ("messagesField", "completionField"):
        if d.get(key):
            raise ConfigError(
                f"dataset.{key}",
                "task dpo reads preference data (spec.dataset.promptField, chosenField, rejectedField); "
                f"remove spec.dataset.{key}",
            )
    for key in ("promptField", "chosenField", "rejectedField"):
        if not d.get(key):
            raise ConfigError(f"dataset.{key}", f"task dpo needs a {key[:-5]} column; set spec.dataset.{key}")


def _check_prompt_fields(d: dict[str, Any]) -> None:
    """Task grpo reads prompts (and the columns its rewards name); the model writes the completions."""
    for key in ("messagesField", "completionField"):
        if d.get(key):
            raise ConfigError(
                f"dataset.{key}",
                f"task grpo reads prompts (spec.dataset.promptField) and generates the completions; remove "
                f"spec.dataset.{key}",
            )


def _rewards(raw: Any) -> tuple[Reward, ...]:
    """Rewards (or the evaluation's metrics, the same shape) as the contract writes them, defaults filled in."""
    each, out = Reward("", ""), []
    for i, r in enumerate(raw or ()):
        kind = r["type"]
        out.append(
            Reward(
                type=kind,
                name=r.get("name") or f"{kind}-{i}",
                weight=float(r.get("weight", each.weight)),
                column=r.get("column"),
                case_sensitive=r.get("caseSensitive", each.case_sensitive) is not False,
                tolerance=float(r.get("tolerance", each.tolerance)),
                pattern=r.get("pattern"),
                max_tokens=r.get("maxTokens"),
                function=r.get("function"),
                model=r.get("model"),
            )
        )
    return tuple(out)


def _grpo(g: dict[str, Any]) -> GrpoConfig:
    """``training.grpo``, what it leaves out at the dataclasses' defaults."""
    at = GrpoConfig()
    rewards = _rewards(g.get("rewards"))
    return GrpoConfig(
        num_generations=g.get("numGenerations", at.num_generations),
        max_completion_length=g.get("maxCompletionLength", at.max_completion_length),
        temperature=float(g.get("temperature", at.temperature)),
        loss_type=g.get("lossType", at.loss_type),
        beta=float(g.get("beta", at.beta)),
        rewards=rewards,
    )


def grpo_schema() -> dict[str, Any]:
    """The contract's ``training.grpo``: besides the fields, what each reward kind needs (``x-requires``), the
    column names TRL keeps for itself (``x-reserved``) and the arguments GRPO sets itself (``x-fixedArgs``), which
    the operator reads from its copy too."""
    found: dict[str, Any] = schema()["properties"]["training"]["properties"]["grpo"]
    return found


def _check_scorers(
    scorers: tuple[Reward, ...], field: str, noun: str, prompt_column: str | None, reserved: list[str]
) -> None:
    """The rules GRPO's rewards and the evaluation's metrics share: what each kind needs, one name each, a reference
    column that is neither the prompt column nor a name the function is given its own arguments under, a valid
    regex."""
    needs = grpo_schema()["properties"]["rewards"]["items"]["x-requires"]
    attrs = {
        "column": "column",
        "pattern": "pattern",
        "maxTokens": "max_tokens",
        "function": "function",
        "model": "model",
    }
    names = set()
    for i, r in enumerate(scorers):
        where = f"{field}[{i}]"
        key = needs[r.type]
        if getattr(r, attrs[key]) in (None, ""):
            raise ConfigError(f"{where}.{key}", f"a {r.type} {noun} needs {key}; set spec.{where}.{key}")
        if r.name in names:
            raise ConfigError(f"{where}.name", f"{noun} name {r.name!r} is used twice; give each {noun} its own name")
        names.add(r.name)
        if r.column is not None and r.column == prompt_column:
            raise ConfigError(f"{where}.column", f"{r.column!r} is the prompt column; name the reference answer's")
        if r.column in reserved:
            raise ConfigError(
                f"{where}.column",
                f"{r.column!r} is a name the {noun} functions are given their own arguments under "
                f"({', '.join(reserved)}); rename the column",
            )
        if r.pattern is not None:
            try:
                re.compile(r.pattern)
            except re.error as e:
                raise ConfigError(f"{where}.pattern", f"not a valid regular expression: {e}") from None


def evaluation_schema() -> dict[str, Any]:
    """The contract's ``evaluation``: its metrics are reward items (``x-kinds`` the kinds that score, ``x-unused``
    the reward settings that mean nothing there)."""
    found: dict[str, Any] = schema()["properties"]["evaluation"]
    return found


EVALUATED_TASKS = ("causal-lm", "dpo", "grpo")  # the tasks whose model writes text


def _evaluation(
    raw: dict[str, Any], task: str, training: TrainingConfig, dataset: DatasetConfig, acceleration: str
) -> EvaluationConfig:
    """``evaluation``, defaults filled in, with the rules the schema cannot say (the operator enforces the same)."""
    contract = evaluation_schema()
    props, metrics_schema = contract["properties"], contract["properties"]["metrics"]
    if task not in EVALUATED_TASKS:
        raise ConfigError(
            "evaluation",
            f"the evaluation stage scores generated text: it is for tasks {', '.join(EVALUATED_TASKS)}, not {task!r} "
            "(which reports its evaluation split's metrics: spec.training.evaluation)",
        )
    if training.sharding == "fsdp":
        raise ConfigError(
            "evaluation", "the evaluation stage generates on rank 0 with the whole model: not with FSDP; remove it"
        )
    if acceleration == "ort":
        raise ConfigError("evaluation", "the evaluation stage runs on the default trainer image, not with ort")
    for i, r in enumerate(raw.get("metrics") or ()):
        if r["type"] not in metrics_schema["x-kinds"]:
            raise ConfigError(
                f"evaluation.metrics[{i}].type",
                f"{r['type']!r} is not a matcher; use one of {', '.join(metrics_schema['x-kinds'])}",
            )
        for key in metrics_schema["x-unused"]:
            if r.get(key) is not None:
                raise ConfigError(f"evaluation.metrics[{i}].{key}", f"{key} is for GRPO's rewards; remove it")
    prompt = raw.get("promptField") or dataset.prompt_field or "prompt"
    metrics = _rewards(raw["metrics"])
    _check_scorers(metrics, "evaluation.metrics", "metric", prompt, metrics_schema["x-reserved"])
    return EvaluationConfig(
        split=raw["split"],
        prompt_field=prompt,
        metrics=metrics,
        max_samples=raw.get("maxSamples", props["maxSamples"]["default"]),
        max_new_tokens=raw.get("maxNewTokens", props["maxNewTokens"]["default"]),
        batch_size=raw.get("batchSize", props["batchSize"]["default"]),
    )


def _check_grpo(training: TrainingConfig, dataset: DatasetConfig) -> None:
    """The cross-field rules of task grpo that the schema cannot say (the operator enforces the same before any pod)."""
    g = training.grpo
    if not g.rewards:
        raise ConfigError(
            "training.grpo.rewards", "task grpo needs at least one reward; set spec.training.grpo.rewards"
        )
    contract = grpo_schema()
    reserved = contract["properties"]["rewards"]["items"]["properties"]["column"]["x-reserved"]
    _check_scorers(g.rewards, "training.grpo.rewards", "reward", dataset.prompt_field, reserved)
    if training.packing:
        raise ConfigError("training.packing", "packing is for task causal-lm, not 'grpo'")
    for key, why in contract["x-fixedArgs"].items():
        if key in training.extra_args:
            raise ConfigError(f"training.extraArgs.{key}", f"task grpo sets {key!r} itself: {why}; remove it")
    if dataset.eval_split:
        raise ConfigError(
            "dataset.evalSplit", "task grpo does not evaluate during training yet; remove spec.dataset.evalSplit"
        )
    if training.sharding == "fsdp":
        raise ConfigError(
            "training.sharding", "task grpo trains with DDP: generation under FSDP is not supported yet; remove it"
        )


def parse_config(raw: dict[str, Any]) -> Config:
    """Validate ``raw`` (the parsed JSON) and return the typed config, or raise :class:`ConfigError`."""
    if not isinstance(raw, dict):
        raise ConfigError("(root)", "the config must be a JSON object")
    validate_schema(raw)

    task = raw["task"]
    if task not in SUPPORTED_TASKS:
        raise ConfigError(
            "task",
            f"task {task!r} is not supported by this trainer image (supported: {', '.join(SUPPORTED_TASKS)}); "
            "set spec.task to one of them",
        )

    m = raw["model"]
    model = ModelConfig(
        name=m.get("name"),
        path=m.get("path"),
        revision=m.get("revision"),
        init_from_config=bool(m.get("initFromConfig", False)),
        trust_remote_code=bool(m.get("trustRemoteCode", False)),
    )
    if not model.name and not model.path:
        raise ConfigError("model", "set spec.model.name (a Hub id) or spec.model.path (a local directory)")

    d = raw["dataset"]
    dataset = DatasetConfig(
        name=d.get("name"),
        config=d.get("config"),
        split=d.get("split") or "train",
        eval_split=d.get("evalSplit"),
        path=d.get("path"),
        format=d.get("format"),
        text_field=d["textField"],
        text_pair_field=d.get("textPairField"),
        label_field=d.get("labelField"),
        messages_field=d.get("messagesField"),
        prompt_field=d.get("promptField") or ("prompt" if task == "grpo" else None),
        completion_field=d.get("completionField"),
        chosen_field=d.get("chosenField") if task == "dpo" else None,
        rejected_field=d.get("rejectedField") if task == "dpo" else None,
        prompts_only=task == "grpo",
    )
    if bool(dataset.name) == bool(dataset.path):
        raise ConfigError(
            "dataset",
            "set exactly one of spec.dataset.name (a Hub id) and spec.dataset.path (a local file or directory)",
        )
    if task == "dpo":
        _check_preference_fields(d)
    elif task == "grpo":
        _check_prompt_fields(d)
    elif d.get("chosenField") or d.get("rejectedField"):
        key = "chosenField" if d.get("chosenField") else "rejectedField"
        raise ConfigError(f"dataset.{key}", f"preference data (chosen/rejected) is for task dpo, not {task!r}")
    if dataset.sft_format and task != "causal-lm":
        key = "messagesField" if dataset.messages_field else "promptField"
        raise ConfigError(f"dataset.{key}", f"chat and prompt/completion data are for task causal-lm, not {task!r}")
    if dataset.messages_field and (dataset.prompt_field or dataset.completion_field):
        raise ConfigError(
            "dataset.messagesField",
            "set either spec.dataset.messagesField (chat) or "
            "spec.dataset.promptField and completionField (prompt/completion), not both",
        )
    if task not in ("dpo", "grpo") and bool(dataset.prompt_field) != bool(dataset.completion_field):
        missing = "completionField" if dataset.prompt_field else "promptField"
        raise ConfigError(
            f"dataset.{missing}", f"prompt/completion data needs both columns; set spec.dataset.{missing}"
        )
    if task == "sequence-classification" and not dataset.label_field:
        raise ConfigError(
            "dataset.labelField", "sequence-classification needs a label column; set spec.dataset.labelField"
        )

    t = raw["training"]
    ev, dpo, grpo = t.get("evaluation") or {}, t.get("dpo") or {}, t.get("grpo") or {}
    lora_raw = t.get("lora")
    lora = None
    if lora_raw:
        lora = LoraConfig(
            r=lora_raw["r"],
            alpha=lora_raw.get("alpha", 16),
            dropout=lora_raw.get("dropout", 0.05),
            target_modules=tuple(lora_raw.get("targetModules") or ()),
            quantization=lora_raw.get("quantization"),
            merge=bool(lora_raw.get("merge") or False),
        )
    training = TrainingConfig(
        epochs=t.get("epochs"),
        max_steps=t.get("maxSteps"),
        per_device_batch_size=t.get("perDeviceBatchSize", 8),
        gradient_accumulation_steps=t.get("gradientAccumulationSteps", 1),
        global_batch_size=t.get("globalBatchSize"),
        learning_rate=t.get("learningRate", 5e-5),
        max_seq_length=t.get("maxSeqLength", 512),
        precision=t.get("precision", "auto"),
        seed=t.get("seed", 42),
        checkpoint_every_steps=t.get("checkpointEverySteps", 500),
        keep_checkpoints=t.get("keepCheckpoints", 2),
        eval_strategy=ev.get("strategy", "no"),
        eval_every_steps=ev.get("everySteps"),
        extra_args=dict(t.get("extraArgs") or {}),
        lora=lora,
        packing=bool(t.get("packing") or False),
        loss_on=t.get("lossOn") or "completion",
        sharding=t.get("sharding") or "none",
        activation_checkpointing=bool(t.get("activationCheckpointing") or False),
        kernels=t.get("kernels") or "auto",
        dpo=DpoConfig(beta=dpo.get("beta", 0.1), loss_type=dpo.get("lossType", "sigmoid")),
        grpo=_grpo(grpo),
    )
    if training.kernels == "liger" and raw.get("acceleration") == "ort":
        raise ConfigError(
            "training.kernels", "Liger's kernels run on the default trainer image, not with acceleration ort"
        )
    if dpo and task != "dpo":
        raise ConfigError("training.dpo", f"DPO settings are for task dpo, not {task!r}")
    if task in ("dpo", "grpo") and raw.get("acceleration") == "ort":
        raise ConfigError(
            "acceleration", f"task {task} runs on the default trainer image; acceleration ort cannot run it"
        )
    if grpo and task != "grpo":
        raise ConfigError("training.grpo", f"GRPO settings are for task grpo, not {task!r}")
    if task == "grpo":
        _check_grpo(training, dataset)
        if training.grpo.beta > 0 and model.init_from_config and lora is None:
            raise ConfigError(
                "training.grpo.beta",
                "a KL term needs the reference model, which TRL reloads from the model's weights, and a model built "
                "from its config has none; set beta to 0, train LoRA adapters (the reference is the base), or start "
                "from saved weights",
            )
    if training.packing and task != "causal-lm":
        raise ConfigError("training.packing", f"packing is for task causal-lm, not {task!r}")
    if (training.epochs is None) == (training.max_steps is None):
        raise ConfigError("training", "set exactly one of spec.training.epochs and spec.training.maxSteps")
    if training.eval_strategy != "no" and not dataset.eval_split:
        raise ConfigError(
            "training.evaluation.strategy",
            f"strategy {training.eval_strategy!r} needs an evaluation split; set spec.dataset.evalSplit",
        )
    if training.eval_strategy == "steps" and not training.eval_every_steps:
        raise ConfigError(
            "training.evaluation.everySteps", "strategy 'steps' needs spec.training.evaluation.everySteps"
        )
    managed = managed_training_args()
    for key in training.extra_args:
        if key in managed:
            raise ConfigError(
                f"training.extraArgs.{key}",
                f"{key!r} is set by the trainer from {managed[key]} and cannot be overridden in extraArgs",
            )

    if training.sharding == "fsdp" and lora is not None and lora.quantization:
        raise ConfigError(
            "training.sharding",
            "QLoRA (lora.quantization) and FSDP do not combine in this trainer; "
            "drop spec.training.sharding (QLoRA fits 70B-class models on one node) or the quantization",
        )

    out = raw["output"]
    hub, s3 = out.get("pushToHub"), out.get("s3")
    metrics = raw.get("metrics") or {}
    preflight = raw.get("preflight") or {}
    cache = raw.get("cache") or {}
    return Config(
        config_version=raw["configVersion"],
        job=JobRef(name=raw["job"]["name"], namespace=raw["job"]["namespace"]),
        task=task,
        model=model,
        dataset=dataset,
        training=training,
        output_path=out["path"],
        acceleration=raw.get("acceleration", "auto"),
        metrics_port=metrics.get("port", 9400),
        preflight_timeout_seconds=preflight.get("timeoutSeconds", 300),
        cache_path=cache.get("path"),
        push_to_hub=HubPush(
            repo=hub["repo"],
            private=hub.get("private") is not False,
            endpoint=hub.get("endpoint"),
        )
        if hub
        else None,
        s3=S3Export(uri=s3["uri"], endpoint=s3.get("endpoint"), region=s3.get("region")) if s3 else None,
        evaluation=_evaluation(raw["evaluation"], task, training, dataset, raw.get("acceleration", "auto"))
        if raw.get("evaluation")
        else None,
    )


def load_config(path: str | None = None, *, settle_seconds: float = 0.0) -> Config:
    """Read and parse the config file (``$FINETUNE_CONFIG``, default ``/etc/finetune/config.json``).

    With ``FINETUNE_CONFIG_SHA256`` in the environment (the operator puts it in every pod: immutable once the pod
    exists), the file must have that digest: the ConfigMap lives in the tenant's namespace, where the ``edit`` role may
    rewrite it after admission. A file that differs is read again every second for ``settle_seconds`` (the launcher:
    the kubelet may still be writing the attempt's new config into the volume), then refused."""
    path = path or os.environ.get("FINETUNE_CONFIG", DEFAULT_CONFIG_PATH)
    deadline = time.monotonic() + settle_seconds
    warned = False
    while True:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise ConfigError("FINETUNE_CONFIG", f"config file {path!r} does not exist") from None
        wrong = _not_admitted(path, data)
        if wrong is None:
            break
        if time.monotonic() >= deadline:
            raise ConfigError("FINETUNE_CONFIG", wrong)
        if not warned:
            log.warning("%s; reading it again for up to %.0fs", wrong, settle_seconds)
            warned = True
        time.sleep(1.0)
    try:
        raw = json.loads(data)
    except ValueError as e:
        raise ConfigError("FINETUNE_CONFIG", f"config file {path!r} is not valid JSON: {e}") from None
    return parse_config(raw)


def _not_admitted(path: str, data: bytes) -> str | None:
    """Why ``data`` is not the config the operator admitted (``FINETUNE_CONFIG_SHA256``), or None."""
    want = os.environ.get(CONFIG_DIGEST_ENV, "").strip().lower()
    if not want:
        return None
    got = hashlib.sha256(data).hexdigest()
    if got == want:
        return None
    return (
        f"config file {path!r} is not the one the operator admitted for this attempt (sha256 {got[:16]}, admitted "
        f"{want[:16]}): the job's ConfigMap was changed after the operator wrote it. The trainer config is the "
        "operator's to write: change the FineTuneJob instead, or re-create it"
    )
