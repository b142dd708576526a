"""One training worker: build tokenizer, model, data and Trainer from the config, train, resume, save.

``run()`` is thin: read config, train, always tear the process group down. Workers are forked by the agent
(``finetune_trainer.agent``, entry ``forked_entry``) with this module already imported, or started by torchrun as
``python -m finetune_trainer.worker`` (``main``; the ONNX Runtime image). Failures are recorded by torchelastic's
``@record`` into ``TORCHELASTIC_ERROR_FILE``, which the launcher turns into the pod's termination message.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import record

from finetune_trainer import (
    accel,
    adapters,
    checkpoints,
    compat,
    data,
    diagnose,
    evaluation,
    resumption,
    scoring,
    sharding,
)
from finetune_trainer.callbacks import CheckpointCallback, RunComplete, StopFlag
from finetune_trainer.config import Config, load_config, model_head
from finetune_trainer.errors import EXIT_TERMINATED, ConfigError
from finetune_trainer.metrics import BatchCounter, MetricsCallback, TrainerMetrics, peak_flops
from finetune_trainer.rounds import CAUSE_ENV

log = logging.getLogger("finetune_trainer.worker")

DEFAULT_LOGGING_STEPS = 10


@dataclass(frozen=True)
class Identity:
    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    nproc_per_node: int
    nnodes: int
    attempt: int
    round: int = 0  # restarts in place within the attempt (finetune_trainer.rounds): the agent's restart count

    @classmethod
    def from_env(cls) -> Identity:
        e = os.environ
        world = int(e.get("WORLD_SIZE", "1"))
        nproc = int(e.get("LOCAL_WORLD_SIZE", "1"))
        return cls(
            rank=int(e.get("RANK", "0")),
            local_rank=int(e.get("LOCAL_RANK", "0")),
            world_size=world,
            node_rank=int(e.get("GROUP_RANK", e.get("NODE_RANK", "0"))),
            nproc_per_node=nproc,
            nnodes=max(1, world // max(1, nproc)),
            attempt=int(e.get("FINETUNE_ATTEMPT", "0") or 0),
            round=int(e.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
        )


def resolve_precision(requested: str, *, cuda: bool, bf16_supported: bool) -> str:
    """``auto``: bf16 on GPUs that support it, fp16 on older GPUs, fp32 on CPU."""
    if requested == "auto":
        if not cuda:
            return "fp32"
        return "bf16" if bf16_supported else "fp16"
    if requested == "fp16" and not cuda:
        raise ConfigError("training.precision", "fp16 needs a GPU; use 'auto', 'bf16' or 'fp32' on CPU")
    return requested


def _auto_classes(task: str) -> Any:
    import transformers

    return {
        "sequence-classification": transformers.AutoModelForSequenceClassification,
        "causal-lm": transformers.AutoModelForCausalLM,
    }[model_head(task)]


def build_training_args(
    config: Config, backend: accel.Backend, ident: Identity, *, cuda: bool, precision: str, kernels: str = "none"
) -> Any:
    _, args_cls = backend.classes()
    t = config.training
    sft: dict[str, Any] = {}
    if data.uses_sft(config):
        from trl import SFTConfig

        args_cls = SFTConfig
        fmt = config.dataset.sft_format
        sft = {
            "max_length": t.max_seq_length,
            "packing": t.packing,
            "dataset_text_field": "text",
            "assistant_only_loss": fmt == "chat" and t.loss_on == "completion",
            "completion_only_loss": fmt == "prompt-completion" and t.loss_on == "completion",
            # torch.compile: one padded shape per batch, as for the other tasks
            "pad_to_multiple_of": t.max_seq_length if backend.name == "compile" and not t.packing else None,
        }
    if config.task == "dpo":
        from trl import DPOConfig

        args_cls = DPOConfig
        sft = {"beta": t.dpo.beta, "loss_type": t.dpo.loss_type, "max_length": t.max_seq_length}
    if config.task == "grpo":
        from trl import GRPOConfig

        args_cls, g = GRPOConfig, t.grpo
        sft = {
            "num_generations": g.num_generations,
            "max_completion_length": g.max_completion_length,
            "temperature": g.temperature,
            "loss_type": g.loss_type,
            "beta": g.beta,
            "reward_weights": [r.weight for r in g.rewards],
            # with beta > 0 and no adapter TRL loads the reference itself: as the policy was (its revision, and remote
            # code only where the job allowed it)
            "trust_remote_code": config.model.trust_remote_code,
            "model_init_kwargs": {"revision": config.model.revision} if config.model.revision else None,
        }
    known = compat.training_arg_names(args_cls)
    for key in t.extra_args:
        if key not in known:
            raise ConfigError(f"training.extraArgs.{key}", f"{key!r} is not a TrainingArguments field of this image")
    kwargs: dict[str, Any] = {
        "output_dir": config.checkpoints_dir,
        "per_device_train_batch_size": t.per_device_batch_size,
        "per_device_eval_batch_size": t.per_device_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "learning_rate": t.learning_rate,
        "seed": t.seed,
        "save_strategy": "steps",
        "save_steps": t.checkpoint_every_steps,
        "save_total_limit": None,  # retention is ours: it only counts complete checkpoints
        "logging_steps": DEFAULT_LOGGING_STEPS,
        "report_to": [],
        "disable_tqdm": True,
        # Every parameter that requires grad is used by the supported tasks (LoRA freezes, it does not skip), so
        # skip DDP's extra graph traversal; extraArgs can turn it back on for exotic models.
        "ddp_find_unused_parameters": False,
        "bf16": precision == "bf16",
        "fp16": precision == "fp16",
        # Fused AdamW (one kernel per parameter group) where torch has it for the device; ort overrides it.
        "optim": "adamw_torch_fused" if accel.fused_adamw_supported("cuda" if cuda else "cpu") else "adamw_torch",
        **compat.eval_strategy_kwargs(args_cls, t.eval_strategy, t.eval_every_steps),
    }
    kwargs.update(sft)
    if t.sharding == "fsdp":
        kwargs.update(sharding.training_args(t.activation_checkpointing, pretrained=not config.model.init_from_config))
    elif t.activation_checkpointing:
        name = "activation_checkpointing" if "activation_checkpointing" in known else "gradient_checkpointing"
        kwargs[name] = True
        kwargs[name + "_kwargs"] = {"use_reentrant": False}  # frozen (LoRA) inputs still get gradients
    if not kwargs.get("gradient_checkpointing"):
        # Off unless asked (TRL's configs default it on): recomputing activations costs a third more compute, and
        # under FSDP its own activation checkpointing (sharding.training_args) is the one that must run.
        kwargs["gradient_checkpointing"] = False
    if t.max_steps is not None:
        kwargs["max_steps"] = t.max_steps
    else:
        kwargs["num_train_epochs"] = t.epochs
    if ident.world_size > 1:
        kwargs["ddp_backend"] = "nccl" if cuda else "gloo"
    if not cuda:
        kwargs["use_cpu"] = True
    if kernels == "liger":  # the Trainer patches Liger's kernels into the model (its base model under PEFT)
        kwargs["use_liger_kernel"] = True
    kwargs.update(backend.extra_args)
    kwargs.update(t.extra_args)
    kwargs = {k: v for k, v in kwargs.items() if k in known or k in t.extra_args}
    try:
        return args_cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError("training.extraArgs", f"TrainingArguments rejected the settings: {e}") from None


def load_tokenizer(config: Config) -> Any:
    from transformers import AutoTokenizer

    m = config.model
    tok = AutoTokenizer.from_pretrained(
        m.source, revision=m.revision, trust_remote_code=m.trust_remote_code, token=os.environ.get("HF_TOKEN") or None
    )
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ConfigError("model", f"tokenizer of {m.source!r} has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
    return tok


def load_model(
    config: Config,
    backend: accel.Backend,
    tokenizer: Any,
    labels: list[str] | None,
    *,
    device: str | None = None,
    precision: str = "fp32",
) -> Any:
    """The model, with LoRA (or QLoRA: the base in 4-bit on ``device``) when configured. ``initFromConfig`` models
    are built and initialised directly on ``device`` (a GPU initialises a billion parameters in well under a second;
    the CPU takes tens of seconds), a LoRA base on a GPU in the run's half precision."""
    import contextlib

    import torch
    import transformers

    m = config.model
    common: dict[str, Any] = {"trust_remote_code": m.trust_remote_code}
    hub: dict[str, Any] = {"revision": m.revision, "token": os.environ.get("HF_TOKEN") or None}
    model_config = transformers.AutoConfig.from_pretrained(m.source, **common, **hub)
    if labels is not None:
        model_config.num_labels = len(labels)
        model_config.id2label = dict(enumerate(labels))
        model_config.label2id = {name: i for i, name in enumerate(labels)}
    model_config.pad_token_id = tokenizer.pad_token_id
    attn = {"attn_implementation": backend.attn_implementation} if backend.attn_implementation else {}
    auto = _auto_classes(config.task)
    transformers.set_seed(config.training.seed)  # identical random init on every rank
    if m.init_from_config:
        # A language model's LoRA base is frozen: on a GPU it is built in the run's half precision, as a
        # half-precision checkpoint loads (an 8 B base takes 16 GB instead of 32); trained weights (every weight, or
        # a classifier head beside a LoRA) stay fp32 under mixed precision.
        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision) if device else None
        lm_lora = config.training.lora is not None and config.task in ("causal-lm", "dpo", "grpo")  # no new head
        dtype = {"dtype": half} if half is not None and lm_lora and backend.name != "ort" else {}
        with torch.device(device) if device else contextlib.nullcontext():
            model = auto.from_config(model_config, **common, **attn, **dtype)
    else:
        quant: dict[str, Any] = {}
        lora = config.training.lora
        if lora is not None and lora.quantization:
            quant = {"quantization_config": adapters.quantization_config(precision), "device_map": {"": device}}
        model = auto.from_pretrained(m.source, config=model_config, **common, **hub, **attn, **quant)
    if config.training.lora is not None:
        model = adapters.apply_lora(config, model)
    return model


