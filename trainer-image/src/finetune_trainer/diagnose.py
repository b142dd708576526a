"""Failures that another attempt would repeat, told apart from crashes, so they do not burn gang restarts.

A worker's exception is mapped (:func:`classify`) to the exception whose name the launcher turns into an exit code:
:class:`ConfigError` (exit 78: a model type this image does not know, a Hub repository or revision that does not
exist or that the token cannot read, anything missing while the Hub is offline, a ``report_to`` integration whose
package the image lacks), :class:`CUDAOutOfMemory` (exit 77, with the settings that lower memory) or
:class:`OutputFull` (exit 73: no space left, or the quota spent, while writing a checkpoint or the model; the restart
would resume and fail at the same save). Everything else stays a crash (exit 1, retried by a gang restart).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from typing import Any

from finetune_trainer import checkpoints
from finetune_trainer.config import Config
from finetune_trainer.errors import ConfigError, CUDAOutOfMemory, OutputFull

OOM_FIX = (
    "lower spec.training.perDeviceBatchSize (raise gradientAccumulationSteps to keep the effective batch) or "
    "maxSeqLength, set training.activationCheckpointing: true, train LoRA or QLoRA adapters instead of every "
    "weight, or shard the model over more GPUs with training.sharding: fsdp"
)
OUTPUT_FULL_FIX = (
    "enlarge the output claim (spec.output: the claimName's claim, or the storage request of "
    "volumeClaimTemplate) or keep fewer checkpoints (spec.training.keepCheckpoints)"
)
FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
# A full volume where no errno survives: safetensors' Rust I/O error ("No space left on device (os error 28)").
FULL_TEXT = ("No space left on device", "Disk quota exceeded", "os error 28", "os error 122")
# torch.save reports a failed write without the cause ("[enforce fail at inline_container.cc:…] unexpected pos …",
# "PytorchStreamWriter failed writing file …"): a full volume only when the output volume is (nearly) full now.
TORCH_WRITE_FAILED = ("inline_container.cc", "PytorchStreamWriter")
NEARLY_FULL_BYTES = 16 * 2**20
HUB_NOT_FOUND = {"RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError", "EntryNotFoundError"}
_INTEGRATION = re.compile(r"(\w+)Callback requires (\S+) to be installed")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _hub_field(config: Config | None, text: str) -> tuple[str, str]:
    """The spec field the Hub error is about, and its value ('' when unknown)."""
    if config is not None and config.dataset.name and config.dataset.name in text:
        return "dataset.name", config.dataset.name
    return "model.name", (config.model.name or "") if config is not None else ""


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:500]


def _nearly_full(path: str) -> bool:
    try:
        return checkpoints.free_bytes(path) < NEARLY_FULL_BYTES
    except OSError:
        return False


def _on_output(filename: Any, config: Config) -> bool:
    out = os.path.realpath(config.output_path)
    return os.path.commonpath([out, os.path.realpath(str(filename))]) == out


def output_full(chain: list[BaseException], config: Config | None) -> OutputFull | None:
    """:class:`OutputFull` when ``chain`` is a write to the output volume that failed for want of space or quota,
    else None. ENOSPC elsewhere is not the output claim's fault (``/dev/shm`` for the DataLoader's workers, the
    Hugging Face cache, inotify's watch limit): a failure that names another path is left a crash, and one that names
    no path counts only while the output volume is (nearly) full."""
    if config is None:
        return None
    for e in chain:
        if (isinstance(e, OSError) and e.errno in FULL_ERRNOS) or any(t in str(e) for t in FULL_TEXT):
            named = e.filename if isinstance(e, OSError) and e.filename else None
            if not (_on_output(named, config) if named else _nearly_full(config.output_path)):
                continue
            where = f" writing {named}" if named else ""
            return OutputFull(
                f"no space left on the volume{where} ({_first_line(e)}); a restart would fail at the same save: "
                f"{OUTPUT_FULL_FIX}"
            )
    if _nearly_full(config.output_path):
        for e in chain:
            if any(t in str(e) for t in TORCH_WRITE_FAILED):
                return OutputFull(
                    f"a write failed ({_first_line(e)}) with less than {NEARLY_FULL_BYTES // 2**20} MiB left on the "
                    f"output volume {config.output_path}; a restart would fail at the same save: {OUTPUT_FULL_FIX}"
                )
    return None


def classify(exc: BaseException, config: Config | None = None) -> Exception | None:
    """The deterministic failure ``exc`` stands for, or None for a crash."""
    chain = list(_chain(exc))
    for e in chain:
        name = type(e).__name__
        if name == "OutOfMemoryError" or "CUDA out of memory" in str(e):
            return CUDAOutOfMemory(f"the GPU ran out of memory ({_first_line(e)}); {OOM_FIX}")
    full = output_full(chain, config)
    if full is not None:
        return full
    for e in chain:
        name, text = type(e).__name__, str(e)
        if name in HUB_NOT_FOUND:
            field, repo = _hub_field(config, text)
            return ConfigError(
                field,
                f"the Hub refused {repo!r} ({_first_line(e)}): check spec.{field} and spec.model.revision, and "
                "that the token in spec.hfTokenSecretRef may read it (gated models need their license accepted)",
            )
        if name == "LocalEntryNotFoundError" and os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True"):
            field, repo = _hub_field(config, text)
            return ConfigError(
                field,
                f"{repo!r} is not in the Hugging Face cache and the Hub is offline (HF_HUB_OFFLINE=1): "
                f"{_first_line(e)}; fill the cache (spec.cache) or let the pod reach the Hub",
            )
        if isinstance(e, ValueError) and "does not recognize this architecture" in text:
            return ConfigError(
                "model",
                f"this image's transformers does not know the model type ({_first_line(e)}); use a newer trainer "
                "image, or set spec.model.trustRemoteCode if the model ships its own code",
            )
        match = _INTEGRATION.search(text)
        if match:
            return ConfigError(
                "training.extraArgs.report_to",
                f"the {match.group(1)} integration needs the {match.group(2)!r} package, which this image lacks; "
                "remove it from spec.training.extraArgs.report_to (the trainer exports Prometheus metrics itself) "
                "or build an image that adds it",
            )
    return None


def reraise_classified(exc: BaseException, config: Any) -> None:
    """Raise what :func:`classify` maps ``exc`` to (from ``exc``), or return for a crash."""
    mapped = classify(exc, config)
    if mapped is not None:
        raise mapped from exc
