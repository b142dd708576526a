"""Fault injection: the operator is SIGKILLed at random moments, and restarted, while jobs go through every phase.

Real: the API server, etcd, the garbage collector and the operator (a subprocess, killed with SIGKILL). Mocked: the
kubelet (ScriptedKubelet writes pod status as each job's script says), since no kubelet can run here.

Invariants, checked on every pod event and at the end: a job's attempts never overlap (no pod of attempt k+1 while a
pod of attempt k exists), every job ends in the state and with the counters its script implies (each injected
failure counted exactly once, whatever the kills), no request or event storm. Figures go to $FAULTS_REPORT (JSON)
when set; ``make soak`` runs the long version (FAULTS_KILLS=120).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.integration.harness import FakeKubelet, Jobs, OperatorProcess, make_job

pytestmark = pytest.mark.faults
KILLS = int(os.environ.get("FAULTS_KILLS", "25"))
SEED = int(os.environ.get("FAULTS_SEED", "7"))


@dataclass(frozen=True)
class Script:
    """What the kubelet does with a job's pods, per attempt, and what the job must end with."""

    name: str
    nodes: int
    max_restarts: int
    outcomes: tuple[str, ...]  # per attempt: "ok" (all exit 0), "fail" (rank 1 exits 1), "evict" (rank 0 evicted)
    state: str  # expected final state
    restarts: int
    disruptions: int
    reason: str


SCRIPTS = (
    Script("ok", 2, 2, ("ok",), "Succeeded", 0, 0, "AllRanksSucceeded"),
    Script("fail-once", 2, 2, ("fail", "ok"), "Succeeded", 1, 0, "AllRanksSucceeded"),
    Script("evict-once", 2, 2, ("evict", "ok"), "Succeeded", 0, 1, "AllRanksSucceeded"),
    Script("fail-always", 2, 1, ("fail", "fail", "fail"), "Failed", 1, 0, "TrainingError"),
    Script("fail-evict-fail", 3, 3, ("fail", "evict", "fail", "ok"), "Succeeded", 2, 1, "AllRanksSucceeded"),
)
RUN_SECONDS = 1.5  # a pod runs this long before its script's outcome


@dataclass
class Observed:
    overlaps: list[str] = field(default_factory=list)  # invariant violations
    pods_created: Counter[str] = field(default_factory=Counter)  # per job
    attempts: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))


class PodWatch(threading.Thread):
    """The namespace's trainer pods as the API server reports them; checks that attempts never overlap."""

    def __init__(self, api: client.ApiClient, namespace: str, seen: Observed) -> None:
        super().__init__(daemon=True)
        self.core, self.ns, self.seen = client.CoreV1Api(api), namespace, seen
        self.live: dict[str, dict[str, int]] = defaultdict(dict)  # job → pod name → attempt
        self.stop = threading.Event()

    def run(self) -> None:
        w = watch.Watch()
        while not self.stop.is_set():
            for ev in w.stream(self.core.list_namespaced_pod, self.ns, label_selector="finetune.dev/job-name",
                               timeout_seconds=5):
                pod = ev["object"]
                job = pod.metadata.labels["finetune.dev/job-name"]
                attempt = int(pod.metadata.labels["finetune.dev/attempt"])
                name = pod.metadata.name
                if ev["type"] == "DELETED":
                    self.live[job].pop(name, None)
                    continue
                if name not in self.live[job] and ev["type"] == "ADDED":
                    others = {a for n, a in self.live[job].items() if n != name}
                    if others - {attempt}:
                        self.seen.overlaps.append(f"{job}: {name} of attempt {attempt} created while attempt(s) "
                                                  f"{sorted(others - {attempt})} still had pods")
                    self.seen.pods_created[job] += 1
                    self.seen.attempts[job].add(attempt)
                self.live[job][name] = attempt
                if self.stop.is_set():
                    break