def make_collator(config: Config, tokenizer: Any, *, static_shapes: bool) -> Any:
    """Dynamic padding (to the longest row of the batch), or to ``maxSeqLength`` when ``static_shapes`` (for
    ``torch.compile``: one graph instead of a recompilation per sequence length)."""
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding

    if config.task == "causal-lm":
        multiple = config.training.max_seq_length if static_shapes else None
        return DataCollatorForLanguageModeling(tokenizer, mlm=False, pad_to_multiple_of=multiple)
    if static_shapes:
        return DataCollatorWithPadding(tokenizer, padding="max_length", max_length=config.training.max_seq_length)
    return DataCollatorWithPadding(tokenizer)


def params_checksum(model: Any) -> str:
    """A short digest of the trained weights: equal on every rank when DDP kept them in sync."""
    import torch

    with torch.no_grad():
        return state_checksum({name: p.detach().cpu() for name, p in model.named_parameters()})


def workload(
    config: Config,
    ident: Identity,
    *,
    params: int,
    train_rows: int,
    mean_row_tokens: float | None,
    done_steps: int = 0,
) -> accel.Workload:
    """The run as ``acceleration: auto`` weighs it, per device (every GPU compiles on its own, so what repays the
    warm-up is the work of one): optimizer steps still to run (after a resumed checkpoint's ``done_steps``) x
    per-device rows per step x maxSeqLength tokens."""
    t = config.training
    device_rows_per_step = t.per_device_batch_size * t.gradient_accumulation_steps
    if t.max_steps is not None:
        steps = t.max_steps
    else:
        steps = math.ceil(t.epochs * max(1, math.ceil(train_rows / (device_rows_per_step * ident.world_size))))
    return accel.Workload(
        params=params,
        total_steps=max(0, steps - done_steps),
        tokens_per_step=device_rows_per_step * t.max_seq_length,
        fill=None
        if mean_row_tokens is None
        else min(1.0, mean_row_tokens / t.max_seq_length)
        if t.max_seq_length
        else 1.0,
    )


