"""The web view's pure parts (finetune_operator.webui: a job's row and page from the API objects) and the client's
(finetune_operator.client: curves, manifests, importable without kopf). The server and the browser are tested on the
real API server in tests/integration/test_webui.py."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from finetune_operator import client
from finetune_operator.client import Job
from finetune_operator.webui import attempt_marks, job_detail, job_row

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _job(**status: object) -> Job:
    created = (NOW - timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Job(
        {
            "metadata": {"name": "j", "namespace": "team", "uid": "u", "creationTimestamp": created},
            "spec": {"nodes": 2},
            "status": status,
        }
    )


HISTORY = {
    "train": [
        {"attempt": 0, "step": 10, "loss": 2.0, "samplesPerSecond": 5.0, "learningRate": 1e-4},
        {"attempt": 0, "step": 20, "loss": 1.5, "samplesPerSecond": 5.5},
        {"attempt": 1, "step": 15, "loss": 1.6, "samplesPerSecond": 5.1, "learningRate": 8e-5},
        {"attempt": 1, "step": 30, "loss": 1.1},
    ],
    "eval": [{"attempt": 0, "step": 20, "evalLoss": 1.7}, {"attempt": 1, "step": 30, "evalLoss": 1.2}],
}


def test_curves_are_series_of_attempt_step_value_and_skip_missing_values() -> None:
    c = client.curves(HISTORY)
    assert c["loss"] == [(0, 10, 2.0), (0, 20, 1.5), (1, 15, 1.6), (1, 30, 1.1)]
    assert c["learning_rate"] == [(0, 10, 1e-4), (1, 15, 8e-5)]
    assert c["eval_loss"] == [(0, 20, 1.7), (1, 30, 1.2)]
    assert client.curves(None) == {"loss": [], "samples_per_second": [], "learning_rate": [], "eval_loss": []}


def test_each_later_attempt_is_marked_where_it_starts() -> None:
    assert attempt_marks(client.curves(HISTORY)) == [{"attempt": 1, "step": 15}]
    assert attempt_marks(client.curves({"train": HISTORY["train"][:2]})) == []


def test_a_jobs_row_and_page() -> None:
    job = _job(
        state="Running",
        attempt=1,
        restarts=1,
        nodes="2/2",
        progress={"step": 30, "totalSteps": 120, "eta": "4m", "mfu": 0.41, "loss": 1.1},
        history=HISTORY,
        conditions=[{"type": "Running", "status": "True", "reason": "AllRanksRunning", "message": "m"}],
    )
    row = job_row(job, NOW)
    assert (row["state"], row["reason"], row["percent"], row["eta"], row["mfu"]) == (
        "Running",
        "AllRanksRunning",
        25.0,
        "4m",
        0.41,
    )
    assert (row["nodes"], row["restarts"], row["age"]) == ("2/2", 1, "3m0s")
    page = job_detail(job, [{"type": "Normal", "reason": "PodsCreated", "message": "x"}] * 30, ["a"], "n", NOW)
    assert page["curves"]["loss"][2] == [1, 15, 1.6] and page["attempts"] == [{"attempt": 1, "step": 15}]
    assert len(page["events"]) == 20 and page["log"] == {"lines": ["a"], "note": "n"}
    pending = job_row(_job(), NOW)
    assert (pending["state"], pending["nodes"], pending["percent"]) == ("Pending", "0/2", None)


def test_a_manifest_from_python_and_from_yaml_text() -> None:
    ft = client.FineTuneClient("team", offline=True)
    m = ft.manifest("j", {"nodes": 2}, labels={"a": "b"})
    assert m["metadata"] == {"name": "j", "namespace": "team", "labels": {"a": "b"}} and m["spec"] == {"nodes": 2}
    where, loaded = ft.load(m)
    assert loaded == m and loaded is not m  # a copy: the notebook's dict is left alone
    where, loaded = ft.load("apiVersion: finetune.dev/v1alpha1\nkind: FineTuneJob\nmetadata: {name: k}\n")
    assert where == "the manifest text" and loaded["metadata"] == {"name": "k", "namespace": "team"}
    with pytest.raises(client.UserError, match="this needs a cluster"):
        ft.get("j")


def test_the_client_imports_without_kopf() -> None:
    """Notebooks install the package without the operator's framework: importing the client (and the web view)
    must not need kopf."""
    code = "import sys; sys.modules['kopf'] = None\nimport finetune_operator.client, finetune_operator.webui\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
