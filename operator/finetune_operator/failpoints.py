"""Failpoints: named places where a fault test can hold one of the operator's threads, to check what the rest of the
operator (and its liveness probe) does meanwhile. Off unless ``FINETUNE_FAILPOINTS_DIR`` names a directory; then a
failpoint holds its thread for as long as a file of its name exists there. One ``stat`` per pass when on, nothing
when off. Never set in the chart.

Failpoints: ``backstop-loop`` (the backstop's timer loop, before its heartbeat)."""

from __future__ import annotations

import time
from pathlib import Path


def hold(directory: str, name: str) -> None:
    """Block while ``<directory>/<name>`` exists; return at once when ``directory`` is empty (failpoints off)."""
    if not directory:
        return
    flag = Path(directory) / name
    while flag.exists():
        time.sleep(0.2)
