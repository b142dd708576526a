"""Peering failover: how long FineTuneJobs go unhandled when the active operator replica dies.

    python -m bench.peering_failover                    # 3 rounds of each case, the operator as shipped
    python -m bench.peering_failover --rounds 5 --json /tmp/failover.json
    python -m bench.peering_failover --lifetime 15      # experiment: kopf's peering lifetime set to 15 s

What it does, on a fresh local control plane (hack/localcluster: etcd, kube-apiserver,
kube-controller-manager; no kubelet, so trainer pods stay Pending, which is all the operator needs to
create them):

1. applies the FineTuneJob CRD and kopf's peering CRDs (the chart's ``crds/``), creates the namespace
   ``bench`` and the KopfPeering ``finetune-operator`` in it (what the chart creates for a namespaced
   release);
2. starts two replicas of ``finetune operator --namespace bench --log-json`` with peering (no
   ``--standalone``), each with its own ``POD_NAME``/``POD_ID``, as the chart's Deployment sets them, so
   each derives its own peering priority (``cli._peering_priority``);
3. confirms exactly one replica is active: the highest-priority one says so in its log (kopf's
   "Resuming operations"), the others are paused, and a probe FineTuneJob is reconciled (its pods
   created) by that replica alone, judged from every replica's own Prometheus counters;
4. each round kills the active replica and, right after the kill, creates a new FineTuneJob; failover
   time = kill sent -> the last pod of that job seen by the benchmark's watch. Cases:
   - ``crash``: SIGKILL (no clean peering exit: the dead replica's entry stays until it expires);
   - ``term``: SIGTERM (kopf removes its own peering entry on exit);
   - ``restart``: SIGKILL and an immediate restart of the same pod (same ``POD_ID``/priority), as the
     kubelet restarts a crashed or OOM-killed container;
   the breakdown: when the dead replica's peering entry expires (its last ``lastseen`` + ``lifetime``), when
   the new active replica's kopf logs "Resuming operations", and which replica created the pods. A
   replacement replica (a new pod name) then joins and the single-active check of step 3 runs again.

What sets the crash figure: a standby resumes only when the dead replica's peering entry expires, at its
latest keep-alive (``lastseen``) + the peering lifetime (``peering.lifetimeSeconds``, default 60 s).
Replicas re-announce every lifetime - 5..10 s, so a crash at a random moment costs between ~5 and 60 s.
Here the kill comes a few seconds after the victim's latest keep-alive (every replica announces itself when it
starts, and the victim started shortly before), i.e. near the worst case; the ``hb age`` column shows how
old that keep-alive was. ``--crash-heartbeat-age A`` waits until it is A seconds old before a crash.

Every replica, the control plane and temp dirs are stopped and removed at the end, also on failure; on
failure (or with ``--keep-logs``) the logs are kept and their directory printed. Exits non-zero when a
round fails or the peering misbehaves (two replicas active, or none).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import GROUP, NAMESPACE, PLURAL, VERSION, Watcher, job_manifest, wait_for  # noqa: E402
from bench.common import Api as BaseApi  # noqa: E402
from hack.localcluster.cluster import BIN_DIR, K8S_VERSION, LocalCluster, free_port, log_tail  # noqa: E402

LABEL_JOB = "finetune.dev/job-name"
PEERING = "finetune-operator"  # fixed by the operator (cli.py: peering_name)
PEERING_PATH = f"/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfpeerings/{PEERING}"
KOPF_DEFAULT_LIFETIME = 60  # the operator's default peering lifetime (chart value peering.lifetimeSeconds)
PASSES = "finetune_operator_reconcile_duration_seconds_count"  # one per reconcile pass
GATE_SECONDS = 5.0  # cli.PeeringGate(every=5.0): how often a replica's own backstop re-reads the peering object
CASES = {
    "crash": "crash (SIGKILL)",
    "term": "clean exit (SIGTERM)",
    "restart": "crash + restart, same pod",
}


def peering_priority(pod_name: str) -> int:
    """The operator's derivation (cli._peering_priority without FINETUNE_PEERING_PRIORITY)."""
    return zlib.crc32(pod_name.encode()) % 10_000 + 1


