"""Which checkpoint every rank resumes from, decided once by rank 0 and broadcast.

Rank 0 checks that the newest complete checkpoint can be loaded (:func:`problem`: the files the Trainer reads on
resume parse) and otherwise falls back to the previous complete one, unmarking the bad one so that no later attempt
trips on it again (a checkpoint that always failed to load would turn every gang restart into the same crash until
``maxRestarts`` ran out). The choice goes to every rank over the control group: on a network filesystem ranks may
list different newest checkpoints, and ranks resuming from different steps would train different models.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from typing import Any

from finetune_trainer import checkpoints
from finetune_trainer.checkpoints import Checkpoint

log = logging.getLogger(__name__)

TORCH_FILES = (".pt", ".pth", ".bin")  # torch.save zip archives: optimizer, scheduler, scaler, RNG states, weights
DCP_METADATA = ".metadata"  # a torch.distributed.checkpoint directory (FSDP's sharded model and optimizer)


def _check_safetensors(path: str) -> None:
    """The header parses and the tensors it lists fit in the file (a truncated file fails here)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        f.keys()


def _check_torch(path: str) -> None:
    """The zip archive opens (its directory sits at the end: a truncated or zero-filled tail fails here) and the
    pickle reads, storages memory-mapped rather than loaded. A global the weights-only unpickler refuses (numpy's
    RNG state, the pickled TrainingArguments) means the archive is readable: the Trainer loads those with its own
    allow-list or not at all."""
    import torch

    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        if not str(e).startswith("Weights only load failed"):
            raise


def _check_json(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        json.load(f)


def _check_dcp(directory: str) -> None:
    """Every byte range the metadata names lies within its shard file."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    for info in FileSystemReader(directory).read_metadata().storage_data.values():
        shard = os.path.join(directory, info.relative_path)
        size = os.path.getsize(shard)
        if info.offset + info.length > size:
            raise ValueError(f"{info.relative_path} has {size} bytes, the metadata needs {info.offset + info.length}")


def _check(path: str, name: str) -> None:
    if name.endswith(".safetensors"):
        _check_safetensors(path)
    elif name.endswith(TORCH_FILES):
        _check_torch(path)
    elif name.endswith(".json"):
        _check_json(path)


# Failures to *read* the volume (EIO, ESTALE on NFS, a file gone while listed) or to check at all (memory) say
# nothing about the checkpoint: they propagate, the worker crashes and the gang restart tries again, instead of the
# checkpoint being unmarked and deleted. Everything else a parser raises means the bytes are not a checkpoint.
NOT_DAMAGE = (OSError, MemoryError)


def _damage(exc: Exception) -> bool:
    # torch and safetensors wrap some read errors in their own types: a message with an errno text is I/O, too
    return not isinstance(exc, NOT_DAMAGE) and "Input/output error" not in str(exc)


def problem(path: str) -> str | None:
    """Why the checkpoint at ``path`` cannot be loaded, or None when every file the Trainer reads parses. An I/O
    error while reading raises (:data:`NOT_DAMAGE`)."""
    for parent, _, files in os.walk(path):
        if DCP_METADATA in files:
            try:
                _check_dcp(parent)
            except Exception as e:
                if not _damage(e):
                    raise
                return f"{os.path.relpath(parent, path)}: {type(e).__name__}: {e}"
        for name in sorted(files):
            try:
                _check(os.path.join(parent, name), name)
            except Exception as e:
                if not _damage(e):
                    raise
                return f"{os.path.relpath(os.path.join(parent, name), path)}: {type(e).__name__}: {e}"
    return None


def choose(root: str) -> tuple[Checkpoint | None, int]:
    """Rank 0: the newest complete checkpoint that loads, and how many newer ones did not (each unmarked, so the
    next :func:`checkpoints.remove_incomplete` deletes it)."""
    fallbacks = 0
    for c in reversed([c for c in checkpoints.list_checkpoints(root) if c.complete]):
        why = problem(c.path)
        if why is None:
            return c, fallbacks
        log.warning("checkpoint %s cannot be loaded (%s): falling back to the previous complete one", c.path, why)
        checkpoints.unmark(c)
        fallbacks += 1
    return None, fallbacks


def agree(root: str, *, rank: int, group: Any) -> tuple[Checkpoint | None, int]:
    """Rank 0 chooses (:func:`choose`) and removes partial checkpoints; every rank gets the same step and
    fallback count. Without a process group (one process) the choice is local."""
    import torch
    import torch.distributed as dist

    chosen, fallbacks = (None, 0)
    if rank == 0:
        chosen, fallbacks = choose(root)
        for c in checkpoints.remove_incomplete(root):
            log.warning("removed partial checkpoint %s (no %s marker)", c.path, checkpoints.MARKER)
    if dist.is_initialized():
        decision = torch.tensor([chosen.step if chosen else -1, fallbacks], dtype=torch.int64)
        dist.broadcast(decision, src=0, group=group)
        step, fallbacks = (int(v) for v in decision.tolist())
        chosen = Checkpoint(step, os.path.join(root, f"checkpoint-{step}"), True) if step >= 0 else None
    return chosen, fallbacks