def mean_row_tokens(ds: Any) -> float:
    """Mean tokenized row length (before padding)."""
    lengths = [len(ids) for ids in ds["input_ids"]]
    return sum(lengths) / len(lengths) if lengths else 0.0


def device_peak_flops(ident: Identity, setup: Any) -> float:
    """The dense peak of this rank's GPU in the run's precision (NaN on a CPU or an unknown device): what ``auto``
    turns the run's work into seconds with."""
    if not setup.cuda:
        return math.nan
    import torch

    return peak_flops(torch.cuda.get_device_name(ident.local_rank), setup.precision)


def state_checksum(state: dict[str, Any]) -> str:
    """A short digest of named CPU tensors: of the replica's parameters (DDP), or of the gathered state (FSDP)."""
    h = hashlib.sha256()
    for name, t in sorted(state.items(), key=lambda kv: kv[0]):
        h.update(name.encode())
        h.update(t.float().numpy().tobytes())
    return h.hexdigest()[:16]


def save_final_model(
    config: Config,
    trainer: Any,
    *,
    tokenizer: Any,
    ident: Identity,
    full_state: dict[str, Any] | None,  # FSDP: the gathered weights (rank 0; empty elsewhere); None: not sharded
    backend: accel.Backend,
    labels: list[str] | None,
    precision: str,
) -> dict[str, Any]:
    """Write the trained model (rank 0) and say what went in. ``model/`` holds what a user loads: the full model,
    the adapter, or, with ``lora.merge``, the adapter merged into the base (then ``adapter/`` holds the adapter).
    Every rank calls this; only rank 0 writes."""
    import torch

    lora = config.training.lora
    merge = bool(lora and lora.merge)
    first_dir = config.adapter_dir if merge else config.model_dir
    if full_state is None:
        trainer.save_model(first_dir)  # rank 0 writes; tokenizer files go with it
    elif ident.rank == 0:
        trainer.model.save_pretrained(first_dir, state_dict=full_state, safe_serialization=True)
        tokenizer.save_pretrained(first_dir)
    if merge and ident.rank == 0:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
        if lora is not None and lora.quantization:
            merged = adapters.merge_from_disk(config, config.adapter_dir, dtype)
        elif full_state is not None:  # FSDP: the gathered weights into a fresh copy on the CPU
            fresh = load_model(config, backend, tokenizer, labels, device="cpu", precision=precision)
            fresh.load_state_dict(full_state)
            merged = adapters.merge_in_memory(fresh)
        else:
            merged = adapters.merge_in_memory(trainer.model)
        merged.save_pretrained(config.model_dir, safe_serialization=True)
        tokenizer.save_pretrained(config.model_dir)
        log.info("merged the adapter into %s: %s", config.model.source, config.model_dir)
    return {
        "base": config.model.source,
        "revision": config.model.revision,
        "init_from_config": config.model.init_from_config,
        "adapter": adapters.adapter_summary(config, trainer.model),
        "merged": merge,
        "path": config.model_dir,
        "adapter_path": config.adapter_dir if merge else (config.model_dir if lora else None),
    }


