"""Small helpers that keep one code path running on transformers 4.47-4.50 (the ONNX Runtime stack) and on
current transformers 5.x / torch. Each helper asks the installed library instead of comparing version numbers."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any


def tokenizer_kwarg(trainer_cls: type, tokenizer: Any) -> dict[str, Any]:
    """``processing_class=`` (transformers >= 4.46) or ``tokenizer=`` (older, and Optimum's ORTTrainer)."""
    params = inspect.signature(trainer_cls.__init__).parameters
    if "processing_class" in params:
        return {"processing_class": tokenizer}
    return {"tokenizer": tokenizer}


def training_arg_names(args_cls: type) -> frozenset[str]:
    """Every field ``TrainingArguments`` (or a subclass) accepts."""
    return frozenset(f.name for f in dataclasses.fields(args_cls) if f.init)


def eval_strategy_kwargs(args_cls: type, strategy: str, every_steps: int | None) -> dict[str, Any]:
    """``eval_strategy`` (>= 4.41) or ``evaluation_strategy`` (older)."""
    names = training_arg_names(args_cls)
    key = "eval_strategy" if "eval_strategy" in names else "evaluation_strategy"
    kwargs: dict[str, Any] = {key: strategy}
    if strategy == "steps" and every_steps:
        kwargs["eval_steps"] = every_steps
    return kwargs


def filter_supported(args_cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Drop keyword arguments this version's ``TrainingArguments`` does not know (only for *our* optional
    settings; user ``extraArgs`` are validated strictly instead)."""
    names = training_arg_names(args_cls)
    return {k: v for k, v in kwargs.items() if k in names}
