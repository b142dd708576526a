"""Acceleration backends behind one small factory, with lazy imports (Optimum/ONNX Runtime load only for ``ort``).

``acceleration: auto`` picks from :data:`AUTO_TABLE`, keyed by hardware class; every row is backed by a measurement
in docs/benchmarks.md ("Trainer throughput", "How acceleration: auto decides"), and a class with no row falls back to
eager:

- CPU -> eager: neither ONNX Runtime (0.93-1.08x eager) nor torch.compile (0.77-1.24x, plus 17-53 s of warm-up) is
  a safe gain on CPUs.
- CUDA -> torch.compile when the run is big enough to repay compilation, eager otherwise. Measured on an H200:
  compile is 1.05-1.20x eager on BERT-base and 1.56x on a 0.8 B Llama-architecture decoder, after 21-40 s of
  warm-up. The break-even of those runs lies at 3.4e16-7.5e16 FLOPs of training work per GPU (6 x parameters x
  tokens), so ``auto`` compiles from :data:`COMPILE_MIN_WORK_FLOPS` = 1e17 per device, above every measured
  break-even (about 5 minutes of eager training at the measured MFU). Per device, because every GPU compiles on its
  own while the work is shared among them. Compiled batches are padded to ``maxSeqLength`` (one graph), so when the
  rows fill less than :data:`COMPILE_MIN_FILL` (95 %) of it, the padding could cost more than the smallest measured
  gain (1.05x) and ``auto`` stays eager.

:envvar:`FINETUNE_AUTO_TABLE` overrides rows for hardware a platform team measured itself.

Every path other than ``ort`` uses the library's default attention, which is SDPA on the default stack (1.21x eager
attention on the H200), and fused AdamW where the installed torch has it for the device.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
from dataclasses import dataclass, field
from typing import Any

from finetune_trainer.errors import ConfigError

COMPILE_MIN_WORK_FLOPS = 1e17
COMPILE_MIN_FILL = 0.95
# Platform teams that measured their own hardware may override rows: a JSON object such as
# {"cuda": {"acceleration": "compile", "minWorkFlops": 5e16, "minFill": 0.9}} in this variable (the trainer image's
# ENV; a job's spec.env cannot set FINETUNE_* names).
AUTO_TABLE_ENV = "FINETUNE_AUTO_TABLE"


@dataclass(frozen=True)
class AutoRow:
    """What ``auto`` runs on one hardware class; below ``min_work_flops`` of estimated training work, or with rows
    that fill less than ``min_fill`` of ``maxSeqLength``, eager instead."""

    acceleration: str
    min_work_flops: float = 0.0
    min_fill: float = 0.0
    kernels: str = "none"  # "liger" only on a row whose measurement shows Liger's kernels faster


# hardware class -> row; see docs/benchmarks.md "Trainer throughput" for the figures behind each row.
AUTO_TABLE: dict[str, AutoRow] = {
    "cpu": AutoRow("none"),
    "cuda": AutoRow("compile", min_work_flops=COMPILE_MIN_WORK_FLOPS, min_fill=COMPILE_MIN_FILL),
}


@dataclass(frozen=True)
class Workload:
    """What ``auto`` weighs: estimated training work of one device and how full the padded rows are."""

    params: int
    total_steps: int
    tokens_per_step: int  # per-device rows per step x maxSeqLength: what one device's compiled (padded) step processes
    fill: float  # mean row length / maxSeqLength, in (0, 1]

    @property
    def flops(self) -> float:
        return 6.0 * self.params * self.total_steps * self.tokens_per_step


def auto_table() -> dict[str, AutoRow]:
    """:data:`AUTO_TABLE` with the rows of ``$FINETUNE_AUTO_TABLE`` over it (a bad value is a config error)."""
    raw = os.environ.get(AUTO_TABLE_ENV)
    if not raw:
        return AUTO_TABLE
    try:
        rows = json.loads(raw)
        table = dict(AUTO_TABLE)
        for hardware, row in rows.items():
            if row["acceleration"] not in ("none", "compile"):
                raise ValueError(f"{hardware}: acceleration must be 'none' or 'compile'")
            if row.get("kernels", "none") not in ("none", "liger"):
                raise ValueError(f"{hardware}: kernels must be 'none' or 'liger'")
            table[hardware] = AutoRow(
                row["acceleration"],
                float(row.get("minWorkFlops", 0)),
                float(row.get("minFill", 0)),
                row.get("kernels", "none"),
            )
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ConfigError(
            "env." + AUTO_TABLE_ENV,
            f'not a JSON object of rows like {{"cuda": {{"acceleration": "compile", "minWorkFlops": 1e17}}}}: '
            f"{type(e).__name__}: {e}",
        ) from None
    return table


def weighs_workload(hardware: str) -> bool:
    """Whether ``auto`` on this hardware depends on the workload (so the trainer must estimate it)."""
    row = auto_table().get(hardware)
    return row is not None and row.acceleration != "none"


def hardware_class(cuda_available: bool | None = None) -> str:
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    return "cuda" if cuda_available else "cpu"


def resolve_acceleration(requested: str, hardware: str, workload: Workload | None = None) -> str:
    """``auto`` -> the table's row for ``hardware`` (eager when the class has no row, or when the row's thresholds
    are not met or cannot be judged yet because ``workload`` is unknown); others pass through."""
    return explain_acceleration(requested, hardware, workload)[0]


def explain_acceleration(requested: str, hardware: str, workload: Workload | None = None) -> tuple[str, str]:
    """:func:`resolve_acceleration` plus the reason, for the log and result.json."""
    if requested != "auto":
        return requested, f"requested {requested}"
    row = auto_table().get(hardware)
    if row is None:
        return "none", f"auto: no measured row for {hardware}: eager"
    if row.acceleration == "none":
        return "none", f"auto: {hardware} row is eager"
    if workload is None:
        return "none", f"auto: {hardware} row is {row.acceleration} once the workload is known"
    if workload.flops < row.min_work_flops:
        return "none", (
            f"auto: estimated work {workload.flops:.2g} FLOPs < {row.min_work_flops:.2g}: "
            f"{row.acceleration}'s warm-up would not pay; eager"
        )
    if workload.fill < row.min_fill:
        return "none", (
            f"auto: rows fill {workload.fill:.0%} of maxSeqLength < {row.min_fill:.0%}: padding for "
            f"{row.acceleration} would cost more than it gains; eager"
        )
    return row.acceleration, (
        f"auto: estimated work {workload.flops:.2g} FLOPs >= {row.min_work_flops:.2g}, rows fill {workload.fill:.0%} "
        f"of maxSeqLength: {row.acceleration}"
    )


def liger_model_types() -> frozenset[str]:
    """The model types Liger's kernels patch (liger_kernel's own table), imported only when asked."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    return frozenset(MODEL_TYPE_TO_APPLY_LIGER_FN)