def parse_ts(ts: str) -> float:
    """An ISO timestamp (kopf's lastseen, python-json-logger's timestamp) as Unix seconds."""
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


class Api(BaseApi):
    """The shared client plus what this benchmark reads."""

    def peers(self) -> dict[str, dict[str, Any]]:
        """The peering object's status: identity -> {priority, lifetime, lastseen}."""
        obj = self.get_json(PEERING_PATH) or {}
        return dict(obj.get("status") or {})


class PodWatch:
    """Remembers when each job's trainer pods were first seen, from a watch of the namespace's pods."""

    def __init__(self, api: Api) -> None:
        listing = api.get_json(f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1") or {}
        rv = listing["metadata"]["resourceVersion"]
        selector = LABEL_JOB.replace("/", "%2F")
        self.lock = threading.Lock()
        self.seen: dict[str, dict[str, float]] = {}  # job -> pod -> monotonic time first seen
        self.stream = Watcher(
            api,
            f"/api/v1/namespaces/{NAMESPACE}/pods?watch=1&resourceVersion={rv}"
            f"&labelSelector={selector}&timeoutSeconds=3600",
            self.on_event,
        )

    def on_event(self, type_: str, obj: dict[str, Any], at: float) -> None:
        meta = obj.get("metadata") or {}
        job = (meta.get("labels") or {}).get(LABEL_JOB)
        if job and type_ in ("ADDED", "MODIFIED"):
            with self.lock:
                self.seen.setdefault(job, {}).setdefault(meta["name"], at)

    def pods(self, job: str) -> dict[str, float]:
        with self.lock:
            return dict(self.seen.get(job, {}))


class Replica:
    """One operator replica: ``finetune operator`` with peering, as the chart's Deployment runs a pod."""

    def __init__(self, name: str, *, kubeconfig: str, logdir: Path, source: Path, args: argparse.Namespace) -> None:
        self.name = name
        self.priority = peering_priority(name)
        self.kubeconfig, self.logdir, self.source, self.args = kubeconfig, logdir, source, args
        self.incarnation = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = logdir / f"operator-{name}.log"
        self.exited_at: float | None = None  # monotonic, when a signalled process was reaped
        self.killed = False  # signalled by the benchmark: its exit is expected
        self.start()

    def start(self) -> None:
        """Start (or restart, same pod name) the process; a new log per incarnation."""
        self.incarnation += 1
        self.log = self.logdir / f"operator-{self.name}-{self.incarnation}.log"
        self.metrics_port = free_port()
        self.exited_at, self.killed = None, False
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            # This checkout's operator, whether or not the venv has it installed.
            "PYTHONPATH": os.pathsep.join(filter(None, (str(self.source / "operator"), os.environ.get("PYTHONPATH")))),
            "POD_NAME": self.name,  # the chart: both from the downward API (metadata.name)
            "POD_ID": self.name,
            "POD_NAMESPACE": NAMESPACE,
            "FINETUNE_RESYNC_SECONDS": str(self.args.resync_seconds),
            "FINETUNE_METRICS_PORT": str(self.metrics_port),
            "FINETUNE_HEALTH_PORT": str(free_port()),
            "FINETUNE_DEFAULT_IMAGE": "trainer:bench",
        }
        for k in ("KUBECONFIG", "FINETUNE_WATCH_NAMESPACES", "FINETUNE_PEERING_PRIORITY"):
            env.pop(k, None)
        if self.args.lifetime:
            env["FINETUNE_PEERING_LIFETIME_SECONDS"] = str(self.args.lifetime)  # the chart's peering.lifetimeSeconds
        entry = ["-m", "finetune_operator.cli"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    *entry,
                    "operator",
                    "--kubeconfig",
                    self.kubeconfig,
                    "--namespace",
                    NAMESPACE,
                    "--log-json",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.source,
                env=env,
                start_new_session=True,
            )

    def __str__(self) -> str:
        return f"{self.name} (prio {self.priority})"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self) -> None:
        if self.proc is not None and not self.killed and self.proc.poll() is not None:
            raise RuntimeError(f"replica {self} exited with code {self.proc.returncode}; log tail:\n{self.tail()}")

    def kill(self, sig: int) -> None:
        """Signal the process group and note when the process is gone (a thread reaps it)."""
        assert self.proc
        proc, self.killed = self.proc, True
        os.killpg(proc.pid, sig)

        def reap() -> None:
            proc.wait()
            self.exited_at = time.monotonic()

        threading.Thread(target=reap, daemon=True, name=f"reap {self.name}").start()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in ("finetune_operator_pods_created_total", PASSES):
                out[name] = float(value)
        return out

    def metrics_ready(self) -> bool:
        try:
            return bool(self.metrics())
        except OSError:
            return False

    def events(self) -> Iterator[tuple[float, str]]:
        """(Unix time, message) of this incarnation's JSON log lines; other lines (tracebacks) skipped."""
        with contextlib.suppress(OSError):
            for line in self.log.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        rec = json.loads(line)
                        yield parse_ts(rec["timestamp"]), str(rec.get("message", ""))

    def kopf_state(self) -> str:
        """kopf's own view, from its log: 'active' after "Resuming operations", else 'paused' (kopf starts
        paused when peering is mandatory and says nothing until it resumes or pauses again)."""
        state = "paused"
        for _, msg in self.events():
            if msg.startswith("Resuming operations"):
                state = "active"
            elif msg.startswith("Pausing "):
                state = "paused"
        return state

    def first_event(self, prefix: str, after: float) -> float | None:
        return next((t for t, msg in self.events() if t >= after and msg.startswith(prefix)), None)

    def handled(self, job: str) -> bool:
        """The controller logged a state change of this job (it reconciled it)."""
        return any(msg.startswith(f"{NAMESPACE}/{job}: ") for _, msg in self.events())


