"""Fault injection: the operator is SIGKILLed at random moments, and restarted, while jobs go through every phase.

Real: the API server, etcd, the garbage collector and the operator (a subprocess, killed with SIGKILL). Mocked: the
kubelet (tests/faults/harness.ScriptedKubelet writes pod status as each job's script says), since no kubelet can run
here.

Invariants, checked on every pod event and at the end of each round: a job's attempts never overlap (no pod of
attempt k+1 while a pod of attempt k exists), every job ends in the state and with the counters its script implies
(each injected failure counted exactly once, whatever the kills), each rank is created once per attempt, no event
storm, no write to a settled job. The second scenario runs the same rounds while every rank 0 serves a hostile metrics
page (hack/metrics_pages.py, on loopback addresses the pods report as their IP), and adds: every progress value in
the status is one it can hold. Figures go to $FAULTS_REPORT (JSON) when set; ``make soak`` runs the long version
(FAULTS_KILLS=120).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from hack.metrics_pages import HOSTILE, serve
from tests.faults.harness import (
    KILLS_PER_ROUND,
    SCRIPTS,
    Observed,
    PodWatch,
    ScriptedKubelet,
    check_round,
    writes_after_settling,
)
from tests.integration.harness import GROUP, PLURAL, VERSION, Jobs, OperatorProcess, make_job

pytestmark = pytest.mark.faults
KILLS = max(1, int(os.environ.get("FAULTS_KILLS", "25")))
SEED = int(os.environ.get("FAULTS_SEED", "7"))


HOSTILE_KILLS = max(1, int(os.environ.get("FAULTS_HOSTILE_KILLS", "10")))
PAGE_IPS = {kind: f"127.0.0.{21 + i}" for i, kind in enumerate(HOSTILE)}  # each page on its own loopback address


def kill_rounds(
    cluster: Any,
    api_client: Any,
    namespace: str,
    *,
    kills: int,
    scenario: str,
    kubelet: dict[str, Any],
    env: dict[str, str],
    check: Callable[[Jobs, list[str]], list[str]] = lambda jobs, names: [],
) -> dict[str, Any]:
    """Rounds of the scripted jobs while the operator is SIGKILLed ``kills`` times after a random 0.2-3 s of life
    each; every round checked against the invariants (and ``check``, which returns what it found wrong)."""
    rng = random.Random(SEED)
    jobs = Jobs(api_client, namespace)
    seen = Observed()
    podwatch, scripted = PodWatch(api_client, namespace, seen), ScriptedKubelet(api_client, namespace, **kubelet)
    podwatch.start()
    scripted.start()
    done, lifetimes, settle, gaps, events, wrong = 0, [], [], [], [], {}
    quiet_writes, found = 0, []
    op = OperatorProcess(cluster.kubeconfig, namespace, **env).start()
    try:
        for r in range(max(1, -(-kills // KILLS_PER_ROUND))):
            for s in SCRIPTS:
                jobs.create(make_job(f"{s.name}-{r}").nodes(s.nodes).max_restarts(s.max_restarts).build())
            for _ in range(min(KILLS_PER_ROUND, kills - done)):
                life = rng.uniform(0.2, 3.0)
                time.sleep(life)
                op.stop(signal.SIGKILL)
                done += 1
                lifetimes.append(life)
                op = OperatorProcess(cluster.kubeconfig, namespace, **env).start()
            started = time.monotonic()
            finals = {f"{s.name}-{r}": jobs.wait_state(f"{s.name}-{r}", s.state, timeout=180) for s in SCRIPTS}
            settle.append(time.monotonic() - started)
            quiet_writes += writes_after_settling(jobs, finals)
            wrong |= check_round(jobs, seen, finals, r)
            found += check(jobs, list(finals))
            gaps += [st["lastRestartGapSeconds"] for st in finals.values() if "lastRestartGapSeconds" in st]
            events += [len(jobs.events(n)) for n in finals]
    finally:
        op.stop()
        podwatch.stop.set()
        scripted.stop.set()
    report = {
        "scenario": scenario,
        "seed": SEED,
        "kills": done,
        "rounds": len(settle),
        "jobs": len(settle) * len(SCRIPTS),
        "operator_lifetime_s": {"min": round(min(lifetimes), 2), "max": round(max(lifetimes), 2)},
        "violations": len(seen.overlaps) + len(wrong) + quiet_writes + len(found),
        "attempt_overlaps": len(seen.overlaps),
        "wrong_outcomes": len(wrong),
        "quiet_writes": quiet_writes,
        "restart_gap_s": {"p50": round(sorted(gaps)[len(gaps) // 2], 2), "max": round(max(gaps), 2)},
        "events_per_job": {"max": max(events), "mean": round(sum(events) / len(events), 1)},
        "settle_after_last_kill_s": {"max": round(max(settle), 2)},
        "pods_created": sum(seen.pods_created.values()),
    }
    print(json.dumps(report))
    assert seen.overlaps == [], seen.overlaps
    assert wrong == {}, wrong
    assert quiet_writes == 0, "a settled job was written again after an operator restart"
    assert found == [], found
    return report


def test_operator_sigkill_at_random_moments(cluster, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    report = kill_rounds(
        cluster, api_client, namespace, kills=KILLS, scenario="operator SIGKILL at random moments", kubelet={}, env={}
    )
    if out := os.environ.get("FAULTS_REPORT"):
        Path(out).write_text(json.dumps(report, indent=2))


def _progress_the_status_can_hold(jobs: Jobs, names: list[str]) -> list[str]:
    """Every progress value written is finite and in range: what a hostile page said beyond that was left out."""
    bad = []
    for name in names:
        progress = jobs.status(name).get("progress") or {}
        for field, value in progress.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not math.isfinite(value) or abs(value) > 1e15 or (isinstance(value, int) and value < 0):
                bad.append(f"{name}: status.progress.{field} = {value!r}")
    return bad


class ProgressWatch(threading.Thread):
    """Every ``status.progress`` the API server stores for the jobs whose names start with ``prefix``, in order: a
    restart clears the rates, so what a scrape wrote is judged on every write, not on the last one."""

    def __init__(self, api: Any, namespace: str, prefix: str) -> None:
        super().__init__(daemon=True)
        self.co, self.ns, self.prefix = client.CustomObjectsApi(api), namespace, prefix
        self.writes: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        version = None
        while not self.stop.is_set():
            try:
                for ev in watch.Watch().stream(
                    self.co.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self.ns,
                    PLURAL,
                    resource_version=version,
                    timeout_seconds=5,
                ):
                    obj = ev["object"]
                    version = obj["metadata"]["resourceVersion"]
                    progress = (obj.get("status") or {}).get("progress")
                    if obj["metadata"]["name"].startswith(self.prefix) and progress and progress not in self.writes:
                        self.writes.append(progress)
                    if self.stop.is_set():
                        return
            except Exception:  # an expired version: watch again from now (the jobs are long settled by then)
                version = None
                time.sleep(0.2)


def test_operator_sigkill_with_hostile_metrics_pages(cluster, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    """The same rounds, with every rank 0 serving a hostile metrics page (a job's kind by its script: trickled
    without end, 1 MiB, absurd values, or a sane total beside overflows, NaN and negative counters), each pod running
    4 s and progress scraped every second, so scrapes are in flight at every kill. The same invariants, and every
    progress value in a job's status is one the status can hold."""
    servers = [serve(ip, kind) for kind, ip in PAGE_IPS.items()]
    kind_of = {s.name: HOSTILE[i % len(HOSTILE)] for i, s in enumerate(SCRIPTS)}
    overflow = next(s.name for s in SCRIPTS if kind_of[s.name] == "overflow")
    written = ProgressWatch(api_client, namespace, f"{overflow}-")
    written.start()
    try:
        kill_rounds(
            cluster,
            api_client,
            namespace,
            kills=HOSTILE_KILLS,
            scenario="operator SIGKILL at random moments, hostile metrics pages",
            kubelet={
                "ip_of": lambda job, rank: PAGE_IPS[kind_of[job.rsplit("-", 1)[0]]] if rank == 0 else "10.0.0.1",
                "run_seconds": 4.0,
            },
            env={"FINETUNE_PROGRESS_INTERVAL_SECONDS": "1"},
            check=_progress_the_status_can_hold,
        )
    finally:
        written.stop.set()
        for srv in servers:
            srv.shutdown()
    print(json.dumps({"overflow_page_progress_writes": written.writes}))
    # Its page was scraped and written (in some attempt: a restart clears the rates): the sane values kept...
    assert any(w.get("totalSteps") == 100 and w.get("tokensPerSecond") == 2e14 for w in written.writes), written.writes
    # ...and every other one left out, in every write
    left_out = {"loss", "samplesPerSecond", "etaSeconds", "epoch", "lastCheckpointStep"}
    for w in written.writes:
        assert w.get("step", 0) == 0, w  # the overflowing step was never written (0: none reported yet)
        assert not left_out & w.keys(), w
