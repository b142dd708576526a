"""``finetune submit --follow`` and ``finetune logs`` end to end: the real control plane, the real operator, the node
agent running the real trainer (two nodes of the tiny example), and the ``finetune`` command as a subprocess.

Mocked: the kubelet and the container runtime (the node agent stands in for both, and serves the kubelet API's
``/containerLogs`` that the API server proxies ``pods/log`` to).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import E2E, tiny_job

pytestmark = pytest.mark.e2e


def finetune(cluster: Any, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The command's output decoded as it is: text mode would turn a progress bar's "\\r" into a line break."""
    r = subprocess.run([sys.executable, "-m", "finetune_operator.cli", *args, f"--kubeconfig={cluster.kubeconfig}"],
                       capture_output=True, timeout=timeout, env={**os.environ, "COLUMNS": "200"})
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(errors="replace"),
                                       r.stderr.decode(errors="replace"))


def test_submit_follow_streams_rank_0_until_the_end_and_every_ranks_log_stays(e2e: E2E, cluster: Any,
                                                                              tmp_path: Path) -> None:
    job = tiny_job("follow", **{"training.maxSteps": 20, "training.checkpointEverySteps": 10})
    job["metadata"]["namespace"] = e2e.namespace
    path = tmp_path / "follow.yaml"
    path.write_text(yaml.safe_dump(job))
    r = finetune(cluster, "submit", str(path), "--follow", timeout=600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:], e2e.diagnostics())
    out = r.stdout
    assert "finetunejob.finetune.dev/follow created" in out
    assert "--- follow-node-0 (attempt 0, rank 0) ---" in out
    assert "launcher INFO starting:" in out  # rank 0's own log, streamed while it ran
    assert out.strip().splitlines()[-1].startswith("follow: Succeeded — AllRanksSucceeded: all 2 rank(s) exited 0")

    ns = ["-n", e2e.namespace]
    one = finetune(cluster, "logs", "follow", "--rank", "1", *ns)
    assert one.returncode == 0 and "launcher INFO starting:" in one.stdout, one.stderr
    tail = finetune(cluster, "logs", "follow", "--tail", "3", *ns)
    assert tail.returncode == 0 and len(tail.stdout.rstrip("\n").split("\n")) == 3
    both = finetune(cluster, "logs", "follow", "--all", *ns)
    assert both.returncode == 0, both.stderr
    assert {line[:8] for line in both.stdout.rstrip("\n").split("\n")} == {"[node 0]", "[node 1]"}

    # The copy on the output claim, which outlives the pods of the attempt: the pod log from the launcher's start on.
    for rank, text in ((0, finetune(cluster, "logs", "follow", *ns).stdout), (1, one.stdout)):
        copy_file = e2e.output_dir("follow") / "logs" / "attempt-0" / f"node-{rank}.log"
        copy = copy_file.read_bytes().decode(errors="replace")
        assert "launcher INFO starting:" in copy
        assert text.rstrip().endswith(copy.rstrip()), (rank, copy[-500:], text[-500:])
    missing = finetune(cluster, "logs", "follow", "--attempt", "3", *ns)
    assert missing.returncode == 2 and "attempt 3 has not started" in missing.stderr


def test_the_quickstart_manifest_runs_on_what_the_trainer_image_ships(e2e: E2E, cluster: Any) -> None:
    """examples/quickstart.yaml as the chart's NOTES print it: nothing from a checkout, the sample model and data
    from the image (/opt/finetune/samples), the output claim created from the job's template."""
    quickstart = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
    r = finetune(cluster, "submit", str(quickstart), "-n", e2e.namespace, "--follow", timeout=600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:], e2e.diagnostics())
    assert r.stdout.strip().splitlines()[-1].startswith("quickstart: Succeeded — AllRanksSucceeded")
    claim = e2e.jobs.core.read_namespaced_persistent_volume_claim("quickstart-output", e2e.namespace)
    assert claim.metadata.owner_references[0].name == "quickstart"
    out = e2e.claims / e2e.namespace / "quickstart-output" / e2e.namespace / "quickstart"
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 60, result
    assert (out / "model" / "config.json").exists() and (out / "logs" / "attempt-0" / "node-0.log").exists()
