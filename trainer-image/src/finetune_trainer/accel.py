"""Acceleration backends behind one small factory, with lazy imports (Optimum/ONNX Runtime load only for ``ort``).

``acceleration: auto`` picks from :data:`AUTO_TABLE`, keyed by hardware class. Every row other than eager must be
backed by a measurement in docs/benchmarks.md for that hardware class; a class with no measurement falls back to
eager. Today's rows: CPU -> eager (ORT 0.93-1.08x eager; torch.compile 1.07-1.24x in the steady state but with
17-53 s of warm-up, and 0.77-0.86x in FACTS.md's dynamic-shape setting: not a safe default); CUDA -> eager (no GPU
measurement recorded yet).
"""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any

from finetune_trainer.errors import ConfigError

# hardware class -> acceleration; see docs/benchmarks.md "Trainer throughput" for the figures behind each row.
AUTO_TABLE: dict[str, str] = {
    "cpu": "none",
    "cuda": "none",
}


def hardware_class(cuda_available: bool | None = None) -> str:
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    return "cuda" if cuda_available else "cpu"


def resolve_acceleration(requested: str, hardware: str) -> str:
    """``auto`` -> the table's row for ``hardware`` (eager when the class has no row); others pass through."""
    if requested != "auto":
        return requested
    return AUTO_TABLE.get(hardware, "none")


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
                f"'ort' needs {', '.join(missing)}, which this image lacks; use the ONNX Runtime trainer image "
                "(Python 3.11, torch 2.6, transformers <= 4.50.3) or set spec.acceleration to 'none' or 'compile'",
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
                "local ranks > 0); set spec.nprocPerNode to 1 or spec.acceleration to 'none'",
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
