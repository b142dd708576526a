"""Fault injection: the operator is SIGKILLed at random moments, and restarted, while jobs go through every phase.

Real: the API server, etcd, the garbage collector and the operator (a subprocess, killed with SIGKILL). Mocked: the
kubelet (tests/faults/harness.ScriptedKubelet writes pod status as each job's script says), since no kubelet can run
here.

Invariants, checked on every pod event and at the end of each round: a job's attempts never overlap (no pod of
attempt k+1 while a pod of attempt k exists), every job ends in the state and with the counters its script implies
(each injected failure counted exactly once, whatever the kills), each rank is created once per attempt, no event
storm, no write to a settled job. Figures go to $FAULTS_REPORT (JSON) when set; ``make soak`` runs the long version
(FAULTS_KILLS=120).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.faults.harness import (
    KILLS_PER_ROUND,
    SCRIPTS,
    Observed,
    PodWatch,
    ScriptedKubelet,
    check_round,
    writes_after_settling,
)
from tests.integration.harness import Jobs, OperatorProcess, make_job

pytestmark = pytest.mark.faults
KILLS = max(1, int(os.environ.get("FAULTS_KILLS", "25")))
SEED = int(os.environ.get("FAULTS_SEED", "7"))


def test_operator_sigkill_at_random_moments(cluster, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(SEED)
    jobs = Jobs(api_client, namespace)
    seen = Observed()
    podwatch, kubelet = PodWatch(api_client, namespace, seen), ScriptedKubelet(api_client, namespace)
    podwatch.start()
    kubelet.start()
    kills, lifetimes, settle, gaps, events, wrong = 0, [], [], [], [], {}
    quiet_writes = 0
    op = OperatorProcess(cluster.kubeconfig, namespace).start()
    try:
        for r in range(max(1, -(-KILLS // KILLS_PER_ROUND))):
            for s in SCRIPTS:
                jobs.create(make_job(f"{s.name}-{r}").nodes(s.nodes).max_restarts(s.max_restarts).build())
            for _ in range(min(KILLS_PER_ROUND, KILLS - kills)):
                life = rng.uniform(0.2, 3.0)
                time.sleep(life)
                op.stop(signal.SIGKILL)
                kills += 1
                lifetimes.append(life)
                op = OperatorProcess(cluster.kubeconfig, namespace).start()
            started = time.monotonic()
            finals = {f"{s.name}-{r}": jobs.wait_state(f"{s.name}-{r}", s.state, timeout=180) for s in SCRIPTS}
            settle.append(time.monotonic() - started)
            quiet_writes += writes_after_settling(jobs, finals)
            wrong |= check_round(jobs, seen, finals, r)
            gaps += [st["lastRestartGapSeconds"] for st in finals.values() if "lastRestartGapSeconds" in st]
            events += [len(jobs.events(n)) for n in finals]
    finally:
        op.stop()
        podwatch.stop.set()
        kubelet.stop.set()
    report = {
        "scenario": "operator SIGKILL at random moments",
        "seed": SEED,
        "kills": kills,
        "rounds": len(settle),
        "jobs": len(settle) * len(SCRIPTS),
        "operator_lifetime_s": {"min": round(min(lifetimes), 2), "max": round(max(lifetimes), 2)},
        "violations": len(seen.overlaps) + len(wrong) + quiet_writes,
        "attempt_overlaps": len(seen.overlaps),
        "wrong_outcomes": len(wrong),
        "quiet_writes": quiet_writes,
        "restart_gap_s": {"p50": round(sorted(gaps)[len(gaps) // 2], 2), "max": round(max(gaps), 2)},
        "events_per_job": {"max": max(events), "mean": round(sum(events) / len(events), 1)},
        "settle_after_last_kill_s": {"max": round(max(settle), 2)},
        "pods_created": sum(seen.pods_created.values()),
    }
    print(json.dumps(report))
    if out := os.environ.get("FAULTS_REPORT"):
        Path(out).write_text(json.dumps(report, indent=2))
    assert seen.overlaps == [], seen.overlaps
    assert wrong == {}, wrong
    assert quiet_writes == 0, "a settled job was written again after an operator restart"