LIGER_TASKS = ("causal-lm", "dpo")  # Liger's patches replace a causal LM's forward (its fused loss needs an lm_head)


def explain_kernels(
    requested: str,
    hardware: str,
    model_type: str | None,
    *,
    task: str = "causal-lm",
    supported: frozenset[str] | None = None,
) -> tuple[str, str]:
    """``training.kernels`` settled: 'liger' or 'none', and why (for the log and result.json).

    'liger' is Triton GPU kernels (RMSNorm, RoPE, SwiGLU; fused linear cross-entropy where the trainer's loss allows)
    patched into a causal LM: refused for other tasks, without a GPU, without the package and for a model type Liger
    does not patch. 'auto' picks it only where the hardware's row of the
    auto table says a measurement showed it faster (no built-in row does yet: docs/benchmarks.md)."""
    if requested == "none":
        return "none", "requested none"
    if task not in LIGER_TASKS:
        return _unavailable(
            requested,
            f"Liger's kernels are for language-model heads, not {task}",
            f"Liger's kernels are for language-model heads (task causal-lm or dpo), not {task}; set "
            "spec.training.kernels to auto or none",
        )
    if requested == "liger" and hardware != "cuda":
        raise ConfigError(
            "training.kernels",
            "Liger's kernels are Triton GPU kernels and this pod has no GPU: request nvidia.com/gpu in "
            "spec.resources.limits or set spec.training.kernels to none",
        )
    row = auto_table().get(hardware)
    if requested == "auto" and (row is None or row.kernels != "liger"):
        return "none", f"auto: no measurement on {hardware} shows Liger's kernels faster; the model's own"
    try:
        types = supported if supported is not None else liger_model_types()
    except ImportError as e:
        return _unavailable(
            requested,
            f"Liger is not installed in this image ({e})",
            f"Liger is not installed in this image ({e}): use the default trainer image, or set "
            "spec.training.kernels to auto or none",
        )
    if model_type not in types:
        return _unavailable(
            requested,
            f"Liger has no kernels for model type {model_type!r}",
            f"Liger has no kernels for model type {model_type!r} (it patches: {', '.join(sorted(types))}); set "
            "spec.training.kernels to none or auto",
        )
    return "liger", "requested liger" if requested == "liger" else f"auto: the {hardware} row measured Liger faster"