class Bench:
    def __init__(self, args: argparse.Namespace, cluster: LocalCluster) -> None:
        self.args, self.cluster = args, cluster
        self.api = Api(cluster)
        self.replicas: list[Replica] = []
        self.watch: PodWatch | None = None
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.rounds: list[dict[str, Any]] = []
        self.checks: list[dict[str, Any]] = []
        self._names = 0
        self._probes = 0
        self.lifetime = args.lifetime or KOPF_DEFAULT_LIFETIME

    # -- plumbing -----------------------------------------------------------------------------------------

    def check(self) -> None:
        self.cluster.check()
        for r in self.replicas:
            r.check()
        if self.watch and self.watch.stream.error:
            raise RuntimeError(f"the benchmark's pod watch failed: {self.watch.stream.error!r}")

    def alive(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive() and not r.killed]

    def new_replica(self) -> Replica:
        """A new pod name (as a Deployment's replacement pod), with a priority no live replica has."""
        taken = {r.priority for r in self.alive()}
        while True:
            name = f"finetune-operator-6d5f7c9b8-r{self._names:02d}"
            self._names += 1
            if peering_priority(name) not in taken:
                break
        r = Replica(
            name,
            kubeconfig=self.cluster.kubeconfig,
            logdir=Path(self.cluster.state_dir) / "logs",
            source=self.args.source,
            args=self.args,
        )
        self.replicas.append(r)
        return r

    def create_job(self, name: str) -> None:
        self.api.create(f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}", job_manifest(name, self.args.nodes))

    def all_pods(self, job: str) -> dict[str, float] | None:
        assert self.watch
        pods = self.watch.pods(job)
        return pods if len(pods) >= self.args.nodes else None

    def snapshot(self, replicas: list[Replica]) -> dict[str, dict[str, float]]:
        return {r.name: r.metrics() for r in replicas}

    # -- setup ----------------------------------------------------------------------------------------------

    def setup(self) -> None:
        kubectl = [str(BIN_DIR / "kubectl"), f"--kubeconfig={self.cluster.kubeconfig}"]
        src = self.args.source
        for f in (
            src / "crds" / "finetune.dev_finetunejobs.yaml",
            src / "charts" / "finetune-operator" / "crds" / "kopf-peering-crds.yaml",
        ):
            subprocess.run([*kubectl, "apply", "--server-side", "-f", str(f)], check=True, capture_output=True)
        subprocess.run(
            [
                *kubectl,
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                f"crd/{PLURAL}.{GROUP}",
                "crd/kopfpeerings.kopf.dev",
                "crd/clusterkopfpeerings.kopf.dev",
            ],
            check=True,
            capture_output=True,
        )
        self.api.create(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
        # Pods are refused until the namespace's default ServiceAccount exists; CR endpoints may lag Established.
        wait_for(
            lambda: self.api.get_json(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"),
            timeout=60,
            what="the default ServiceAccount",
            check=self.check,
        )
        for path in (
            f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}",
            f"/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfpeerings",
        ):
            wait_for(functools.partial(self.api.get_json, path), timeout=60, what=path, check=self.check)
        # What the chart's templates/peering.yaml creates for a namespaced release.
        self.api.create(
            f"/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfpeerings",
            {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}},
        )
        self.watch = PodWatch(self.api)
        self.watch.stream.start()
        self.watch.stream.ready.wait(30)
        self.check()

    # -- the single-active check ----------------------------------------------------------------------------

    def live_peers(self) -> dict[str, dict[str, Any]]:
        now = time.time()
        return {
            k: v for k, v in self.api.peers().items() if parse_ts(str(v["lastseen"])) + int(v.get("lifetime", 60)) > now
        }

    def joined(self, replicas: list[Replica]) -> bool:
        peers = self.live_peers()
        for r in replicas:
            if r.name in peers and int(peers[r.name]["priority"]) != r.priority:
                raise RuntimeError(
                    f"{r.name} announced priority {peers[r.name]['priority']}, expected "
                    f"{r.priority} (cli._peering_priority changed?)"
                )
        return all(r.name in peers for r in replicas) and all(r.metrics_ready() for r in replicas)

    def confirm_single_active(self, label: str) -> Replica:
        """The highest-priority live replica, and only it, is active: kopf's log and a probe job agree."""
        alive = self.alive()
        wait_for(lambda: self.joined(alive), timeout=90, what="every replica in the peering", check=self.check)
        expected = max(alive, key=lambda r: r.priority)
        t0 = time.monotonic()

        def settled() -> bool:
            return all(r.kopf_state() == ("active" if r is expected else "paused") for r in alive)

        try:
            wait_for(settled, timeout=self.lifetime + 30, what="kopf to settle", check=self.check)
        except TimeoutError:
            states = ", ".join(f"{r}: {r.kopf_state()}" for r in alive)
            self.problems.append(f"{label}: kopf did not settle on {expected} as the only active replica ({states})")
            raise
        settle = time.monotonic() - t0
        at_pause = self.snapshot(alive)
        time.sleep(GATE_SECONDS + 1)  # the backstop's PeeringGate catches up with kopf
        self._probes += 1
        probe = f"probe-{self._probes:02d}"
        before = self.snapshot(alive)
        self.create_job(probe)
        try:
            wait_for(lambda: self.all_pods(probe), timeout=60, what=f"the pods of {probe}", check=self.check)
        except TimeoutError:
            self.problems.append(f"{label}: no replica created the pods of {probe} (none active)")
            raise
        time.sleep(1.5)  # late passes of a second active replica would show here
        after = self.snapshot(alive)
        passes = {r.name: after[r.name].get(PASSES, 0) - before[r.name].get(PASSES, 0) for r in alive}
        acting = [r for r in alive if passes[r.name] > 0 or r.handled(probe)]
        # Passes of a replica kopf had already paused, before the probe: its backstop's PeeringGate lagging.
        lagging = {
            r.name: before[r.name].get(PASSES, 0) - at_pause[r.name].get(PASSES, 0) for r in alive if r is not expected
        }
        self.checks.append(
            {
                "label": label,
                "replicas": [str(r) for r in alive],
                "expected_active": str(expected),
                "reconcile_passes": passes,
                "paused_replica_passes_before_probe": lagging,
                "kopf_settle_seconds": round(settle, 2),
            }
        )
        if acting != [expected]:
            self.problems.append(
                f"{label}: expected only {expected} active; reconciling replicas: {[str(r) for r in acting]}, "
                f"passes {passes}"
            )
        if any(lagging.values()):
            self.warnings.append(
                f"{label}: a replica kopf had paused still reconciled (backstop, within the PeeringGate's "
                f"{GATE_SECONDS:g} s cache): passes {lagging}"
            )
        return expected

    # -- one failover ---------------------------------------------------------------------------------------

    def failover(self, case: str, n: int, active: Replica) -> dict[str, Any]:
        standby = [r for r in self.alive() if r is not active]
        if case == "crash" and self.args.crash_heartbeat_age:
            wait_for(
                lambda: (
                    time.time() - parse_ts(str(self.api.peers()[active.name]["lastseen"]))
                    >= self.args.crash_heartbeat_age
                ),
                timeout=self.lifetime,
                interval=0.05,
                what=f"{active}'s keep-alive to age {self.args.crash_heartbeat_age} s",
                check=self.check,
            )
        peer = self.api.peers().get(active.name) or {}
        lastseen = parse_ts(str(peer["lastseen"])) if peer else None  # its latest keep-alive
        before = self.snapshot(standby)
        job = f"{case}-{n:02d}"
        sig = signal.SIGTERM if case == "term" else signal.SIGKILL
        victim_log = active.log  # this incarnation's: a restart starts a new one
        kill_wall, kill_at = time.time(), time.monotonic()
        active.kill(sig)
        self.create_job(job)
        if case == "restart":  # the kubelet restarts the container of the same pod at once
            wait_for(lambda: active.exited_at, timeout=10, what=f"{active} to exit", check=self.check, interval=0.01)
            active.start()
        row: dict[str, Any] = {
            "case": case,
            "round": n,
            "killed": str(active),
            "job": job,
            "heartbeat_age_at_kill": None,
            "expiry_after_kill": None,
        }
        if lastseen is not None:
            row["heartbeat_age_at_kill"] = round(kill_wall - lastseen, 2)
            row["expiry_after_kill"] = round(lastseen + int(peer.get("lifetime", 60)) - kill_wall, 2)
        try:
            pods = wait_for(
                lambda: self.all_pods(job),
                timeout=self.args.timeout or self.lifetime + 60,
                what=f"the pods of {job} after the {case}",
                check=self.check,
                interval=0.02,
            )
        except TimeoutError:
            self.problems.append(f"{case} #{n}: no replica took over: the pods of {job} did not appear")
            raise
        row["failover"] = round(max(pods.values()) - kill_at, 2)
        row["first_pod"] = round(min(pods.values()) - kill_at, 2)
        time.sleep(1)
        candidates = [*standby, *([active] if case == "restart" else [])]
        after = self.snapshot(candidates)
        created = {
            r.name: after[r.name].get("finetune_operator_pods_created_total", 0)
            - (before.get(r.name) or {}).get("finetune_operator_pods_created_total", 0)
            for r in candidates
        }
        by = [r for r in candidates if created[r.name] > 0 or r.handled(job)]
        row["pods_by"] = ", ".join(str(r) for r in by) or "?"
        if len(by) != 1:
            self.problems.append(f"{case} #{n}: the pods of {job} were created by {row['pods_by']} (want one replica)")
        elif case != "restart" and by[0] is not max(standby, key=lambda r: r.priority):
            self.problems.append(f"{case} #{n}: {by[0]} took over, not the highest-priority standby")
        # A replica shutting down (SIGTERM) must not handle the new job either: it is no longer in the peering.
        if f'"message": "{NAMESPACE}/{job}: ' in victim_log.read_text(errors="replace"):
            self.problems.append(f"{case} #{n}: the killed replica {active} also reconciled {job} on its way out")
            row["pods_by"] += f" + {active} (exiting)"
        if by:
            resumed = by[0].first_event("Resuming operations", kill_wall)
            row["kopf_resumed_after_kill"] = round(resumed - kill_wall, 2) if resumed is not None else None
        if case != "restart":
            wait_for(lambda: active.exited_at, timeout=30, what=f"{active} to exit", check=self.check)
            assert active.exited_at is not None
            row["victim_exit"] = round(active.exited_at - kill_at, 2)
            # term: kopf removed its own entry on exit; crash: the new active replica cleans the dead entry.
            row["entry_left"] = active.name in self.api.peers()
        return row

    def run(self) -> None:
        self.setup()
        self.new_replica()
        self.new_replica()
        active = self.confirm_single_active("start")
        for n in range(1, self.args.rounds + 1):
            for case in self.args.cases:
                print(f"round {n}: {CASES[case]} of {active} ...", file=sys.stderr, flush=True)
                row = self.failover(case, n, active)
                self.rounds.append(row)
                print(f"  -> {row}", file=sys.stderr, flush=True)
                if case != "restart":
                    self.new_replica()  # the Deployment replaces the pod: a new name, a new priority
                active = self.confirm_single_active(f"after {case} #{n}")


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):6.2f}  {statistics.median(values):6.2f}  {max(values):6.2f}"


