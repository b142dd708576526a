"""`bench/gpu_check.sh` at toy sizes on the CPU (`GPU_CHECK_DEVICE=cpu`): the script a GPU machine runs, checked on
every change so that a run on a GPU is never spent on a broken script.

Nothing is mocked: the same rows run as on a GPU (`finetune run-local` scraped mid-run, then the rows forked from
one process by `bench/gpu_rows.py`, then the benches), at sizes a CPU trains in seconds; the rows a CPU cannot run
(Liger's kernels, QLoRA) must be refused by the trainer itself, exit 78 naming the field.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainer
ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_runs_every_row_at_toy_sizes(tmp_path: Path) -> None:
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "OUT": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", "bench/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = (tmp_path / "summary.log").read_text()
    lines = {line.split(":", 1)[0]: line for line in summary.splitlines() if ":" in line}
    # row 1: what auto settled and why, the scraped gauges, the start-up by phase
    assert "acceleration none (auto: no option faster than eager measured for causal-lm on cpu)" in summary, summary
    assert "mid-run gauges" in summary and "'launcher_seconds'" in summary, summary
    # the rows of one process, in order, each with its figures or the refusal a CPU must give
    rows = ["kernels-none", "liger", "llama8b-lora", "dpo", "grpo", "qlora", "fsdp"]
    assert [name for name in lines if name in rows] == rows, summary
    for refused, field in (("liger", "training.kernels"), ("qlora", "training.lora.quantization")):
        assert f"exit 78 on CPU, refused by the trainer naming {field}" in lines[refused], lines[refused]
    assert "adapter lora" in lines["llama8b-lora"] and "rewards" in lines["dpo"], summary
    assert "completion tokens/s" in lines["grpo"] and "adapter lora" in lines["grpo"], lines["grpo"]
    assert "sharded checkpoint True" in lines["fsdp"], lines["fsdp"]
    assert "rows: 7 in" in summary and ", 0 failed" in summary, summary
    assert "forked from this process" in summary, summary
    # the BERT bench, with its table
    assert "| eager | sdpa |" in summary and "| compile | sdpa |" in summary, summary
    assert "done in" in summary, summary
