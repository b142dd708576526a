"""`finetune run-local` on the README's example: two local nodes through real torchrun rendezvous and DDP.

Nothing is mocked: the operator's builders produce each node's config and env, and the trainer trains.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainer
ROOT = Path(__file__).resolve().parents[2]


def test_run_local_trains_the_example(tmp_path: Path) -> None:
    finetune = Path(sys.executable).with_name("finetune")
    proc = subprocess.run(
        [str(finetune), "run-local", "examples/tiny-job.yaml", "--workdir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "output" / "default" / "tiny"
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 150 and result["world_size"] == 2
    assert (out / "model" / "config.json").exists()
    configs = [json.loads((tmp_path / f"config-node{r}.json").read_text()) for r in (0, 1)]
    assert [c["metrics"]["port"] for c in configs] == [9400, 9401]
    assert configs[0]["dataset"]["path"] == str(ROOT / "examples" / "tiny" / "data")