def report(b: Bench, args: argparse.Namespace, command: str, meta: dict[str, Any]) -> str:
    lines = [
        f"Peering failover, {args.rounds} round(s) per case: seconds from the signal to the active replica until "
        f"a FineTuneJob created right after it has all {args.nodes} pods",
        "",
        f"{'case':28}  {'n':>2}  {'   min  median     max':22}   (kopf resumed after kill: min median max)",
    ]
    for case in args.cases:
        rows = [r for r in b.rounds if r["case"] == case]
        fail = [float(r["failover"]) for r in rows]
        res = [float(r["kopf_resumed_after_kill"]) for r in rows if r.get("kopf_resumed_after_kill") is not None]
        lines.append(f"{CASES[case]:28}  {len(rows):>2}  {summary(fail):22}   ({summary(res)})")
    lines += [
        "",
        "per round, seconds after the signal: failover = the job's last pod seen; hb age = how old the "
        "killed replica's latest keep-alive (lastseen) was at the kill; expiry = its lastseen + lifetime; "
        "resumed = kopf's 'Resuming operations' in the new active replica's log; exit = the killed process gone",
    ]
    lines.append(
        f"{'case':8} {'#':>2}  {'failover':>8} {'hb age':>7} {'expiry':>6} {'resumed':>7} {'exit':>5}  "
        f"{'entry left':10}  killed -> pods created by"
    )
    for r in b.rounds:
        f = {
            k: "-" if r.get(k) is None else str(r[k])
            for k in (
                "failover",
                "heartbeat_age_at_kill",
                "expiry_after_kill",
                "kopf_resumed_after_kill",
                "victim_exit",
            )
        }
        entry = "-" if "entry_left" not in r else ("yes" if r["entry_left"] else "no")
        lines.append(
            f"{r['case']:8} {r['round']:>2}  {f['failover']:>8} {f['heartbeat_age_at_kill']:>7} "
            f"{f['expiry_after_kill']:>6} {f['kopf_resumed_after_kill']:>7} {f['victim_exit']:>5}  "
            f"{entry:10}  {r['killed']} -> {r['pods_by']}"
        )
    lines += [
        "",
        "single-active checks (reconcile passes per replica during a probe job; only the expected one may reconcile):",
    ]
    for c in b.checks:
        lag = {k: v for k, v in c["paused_replica_passes_before_probe"].items() if v}
        lines.append(
            f"  {c['label']:16} active {c['expected_active']:40} passes {c['reconcile_passes']}"
            + (f"; a paused replica's passes before the probe: {lag}" if lag else "")
        )
    how_lifetime = (
        "--lifetime: FINETUNE_PEERING_LIFETIME_SECONDS = peering.lifetimeSeconds"
        if args.lifetime
        else "the default of peering.lifetimeSeconds"
    )
    lines += [
        "",
        f"peering lifetime: {b.lifetime} s ({how_lifetime}); "
        f"kopf re-announces every lifetime - 5..10 s; backstop resync every {args.resync_seconds} s",
        f"machine: {meta['cpus']} CPUs, load average {meta['loadavg_before'][0]:.2f} before / "
        f"{os.getloadavg()[0]:.2f} after; Kubernetes {K8S_VERSION}, Python {platform.python_version()}, "
        f"kopf {meta['kopf']}; operator source: {args.source}",
        f"total {meta['total_seconds']:.0f} s; command (from {os.getcwd()}): {command}",
    ]
    if b.warnings:
        lines += ["", "warnings:", *(f"  - {w}" for w in b.warnings)]
    if b.problems:
        lines += ["", "PROBLEMS:", *(f"  - {p}" for p in b.problems)]
    return "\n".join(lines)


