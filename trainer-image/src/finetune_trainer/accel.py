"""Acceleration backends behind one small factory, with lazy imports (Optimum/ONNX Runtime load only for ``ort``),
and what ``acceleration: auto`` and ``training.kernels: auto`` pick.

``auto`` picks from :data:`AUTO_TABLE`: per hardware class and task, the ways to train that a measurement showed
(docs/benchmarks.md, "How auto decides"), each with its steady speed against eager with the model's own kernels and
the one-off warm-up it costs. Once the model and data are known the trainer estimates the run's eager time (the
training work of one device, 6 x parameters x tokens, at the row's measured eager utilisation of the device's
peak) and takes the option that finishes first: time / speedup + warm-up. A combination (compile with Liger's
kernels) is an option only where it was measured itself, never the product of two measurements. A hardware class
or task with no row trains eager with the model's own kernels.

- CPU: no row. Neither ONNX Runtime (0.93-1.08x eager) nor torch.compile (0.77-1.24x, plus 17-53 s of warm-up) is
  a safe gain on CPUs.
- CUDA, causal LM (SFT, every weight trained): compile 1.48x after 39.7 s of warm-up, Liger's kernels 1.34x with no
  separate warm-up (an H200, a 0.82 B Llama-architecture decoder, 512-token rows, bf16, 2026-12-04; each against the
  eager run of its own harness). So Liger's kernels up to about 9.4 minutes of eager training, compile above it.
- CUDA, sequence classification: compile 1.05x after 21 s (BERT-base, the smallest gain measured).
- Compile pads every batch to ``maxSeqLength`` (one graph): it is set aside when the rows fill less than
  :data:`COMPILE_MIN_FILL` (95 %) of it, where the padding could cost more than the smallest measured gain.
- LoRA, QLoRA and DPO: not measured; eager with the model's own kernels.

:envvar:`FINETUNE_AUTO_TABLE` replaces rows for hardware a platform team measured itself.

Every path other than ``ort`` uses the library's default attention, which is SDPA on the default stack (1.21x eager
attention on the H200), and fused AdamW where the installed torch has it for the device.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from finetune_trainer.errors import ConfigError

COMPILE_MIN_FILL = 0.95
REFERENCE_PEAK_FLOPS = 989e12  # the H200's dense bf16 peak: the device the built-in rows were measured on
# Platform teams that measured their own hardware replace rows with a JSON object in this variable (the trainer
# image's ENV; a job's spec.env cannot set FINETUNE_* names): {hardware: {task or "*": row}}, a row being
# {"eagerMfu": 0.3 | "eagerFlopsPerSecond": 2e14, "options": [{"acceleration": "compile", "kernels": "none",
# "speedup": 1.4, "warmupSeconds": 40, "minFill": 0.95, "bases": ["full", "lora"]}]}.
AUTO_TABLE_ENV = "FINETUNE_AUTO_TABLE"
BASES = ("full", "lora", "qlora")  # what the model trains: every weight, a LoRA adapter, a LoRA on a 4-bit base


@dataclass(frozen=True)
class Option:
    """One measured way to train: its steady throughput against eager with the model's own kernels, and the one-off
    warm-up it costs (compilation)."""

    acceleration: str  # "none" or "compile"
    kernels: str = "none"  # "none" or "liger"
    speedup: float = 1.0
    warmup_seconds: float = 0.0
    min_fill: float = 0.0  # batches padded to maxSeqLength: the rows must fill at least this much of it
    bases: tuple[str, ...] = ("full",)  # what it was measured with: every weight trained, a LoRA, a QLoRA
    measured: str = ""

    @property
    def label(self) -> str:
        parts = [p for p in (self.acceleration if self.acceleration != "none" else "", self.kernels) if p != "none"]
        return " + ".join(p for p in parts if p) or "eager"


EAGER = Option("none", bases=BASES)


@dataclass(frozen=True)
class TaskRow:
    """The options measured for one task on one hardware class, and eager's measured rate (to turn the run's work
    into seconds): a share of the device's peak, or FLOP/s outright for hardware without a known peak."""

    options: tuple[Option, ...] = ()
    eager_mfu: float = 0.0
    eager_flops: float = 0.0

    def eager_rate(self, peak_flops: float) -> float:
        if self.eager_flops > 0:
            return self.eager_flops
        peak = peak_flops if math.isfinite(peak_flops) and peak_flops > 0 else REFERENCE_PEAK_FLOPS
        return self.eager_mfu * peak


