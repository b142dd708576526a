"""LoRA and QLoRA adapters (PEFT), and merging a trained adapter into its base model."""

from __future__ import annotations

import logging
import os
from typing import Any

from finetune_trainer.config import Config, model_head
from finetune_trainer.errors import ConfigError

log = logging.getLogger(__name__)


def peft_module() -> Any:
    try:
        import peft
    except ImportError:
        raise ConfigError("training.lora", "LoRA needs the 'peft' package, which this image lacks") from None
    return peft


def quantization_config(precision: str) -> Any:
    """QLoRA's base: 4-bit NF4 with double quantization, computing in the run's half precision."""
    import torch
    from transformers import BitsAndBytesConfig

    compute = torch.bfloat16 if precision == "bf16" else torch.float16
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute,
        bnb_4bit_quant_storage=compute,
    )


def base_kind(config: Config) -> str:
    """What the run trains, as ``auto``'s table names it: every weight ('full'), a LoRA adapter ('lora') or a LoRA on
    a 4-bit base ('qlora')."""
    lora = config.training.lora
    if lora is None:
        return "full"
    return "qlora" if lora.quantization else "lora"


def apply_lora(config: Config, model: Any) -> Any:
    peft = peft_module()
    lora = config.training.lora
    assert lora is not None
    if lora.quantization:
        # casts norms to fp32 and makes the frozen embeddings' output require grad (for checkpointing)
        model = peft.prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=config.training.activation_checkpointing
        )
    task_type = {"sequence-classification": peft.TaskType.SEQ_CLS, "causal-lm": peft.TaskType.CAUSAL_LM}[
        model_head(config.task)
    ]
    peft_config = peft.LoraConfig(
        task_type=task_type,
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora_targets(lora.target_modules),
    )
    try:
        return peft.get_peft_model(model, peft_config)
    except ValueError as e:
        raise ConfigError("training.lora.targetModules", str(e)) from None


def lora_targets(names: tuple[str, ...]) -> Any:
    """PEFT's target_modules: the names, PEFT's per-architecture default (None) when empty, or its keyword
    "all-linear" (every linear layer but the output head), which PEFT takes as a string, not a list."""
    if list(names) == ["all-linear"]:
        return "all-linear"
    return list(names) or None


def adapter_summary(config: Config, model: Any) -> dict[str, Any] | None:
    """What went into the result: the method, its settings and the modules PEFT actually adapted."""
    lora = config.training.lora
    if lora is None:
        return None
    peft_config = getattr(model, "peft_config", {}).get("default")
    targets = sorted(getattr(peft_config, "target_modules", None) or ())
    return {
        "method": "qlora" if lora.quantization else "lora",
        "r": lora.r,
        "alpha": lora.alpha,
        "dropout": lora.dropout,
        "target_modules": targets,
        "quantization": lora.quantization,
    }


def merge_in_memory(model: Any) -> Any:
    """The trained PEFT model with its adapter folded into the base weights (a plain transformers model)."""
    return model.merge_and_unload()


def merge_from_disk(config: Config, adapter_dir: str, torch_dtype: Any) -> Any:
    """QLoRA: the base reloaded unquantized (in ``torch_dtype``, on CPU) with the saved adapter merged into it;
    folding an adapter into 4-bit weights would round the result to the 4-bit grid."""
    import transformers

    peft = peft_module()
    m = config.model
    auto = {
        "sequence-classification": transformers.AutoModelForSequenceClassification,
        "causal-lm": transformers.AutoModelForCausalLM,
    }[model_head(config.task)]
    base = auto.from_pretrained(
        m.source,
        revision=m.revision,
        trust_remote_code=m.trust_remote_code,
        token=os.environ.get("HF_TOKEN") or None,
        dtype=torch_dtype,
        low_cpu_mem_usage=True,
    )
    log.info("merging the adapter in %s into an unquantized copy of %s", adapter_dir, m.source)
    return peft.PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
