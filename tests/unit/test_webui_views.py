"""The web view's pure parts (finetune_operator.webui: a job's row and page from the API objects) and the client's
(finetune_operator.client: curves, manifests, importable without kopf). The server and the browser are tested on the
real API server in tests/integration/test_webui.py."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from finetune_operator import client, k8s, webui
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
    assert client.curves(None) == {
        "loss": [],
        "samples_per_second": [],
        "learning_rate": [],
        "eval_loss": [],
        "reward": [],
    }


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


class _Stream:
    """A pod log answer as the API client gives it: byte chunks, then release_conn()."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks, self.released = chunks, False

    def stream(self, amt: int, decode_content: bool = True) -> Any:
        yield from self.chunks

    def release_conn(self) -> None:
        self.released = True


class _Kube:
    """Stands in for finetune_operator.k8s.Kube (no API server in the unit tier): records what was asked."""

    def __init__(self, jobs: int = 0, log: list[bytes] | None = None) -> None:
        self.jobs, self.log, self.asked = jobs, log or [], []

    def list_jobs_first(self, namespace: str | None, limit: int) -> tuple[list[dict], int | None]:
        self.asked.append(("list", namespace, limit))
        shown = min(limit, self.jobs)
        return [_job().raw | {"metadata": {**_job().raw["metadata"], "name": f"j{i:05d}"}} for i in range(shown)], (
            self.jobs - shown
        )

    def pod_log(self, namespace: str, pod: str, **kw: Any) -> _Stream:
        self.asked.append(("log", pod, kw))
        return _Stream(self.log)


def test_log_lines_split_each_chunk_once_whatever_the_line_lengths() -> None:
    """A 16 MiB line without a newline arrives in 4 KiB chunks: one line, built in place (the old loop re-split the
    whole buffer on every chunk: quadratic); newlines at chunk edges and across chunks come out right."""
    big = [b"x" * 4096] * 4096
    kube = _Kube(log=[b"a\nb", b"c\n", b"\n", b"d", *big, b"\ne"])
    lines = list(client.FineTuneClient("team", kube=kube).log_lines("p", tail=5))  # type: ignore[arg-type]
    assert [len(line) for line in lines] == [1, 2, 0, 1 + 16 * 2**20, 1]
    assert lines[:3] == ["a", "bc", ""] and lines[-1] == "e"


def test_the_job_page_asks_for_a_bounded_log_tail_and_the_jobs_page_for_one_bounded_list() -> None:
    """Rank 0's tail is asked with limitBytes (the kubelet cuts a huge line), and with 5,000 jobs the jobs page reads
    JOBS_SHOWN of them in one request and says how many more there are."""
    kube = _Kube(jobs=5000, log=[b"line\n"])
    views = webui.Views(client.FineTuneClient("team", kube=kube))  # type: ignore[arg-type]
    page = views.jobs()
    assert kube.asked == [("list", None, webui.JOBS_SHOWN)]
    assert len(page["jobs"]) == webui.JOBS_SHOWN and "4500 more" in page["notes"][-1]
    c = client.FineTuneClient("team", kube=kube)  # type: ignore[arg-type]
    assert list(c.log_lines("p", tail=webui.LOG_TAIL_LINES, limit_bytes=webui.LOG_TAIL_BYTES)) == ["line"]
    assert kube.asked[-1] == ("log", "p", {"follow": False, "tail_lines": 60, "limit_bytes": 64 * 1024})


def test_dot_segments_are_never_a_namespace_or_a_name() -> None:
    """The HTTP client resolves ``.`` and ``..`` before sending: /api/jobs/../.. would read the API group's discovery
    document, and a job's pods and events would become cluster-wide lists."""
    for path in ("/api/jobs/../..", "/api/jobs/../x", "/api/jobs/ns/..", "/api/jobs/./x", "/api/jobs/ns/.x"):
        assert webui._JOB_PATH.match(path) is None, path
    assert webui._JOB_PATH.match("/api/jobs/team/llama-3.1-sft").groups() == ("team", "llama-3.1-sft")
    assert webui._PAGE_PATH.match("/jobs/../..") is None
    for bad in (".", ".."):
        with pytest.raises(ValueError):
            k8s._q(bad)


class _Views:
    def jobs(self) -> dict[str, Any]:
        return {"scope": "s", "notes": [], "jobs": []}


def _get(url: str, cookie: str | None = None) -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def test_an_address_other_machines_reach_needs_the_token_of_the_printed_url() -> None:
    """Bound to 0.0.0.0 any client may send ``Host: localhost``: without the token, 403; the printed URL's token
    opens the page and sets an HttpOnly, SameSite=Strict cookie that the page's own requests carry."""
    server = webui.UiServer(_Views(), address="0.0.0.0", port=0).start()  # type: ignore[arg-type]
    try:
        port = server.httpd.server_address[1]
        base = f"http://127.0.0.1:{port}"
        assert server.token and server.url.endswith(f"/?token={server.token}")
        assert _get(f"{base}/api/jobs")[0] == 403
        assert _get(f"{base}/?token=wrong")[0] == 403
        assert _get(f"{base}/api/jobs", cookie=f"{webui.TOKEN_COOKIE}=wrong")[0] == 403
        status, headers = _get(f"{base}/?token={server.token}")
        assert status == 200 and "HttpOnly" in headers["Set-Cookie"] and "SameSite=Strict" in headers["Set-Cookie"]
        assert _get(f"{base}/api/jobs", cookie=headers["Set-Cookie"].split(";")[0])[0] == 200
    finally:
        server.stop()
    local = webui.UiServer(_Views(), address="127.0.0.1", port=0).start()  # type: ignore[arg-type]
    try:
        assert local.token is None and "token" not in local.url
        assert _get(f"{local.url}api/jobs")[0] == 200  # the loopback bind: the Host check, as before
    finally:
        local.stop()
