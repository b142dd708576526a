"""Task grpo's settings (``spec.training.grpo``): parsed and checked before any pod, with the trainer's own rules.

The kinds of reward, the loss types and the defaults are read from the trainer's config contract (the operator's
copy, contract.schema.json), so the two sides cannot drift; the rewards go to the trainer's config as the user wrote
them, with their defaults filled in. What the trainer checks again at start (a python reward's module must be
installed in the image) is only shaped here: the operator cannot see inside an image.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

_SCHEMA: dict[str, Any] = json.loads(
    resources.files("finetune_operator").joinpath("contract.schema.json").read_text(encoding="utf-8")
)["properties"]["training"]["properties"]["grpo"]
SETTINGS: dict[str, Any] = _SCHEMA["properties"]
REWARD: dict[str, Any] = SETTINGS["rewards"]["items"]
LOSS_TYPES: tuple[str, ...] = tuple(SETTINGS["lossType"]["enum"])
REWARD_TYPES: tuple[str, ...] = tuple(REWARD["properties"]["type"]["enum"])
MAX_REWARDS: int = SETTINGS["rewards"]["maxItems"]
NEEDS: dict[str, str] = REWARD["x-requires"]  # what each kind needs besides its type
RESERVED_COLUMNS: tuple[str, ...] = tuple(REWARD["properties"]["column"]["x-reserved"])  # TRL's own reward arguments
FIXED_ARGS: dict[str, str] = _SCHEMA["x-fixedArgs"]  # extraArgs task grpo sets itself, and why
NAME_RE = re.compile(REWARD["properties"]["name"]["pattern"])
FUNCTION_RE = re.compile(REWARD["properties"]["function"]["pattern"])

Add = Callable[[str, str], None]


@dataclass(frozen=True)
class Grpo:
    num_generations: int = SETTINGS["numGenerations"]["default"]
    max_completion_length: int = SETTINGS["maxCompletionLength"]["default"]
    temperature: float = SETTINGS["temperature"]["default"]
    loss_type: str = SETTINGS["lossType"]["default"]
    beta: float = SETTINGS["beta"]["default"]
    rewards: tuple[dict[str, Any], ...] = ()  # as the trainer's config takes them, defaults filled in

    def config(self) -> dict[str, Any]:
        """``training.grpo`` of the trainer's config."""
        return {
            "numGenerations": self.num_generations,
            "maxCompletionLength": self.max_completion_length,
            "temperature": self.temperature,
            "lossType": self.loss_type,
            "beta": self.beta,
            "rewards": [dict(r) for r in self.rewards],
        }


def _number(d: dict[str, Any], key: str, where: str, kind: type, add: Add, *, least: float, strict: bool) -> Any:
    value = d.get(key, SETTINGS.get(key, {}).get("default"))
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        add(where, f"must be {'an integer' if kind is int else 'a number'}, got {value!r}")
        return SETTINGS.get(key, {}).get("default")
    if value < least or (strict and value == least):
        add(where, f"must be {'greater than' if strict else 'at least'} {least}, got {value}")
    return kind(value)


@dataclass(frozen=True)
class Scorer:
    """What a reward-shaped item is called in messages, the settings it takes, and the column names its functions
    are given their own arguments under: GRPO's rewards, or the evaluation stage's metrics."""

    noun: str = "reward"
    settings: tuple[str, ...] = tuple(REWARD["properties"])
    reserved: tuple[str, ...] = RESERVED_COLUMNS


def reward(r: Any, f: str, i: int, add: Add, of: Scorer = Scorer()) -> dict[str, Any] | None:
    """One reward (or an item of the same shape: ``of``) at field ``f``, defaults filled in."""
    reserved = of.reserved
    if not isinstance(r, dict):
        add(f, f"must be an object with a type ({', '.join(REWARD_TYPES)}), got {r!r}")
        return None
    unknown = sorted(set(r) - set(of.settings))
    if unknown:
        add(f"{f}.{unknown[0]}", f"is not a {of.noun} setting (known: {', '.join(of.settings)})")
    kind = r.get("type")
    if kind not in REWARD_TYPES:
        add(f"{f}.type", f"must be one of {', '.join(REWARD_TYPES)}, got {kind!r}")
        return None
    need = NEEDS[kind]
    if r.get(need) in (None, ""):
        add(f"{f}.{need}", f"a {kind} {of.noun} needs {need}; set it")
    out = {"type": kind, "name": r.get("name") or f"{kind}-{i}", "weight": r.get("weight", 1.0)}
    if not isinstance(out["name"], str) or not NAME_RE.match(out["name"]):
        add(f"{f}.name", f"must match {NAME_RE.pattern} (its metrics carry it), got {out['name']!r}")
    if isinstance(out["weight"], bool) or not isinstance(out["weight"], int | float):
        add(f"{f}.weight", f"must be a number, got {out['weight']!r}")
    for key in ("column", "caseSensitive", "tolerance", "pattern", "maxTokens", "function", "model"):
        if r.get(key) is not None:
            out[key] = r[key]
    if (
        kind == "rewardModel"
        and r.get("model") is not None
        and not (isinstance(r["model"], str) and r["model"].startswith("/") and len(r["model"]) > 1)
    ):
        add(f"{f}.model", f"must be the model's directory as an absolute path in the pod, got {r['model']!r}")
    if r.get("column") in reserved:
        add(
            f"{f}.column",
            f"{r['column']!r} is a name the functions are given their own arguments under ({', '.join(reserved)}); "
            "rename the column",
        )
    if kind == "regex" and isinstance(r.get("pattern"), str):
        try:
            re.compile(r["pattern"])
        except re.error as e:
            add(f"{f}.pattern", f"is not a valid regular expression: {e}")
    if kind == "length" and r.get("maxTokens") is not None:
        _number(r, "maxTokens", f"{f}.maxTokens", int, add, least=1, strict=False)
    if kind == "numericMatch" and r.get("tolerance") is not None:
        _number(r, "tolerance", f"{f}.tolerance", float, add, least=0, strict=False)
    if kind == "python" and isinstance(r.get("function"), str) and not FUNCTION_RE.match(r["function"]):
        add(f"{f}.function", f"must be package.module:function, a module installed in the image; got {r['function']!r}")
    return out