H200_DECODER = "an H200, a 0.82 B Llama-architecture decoder, 512-token rows, batch 16, bf16, 2026-12-04"
# the two decoder figures come from two harnesses, each against its own eager run: Liger's from finetune run-local
# (68,995 -> 92,663 tokens/s), compile's from bench/trainer_throughput.py (55,766 -> 82,508); the GPU check now
# measures both, and the pair, in one harness
DECODER_LIGER = H200_DECODER + ", finetune run-local"
DECODER_COMPILE = H200_DECODER + ", bench/trainer_throughput.py"
H200_BERT = "an H200, BERT-base, 128-token rows, batch 64, bf16, 2026-11-30 (the smallest gain of three settings)"
# hardware class -> task (or "*" for every task without its own row) -> row; docs/benchmarks.md has the figures.
AUTO_TABLE: dict[str, dict[str, TaskRow]] = {
    "cpu": {},
    "cuda": {
        "causal-lm": TaskRow(
            options=(
                Option(
                    "compile", speedup=1.48, warmup_seconds=39.7, min_fill=COMPILE_MIN_FILL, measured=DECODER_COMPILE
                ),
                Option("none", "liger", speedup=1.34, measured=DECODER_LIGER),
            ),
            eager_mfu=0.30,
        ),
        "sequence-classification": TaskRow(
            options=(
                Option("compile", speedup=1.05, warmup_seconds=21.0, min_fill=COMPILE_MIN_FILL, measured=H200_BERT),
            ),
            eager_mfu=0.17,
        ),
    },
}


@dataclass(frozen=True)
class Workload:
    """What ``auto`` weighs: estimated training work of one device and how full the padded rows are."""

    params: int
    total_steps: int
    tokens_per_step: int  # per-device rows per step x maxSeqLength: what one device's compiled (padded) step processes
    fill: float | None  # mean row length / maxSeqLength, in (0, 1]; None: not known (TRL pads DPO's pairs itself)

    @property
    def flops(self) -> float:
        return 6.0 * self.params * self.total_steps * self.tokens_per_step


def _option(hardware: str, raw: dict[str, Any]) -> Option:
    if raw.get("acceleration", "none") not in ("none", "compile"):
        raise ValueError(f"{hardware}: acceleration must be 'none' or 'compile'")
    if raw.get("kernels", "none") not in ("none", "liger"):
        raise ValueError(f"{hardware}: kernels must be 'none' or 'liger'")
    bases = tuple(raw.get("bases", ("full",)))
    if not set(bases) <= set(BASES):
        raise ValueError(f"{hardware}: bases must be among {', '.join(BASES)}")
    option = Option(
        raw.get("acceleration", "none"),
        raw.get("kernels", "none"),
        float(raw.get("speedup", 1.0)),
        float(raw.get("warmupSeconds", 0.0)),
        float(raw.get("minFill", 0.0)),
        bases,
        str(raw.get("measured", f"{AUTO_TABLE_ENV}")),
    )
    if not (math.isfinite(option.speedup) and option.speedup > 0):
        raise ValueError(f"{hardware}: speedup must be a number above 0")
    if not (math.isfinite(option.warmup_seconds) and option.warmup_seconds >= 0):
        raise ValueError(f"{hardware}: warmupSeconds must be a number of at least 0")
    if not 0 <= option.min_fill <= 1:
        raise ValueError(f"{hardware}: minFill must lie in [0, 1]")
    return option


def _row(hardware: str, raw: dict[str, Any]) -> TaskRow:
    row = TaskRow(
        tuple(_option(hardware, o) for o in raw.get("options", ())),
        float(raw.get("eagerMfu", 0.0)),
        float(raw.get("eagerFlopsPerSecond", 0.0)),
    )
    rate_known = (0 < row.eager_mfu <= 1) or (math.isfinite(row.eager_flops) and row.eager_flops > 0)
    if any(o.warmup_seconds for o in row.options) and not rate_known:
        raise ValueError(
            f"{hardware}: an option with warmupSeconds needs eagerMfu (0-1] or eagerFlopsPerSecond to weigh it against"
        )
    return row


