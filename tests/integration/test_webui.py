"""``finetune ui`` in a real browser: the operator records a job's curves across a gang restart from rank 0's
metrics, and headless Chromium renders the jobs page and the job's page (its curves with the restart marked, its
conditions, events and the note on rank 0's log) from the server that ``finetune ui`` runs with the user's
kubeconfig; a user who may read only one namespace sees that namespace's jobs and a note why.

Real: the API server, the operator (a subprocess that scrapes over HTTP), the trainer's own metrics exporter
(finetune_trainer.metrics on 127.0.0.1:9400), the ``finetune ui`` server (a subprocess) and Chromium (Debian's
chromium-headless-shell, installed by hack/localcluster/host-packages.sh). Mocked: the kubelet (FakeKubelet reports
rank 0's podIP as 127.0.0.1), as everywhere in the integration tier.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import FakeKubelet, Jobs, OperatorProcess, make_job
from tests.kubeconfigs import service_account_kubeconfig
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

BROWSER = "chromium-headless-shell"


class Dom(HTMLParser):
    """The rendered DOM as (tag, attributes, text) per element, enough to find rows, lines and marks."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], list[str]]] = []
        self._open: list[int] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}, []))
        if tag not in ("br", "img", "meta", "link", "input", "hr"):  # HTML's void elements (SVG's are closed)
            self._open.append(len(self.elements) - 1)

    def handle_endtag(self, tag: str) -> None:
        if any(self.elements[i][0] == tag for i in self._open):
            while self.elements[self._open.pop()][0] != tag:
                pass

    def handle_data(self, data: str) -> None:
        for i in self._open:
            self.elements[i][2].append(data)

    def find(self, tag: str, **attrs: str) -> list[tuple[dict[str, str], str]]:
        return [
            (a, "".join(text))
            for t, a, text in self.elements
            if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]


def render(url: str, screenshot: Path | None = None) -> Dom:
    """The page's DOM once its scripts ran (and fetched), as Chromium rendered it."""
    browser = shutil.which(BROWSER)
    assert browser, f"{BROWSER} is missing: bash hack/localcluster/host-packages.sh installs it (as root)"
    base = [browser, "--no-sandbox", "--disable-gpu", "--virtual-time-budget=8000", "--window-size=1280,1300"]
    if screenshot is not None:
        subprocess.run([*base, f"--screenshot={screenshot}", url], capture_output=True, timeout=60, check=True)
    r = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return Dom(r.stdout)


class Ui:
    """``finetune ui`` as a user runs it (a subprocess with a kubeconfig), on a free port."""

    def __init__(self, kubeconfig: str, namespace: str, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "finetune_operator.cli", "ui", "--port", "0", "-n", namespace],
            env={**os.environ, "KUBECONFIG": kubeconfig},
            stdout=subprocess.DEVNULL,
            stderr=log.open("w"),
        )
        said = wait_for(
            lambda: re.search(r"serving (http://\S+)", log.read_text()) or self.proc.poll() is not None,
            timeout=30,
            what="finetune ui to listen",
        )
        assert self.proc.poll() is None, log.read_text()
        self.url = said.group(1)

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _train(m: Any, jobs: Jobs, steps: range, loss0: float, *, attempt: int) -> None:
    """Rank 0 reports each step in turn; the next only once the operator's scrape recorded it in status.history."""
    for step in steps:
        m.loss.set(loss0 / (1 + 0.1 * step))
        m.learning_rate.set(1e-4 * (1 - step / 40))
        m.samples_per_second.set(10.0 + step % 3)
        if step % 3 == 0:
            m.eval_loss.set(loss0 / (1 + 0.1 * step) + 0.05)
        m.total_steps.set(40)
        m.step.set(step)
        wait_for(
            lambda step=step: any(
                p["step"] == step and p["attempt"] == attempt
                for p in (jobs.status("curves").get("history") or {}).get("train", [])
            ),
            timeout=30,
            what=f"step {step} of attempt {attempt} in status.history",
        )


