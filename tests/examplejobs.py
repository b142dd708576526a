"""The tiny example as the tiers that run it for real use it: ``examples/tiny-job.yaml`` under another name, with
spec overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

TINY_JOB = Path(__file__).resolve().parents[1] / "examples" / "tiny-job.yaml"


def tiny_job(name: str, **spec: Any) -> dict[str, Any]:
    """examples/tiny-job.yaml under another name, with spec overrides (dotted keys reach into the spec)."""
    job = yaml.safe_load(TINY_JOB.read_text())
    job["metadata"] = {"name": name}
    for key, value in spec.items():
        node = job["spec"]
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return dict(job)