def parse(g: dict[str, Any], add: Add) -> Grpo:
    """``spec.training.grpo`` (an object), every error added with its field."""
    f = "spec.training.grpo"
    unknown = sorted(set(g) - set(SETTINGS))
    if unknown:
        add(f"{f}.{unknown[0]}", f"is not a GRPO setting (known: {', '.join(SETTINGS)})")
    loss_type = g.get("lossType", SETTINGS["lossType"]["default"])
    if loss_type not in LOSS_TYPES:
        add(f"{f}.lossType", f"must be one of {', '.join(LOSS_TYPES)}, got {loss_type!r}")
    raw = g.get("rewards") or []
    if not isinstance(raw, list):
        add(f"{f}.rewards", f"must be a list of rewards, got {raw!r}")
        raw = []
    if len(raw) > MAX_REWARDS:
        add(f"{f}.rewards", f"holds {len(raw)} rewards; at most {MAX_REWARDS}")
    rewards = [r for r in (reward(r, f"{f}.rewards[{i}]", i, add) for i, r in enumerate(raw)) if r is not None]
    seen: set[str] = set()
    for i, r in enumerate(rewards):
        if r["name"] in seen:
            add(f"{f}.rewards[{i}].name", f"{r['name']!r} is used twice; give each reward its own name")
        seen.add(r["name"])
    return Grpo(
        num_generations=_number(g, "numGenerations", f"{f}.numGenerations", int, add, least=2, strict=False),
        max_completion_length=_number(
            g, "maxCompletionLength", f"{f}.maxCompletionLength", int, add, least=1, strict=False
        ),
        temperature=_number(g, "temperature", f"{f}.temperature", float, add, least=0, strict=True),
        loss_type=loss_type,
        beta=_number(g, "beta", f"{f}.beta", float, add, least=0, strict=False),
        rewards=tuple(rewards),
    )


def problems(spec: Any) -> list[tuple[str, str]]:
    """(field, message) for a grpo job (a parsed ``JobSpec``) the trainer would refuse, or could not run exactly."""
    t, g, found = spec.training, spec.training.grpo, []
    if not g.rewards:
        found.append(("spec.training.grpo.rewards", "task grpo needs at least one reward (exactMatch, regex, ...)"))
    prompt = spec.dataset.prompt_field
    for i, r in enumerate(g.rewards):
        if r.get("column") == prompt:
            found.append((f"spec.training.grpo.rewards[{i}].column", f"{prompt!r} is the prompt column"))
    per_step = t.per_device_batch_size * spec.procs_per_node * spec.nodes * t.gradient_accumulation_steps
    if per_step % g.num_generations:
        found.append(
            (
                "spec.training.grpo.numGenerations",
                f"each step generates perDeviceBatchSize x processes x nodes x gradientAccumulationSteps = "
                f"{per_step} completions, not a whole number of groups of {g.num_generations}; make it a multiple",
            )
        )
    for key, why in FIXED_ARGS.items():
        if key in t.extra_args:
            found.append((f"spec.training.extraArgs.{key}", f"task grpo sets it itself: {why}; remove it"))
    if spec.elastic is not None:
        found.append(
            (
                "spec.elastic",
                "task grpo does not resize: its groups of generations must divide every size's batch, and that is "
                "not kept yet; remove spec.elastic",
            )
        )
    if spec.dataset.eval_split is not None or t.evaluation.strategy != "no":
        found.append(("spec.dataset.evalSplit", "task grpo does not evaluate during training yet; remove it"))
    if spec.acceleration == "ort":
        found.append(("spec.acceleration", "task grpo runs on the default trainer image, not with ort"))
    if t.sharding == "fsdp":
        found.append(
            (
                "spec.training.sharding",
                "task grpo trains with data parallelism (DDP): generation under FSDP is not supported yet; remove "
                "spec.training.sharding, or train LoRA adapters to fit a larger model",
            )
        )
    if g.beta > 0 and spec.model.init_from_config and t.lora is None:
        found.append(
            (
                "spec.training.grpo.beta",
                "a KL term needs the reference model, which is reloaded from the model's weights, and "
                "spec.model.initFromConfig has none; set beta to 0, train LoRA adapters, or start from saved weights",
            )
        )
    return found
