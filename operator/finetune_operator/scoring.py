"""The evaluation stage (``spec.evaluation``): after training, rank 0 generates a completion for each prompt of a
held-out split with the final model and scores it with the matchers GRPO's rewards use. Parsed and checked here
before any pod, with the trainer's own rules: the settings, their defaults, the kinds that score (``x-kinds``) and
the reward settings that mean nothing here (``x-unused``) are read from the trainer's config contract (the operator's
copy), and each metric is checked as a reward is (finetune_operator.grpo).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from finetune_operator import grpo
from finetune_operator.grpo import Add

_SCHEMA: dict[str, Any] = json.loads(
    resources.files("finetune_operator").joinpath("contract.schema.json").read_text(encoding="utf-8")
)["properties"]["evaluation"]
SETTINGS: dict[str, Any] = _SCHEMA["properties"]
KINDS: tuple[str, ...] = tuple(SETTINGS["metrics"]["x-kinds"])
UNUSED: tuple[str, ...] = tuple(SETTINGS["metrics"]["x-unused"])
RESERVED_COLUMNS: tuple[str, ...] = tuple(SETTINGS["metrics"]["x-reserved"])  # the metrics' own arguments
METRIC = grpo.Scorer("metric", tuple(k for k in grpo.REWARD["properties"] if k not in UNUSED), RESERVED_COLUMNS)
MAX_METRICS: int = SETTINGS["metrics"]["maxItems"]
TASKS = ("causal-lm", "dpo", "grpo")  # the tasks whose model writes text
FIELD = "spec.evaluation"


@dataclass(frozen=True)
class Scoring:
    split: str
    metrics: tuple[dict[str, Any], ...]  # as the trainer's config takes them, defaults filled in
    prompt_field: str | None = None  # None: the dataset's promptField, else prompt
    max_samples: int = SETTINGS["maxSamples"]["default"]
    max_new_tokens: int = SETTINGS["maxNewTokens"]["default"]
    batch_size: int = SETTINGS["batchSize"]["default"]

    def config(self) -> dict[str, Any]:
        """``evaluation`` of the trainer's config."""
        return {
            "split": self.split,
            "promptField": self.prompt_field,
            "maxSamples": self.max_samples,
            "maxNewTokens": self.max_new_tokens,
            "batchSize": self.batch_size,
            "metrics": [dict(m) for m in self.metrics],
        }


def _bounded(e: dict[str, Any], key: str, add: Add) -> int:
    limits = SETTINGS[key]
    value = e.get(key, limits["default"])
    if isinstance(value, bool) or not isinstance(value, int):
        add(f"{FIELD}.{key}", f"must be an integer, got {value!r}")
        return int(limits["default"])
    if not limits["minimum"] <= value <= limits["maximum"]:
        add(f"{FIELD}.{key}", f"must be between {limits['minimum']} and {limits['maximum']}, got {value}")
    return value


def _metric(m: Any, i: int, add: Add) -> dict[str, Any] | None:
    f = f"{FIELD}.metrics[{i}]"
    if isinstance(m, dict):
        for key in UNUSED:
            if key in m:
                add(f"{f}.{key}", "is for GRPO's rewards, not the evaluation's metrics; remove it")
        if "type" in m and m["type"] not in KINDS:
            add(f"{f}.type", f"must be one of {', '.join(KINDS)} (a matcher), got {m['type']!r}")
            return None
    kept = {k: v for k, v in m.items() if k not in UNUSED} if isinstance(m, dict) else m
    out = grpo.reward(kept, f, i, add, METRIC)
    if out is not None:
        out.pop("weight", None)
    return out


def parse(e: dict[str, Any], add: Add) -> Scoring:
    """``spec.evaluation`` (an object), every error added with its field."""
    unknown = sorted(set(e) - set(SETTINGS))
    if unknown:
        add(f"{FIELD}.{unknown[0]}", f"is not an evaluation setting (known: {', '.join(SETTINGS)})")
    split = e.get("split")
    if not isinstance(split, str) or not split:
        add(f"{FIELD}.split", "is required: the held-out split to generate for (for example test)")
        split = ""
    prompt = e.get("promptField")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        add(f"{FIELD}.promptField", f"must name a column, got {prompt!r}")
        prompt = None
    raw = e.get("metrics") or []
    if not isinstance(raw, list) or not raw:
        add(f"{FIELD}.metrics", f"needs at least one metric ({', '.join(KINDS)}), as a list")
        raw = raw if isinstance(raw, list) else []
    if len(raw) > MAX_METRICS:
        add(f"{FIELD}.metrics", f"holds {len(raw)} metrics; at most {MAX_METRICS}")
    metrics = [m for m in (_metric(m, i, add) for i, m in enumerate(raw)) if m is not None]
    seen: set[str] = set()
    for i, m in enumerate(metrics):
        if m["name"] in seen:
            add(f"{FIELD}.metrics[{i}].name", f"{m['name']!r} is used twice; give each metric its own name")
        seen.add(m["name"])
    return Scoring(
        split=split,
        metrics=tuple(metrics),
        prompt_field=prompt,
        max_samples=_bounded(e, "maxSamples", add),
        max_new_tokens=_bounded(e, "maxNewTokens", add),
        batch_size=_bounded(e, "batchSize", add),
    )


def problems(spec: Any) -> list[tuple[str, str]]:
    """(field, message) for a job (a parsed ``JobSpec``) whose evaluation stage the trainer would refuse."""
    s, found = spec.evaluation, list[tuple[str, str]]()
    if s is None:
        return found
    if spec.task not in TASKS:
        found.append(
            (
                FIELD,
                f"the evaluation stage scores generated text: it is for tasks {', '.join(TASKS)}, not {spec.task} "
                "(whose evaluation split's metrics come from spec.training.evaluation)",
            )
        )
    if spec.training.sharding == "fsdp":
        found.append((FIELD, "the evaluation stage generates on rank 0 with the whole model: not with FSDP"))
    if spec.acceleration == "ort":
        found.append((FIELD, "the evaluation stage runs on the default trainer image, not with acceleration ort"))
    prompt = s.prompt_field or spec.dataset.prompt_field or "prompt"
    for i, m in enumerate(s.metrics):
        if m.get("column") == prompt:
            found.append((f"{FIELD}.metrics[{i}].column", f"{prompt!r} is the prompt column; name the reference's"))
    return found
