"""Fault injection: the API server answers 429 (Retry-After), 500 or nothing at all to a share of the operator's
requests, and cuts its watch streams short, while jobs run, fail and restart.

Real: the API server, etcd, the garbage collector and the operator (a subprocess whose every request, its kopf watches
included, goes through tests/faults/apiproxy.FaultProxy). Mocked: the kubelet (harness.ScriptedKubelet), since no
kubelet can run here.

Invariants as in test_operator_kills (no overlapping attempts, each rank once per attempt, exact counters and
reasons, no event storm, no write to a settled job), plus: the operator never exits, and its requests per job stay
bounded (errors are retried with a backoff, not in a loop).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.faults.apiproxy import FaultProxy, upstream_of
from tests.faults.harness import SCRIPTS, Observed, PodWatch, ScriptedKubelet, check_round, writes_after_settling
from tests.integration.harness import Jobs, OperatorProcess, make_job

pytestmark = pytest.mark.faults
SEED = int(os.environ.get("FAULTS_SEED", "7"))
RATE = float(os.environ.get("FAULTS_API_ERROR_RATE", "0.1"))  # a tenth of all requests fail
ROUNDS = int(os.environ.get("FAULTS_API_ROUNDS", "1"))


def test_api_errors_and_cut_watches(cluster, api_client, namespace, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server, tls = upstream_of(cluster.kubeconfig, tmp_path)
    proxy = FaultProxy(server, tls, rate=RATE, seed=SEED).start()
    jobs, seen = Jobs(api_client, namespace), Observed()
    podwatch, kubelet = PodWatch(api_client, namespace, seen), ScriptedKubelet(api_client, namespace)
    podwatch.start()
    kubelet.start()
    op = OperatorProcess(proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig"), namespace).start()
    wrong, quiet_writes, settle = {}, 0, []
    try:
        for r in range(ROUNDS):
            started = time.monotonic()
            for s in SCRIPTS:
                jobs.create(make_job(f"{s.name}-{r}").nodes(s.nodes).max_restarts(s.max_restarts).build())
            finals = {f"{s.name}-{r}": jobs.wait_state(f"{s.name}-{r}", s.state, timeout=240) for s in SCRIPTS}
            settle.append(time.monotonic() - started)
            quiet_writes += writes_after_settling(jobs, finals)
            wrong |= check_round(jobs, seen, finals, r)
        alive = op.proc is not None and op.proc.poll() is None
    finally:
        op.stop()
        podwatch.stop.set()
        kubelet.stop.set()
        proxy.stop()
    figures = proxy.figures()
    n_jobs = ROUNDS * len(SCRIPTS)
    attempts = ROUNDS * sum(s.restarts + s.disruptions + 1 for s in SCRIPTS)
    restarts = attempts - n_jobs
    requests = sum(figures["requests"].values())
    report = {
        "scenario": "API errors (429/500/dropped) and cut watches",
        "seed": SEED,
        "rate": RATE,
        "jobs": n_jobs,
        "restarts": restarts,
        **figures,
        "violations": len(seen.overlaps) + len(wrong) + quiet_writes + (not alive),
        "attempt_overlaps": len(seen.overlaps),
        "wrong_outcomes": len(wrong),
        "quiet_writes": quiet_writes,
        "operator_alive": alive,
        "requests_per_attempt": round(requests / attempts, 1),
        "job_lifetime_s": {"max": round(max(settle), 2)},
        "pods_created": sum(seen.pods_created.values()),
    }
    print(json.dumps(report))
    if out := os.environ.get("FAULTS_REPORT"):
        Path(out).with_suffix(".api-errors.json").write_text(json.dumps(report, indent=2))
    assert sum(v for k, v in figures["injected"].items() if k != "watch-cut") > 0, "no fault was injected"
    assert seen.overlaps == [], seen.overlaps
    assert wrong == {}, wrong
    assert quiet_writes == 0 and alive, op.output()[-3000:]


WRITE_KILL_SCRIPTS = os.environ.get("FAULTS_WRITE_KILL_SCRIPTS", "fail-evict-fail").split(",")


def test_operator_killed_after_every_write(cluster, api_client, namespace, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Every write the operator makes (a create, a status update, a delete, an event) is applied by the API server,
    and then, before the answer reaches it, the operator is SIGKILLed and started again: each operator life makes
    exactly one write. Every boundary between the writes of a pass is a crash point once. The jobs must still end as
    their scripts say, with nothing done twice."""
    server, tls = upstream_of(cluster.kubeconfig, tmp_path)
    killed, writes = threading.Event(), []
    current: list[OperatorProcess] = []

    def kill_after(what: str) -> None:
        writes.append(what)
        op = current[-1]
        if op.proc is not None and op.proc.poll() is None and not killed.is_set():
            os.killpg(op.proc.pid, signal.SIGKILL)
            killed.set()

    proxy = FaultProxy(server, tls, rate=0.0, seed=SEED, watch_cut_s=None, after_write=kill_after).start()
    kubeconfig = proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")
    scripts = [s for s in SCRIPTS if s.name in WRITE_KILL_SCRIPTS]
    jobs, seen = Jobs(api_client, namespace), Observed()
    podwatch, kubelet = PodWatch(api_client, namespace, seen), ScriptedKubelet(api_client, namespace)
    podwatch.start()
    kubelet.start()
    for s in scripts:
        jobs.create(make_job(f"{s.name}-0").nodes(s.nodes).max_restarts(s.max_restarts).build())
    kills, deadline = 0, time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            current.append(OperatorProcess(kubeconfig, namespace).start())
            if killed.wait(10):
                assert current[-1].proc is not None
                current[-1].proc.wait()
                killed.clear()
                kills += 1
                continue
            # ten seconds without a write: settled, if every job is where its script ends
            if all(jobs.state(f"{s.name}-0") == s.state for s in scripts):
                break
            current[-1].stop()
        finals = {f"{s.name}-0": jobs.status(f"{s.name}-0") | {"state": jobs.state(f"{s.name}-0")} for s in scripts}
    finally:
        for op in current:
            op.stop()
        podwatch.stop.set()
        kubelet.stop.set()
        proxy.stop()
    wrong = {n: w for n, w in check_round(jobs, seen, finals, 0, scripts=scripts).items()}
    report = {
        "scenario": "operator SIGKILL after every write",
        "jobs": len(scripts),
        "kills": kills,
        "writes": Counter(w.split()[0] for w in writes),
        "violations": len(seen.overlaps) + len(wrong),
        "attempt_overlaps": len(seen.overlaps),
        "wrong_outcomes": len(wrong),
        "pods_created": sum(seen.pods_created.values()),
    }
    print(json.dumps(report))
    if out := os.environ.get("FAULTS_REPORT"):
        Path(out).with_suffix(".write-kills.json").write_text(json.dumps(report, indent=2))
    assert kills > 10, writes
    assert seen.overlaps == [], seen.overlaps
    assert wrong == {}, wrong
