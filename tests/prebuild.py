"""The Go tools only some tiers need, built in the background while the tiers that do not need them run.

On a cold machine helm, promtool and controller-gen (the chart tier, and helm for real nodes), Kueue's controller
manager (the Kueue tests), the distribution registry (the local release, real nodes) and the gang schedulers' pieces
(the coscheduling scheduler, the PodGroup CRDs) take about sixteen minutes of compiling. The session runs its tiers in
an order that puts the tests needing them late (``tier``) and starts their builds at the lowest CPU priority when the
session begins, so they take the CPU the earlier tiers leave idle while they wait on the API server, kubelets and
timeouts. A test that
needs a tool calls the same build script, which waits on the build's lock and then finds it complete. Warm, the
builds are cached and nothing starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("FINETUNE_CACHE", Path.home() / ".cache" / "finetune-operator"))
SCRIPTS = {  # what the tests call to get each tool (hack/helmtools.ensure_tools, hack/kueue.ensure_built)
    "chart tools": ROOT / "hack" / "helmtools" / "build.sh",
    "kueue": ROOT / "hack" / "kueue" / "build.sh",
    "registry": ROOT / "hack" / "registry" / "build.sh",  # the local release (real nodes)
    "gang schedulers": ROOT / "hack" / "gangschedulers" / "build.sh",  # coscheduling, PodGroup CRDs
}


def needs_tools(item: pytest.Item) -> bool:
    path = str(item.fspath)
    return (
        "/chart/" in path
        or "/realnodes/" in path
        or item.get_closest_marker("kueue") is not None
        or item.get_closest_marker("gangschedulers") is not None
    )


def tier(item: pytest.Item) -> int:
    """The order the tiers run in: pure code; the control-plane tiers (mostly waiting: the background builds run
    beside them); the tiers needing the tools (chart, Kueue, then real nodes); the trainer's training last (it keeps
    both cores busy, so nothing would build beside it)."""
    path = str(item.fspath)
    if "/unit/" in path:
        return 0
    if "/trainer/" in path:
        return 5
    if "/realnodes/" in path:
        return 4
    if "/chart/" in path:
        return 2
    if item.get_closest_marker("kueue") is not None or item.get_closest_marker("gangschedulers") is not None:
        return 3
    return 1


def order(items: list[pytest.Item]) -> None:
    items.sort(key=tier)  # stable: each tier keeps its own order


def _complete(script: Path) -> bool:
    out = subprocess.run(["bash", str(script), "--path"], capture_output=True, text=True, check=False).stdout.strip()
    return bool(out) and (Path(out) / ".complete").exists()


def start(items: list[pytest.Item], log: Path) -> subprocess.Popen[bytes] | None:
    """Start the builds the collected tests need and the cache lacks, at nice 19, in their own process group."""
    if not any(needs_tools(item) for item in items):
        return None
    missing = [str(script) for script in SCRIPTS.values() if not _complete(script)]
    if not missing:
        return None
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(
            ["nice", "-n", "19", "bash", "-c", " && ".join(f"bash {s}" for s in missing)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """End a build still running when the session ends (a later run starts it again: the scripts are idempotent)."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
