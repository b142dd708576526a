"""Sharded data parallelism (``training.sharding: fsdp``) through the Trainer's FSDP support (FSDP2).

* Arguments: full shard, auto-wrap by the model's transformer block (Accelerate reads the model's
  ``_no_split_modules``), sharded (DCP) checkpoints, so every rank writes and resumes only its own shard.
* CPU: Accelerate turns its FSDP plugin on only for accelerator devices (``AcceleratorState`` switches
  ``MULTI_CPU`` to ``FSDP`` never), so on CPU the Trainer would silently train plain DDP. torch's ``fully_shard``
  runs on CPU with gloo, so :func:`enable_on_cpu` lets the plugin through: CPU runs shard as GPU runs do.
* The final model: Accelerate's full-state-dict gather (``get_model_state_dict`` with ``cpu_offload``) hangs on
  gloo, so :func:`full_state_dict` gathers one parameter at a time (``DTensor.full_tensor``), the same on NCCL.
"""

from __future__ import annotations

from typing import Any


def training_args(activation_checkpointing: bool, *, pretrained: bool) -> dict[str, Any]:
    """The ``TrainingArguments`` keywords that turn FSDP on. ``pretrained``: only rank 0 reads the weights from
    disk, the others build the model on the meta device and receive their shards (a 70B model would otherwise be
    read into CPU memory once per process)."""
    return {
        "fsdp": "full_shard auto_wrap",
        "fsdp_config": {
            "version": 2,
            "state_dict_type": "SHARDED_STATE_DICT",
            # FSDP's own activation checkpointing (per wrapped block), not the Trainer's, which would add an
            # all-gather to every backward pass
            "activation_checkpointing": activation_checkpointing,
            "cpu_ram_efficient_loading": pretrained,
        },
    }


def enable_on_cpu() -> None:
    """Let Accelerate's FSDP plugin through on CPU (idempotent; GPU runs are untouched)."""
    from accelerate import state
    from accelerate.utils import DistributedType

    init = state.AcceleratorState.__init__
    if getattr(init, "_finetune_fsdp_cpu", False):
        return

    def init_with_cpu_fsdp(self: Any, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin

    init_with_cpu_fsdp._finetune_fsdp_cpu = True  # type: ignore[attr-defined]
    state.AcceleratorState.__init__ = init_with_cpu_fsdp  # type: ignore[method-assign]


def full_state_dict(model: Any, *, keep: bool) -> dict[str, Any]:
    """The unsharded state dict on CPU where ``keep`` (rank 0), empty elsewhere. A collective: every rank calls
    it, in step; only one parameter is ever unsharded on the device at a time."""
    from torch.distributed.tensor import DTensor

    out: dict[str, Any] = {}
    for name, value in model.state_dict().items():
        full = value.full_tensor() if isinstance(value, DTensor) else value
        if keep:
            out[name] = full.detach().cpu().clone()
        del full
    return out
