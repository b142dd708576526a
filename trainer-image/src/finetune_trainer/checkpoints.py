"""Checkpoint discovery, completion markers and retention (pure file-system logic, no torch).

A checkpoint directory ``checkpoints/checkpoint-<step>`` is *complete* only when it holds the marker file
:data:`MARKER`, written by rank 0 after a barrier that every rank reaches once its part of the save is on disk.
A directory without the marker (cut off mid-write, or a peer died) is never resumed from and is removed at start.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass

MARKER = "COMPLETE"
_NAME = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True, order=True)
class Checkpoint:
    step: int
    path: str
    complete: bool


def list_checkpoints(root: str) -> list[Checkpoint]:
    """Every ``checkpoint-<step>`` directory under ``root``, oldest first."""
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        match = _NAME.match(name)
        path = os.path.join(root, name)
        if match and os.path.isdir(path):
            found.append(Checkpoint(int(match.group(1)), path, os.path.isfile(os.path.join(path, MARKER))))
    return sorted(found)


def latest_complete(root: str) -> Checkpoint | None:
    complete = [c for c in list_checkpoints(root) if c.complete]
    return complete[-1] if complete else None


def mark_complete(path: str, step: int) -> None:
    """Write the marker atomically (temp file, fsync, rename), then fsync the directory."""
    tmp = os.path.join(path, f".{MARKER}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"step": step, "time": time.time()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, MARKER))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_incomplete(root: str, *, keep_newer_than: int | None = None) -> list[Checkpoint]:
    """Delete checkpoints without a marker (only those at or below ``keep_newer_than`` when given)."""
    removed = []
    for c in list_checkpoints(root):
        if not c.complete and (keep_newer_than is None or c.step <= keep_newer_than):
            shutil.rmtree(c.path, ignore_errors=True)
            removed.append(c)
    return removed


def apply_retention(root: str, keep: int) -> list[Checkpoint]:
    """Keep the newest ``keep`` complete checkpoints; delete older complete ones and partial ones older than the
    newest complete one. Returns what was removed."""
    checkpoints = list_checkpoints(root)
    complete = [c for c in checkpoints if c.complete]
    doomed = complete[:-keep] if keep > 0 else complete
    if complete:
        newest = complete[-1].step
        doomed += [c for c in checkpoints if not c.complete and c.step < newest]
    for c in doomed:
        _remove(c)
    return doomed


def _remove(c: Checkpoint) -> None:
    # Drop the marker first: a deletion cut off half-way must leave a partial checkpoint, never a "complete" one.
    if c.complete:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(c.path, MARKER))
    shutil.rmtree(c.path, ignore_errors=True)
