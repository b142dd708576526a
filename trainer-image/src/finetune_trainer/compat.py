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


def cpu_resumable(trainer_cls: type) -> type:
    """A subclass whose optimizer state resumes on CPU under torchrun.

    transformers (4.50 and later) loads the optimizer state with ``map_location=args.device`` when
    ``world_size > 1``; on CPU under torchrun that device is ``cpu:0``, which ``torch.load`` cannot restore to
    ("don't know how to restore data location ... (tagged with cpu:0)"), so every resumed multi-node CPU run
    crashed. On CPU the state is mapped to plain ``"cpu"``; GPU runs are untouched.
    """
    import torch

    def _load_optimizer_and_scheduler(self: Any, checkpoint: Any) -> Any:
        parent = super(cls, self)._load_optimizer_and_scheduler  # type: ignore[misc]
        if getattr(self.args.device, "type", None) != "cpu":
            return parent(checkpoint)
        original = torch.load

        def load(*args: Any, **kwargs: Any) -> Any:
            loc = kwargs.get("map_location")
            if isinstance(loc, torch.device) and loc.type == "cpu":
                kwargs["map_location"] = "cpu"
            return original(*args, **kwargs)

        torch.load = load
        try:
            return parent(checkpoint)
        finally:
            torch.load = original

    cls = type(trainer_cls.__name__, (trainer_cls,), {"_load_optimizer_and_scheduler": _load_optimizer_and_scheduler})
    return cls


def eval_without_collator_wrapper(trainer_cls: type) -> type:
    """A subclass whose evaluation and prediction dataloaders use the collator the metrics' batch counter wraps.

    The Trainer builds every dataloader from ``self.data_collator``; the batch counter wraps it to count what is
    *trained*, so eval batches (built between optimizer steps) must not pass through it.
    """
    from finetune_trainer.metrics import BatchCounter

    def _plain(self: Any, build: Any) -> Any:
        wrapper = self.data_collator
        if not isinstance(wrapper, BatchCounter):
            return build()
        inner = wrapper.collator
        self.data_collator = inner
        try:
            return build()
        finally:
            self.data_collator = wrapper

    def get_eval_dataloader(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _plain(self, lambda: super(cls, self).get_eval_dataloader(*args, **kwargs))  # type: ignore[misc]

    def get_test_dataloader(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _plain(self, lambda: super(cls, self).get_test_dataloader(*args, **kwargs))  # type: ignore[misc]

    cls = type(
        trainer_cls.__name__,
        (trainer_cls,),
        {"get_eval_dataloader": get_eval_dataloader, "get_test_dataloader": get_test_dataloader},
    )
    return cls