def test_the_web_view_shows_every_job_and_a_jobs_curves_across_a_restart(
    cluster,  # type: ignore[no-untyped-def]
    api_client,
    namespace,
    rank0_metrics,
    tmp_path,
) -> None:
    m = rank0_metrics
    jobs, kubelet = Jobs(api_client, namespace), FakeKubelet(api_client, namespace)
    op = OperatorProcess(cluster.kubeconfig, namespace, FINETUNE_PROGRESS_INTERVAL_SECONDS="1").start()
    ui = Ui(cluster.kubeconfig, namespace, tmp_path / "ui.log")
    try:
        jobs.create(make_job("curves").nodes(2).max_restarts(2).build())
        jobs.create(make_job("waiting").nodes(2).build())  # its pods are never run: it stays Created
        pods = jobs.wait_pods("curves", 2)
        for p in pods:
            kubelet.run(p.metadata.name, ip="127.0.0.1")
        jobs.wait_state("curves", "Running")
        _train(m, jobs, range(1, 9), 3.0, attempt=0)
        kubelet.exit(pods[1].metadata.name, 1)  # a rank fails: the gang restarts from the checkpoint (step 5)
        pods = jobs.wait_pods("curves", 2, attempt=1)
        for p in pods:
            kubelet.run(p.metadata.name, ip="127.0.0.1")
        jobs.wait_state("curves", "Running")
        _train(m, jobs, range(5, 13), 3.0, attempt=1)
        history = jobs.status("curves")["history"]

        listed = render(ui.url, screenshot=tmp_path / "jobs.png")
        assert listed.find("body", data_ready="jobs"), "the jobs page did not render"
        rows = {a["data-job"]: text for a, text in listed.find("tr") if a.get("data-job")}
        assert f"{namespace}/curves" in rows and f"{namespace}/waiting" in rows, rows
        assert "Running" in rows[f"{namespace}/curves"] and "12/40" in rows[f"{namespace}/curves"]
        assert "Created" in rows[f"{namespace}/waiting"]
        links = [a["href"] for a, _ in listed.find("a")]
        assert f"/jobs/{namespace}/curves" in links

        page = render(f"{ui.url}jobs/{namespace}/curves", screenshot=tmp_path / "job.png")
        assert page.find("body", data_ready="job"), "the job page did not render"
        lines = {(a["data-series"], a["data-attempt"]): int(a["data-points"]) for a, _ in page.find("polyline")}
        train = {a: sum(1 for p in history["train"] if p["attempt"] == a) for a in (0, 1)}
        assert lines[("train loss", "0")] == train[0] and lines[("train loss", "1")] == train[1], lines
        assert lines[("samples/s", "1")] == train[1] and lines[("learning rate", "0")] == train[0]
        evals = {a: sum(1 for p in history["eval"] if p["attempt"] == a) for a in (0, 1)}
        assert lines[("eval loss", "0")] == evals[0] >= 2 and lines[("eval loss", "1")] == evals[1] >= 1, lines
        marks = page.find("g", **{"class": "attempt-mark"})
        assert [a["data-attempt"] for a, _ in marks] == ["1", "1", "1"]  # on each of the three charts
        assert all("attempt 1" in text for _, text in marks)
        conditions = next(text for a, text in page.find("table") if a.get("id") == "conditions")
        assert "Running" in conditions and "AllRanksRunning" in conditions
        events = next(text for a, text in page.find("table") if a.get("id") == "events")
        assert "attempt 1: created 2 trainer pod(s)" in events, events
        assert (tmp_path / "job.png").stat().st_size > 10_000  # a screenshot of a drawn page, not a blank one
        if keep := os.environ.get("FINETUNE_UI_SCREENSHOTS"):  # docs/cli.md's pictures: =docs/images
            for shot in ("jobs", "job"):
                shutil.copy(tmp_path / f"{shot}.png", Path(keep) / f"ui-{shot}.png")
        # FakeKubelet runs no container: the API server has no log to give, and the page says so.
        assert any("rank 0" in text or "log" in text for a, text in page.find("p") if a.get("class") == "muted")
    finally:
        ui.stop()
        op.stop()


def _namespace_reader_kubeconfig(cluster: Any, namespace: str, path: Path) -> str:
    """A kubeconfig of a ServiceAccount that may read FineTuneJobs, pods, logs and events in ``namespace`` only."""
    rules = (
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: reader}\nrules:\n"
        "- {apiGroups: [finetune.dev], resources: [finetunejobs], verbs: [get, list, watch]}\n"
        "- {apiGroups: [''], resources: [pods, pods/log, events], verbs: [get, list]}\n"
    )
    role = path.parent / "role.yaml"
    role.write_text(rules)
    cluster.run_kubectl("apply", "-n", namespace, "-f", str(role))
    cluster.run_kubectl("create", "serviceaccount", "reader", "-n", namespace)
    cluster.run_kubectl(
        "create", "rolebinding", "reader", "-n", namespace, "--role=reader", f"--serviceaccount={namespace}:reader"
    )
    return str(service_account_kubeconfig(cluster, "reader", namespace, path))


def test_a_user_who_reads_one_namespace_sees_its_jobs_and_why_only_those(
    cluster,  # type: ignore[no-untyped-def]
    api_client,
    namespace,
    tmp_path,
) -> None:
    jobs = Jobs(api_client, namespace)
    jobs.create(make_job("mine").build())
    kubeconfig = _namespace_reader_kubeconfig(cluster, namespace, tmp_path / "reader.kubeconfig")
    ui = Ui(kubeconfig, namespace, tmp_path / "ui.log")
    try:
        listed = ui.api("/api/jobs")
        assert [(j["namespace"], j["name"]) for j in listed["jobs"]] == [(namespace, "mine")]
        assert listed["scope"] == f"namespace {namespace}"
        assert "listing FineTuneJobs in every namespace is not allowed" in listed["notes"][0]
        page = render(ui.url)
        notes = [text for a, text in page.find("div") if a.get("class") == "note"]
        assert any("not allowed" in n for n in notes) and page.find("tr", data_job=f"{namespace}/mine")
        # Another namespace's job: the API server refuses, and the page says so instead of failing.
        req = urllib.request.Request(ui.url + "api/jobs/default/other")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 502 and "403" in json.loads(refused.value.read())["error"]
        # Only this machine's name is answered: a page on another site cannot reach it by DNS rebinding.
        forged = urllib.request.Request(ui.url + "api/jobs", headers={"Host": "attacker.example:80"})
        with pytest.raises(urllib.error.HTTPError) as foreign:
            urllib.request.urlopen(forged, timeout=10)
        assert foreign.value.code == 403
    finally:
        ui.stop()