def _write_json(path: str, payload: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def batch_record(config: Config, ident: Identity) -> dict[str, Any]:
    """The global batch this attempt trains with (world size x per-device batch x accumulation) and, for an elastic
    job, the one it asked for at full size (its accumulation is adapted to the attempt's world size by the operator;
    the two differ only where no whole accumulation gives it exactly)."""
    t = config.training
    used = ident.world_size * t.per_device_batch_size * t.gradient_accumulation_steps
    return {
        "world_size": ident.world_size,
        "nodes": ident.nnodes,
        "per_device_batch_size": t.per_device_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "global_batch_size": used,
        "global_batch_size_asked": t.global_batch_size if t.global_batch_size is not None else used,
    }


def workers_record() -> dict[str, Any]:
    """How this node's training processes started: ``fork`` (from the agent, the stack imported once, in
    ``agent_import_seconds`` beside the launcher's own work), ``spawn`` (the agent had initialised CUDA) or
    ``torchrun`` (each worker its own interpreter: the ONNX Runtime image)."""
    imported = os.environ.get("FINETUNE_AGENT_IMPORT_SECONDS")
    return {
        "start_method": os.environ.get("FINETUNE_START_METHOD", "torchrun"),
        "agent_import_seconds": round(float(imported), 3) if imported else None,
    }


def attempt_record_path(config: Config, ident: Identity) -> str:
    """``attempts/attempt-<n>.json``; a round restarted in place, ``attempt-<n>.<round>.json``."""
    name = f"attempt-{ident.attempt}" + (f".{ident.round}" if ident.round else "")
    return os.path.join(config.output_path, "attempts", f"{name}.json")


def _record_order(name: str) -> tuple[int, int] | None:
    """``attempt-3.json`` → (3, 0), ``attempt-3.2.json`` → (3, 2); anything else None."""
    m = re.fullmatch(r"attempt-(\d+)(?:\.(\d+))?\.json", name)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def attempt_record(config: Config, ident: Identity, setup: Setup, **end: Any) -> dict[str, Any]:
    """Rank 0's record of one attempt (``attempts/attempt-<n>.json``), written as it starts training and again as it
    ends: its size and batch, the step it resumed from, and at the end its last step and losses."""
    rounds = {"round": ident.round, "restart_cause": os.environ.get(CAUSE_ENV, "")[-800:]} if ident.round else {}
    return {
        "attempt": ident.attempt,
        **rounds,
        "resumed_from_step": setup.resume.step if setup.resume else 0,
        **batch_record(config, ident),
        **end,
    }


def attempt_figures(ident: Identity, setup: Setup, metrics_cb: Any, runtime: float, *, steps: int) -> dict[str, Any]:
    """What one attempt trained, job-wide (this node's counts x nodes: every node runs the same batches), for its end
    record: the run's result.json adds them up over the attempts."""
    return {
        "steps_trained": steps,
        "samples": metrics_cb.total_samples * ident.nnodes,
        "tokens": metrics_cb.total_tokens * ident.nnodes,
        "steady_samples": metrics_cb.steady_samples * ident.nnodes,
        "steady_tokens": metrics_cb.steady_tokens * ident.nnodes,
        "steady_seconds": metrics_cb.steady_seconds,
        "runtime_seconds": round(runtime, 3),
        "time_to_first_step_seconds": metrics_cb.time_to_first_step,
        "startup": {k: round(v, 3) for k, v in setup.phases.items()},
    }


ATTEMPT_SUMMARY = (
    "attempt",
    "round",
    "restart_cause",
    "nodes",
    "world_size",
    "gradient_accumulation_steps",
    "resumed_from_step",
    "last_step",
    "steps_trained",
    "samples",
    "stopped_by_signal",
    "runtime_seconds",
    "time_to_first_step_seconds",
    "estimated",
)


def run_totals(config: Config, ident: Identity) -> dict[str, Any]:
    """The run so far, from every attempt's end record up to this one: rows and tokens trained, the steady rates (all
    steady rows over all steady seconds), and one entry per attempt. An attempt that ended without a record (a crash)
    trained nothing that was kept past its newest checkpoint, and is listed with what it recorded at its start."""
    records = []
    folder = os.path.join(config.output_path, "attempts")
    try:
        names = os.listdir(folder)
    except OSError:
        names = []
    ordered = sorted((order, name) for name in names if (order := _record_order(name)) is not None)
    for order, name in ordered:
        if order > (ident.attempt, ident.round):
            continue  # a later attempt's (this one resumed a path another run of the job wrote after it)
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                records.append(json.load(f))
        except (OSError, ValueError):
            continue

    for r, after in itertools.pairwise(records):
        if "steps_trained" not in r:  # ended without its end record (a crash, a lost node): it kept the steps up to
            # the checkpoint the next attempt resumed from, each of its global batch (a partial batch at an epoch's
            # end counts whole: an estimate, said so)
            kept = max(0, (after.get("resumed_from_step") or 0) - (r.get("resumed_from_step") or 0))
            r.update(steps_trained=kept, samples=kept * (r.get("global_batch_size") or 0), estimated=True)

    def total(key: str) -> float:
        return sum(r.get(key) or 0 for r in records)

    seconds = total("steady_seconds")
    return {
        "samples": int(total("samples")),
        "tokens": int(total("tokens")),
        "samples_per_second": total("steady_samples") / seconds if seconds > 0 else None,
        "tokens_per_second": total("steady_tokens") / seconds if seconds > 0 else None,
        "attempts": [
            {
                **{k: r.get(k) for k in ATTEMPT_SUMMARY if k in r},
                "samples_per_second": r["steady_samples"] / r["steady_seconds"] if r.get("steady_seconds") else None,
            }
            for r in records
        ],
    }


def record_agreed_stop(step: int) -> None:
    """Tell this node's launcher that the workers stopped by the ranks' agreement (``FINETUNE_STOP_FILE``, in the
    launcher's temp dir). torchrun reports a worker's exit 143 as its own exit 1 and no error file, so without this
    only the launcher that got SIGTERM itself would exit 143; the others would read as training errors."""
    path = os.environ.get("FINETUNE_STOP_FILE")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"stopped by agreement at step {step}\n")


DDP_TIMEOUT_DEFAULT = 1800  # TrainingArguments.ddp_timeout's default


def init_process_group(timeout_seconds: int, *, cuda: bool) -> None:
    """Form the process group here, before transformers does, when it must differ from transformers' own:

    - on CPU, with ``ddp_timeout``: transformers' CPU path (``use_cpu``) forms the gloo group without it, with gloo's
      30-minute default, so a frozen or cut-off peer would block every collective (a DDP gradient all-reduce, the
      SIGTERM agreement) for half an hour instead of failing the rank and restarting the gang;
    - in a round restarted in place (``TORCHELASTIC_RESTART_COUNT`` > 0, ``finetune_trainer.rounds``), on CPU and GPU,
      under a prefix of the round's own in the agent's store: the static rendezvous keeps one store for the agent's
      life, and the round before left its keys there (the ranks' addresses), which ``env://`` would read again.

    Accelerate reuses a group that exists. One process (no torchrun world): nothing to do."""
    import torch.distributed as dist

    e = os.environ
    world = int(e.get("WORLD_SIZE", "1"))
    if world <= 1 or dist.is_initialized():
        return
    timeout = timedelta(seconds=timeout_seconds)
    backend = "nccl" if cuda else "gloo"
    rnd = int(e.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if rnd == 0:
        if not cuda:
            dist.init_process_group(backend="gloo", timeout=timeout)
            log.info("process group: gloo, collectives time out after %ss (ddp_timeout)", timeout_seconds)
        return
    if cuda:
        import torch

        torch.cuda.set_device(int(e.get("LOCAL_RANK", "0")))
    store = dist.TCPStore(e["MASTER_ADDR"], int(e["MASTER_PORT"]), world, is_master=False, timeout=timeout)
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore(f"/finetune/round_{rnd}", store),
        rank=int(e["RANK"]),
        world_size=world,
        timeout=timeout,
    )
    log.info("process group: %s in round %d restarted in place", backend, rnd)


@dataclass
class Setup:
    """Phase 1: the hardware, the acceleration and precision, the process group, the metrics and the checkpoint
    every rank resumes from."""

    cuda: bool
    hardware: str
    kind: str  # the acceleration (``auto`` is settled again once model and data are known)
    why: str
    backend: accel.Backend
    precision: str
    args: Any  # TrainingArguments
    control_group: Any  # a gloo group beside NCCL, or None
    metrics: TrainerMetrics
    resume: Any  # the agreed checkpoint, or None
    resume_fallbacks: int
    phases: dict[str, float]  # start-up seconds by phase, for result.json
    kernels: str = "none"  # settled once the model type is known (accel.choose)
    kernels_why: str = "not settled yet"


