"""The log copy on the output volume (finetune_trainer.podlog): a real process tees its own output and a child's
to the file and to its standard output; an unwritable volume costs the copy, never the pod log. Nothing is
mocked: each case runs a Python subprocess, as the launcher is PID 1 of its pod."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from finetune_trainer.podlog import path_for

pytestmark = pytest.mark.trainer

SCRIPT = textwrap.dedent("""
    import subprocess, sys
    from finetune_trainer import podlog
    podlog.start(sys.argv[1], attempt=2, node_rank=1)
    print("from the launcher", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-c", "print('from a worker')"], check=True)
    podlog.close_active()
    print("after the copy ended", flush=True)
""")


def _run(output: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(output)], capture_output=True, text=True, timeout=60)


def test_every_line_reaches_the_pod_log_and_the_attempts_file(tmp_path: Path) -> None:
    proc = _run(tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    lines = ["from the launcher", "to stderr", "from a worker"]
    assert proc.stdout.splitlines() == [*lines, "after the copy ended"]  # stderr merged, as in a pod log
    copy = Path(path_for(str(tmp_path / "out"), 2, 1))
    assert copy == tmp_path / "out" / "logs" / "attempt-2" / "node-1.log"
    assert copy.read_text().splitlines() == lines


def test_an_unwritable_output_volume_costs_the_copy_not_the_pod_log(tmp_path: Path) -> None:
    blocked = tmp_path / "out"
    blocked.write_text("a file where the output directory should be")  # makedirs fails: ENOTDIR
    proc = _run(blocked)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert "from the launcher" in out and "from a worker" in out and out[-1] == "after the copy ended"
    assert any("the log copy" in line and "stopped" in line for line in proc.stderr.splitlines())
