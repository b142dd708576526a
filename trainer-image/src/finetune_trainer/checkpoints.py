"""Checkpoint discovery, completion markers and retention (pure file-system logic, no torch).

A checkpoint directory ``checkpoints/checkpoint-<step>`` is *complete* only when it holds the marker file
:data:`MARKER`, written by rank 0 after a barrier that every rank reaches once its part of the save is on disk.
A directory without the marker (cut off mid-write, or a peer died) is never resumed from and is removed at start.
Before the barrier every rank fsyncs what is in the directory (:func:`sync_tree`), so the marker never reaches the
disk ahead of the files it vouches for.

Retention keeps at least :data:`KEEP_WHILE_RUNNING` complete checkpoints until the run ends: the newest one has
not been loaded yet, and if it proves unloadable the resume falls back to the one before it (``resumption.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass

MARKER = "COMPLETE"
KEEP_WHILE_RUNNING = 2
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
        # A real directory holding a real marker, never a symlink: a link planted on a shared claim
        # (checkpoint-999999 -> another job's directory) must not be resumed from, unmarked or deleted.
        if match and _real_dir(path):
            marker = os.path.join(path, MARKER)
            complete = os.path.isfile(marker) and not os.path.islink(marker)
            found.append(Checkpoint(int(match.group(1)), path, complete))
    return sorted(found)


def _real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


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
    _fsync(path)


def unmark(c: Checkpoint) -> None:
    """Make ``c`` partial (drop its marker): it is never resumed from again and :func:`remove_incomplete` deletes
    it."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(c.path, MARKER))
        _fsync(c.path)


def _fsync(path: str) -> None:
    """fsync a file or a directory (its entries) by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(path: str) -> None:
    """fsync every file and directory under ``path``, and ``path``'s entry in its parent. Called by every rank
    after its part of a save and before the completion barrier: each file is then synced at least by the rank that
    wrote it (it lists the directory after writing), wherever the ranks run. The libraries that write checkpoints
    (transformers, torch, safetensors) do not fsync, and a marker that reaches the disk before the weights would
    vouch for files a node crash can leave empty."""
    for parent, _, files in os.walk(path, topdown=False):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # a temp file another rank renamed meanwhile
                _fsync(os.path.join(parent, name))
        _fsync(parent)
    _fsync(os.path.dirname(os.path.abspath(path)))


def size_of(path: str) -> int:
    """Bytes of the files under ``path``."""
    total = 0
    for parent, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of ``path`` (the trainer does not run as
    root, so blocks reserved for root do not count)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def make_room(root: str) -> list[Checkpoint]:
    """Before a save: when the free space is below the size of the newest complete checkpoint (what the next one
    will roughly need) and an older complete one exists, delete the oldest complete ones until it fits or only the
    newest is left. Never the newest: it is what a restart resumes from. Returns what was removed."""
    removed: list[Checkpoint] = []
    complete = [c for c in list_checkpoints(root) if c.complete]
    if not complete:
        return removed
    needed = size_of(complete[-1].path)
    for c in complete[:-1]:
        if free_bytes(root) >= needed:
            break
        _remove(c)
        removed.append(c)
    return removed


def remove_incomplete(root: str, *, keep_newer_than: int | None = None) -> list[Checkpoint]:
    """Delete checkpoints without a marker (only those at or below ``keep_newer_than`` when given)."""
    removed = []
    for c in list_checkpoints(root):
        if not c.complete and (keep_newer_than is None or c.step <= keep_newer_than):
            shutil.rmtree(c.path, ignore_errors=True)
            removed.append(c)
    return removed


def apply_retention(root: str, keep: int, *, finished: bool = False) -> list[Checkpoint]:
    """Keep the newest ``keep`` complete checkpoints, but at least :data:`KEEP_WHILE_RUNNING` until the run has
    ``finished`` (a newest checkpoint that proves unloadable must leave one to fall back to); delete older complete
    ones and partial ones older than the newest complete one. Returns what was removed."""
    keep = keep if finished else max(keep, KEEP_WHILE_RUNNING)
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
        unmark(c)
    shutil.rmtree(c.path, ignore_errors=True)