@dataclass
class Data:
    """Phase 2: the tokenized (or, for SFT, checked) training and evaluation splits."""

    train: Any
    eval: Any  # None without evaluation
    sft: bool  # TRL's SFTTrainer renders and tokenizes the rows itself
    labels: list[str] | None  # sequence classification: the label names by id
    mean_train_tokens: float  # per row, when ``auto`` weighs the workload (else 0)
    preference: str | None = None  # dpo: 'plain' or 'conversational' pairs (TRL's DPOTrainer tokenizes them)
    prompts: str | None = None  # grpo: 'plain' or 'conversational' prompts (TRL's GRPOTrainer generates from them)


@dataclass
class Model:
    """Phase 3: the model (with its adapters) and its parameter count."""

    model: Any
    params: int


@dataclass
class Built:
    """Phase 4: the Trainer (of the backend's, or TRL's SFTTrainer) with our callbacks."""

    trainer: Any
    metrics_cb: MetricsCallback


@dataclass
class Run:
    """Phase 5: what ``Trainer.train`` returned and how long it ran."""

    output: Any
    runtime: float


def set_up(config: Config, ident: Identity, launch_time: float) -> Setup:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    hardware = accel.hardware_class(cuda)
    # ``auto`` is settled once model and data are known (accel.choose weighs the workload); until then the
    # process group forms and the data loads under eager arguments.
    kind = accel.resolve_acceleration(config.acceleration)
    why = f"requested {kind}" if config.acceleration != "auto" else "auto: settled once the model is loaded"
    backend = accel.make_backend(kind)
    precision = resolve_precision(
        config.training.precision, cuda=cuda, bf16_supported=cuda and torch.cuda.is_bf16_supported()
    )
    if config.training.sharding == "fsdp" and not cuda:
        sharding.enable_on_cpu()
    # before the arguments: building them may already form the group
    init_process_group(int(config.training.extra_args.get("ddp_timeout", DDP_TIMEOUT_DEFAULT)), cuda=cuda)
    args = build_training_args(config, backend, ident, cuda=cuda, precision=precision)
    _ = args.device  # forms the process group (torchrun env) now, so the rendezvous time is measurable
    rendezvous_s = time.time() - launch_time
    torchrun_time = float(os.environ.get("FINETUNE_TORCHRUN_TIME") or launch_time)
    # launcher: validation, cache fill, preflight; rendezvous: torchrun and worker start-up (imports) + the group
    phases = {"launcher_seconds": torchrun_time - launch_time, "rendezvous_seconds": time.time() - torchrun_time}
    control_group = None
    if dist.is_initialized() and dist.get_backend() != "gloo":
        # SIGTERM agreement and resume broadcast without GPU syncs, bounded like the training collectives
        control_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=args.ddp_timeout))

    metrics = TrainerMetrics(
        namespace=config.job.namespace,
        job=config.job.name,
        node_rank=ident.node_rank,
        rollouts=config.task == "grpo",
        evaluation=config.evaluation is not None and ident.rank == 0,
    )
    metrics.rendezvous_duration.set(rendezvous_s)
    metrics.startup_launcher.set(phases["launcher_seconds"])
    metrics.attempt.set(ident.attempt)
    metrics.restarts_in_place.set(ident.round)
    if ident.local_rank == 0:
        metrics.serve(config.metrics_port)

    # Rank 0 picks the newest checkpoint that loads (unloadable ones are unmarked, partial ones removed) and every
    # rank resumes from that one, whatever its own view of the volume.
    resume, resume_fallbacks = resumption.agree(config.checkpoints_dir, rank=ident.rank, group=control_group)
    metrics.checkpoint_resume_fallbacks.set(resume_fallbacks)
    if resume is not None:
        metrics.checkpoint_last_step.set(resume.step)
        log.info("resuming from %s", resume.path)
    return Setup(
        cuda, hardware, kind, why, backend, precision, args, control_group, metrics, resume, resume_fallbacks, phases
    )


def load_data(config: Config, setup: Setup, tokenizer: Any, launch_time: float) -> Data:
    sft = data.uses_sft(config)
    evaluate = bool(config.dataset.eval_split and config.training.eval_strategy != "no")
    splits = [config.dataset.split] + ([config.dataset.eval_split] if evaluate else [])
    prepared: list[Any] = []
    mean_tokens: list[float] = []  # per split, the training split's first
    weigh = config.acceleration == "auto" and accel.weighs_workload(setup.hardware, config.task)
    label_ids, labels = (None, None)
    preference = prompts = None
    with setup.args.main_process_first(desc="load and tokenize the dataset"):
        for split in splits:
            raw = data.load_split(config, split)
            data.check_columns(config, list(raw.column_names))
            if config.task == "dpo":  # TRL's DPOTrainer tokenizes each pair; every row is checked first
                prepared.append(data.preference_dataset(config, raw))
                kind = data.check_preference_rows(config, prepared[-1], tokenizer, split)
                if preference is not None and kind != preference:
                    raise ConfigError(
                        "dataset.evalSplit",
                        f"split {split!r} holds {kind} pairs but {config.dataset.split!r} holds {preference} ones; "
                        "use one kind for both",
                    )
                preference = kind
                mean_tokens.append(0.0)
            elif config.task == "grpo":  # TRL's GRPOTrainer tokenizes the prompts as it generates
                prepared.append(data.prompt_dataset(config, raw))
                prompts = data.check_prompt_rows(config, prepared[-1], tokenizer, split)
                mean_tokens.append(0.0)
            elif sft:  # TRL's SFTTrainer renders and tokenizes; every row is checked first, naming the bad one
                prepared.append(data.sft_dataset(config, raw))
                mean_tokens.append(data.check_sft_rows(config, prepared[-1], tokenizer, split))
            else:
                if config.task == "sequence-classification" and label_ids is None:
                    label_ids, labels = data.label_mapping(raw.unique(config.dataset.label_field))
                prepared.append(data.tokenize(config, raw, tokenizer, label_ids))
                mean_tokens.append(mean_row_tokens(prepared[-1]) if weigh else 0.0)
    if len(prepared[0]) == 0:
        raise ConfigError("dataset", f"split {config.dataset.split!r} has no usable rows after tokenization")
    setup.phases["data_seconds"] = time.time() - launch_time - sum(setup.phases.values())
    setup.metrics.startup_data.set(setup.phases["data_seconds"])
    return Data(prepared[0], prepared[1] if evaluate else None, sft, labels, mean_tokens[0], preference, prompts)