def auto_table() -> dict[str, dict[str, TaskRow]]:
    """:data:`AUTO_TABLE` with the hardware classes of ``$FINETUNE_AUTO_TABLE`` in place of its own (a bad value is
    a config error)."""
    raw = os.environ.get(AUTO_TABLE_ENV)
    if not raw:
        return AUTO_TABLE
    try:
        table = dict(AUTO_TABLE)
        for hardware, tasks in json.loads(raw).items():
            table[hardware] = {task: _row(hardware, row) for task, row in tasks.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ConfigError(
            "env." + AUTO_TABLE_ENV,
            'not a JSON object of rows like {"cuda": {"causal-lm": {"eagerMfu": 0.3, "options": [{"acceleration": '
            f'"compile", "speedup": 1.4, "warmupSeconds": 40}}]}}}}: {type(e).__name__}: {e}',
        ) from None
    return table


def task_row(hardware: str, task: str) -> TaskRow | None:
    rows = auto_table().get(hardware) or {}
    return rows.get(task) or rows.get("*")


def weighs_workload(hardware: str, task: str) -> bool:
    """Whether ``auto`` for this task on this hardware depends on the workload (so the trainer must estimate it)."""
    row = task_row(hardware, task)
    return row is not None and any(o.warmup_seconds or o.min_fill for o in row.options)


def _fitting(acceleration: str, kernels: str, row: TaskRow | None) -> list[Option]:
    """Eager and the row's options that match what was requested (``auto`` matches any value)."""
    return [
        o
        for o in (EAGER, *(row.options if row else ()))
        if acceleration in ("auto", o.acceleration) and kernels in ("auto", o.kernels)
    ]


def liger_considered(acceleration: str, kernels: str, hardware: str, task: str, *, base: str = "full") -> bool:
    """Whether Liger's kernels are requested, or an option ``auto`` may pick: only then is the package asked
    whether it can run here (importing it costs Triton and its model patches)."""
    if kernels != "auto":
        return kernels == "liger"
    fitting = _fitting(acceleration, kernels, task_row(hardware, task))
    return any(o.kernels == "liger" and base in o.bases for o in fitting)


def hardware_class(cuda_available: bool | None = None) -> str:
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    return "cuda" if cuda_available else "cpu"


def resolve_acceleration(requested: str) -> str:
    """The acceleration until the model and data are known: ``auto`` trains eager until :func:`choose` settles it
    (never ``ort``), the others as requested."""
    return "none" if requested == "auto" else requested


@dataclass(frozen=True)
class Choice:
    """What a run trains with, and why (the log, result.json and the job's status say it)."""

    acceleration: str
    kernels: str
    why: str


def choose(
    acceleration: str,
    kernels: str,
    hardware: str,
    task: str,
    *,
    base: str = "full",
    workload: Workload | None = None,
    liger_blocked: str | None = None,
    peak_flops: float = math.nan,
) -> Choice:
    """Settle ``auto`` (of ``acceleration``, ``kernels`` or both) from the table: of the options that match what was
    requested and can run here, the one whose estimated time (eager time / speedup + warm-up) is least.
    ``liger_blocked`` says why Liger's kernels cannot run here (None: they can)."""
    if acceleration != "auto" and kernels != "auto":
        return Choice(acceleration, kernels, f"requested acceleration {acceleration}, kernels {kernels}")
    where = f"{task} on {hardware}"
    row = task_row(hardware, task)
    aside: list[str] = []
    usable: list[Option] = []
    fill = workload.fill if workload is not None else None
    for o in _fitting(acceleration, kernels, row):
        chosen_by_auto = acceleration == "auto" and o.acceleration != "none"
        if base not in o.bases:
            aside.append(f"{o.label}: not measured with {base}")
        elif o.kernels == "liger" and kernels == "auto" and liger_blocked:
            aside.append(f"{o.label}: {liger_blocked}")
        elif o.min_fill and chosen_by_auto and workload is not None and fill is None:
            aside.append(f"{o.label}: how full the padded rows are is not known for {task}")
        elif o.min_fill and chosen_by_auto and fill is not None and fill < o.min_fill:
            aside.append(f"{o.label}: rows fill {fill:.0%} of maxSeqLength < {o.min_fill:.0%}")
        elif o.warmup_seconds and chosen_by_auto and workload is None:
            aside.append(f"{o.label}: its warm-up is weighed once the workload is known")
        else:
            usable.append(o)
    settled_a = acceleration if acceleration != "auto" else "none"
    settled_k = kernels if kernels != "auto" else "none"
    if not usable:  # what was requested outright, and the model's own kernels / eager for the rest
        return Choice(settled_a, settled_k, _reason(f"auto: nothing measured for {where} with that request", aside))
    eager_s = None
    if workload is not None and row is not None and row.eager_rate(peak_flops) > 0:
        eager_s = workload.flops / row.eager_rate(peak_flops)

    def cost(o: Option) -> float:
        return (eager_s / o.speedup + o.warmup_seconds) if eager_s is not None else 1.0 / o.speedup

    best = min(usable, key=cost)
    measured = f"; {best.measured}" if best.measured else ""
    if len(usable) == 1 and best is EAGER:
        head = f"auto: no option faster than eager measured for {where}"
    elif eager_s is None:
        warmup = f" after {best.warmup_seconds:.3g} s of warm-up" if best.warmup_seconds else ""
        head = f"auto: {best.label} ({best.speedup:.3g}x eager{warmup}{measured})"
    else:
        others = ", ".join(f"{o.label} {cost(o):.3g} s" for o in usable if o is not best)
        head = f"auto: {best.label}, estimated {cost(best):.3g} s for {workload.flops if workload else 0:.2g} FLOPs"
        head += (f" against {others}" if others else "") + (f" ({best.measured})" if best.measured else "")
    return Choice(best.acceleration, best.kernels, _reason(head, aside))  # _fitting kept what was requested


def _reason(head: str, aside: list[str]) -> str:
    return head + (f"; set aside: {'; '.join(aside)}" if aside else "")


def liger_model_types() -> frozenset[str]:
    """The model types Liger's kernels patch (liger_kernel's own table), imported only when asked."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    return frozenset(MODEL_TYPE_TO_APPLY_LIGER_FN)


LIGER_TASKS = ("causal-lm", "dpo")  # Liger's patches replace a causal LM's forward (its fused loss needs an lm_head)


def liger_unavailable(
    hardware: str, model_type: str | None, *, task: str, supported: frozenset[str] | None = None
) -> tuple[str, str] | None:
    """Why Liger's kernels cannot run here, as (a short reason, the refusal naming the field and the fix), or None.

    Liger's kernels are Triton GPU kernels (RMSNorm, RoPE, SwiGLU; fused linear cross-entropy where the trainer's
    loss allows) patched into a causal LM: not for other tasks, not without a GPU, not without the package and not
    for a model type Liger does not patch. ``model_type`` None: not known yet (checked again with the model)."""
    if task not in LIGER_TASKS:
        why = f"Liger's kernels are for language-model heads, not {task}"
        return why, f"{why} (task causal-lm or dpo); set spec.training.kernels to auto or none"
    if hardware != "cuda":
        return (
            "Liger's kernels need a GPU",
            "Liger's kernels are Triton GPU kernels and this pod has no GPU: request nvidia.com/gpu in "
            "spec.resources.limits or set spec.training.kernels to none",
        )
    try:
        types = supported if supported is not None else liger_model_types()
    except ImportError as e:
        why = f"Liger is not installed in this image ({e})"
        return why, f"{why}: use the default trainer image, or set spec.training.kernels to auto or none"
    if model_type is not None and model_type not in types:
        why = f"Liger has no kernels for model type {model_type!r}"
        return why, f"{why} (it patches: {', '.join(sorted(types))}); set spec.training.kernels to none or auto"
    return None


def require_liger(hardware: str, model_type: str | None, *, task: str, supported: frozenset[str] | None = None) -> None:
    """``training.kernels: liger`` where it cannot run is a config error naming the field."""
    blocked = liger_unavailable(hardware, model_type, task=task, supported=supported)
    if blocked is not None:
        raise ConfigError("training.kernels", blocked[1])


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