class ScriptedKubelet(threading.Thread):
    """Runs each new trainer pod, and after RUN_SECONDS ends it as the job's script says for that attempt."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        super().__init__(daemon=True)
        self.core, self.kubelet = client.CoreV1Api(api), FakeKubelet(api, namespace)
        self.ns = namespace
        self.started: dict[str, float] = {}  # pod uid → when it was run
        self.stop = threading.Event()
        self.scripts = {s.name: s for s in SCRIPTS}

    def run(self) -> None:
        while not self.stop.wait(0.2):
            with contextlib.suppress(ApiException):  # a pod deleted under us: the next tick sees the new state
                self.tick()

    def tick(self) -> None:
        for pod in self.core.list_namespaced_pod(self.ns, label_selector="finetune.dev/job-name").items:
            if pod.metadata.deletion_timestamp is not None or pod.status.phase in ("Succeeded", "Failed"):
                continue
            uid, name = pod.metadata.uid, pod.metadata.name
            script = self.scripts[pod.metadata.labels["finetune.dev/job-name"].rsplit("-", 1)[0]]
            attempt = int(pod.metadata.labels["finetune.dev/attempt"])
            rank = int(pod.metadata.labels["finetune.dev/node-rank"])
            if uid not in self.started:
                self.kubelet.run(name)
                self.started[uid] = time.monotonic()
                continue
            if time.monotonic() - self.started[uid] < RUN_SECONDS:
                continue
            outcome = script.outcomes[min(attempt, len(script.outcomes) - 1)]
            if outcome == "fail" and rank == 1:
                self.kubelet.exit(name, 1, message="RuntimeError: injected")
            elif outcome == "evict" and rank == 0:
                self.kubelet.evict(name)
            elif outcome == "ok":
                self.kubelet.exit(name, 0)
            # the other ranks of a failing attempt keep running until the operator deletes them


KILLS_PER_ROUND = 25  # a fresh set of jobs every round, so that kills keep landing on jobs mid-lifecycle


def _check_round(jobs: Jobs, seen: Observed, finals: dict[str, dict[str, Any]], r: int) -> dict[str, Any]:
    wrong: dict[str, Any] = {}
    for s in SCRIPTS:
        name, st = f"{s.name}-{r}", finals[f"{s.name}-{r}"]
        got = (st["state"], st.get("restarts"), st.get("disruptions"), st["conditions"][-1]["reason"]
               if s.state == "Succeeded" else st["failure"]["reason"])
        if got != (want := (s.state, s.restarts, s.disruptions, s.reason)):
            wrong[name] = {"got": got, "want": want}
        attempts = s.restarts + s.disruptions + 1
        if seen.attempts[name] != set(range(attempts)):
            wrong[f"{name}/attempts"] = {"got": sorted(seen.attempts[name]), "want": list(range(attempts))}
        if seen.pods_created[name] != attempts * s.nodes:  # no duplicate pods: each rank once per attempt
            wrong[f"{name}/pods"] = {"got": seen.pods_created[name], "want": attempts * s.nodes}
        events = Counter(e.reason for e in jobs.events(name))
        # events per transition, not per pass or per operator restart: per attempt at most PodsCreated,
        # AllRanksRunning and the attempt's end, plus the job's end
        if sum(events.values()) > 3 * attempts + 1:
            wrong[f"{name}/events"] = dict(events)
    return wrong


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
            # quiet: a settled job gets no more writes from a freshly (re)started operator
            before = {n: jobs.get(n)["metadata"]["resourceVersion"] for n in finals}
            time.sleep(4)
            quiet_writes += sum(jobs.get(n)["metadata"]["resourceVersion"] != v for n, v in before.items())
            wrong |= _check_round(jobs, seen, finals, r)
            gaps += [st["lastRestartGapSeconds"] for st in finals.values() if "lastRestartGapSeconds" in st]
            events += [len(jobs.events(n)) for n in finals]
    finally:
        op.stop()
        podwatch.stop.set()
        kubelet.stop.set()
    report = {"scenario": "operator SIGKILL at random moments", "seed": SEED, "kills": kills,
              "rounds": len(settle), "jobs": len(settle) * len(SCRIPTS),
              "operator_lifetime_s": {"min": round(min(lifetimes), 2), "max": round(max(lifetimes), 2)},
              "violations": len(seen.overlaps) + len(wrong) + quiet_writes,
              "attempt_overlaps": len(seen.overlaps), "wrong_outcomes": len(wrong), "quiet_writes": quiet_writes,
              "restart_gap_s": {"p50": round(sorted(gaps)[len(gaps) // 2], 2), "max": round(max(gaps), 2)},
              "events_per_job": {"max": max(events), "mean": round(sum(events) / len(events), 1)},
              "settle_after_last_kill_s": {"max": round(max(settle), 2)},
              "pods_created": sum(seen.pods_created.values())}
    print(json.dumps(report))
    if out := os.environ.get("FAULTS_REPORT"):
        Path(out).write_text(json.dumps(report, indent=2))
    assert seen.overlaps == [], seen.overlaps
    assert wrong == {}, wrong
    assert quiet_writes == 0, "a settled job was written again after an operator restart"
    assert kills == KILLS