def load_the_model(
    config: Config, ident: Identity, setup: Setup, *, tokenizer: Any, ds: Data, launch_time: float
) -> Model:
    """The model, then ``auto`` settled with the workload known (the backend and arguments may change)."""
    device = f"cuda:{ident.local_rank}" if setup.cuda else None
    model = load_model(config, setup.backend, tokenizer, ds.labels, device=device, precision=setup.precision)
    params = sum(p.numel() for p in model.parameters())
    setup.phases["model_seconds"] = time.time() - launch_time - sum(setup.phases.values())
    setup.metrics.startup_model.set(setup.phases["model_seconds"])
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    requested_kernels, base = config.training.kernels, adapters.base_kind(config)
    blocked = None
    if accel.liger_considered(config.acceleration, requested_kernels, setup.hardware, config.task, base=base):
        blocked = accel.liger_unavailable(setup.hardware, model_type, task=config.task)
        if requested_kernels == "liger" and blocked is not None:
            raise ConfigError("training.kernels", blocked[1])
    load = None
    if config.acceleration == "auto" and accel.weighs_workload(setup.hardware, config.task):
        row_tokens = config.training.max_seq_length if config.training.packing else ds.mean_train_tokens
        load = workload(
            config,
            ident,
            params=params,
            train_rows=len(ds.train),
            # TRL pads DPO's pairs itself, and GRPO's completions are generated
            mean_row_tokens=None if ds.preference is not None or ds.prompts is not None else row_tokens,
            done_steps=setup.resume.step if setup.resume else 0,
        )
    choice = accel.choose(
        config.acceleration,
        requested_kernels,
        setup.hardware,
        config.task,
        base=base,
        workload=load,
        liger_blocked=blocked[0] if blocked else None,
        peak_flops=device_peak_flops(ident, setup),
    )
    setup.kernels = choice.kernels
    setup.kernels_why = f"requested {requested_kernels}" if requested_kernels != "auto" else choice.why
    if config.acceleration == "auto":
        setup.kind, setup.why = choice.acceleration, choice.why
    setup.metrics.set_choice(setup.kind, setup.kernels, choice.why)
    rebuild = setup.kernels != "none"
    if setup.kind != setup.backend.name:
        setup.backend = accel.make_backend(setup.kind)
        rebuild = True
    if rebuild:
        setup.args = build_training_args(
            config, setup.backend, ident, cuda=setup.cuda, precision=setup.precision, kernels=setup.kernels
        )
    return Model(model, params)


def build_trainer(
    config: Config,
    ident: Identity,
    setup: Setup,
    *,
    tokenizer: Any,
    ds: Data,
    m: Model,
    stop: StopFlag,
    launch_time: float,
) -> Built:
    import torch

    precision, args = setup.precision, setup.args
    attention = getattr(getattr(m.model, "config", None), "_attn_implementation", None)
    log.info(
        "rank %d/%d (node %d): task=%s acceleration=%s (%s) kernels=%s precision=%s attention=%s optim=%s",
        ident.rank,
        ident.world_size,
        ident.node_rank,
        config.task,
        setup.kind,
        setup.why,
        setup.kernels,
        precision,
        attention,
        optimizer_name(args),
    )
    device_name = torch.cuda.get_device_name(0) if setup.cuda else None
    # SFTTrainer and DPOTrainer build their own collators (completion / assistant masks, packing; chosen and rejected
    # padded side by side): wrapped once the trainer exists.
    own_collator = ds.sft or ds.preference is not None or ds.prompts is not None
    counter = BatchCounter(
        None if own_collator else make_collator(config, tokenizer, static_shapes=setup.kind == "compile")
    )
    metrics_cb = MetricsCallback(
        setup.metrics,
        counter,
        nproc_per_node=ident.nproc_per_node,
        launch_time=launch_time,
        params=m.params,
        peak_flops_per_device=peak_flops(device_name, precision),
        task=config.task,
    )
    ckpt_cb = CheckpointCallback(
        stop,
        root=config.checkpoints_dir,
        keep=config.training.keep_checkpoints,
        metrics=setup.metrics,
        control_group=setup.control_group,
    )
    trainer_cls = setup.backend.classes()[0]
    extra: dict[str, Any] = {}
    if ds.sft:
        from trl import SFTTrainer

        trainer_cls = SFTTrainer
    if ds.preference is not None:
        from trl import DPOTrainer

        trainer_cls = DPOTrainer
        extra["ref_model"] = reference_model(config, setup, tokenizer, ident)
    if ds.prompts is not None:
        from trl import GRPOTrainer

        from finetune_trainer import rewards, rollout

        metrics_cb.rollout = rollout.RolloutMeter()
        trainer_cls = rollout.counted(GRPOTrainer, counter, metrics_cb.rollout)
        extra["reward_funcs"] = rewards.functions(config)
    trainer_cls = compat.eval_without_collator_wrapper(compat.cpu_resumable(trainer_cls))
    if config.task == "sequence-classification" and ds.eval is not None:  # the other tasks' defaults are None
        extra["compute_metrics"] = evaluation.classification_metrics
        extra["preprocess_logits_for_metrics"] = evaluation.argmax_logits
    trainer = trainer_cls(
        model=m.model,
        args=args,
        train_dataset=ds.train,
        eval_dataset=ds.eval,
        **({} if ds.prompts is not None else {"data_collator": None if own_collator else counter}),
        callbacks=[metrics_cb, ckpt_cb],
        **extra,
        **compat.tokenizer_kwarg(trainer_cls, tokenizer),
    )
    if own_collator and ds.prompts is None:  # GRPO's rows pass through; its rollouts are counted as generated
        counter.collator, trainer.data_collator = trainer.data_collator, counter
    return Built(trainer, metrics_cb)