def _unavailable(requested: str, auto_why: str, refusal: str) -> tuple[str, str]:
    """Liger cannot run here: ``auto`` keeps the model's own kernels and says why; ``liger`` is a config error."""
    if requested == "auto":
        return "none", f"auto: {auto_why}; the model's own"
    raise ConfigError("training.kernels", refusal)


def fused_adamw_supported(device_type: str) -> bool:
    """Whether this torch has a fused AdamW kernel for the device ('cuda' always; 'cpu' from torch 2.4)."""
    if device_type == "cuda":
        return True
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices
    except ImportError:  # a private helper: without it, only CUDA is known to be safe
        return False
    return device_type in _get_fused_kernels_supported_devices()


def ort_torch_cpp_dir() -> str | None:
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(next(iter(spec.submodule_search_locations)), "training", "ortmodule", "torch_cpp_extensions")


def ort_extensions_built() -> bool:
    """True when ORTModule's C++ extensions were compiled into the installed onnxruntime package."""
    path = ort_torch_cpp_dir()
    if not path:
        return False
    built = {os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(path, "*.so"))}
    return {"aten_op_executor", "torch_interop_utils"} <= built


def check_available(kind: str, *, nproc_per_node: int, cuda_available: bool) -> None:
    """Reject, before torchrun starts, an acceleration this image or machine cannot run."""
    if kind == "ort":
        missing = [m for m in ("optimum.onnxruntime", "onnxruntime.training") if _missing(m)]
        if missing:
            raise ConfigError(
                "acceleration",
                f"'ort' needs {', '.join(missing)}, which this image lacks: ORTTrainer runs only on the ONNX Runtime "
                "trainer image (Python 3.11, torch 2.6, transformers 4.50.3), which the operator picks for "
                "acceleration 'ort' unless spec.image is set (Helm value trainer.ortImage); remove spec.image or "
                "point it at an ONNX Runtime image, or set spec.acceleration to 'auto', 'none' or 'compile'",
            )
        if not ort_extensions_built():
            raise ConfigError(
                "acceleration",
                "'ort' needs ORTModule's C++ extensions, which are not built in this image "
                "(python -m onnxruntime.training.ortmodule.torch_cpp_extensions.install)",
            )
        if not cuda_available and nproc_per_node > 1:
            raise ConfigError(
                "acceleration",
                "'ort' on CPU supports one process per node (Optimum's ORTTrainer calls torch.cuda.set_device for "
                "local ranks > 0); set spec.procsPerNode to 1 or spec.acceleration to 'none'",
            )


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        return True


@dataclass(frozen=True)
class Backend:
    """What differs between accelerations: the Trainer / TrainingArguments classes and a few settings."""

    name: str
    attn_implementation: str | None = None
    extra_args: dict[str, Any] = field(default_factory=dict)

    def args_class(self) -> type:
        """Only the ``TrainingArguments`` class (cheaper to import than the Trainer: used by the launcher)."""
        if self.name == "ort":
            from optimum.onnxruntime.training_args import ORTTrainingArguments

            return ORTTrainingArguments
        from transformers import TrainingArguments

        return TrainingArguments

    def classes(self) -> tuple[type, type]:
        """``(TrainerClass, TrainingArgumentsClass)``, imported only now."""
        if self.name == "ort":
            from optimum.onnxruntime import ORTTrainer, ORTTrainingArguments

            return ORTTrainer, ORTTrainingArguments
        from transformers import Trainer, TrainingArguments

        return Trainer, TrainingArguments


def make_backend(kind: str) -> Backend:
    if kind == "ort":
        # ORTTrainingArguments still defaults to optim="adamw_hf" (gone from newer transformers); SDPA attention
        # breaks ORT's gradient builder.
        return Backend("ort", attn_implementation="eager", extra_args={"optim": "adamw_torch"})
    if kind == "compile":
        return Backend("compile", extra_args={"torch_compile": True})
    if kind == "none":
        return Backend("none")
    raise ConfigError("acceleration", f"unknown acceleration {kind!r}; use auto, ort, compile or none")
