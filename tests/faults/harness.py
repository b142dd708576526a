"""What the fault-injection scenarios share: the jobs' scripts, a kubelet that plays them, a pod watch that checks
that attempts never overlap, and the end-of-round check of states, counters, pods and events.

Mocked: the kubelet (ScriptedKubelet writes pod status as a kubelet would), since no kubelet can run here.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch

from tests.integration.harness import FakeKubelet, Jobs


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
        self.uids: set[str] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._follow()
            except Exception:  # the API server went away (a fault being injected): list again, then watch
                time.sleep(0.5)

    def _follow(self) -> None:
        """List (what a broken watch may have missed: pods are recounted by uid, never twice), then watch."""
        listed = self.core.list_namespaced_pod(self.ns, label_selector="finetune.dev/job-name")
        self.live = defaultdict(dict)
        for pod in listed.items:
            self._seen(pod, check=False)
        for ev in watch.Watch().stream(
            self.core.list_namespaced_pod,
            self.ns,
            label_selector="finetune.dev/job-name",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=10,
        ):
            pod = ev["object"]
            if ev["type"] == "DELETED":
                self.live[pod.metadata.labels["finetune.dev/job-name"]].pop(pod.metadata.name, None)
            else:
                self._seen(pod, check=ev["type"] == "ADDED")
            if self.stop.is_set():
                return

    def _seen(self, pod: Any, *, check: bool) -> None:
        job = pod.metadata.labels["finetune.dev/job-name"]
        attempt = int(pod.metadata.labels["finetune.dev/attempt"])
        name, uid = pod.metadata.name, pod.metadata.uid
        if uid not in self.uids:
            others = {a for n, a in self.live[job].items() if n != name}
            if check and others - {attempt}:
                self.seen.overlaps.append(
                    f"{job}: {name} of attempt {attempt} created while attempt(s) "
                    f"{sorted(others - {attempt})} still had pods"
                )
            self.uids.add(uid)
            self.seen.pods_created[job] += 1
            self.seen.attempts[job].add(attempt)
        self.live[job][name] = attempt


class ScriptedKubelet(threading.Thread):
    """Runs each new trainer pod, and after ``run_seconds`` ends it as the job's script says for that attempt. A pod's
    IP is ``ip_of(job, rank)`` (where its metrics page is served), 10.0.0.1 without it."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        *,
        ip_of: Callable[[str, int], str] | None = None,
        run_seconds: float = RUN_SECONDS,
    ) -> None:
        super().__init__(daemon=True)
        self.core, self.kubelet = client.CoreV1Api(api), FakeKubelet(api, namespace)
        self.ns = namespace
        self.started: dict[str, float] = {}  # pod uid → when it was run
        self.stop = threading.Event()
        self.scripts = {s.name: s for s in SCRIPTS}
        self.ip_of, self.run_seconds = ip_of, run_seconds

    def run(self) -> None:
        while not self.stop.wait(0.2):
            # a pod deleted under us, or the API server away (a fault being injected): the next tick sees it
            with contextlib.suppress(Exception):
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
                job = pod.metadata.labels["finetune.dev/job-name"]
                self.kubelet.run(name, self.ip_of(job, rank) if self.ip_of else "10.0.0.1")
                self.started[uid] = time.monotonic()
                continue
            if time.monotonic() - self.started[uid] < self.run_seconds:
                continue
            outcome = script.outcomes[min(attempt, len(script.outcomes) - 1)]
            if outcome == "fail" and rank == 1:
                self.kubelet.exit(name, 1, message="RuntimeError: injected")
            elif outcome == "evict" and rank == 0:
                self.kubelet.evict(name)
            elif outcome == "ok":
                self.kubelet.exit(name, 0)
            # the other ranks of a failing attempt keep running until the operator deletes them


def writes_after_settling(jobs: Jobs, names: Iterable[str], seconds: float = 4.0) -> int:
    """How many of the settled jobs ``names`` are written again within ``seconds`` (must be none: a restarted or
    retrying operator leaves a settled job alone)."""
    before = {n: jobs.get(n)["metadata"]["resourceVersion"] for n in names}
    time.sleep(seconds)
    return sum(jobs.get(n)["metadata"]["resourceVersion"] != v for n, v in before.items())


KILLS_PER_ROUND = 25  # a fresh set of jobs every round, so that kills keep landing on jobs mid-lifecycle


def check_round(
    jobs: Jobs,
    seen: Observed,
    finals: dict[str, dict[str, Any]],
    r: int,
    scripts: tuple[Script, ...] | list[Script] = SCRIPTS,
) -> dict[str, Any]:
    """Every job of round ``r`` (named ``<script>-<r>``) against its script: final state, counters and reason, one
    attempt label per attempt, each rank created once per attempt, at most 3 events per attempt. Empty: all held."""
    wrong: dict[str, Any] = {}
    for s in scripts:
        name, st = f"{s.name}-{r}", finals[f"{s.name}-{r}"]
        got = (
            st["state"],
            st.get("restarts"),
            st.get("disruptions"),
            st["conditions"][-1]["reason"] if s.state == "Succeeded" else st["failure"]["reason"],
        )
        if got != (want := (s.state, s.restarts, s.disruptions, s.reason)):
            wrong[name] = {"got": got, "want": want}
        attempts = s.restarts + s.disruptions + 1
        if seen.attempts[name] != set(range(attempts)):
            wrong[f"{name}/attempts"] = {"got": sorted(seen.attempts[name]), "want": list(range(attempts))}
        if seen.pods_created[name] != attempts * s.nodes:  # no duplicate pods: each rank once per attempt
            wrong[f"{name}/pods"] = {"got": seen.pods_created[name], "want": attempts * s.nodes}
        events = Counter(e.reason for e in jobs.events(name))
        # events per transition, not per pass or per operator restart: per attempt at most PodsCreated and
        # AllRanksRunning, per restart its Warning, and the job's end (3 per attempt in all)
        if sum(events.values()) > 3 * attempts:
            wrong[f"{name}/events"] = dict(events)
    return wrong