def reference_model(config: Config, setup: Setup, tokenizer: Any, ident: Identity) -> Any:
    """DPO's frozen reference: with LoRA none (TRL scores the reference by disabling the adapter: no second copy of
    the weights); else the model as it was loaded, loaded once more (the same weights, or the same seeded random
    init), so that a resumed attempt compares against the original model, not the checkpoint it resumed from."""
    if config.training.lora is not None:
        return None
    device = f"cuda:{ident.local_rank}" if setup.cuda else None
    ref = load_model(config, setup.backend, tokenizer, None, device=device, precision=setup.precision)
    ref.eval()
    ref.requires_grad_(False)
    return ref


def dpo_result(config: Config, ds: Data, metrics_cb: MetricsCallback) -> dict[str, Any]:
    history = metrics_cb.reward_history
    return {
        "dpo": {
            "beta": config.training.dpo.beta,
            "loss_type": config.training.dpo.loss_type,
            "pairs": ds.preference,
            "rewards": history[-1] if history else None,
            "reward_history": history,
        }
    }


def grpo_result(config: Config, ds: Data, metrics_cb: MetricsCallback) -> dict[str, Any]:
    g, history = config.training.grpo, metrics_cb.grpo_history
    rate = metrics_cb.rollout_rate()
    return {
        "grpo": {
            "num_generations": g.num_generations,
            "max_completion_length": g.max_completion_length,
            "loss_type": g.loss_type,
            "beta": g.beta,
            "prompts": ds.prompts,
            "rewards": {r.name: {"type": r.type, "weight": r.weight} for r in g.rewards},
            "last": history[-1] if history else None,
            "history": history,
            "rollout_tokens": metrics_cb.rollout_tokens,
            "rollout_tokens_per_second": round(rate, 3) if rate is not None else None,
        }
    }


def optimizer_name(args: Any) -> str:
    return str(getattr(args.optim, "value", args.optim))  # an OptimizerNames enum on current transformers


def run_training(built: Built, setup: Setup, ds: Data, stop: StopFlag, *, config: Config, ident: Identity) -> Run:
    """``Trainer.train`` from the agreed checkpoint, then the final model's evaluation unless the schedule just did
    it (a collective: every rank)."""
    trainer = built.trainer
    if ident.rank == 0:
        _write_json(attempt_record_path(config, ident), attempt_record(config, ident, setup))
    started = time.perf_counter()
    try:
        output = trainer.train(resume_from_checkpoint=setup.resume.path if setup.resume else None)
    except RunComplete as done:  # resumed at the last step: the checkpoint's weights are the final model
        from transformers.trainer_utils import TrainOutput

        log.info("%s: nothing left to train; writing the final model and the run's result", done)
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        output = TrainOutput(trainer.state.global_step, losses[-1] if losses else math.nan, {})
    runtime = time.perf_counter() - started
    history = built.metrics_cb.eval_history
    if ds.eval is not None and not stop.agreed and (not history or history[-1]["step"] != trainer.state.global_step):
        trainer.evaluate()
    return Run(output, runtime)