def kopf_version() -> str:
    try:
        from importlib.metadata import version

        return version("kopf")
    except Exception:
        return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each case")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--nodes", type=int, default=2, help="nodes (pods) per FineTuneJob")
    ap.add_argument(
        "--resync-seconds",
        type=int,
        default=30,
        help="the operator's backstop period (FINETUNE_RESYNC_SECONDS; the chart's default is 30)",
    )
    ap.add_argument(
        "--lifetime",
        type=int,
        default=0,
        help="run the replicas with this peering lifetime (FINETUNE_PEERING_LIFETIME_SECONDS, the chart's "
        "peering.lifetimeSeconds; default: as shipped, 60 s)",
    )
    ap.add_argument(
        "--crash-heartbeat-age",
        type=float,
        default=0,
        help="crash only when the active replica's latest keep-alive is this many seconds old "
        "(default: at once, a few seconds after it)",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=0,
        help="give up on one failover after this many seconds (default: lifetime + 60)",
    )
    ap.add_argument(
        "--source",
        type=Path,
        default=ROOT,
        help="checkout to take operator/, crds/ and the chart's crds/ from (default: this one)",
    )
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--keep-logs", action="store_true", help="keep the cluster's and the replicas' logs")
    args = ap.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if unknown := [c for c in args.cases if c not in CASES]:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    args.source = args.source.resolve()
    command = shlex.join(
        [sys.executable, "-m", "bench.peering_failover", *(argv if argv is not None else sys.argv[1:])]
    )

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # so that the replicas and the cluster are stopped

    signal.signal(signal.SIGTERM, on_term)
    meta: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_before": os.getloadavg(), "kopf": kopf_version()}
    t0 = time.monotonic()
    cluster = LocalCluster()
    bench: Bench | None = None
    ok = False
    try:
        cluster.start()
        bench = Bench(args, cluster)
        bench.run()
        ok = not bench.problems
    except BaseException:
        print(f"\nbenchmark failed; logs kept in {cluster.state_dir}/logs", file=sys.stderr)
        for r in bench.replicas if bench else []:
            print(f"--- {r} log tail:\n{r.tail(15)}", file=sys.stderr)
        with contextlib.suppress(Exception):
            print(f"--- kube-apiserver log tail:\n{log_tail(cluster.state_dir, 'kube-apiserver', 10)}", file=sys.stderr)
        if bench and bench.problems:
            print("problems: " + "; ".join(bench.problems), file=sys.stderr)
        raise
    finally:
        if bench:
            if bench.watch:
                bench.watch.stream.close()
            for r in bench.replicas:
                r.stop()
        keep = args.keep_logs or not ok
        cluster.stop(keep_logs=keep)
        if keep:
            print(f"logs kept in {cluster.state_dir}/logs", file=sys.stderr)
    assert bench is not None
    meta["total_seconds"] = time.monotonic() - t0
    print(report(bench, args, command, meta))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "rounds": bench.rounds,
                    "checks": bench.checks,
                    "problems": bench.problems,
                    "warnings": bench.warnings,
                    "lifetime": bench.lifetime,
                    "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                    **meta,
                },
                indent=2,
            )
            + "\n"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