def save_results(
    config: Config,
    ident: Identity,
    setup: Setup,
    *,
    tokenizer: Any,
    ds: Data,
    m: Model,
    built: Built,
    run: Run,
    stop: StopFlag,
) -> int:
    """Every rank's record, then (unless a SIGTERM stopped the run) the final model, retention and rank 0's
    result.json; the exit code."""
    import torch
    import torch.distributed as dist

    trainer, metrics_cb, state = built.trainer, built.metrics_cb, built.trainer.state
    output, runtime, cuda, precision = run.output, run.runtime, setup.cuda, setup.precision
    resume, phases, kind, why = setup.resume, setup.phases, setup.kind, setup.why
    attention = getattr(getattr(m.model, "config", None), "_attn_implementation", None)
    losses = [(h["step"], h["loss"]) for h in state.log_history if "loss" in h]

    fsdp = config.training.sharding == "fsdp"
    # FSDP: every rank holds a shard; the full weights are gathered once (a collective), for the checksum and the
    # final model. A run stopped by SIGTERM keeps only its sharded checkpoint.
    full_state = sharding.full_state_dict(trainer.model, keep=ident.rank == 0) if fsdp and not stop.agreed else None
    # DDP: every rank's replica, equal when DDP kept them in sync; FSDP: the gathered weights, on rank 0 only
    checksum = params_checksum(trainer.model) if not fsdp else state_checksum(full_state) if full_state else None
    final_loss = losses[-1][1] if losses else output.training_loss
    _write_json(
        os.path.join(config.output_path, "ranks", f"rank-{ident.rank}.json"),
        {
            "rank": ident.rank,
            "step": state.global_step,
            "final_loss": final_loss,
            "params_sha256": checksum,
            "stopped_by_signal": stop.agreed,
            "attempt": ident.attempt,
        },
    )
    resumed_from = resume.step if resume else 0
    if ident.rank == 0:
        _write_json(
            attempt_record_path(config, ident),
            attempt_record(
                config,
                ident,
                setup,
                last_step=state.global_step,
                stopped_by_signal=stop.agreed,
                loss_history=[h for h in losses if h[0] > resumed_from],
                **attempt_figures(ident, setup, metrics_cb, runtime, steps=state.global_step - resumed_from),
            ),
        )
    if stop.agreed:
        log.warning("stopped on SIGTERM at step %d after saving a checkpoint", state.global_step)
        record_agreed_stop(state.global_step)
        return EXIT_TERMINATED

    model_result = save_final_model(
        config,
        trainer,
        tokenizer=tokenizer,
        ident=ident,
        full_state=full_state,
        backend=setup.backend,
        labels=ds.labels,
        precision=precision,
    )
    if ident.rank == 0:
        for c in checkpoints.apply_retention(config.checkpoints_dir, config.training.keep_checkpoints, finished=True):
            log.info("retention: removed %s (the run is over)", c.path)
        steps_run = state.global_step - resumed_from
        whole = run_totals(config, ident)
        result = {
            "steps": state.global_step,
            "steps_this_attempt": steps_run,
            "epochs": state.epoch,
            "final_loss": final_loss,
            "train_loss_mean": output.training_loss,
            "loss_history": losses,
            # The whole run, every attempt together (attempts/attempt-<n>.json, one entry each in "attempts"):
            # the rows and tokens trained, and the steady state as the status and the Prometheus gauges show it
            # (job-wide: nodes x node rate, over the steps after each attempt's first); start-up and warm-up are
            # this attempt's separate figures below.
            **whole,
            "runtime_seconds": runtime,
            "time_to_first_step_seconds": metrics_cb.time_to_first_step,
            "warmup_seconds": metrics_cb.first_step_seconds,
            "startup": {k: round(v, 3) for k, v in phases.items()},
            "workers": workers_record(),
            "resumed_from_step": resumed_from,
            "resume_fallbacks": setup.resume_fallbacks,
            "acceleration": kind,
            "acceleration_requested": config.acceleration,
            "acceleration_reason": why,
            "kernels": setup.kernels,
            "kernels_reason": setup.kernels_why,
            "attention": attention,
            "optimizer": optimizer_name(setup.args),
            "precision": precision,
            **batch_record(config, ident),
            "attempt": ident.attempt,
            "params": m.params,
            "params_sha256": checksum,
            "sharding": config.training.sharding,
            # the peak of rank 0's GPU; null on CPU
            "gpu_memory_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None,
            "mfu": metrics_cb.steady_mfu(),  # rank 0's node at its steady rate; null on CPU or an unknown GPU
            "model": model_result,
            # Every evaluation ({"step", "loss", and perplexity, or accuracy and f1}) and the final model's.
            "eval_history": metrics_cb.eval_history,
            "final_eval": metrics_cb.eval_history[-1] if metrics_cb.eval_history else None,
            # dpo: the rewards at every log of this attempt and the last ({"step", "accuracy", "margin",
            # "chosen", "rejected"}), beta and the loss type; null for the other tasks
            **(dpo_result(config, ds, metrics_cb) if ds.preference is not None else {"dpo": None}),
            # grpo: every log of this attempt ({"step", "reward", "reward_std", "completion_length", "kl",
            # "entropy", "rewards": {name: mean}}), the last, the settings, and rank 0's node's rollout rate
            # (completion tokens per second of generation); null for the other tasks
            **(grpo_result(config, ds, metrics_cb) if ds.prompts is not None else {"grpo": None}),
            # the evaluation stage's record (finetune_trainer.scoring), once it ran; null without spec.evaluation
            "evaluation": None,
        }
        _write_json(config.result_path, result)
    if dist.is_initialized():
        dist.barrier(group=setup.control_group)
    if ident.rank == 0 and config.evaluation is not None:
        # After the barrier: the other ranks exit while rank 0 generates, with the model already saved.
        log.info("evaluation stage: split %r, up to %d samples", config.evaluation.split, config.evaluation.max_samples)
        result["evaluation"] = scoring.run_safely(config, trainer.model, tokenizer, stop, setup.metrics)
        _write_json(config.result_path, result)
        log.info("evaluation stage: %s", json.dumps(result["evaluation"]))
    log.info("done: %d steps, final loss %.4f", state.global_step, final_loss if final_loss is not None else math.nan)
    return 0


def train(config: Config, ident: Identity, stop: StopFlag, launch_time: float) -> int:
    """The worker's main path, in phases: set-up, data, model, trainer construction, run, results."""
    setup = set_up(config, ident, launch_time)
    tokenizer = load_tokenizer(config)
    ds = load_data(config, setup, tokenizer, launch_time)
    m = load_the_model(config, ident, setup, tokenizer=tokenizer, ds=ds, launch_time=launch_time)
    built = build_trainer(config, ident, setup, tokenizer=tokenizer, ds=ds, m=m, stop=stop, launch_time=launch_time)
    run = run_training(built, setup, ds, stop, config=config, ident=ident)
    return save_results(config, ident, setup, tokenizer=tokenizer, ds=ds, m=m, built=built, run=run, stop=stop)


def run() -> tuple[int, Config | None]:
    """The worker's whole life in this process: its exit code and config (None when the config did not load). Raises
    on failure; the caller (``main``, or the agent's forked entry) turns the exception into the error file."""
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s rank" + os.environ.get("RANK", "?") + " %(levelname)s %(name)s: %(message)s",
        force=True,  # a worker forked from the agent inherits its handlers, without the rank
    )
    launch_time = float(os.environ.get("FINETUNE_LAUNCH_TIME") or time.time())
    stop = StopFlag()
    stop.install()
    ident = Identity.from_env()
    code = 1
    config = None
    try:
        # A ConfigError propagates as is: @record writes "ConfigError: <field>: <message>" to the error file and
        # the launcher turns that prefix into exit 78 instead of a crash; failures another attempt would repeat
        # (CUDA out of memory, a model type or Hub repo that does not exist, ...) are mapped the same way.
        config = load_config()
        code = train(config, ident, stop, launch_time)
    except ConfigError:
        raise
    except Exception as e:
        diagnose.reraise_classified(e, config)
        raise
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return code, config


def forked_entry() -> None:
    """The agent's entry point (``finetune_trainer.agent``), in a process forked from it with the stack imported. A
    non-zero code leaves through SystemExit: torch's process context reports it as this rank's exit code. The agent's
    handlers for SIGINT, SIGHUP and SIGQUIT (torch's, raising in the agent) go back to the defaults; SIGTERM is the
    worker's own (StopFlag)."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    code, _ = run()
    if code != 0:
        raise SystemExit(code)


@record
def main() -> None:
    code, config = run()
    if config is not None and config.acceleration == "ort":
        # onnxruntime-training tears its environment down in an atexit hook that intermittently hangs the interpreter's
        # exit (seen in this project's test runs, after the checkpoint and the stop record were written): the work
        # is done and on disk, so the process leaves without running exit hooks. Errors never get here: they raise
        # above, through @record, which writes the error file.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
