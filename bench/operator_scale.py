"""Operator scale: 100 FineTuneJobs of 4 nodes created at once against a real control plane.

    python bench/operator_scale.py                      # 100 jobs x 4 nodes, backstop timer every 5 s
    python bench/operator_scale.py --jobs 20 --json /tmp/scale.json

What it does, in order, all on a fresh local control plane (hack/localcluster: etcd, kube-apiserver,
kube-controller-manager; no scheduler, no kubelet, so trainer pods stay Pending, which is all the
operator needs to create them):

1. applies the CRD, creates the namespace ``bench`` and starts the operator as a subprocess
   (``python -m finetune_operator.cli operator --standalone --namespace bench``), then waits until the
   apiserver shows its two namespaced watches (jobs, pods);
2. the ramp: creates ``--jobs`` FineTuneJobs of ``--nodes`` nodes from ``--workers`` threads at once, and
   watches pods and jobs itself. Per job: seconds from the moment its create request was sent to the
   moment the watch delivered its last pod (client clock, sub-second); total: first create sent to the
   last pod of the last job. The ramp ends when every pod exists, every job has a status, and the
   operator has made no write for 3 s;
3. the quiet window: nothing changes for ``--quiet-ticks`` backstop periods; every write the operator
   makes there is a write that should not happen.

API requests are counted on the apiserver side: deltas of ``apiserver_request_total`` for the resources
the operator touches (finetunejobs, pods, services, configmaps, events, persistentvolumeclaims,
poddisruptionbudgets), watches excluded. Nothing else
reads or writes those resources in this cluster during the measured windows (kube-controller-manager only
watches them, once its garbage collector has discovered the CRD, which the setup waits for; the benchmark's
own requests there are its job creates, which are subtracted, and its watches), so the remainder is the
operator's. The operator's own Prometheus counters are scraped too (its reconcile passes, to set against the
LIST pods the apiserver saw: one per pass without the watch cache). Run it with FINETUNE_WATCH_CACHE=0 in the
environment to measure the operator reading per pass instead. Peak RSS is ``VmHWM`` from /proc of the operator process.

Everything (operator, control plane, temp dirs) is stopped and removed at the end, also on failure; on
failure the logs are kept and their directory printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import GROUP, NAMESPACE, PLURAL, VERSION, Watcher, job_manifest, wait_for  # noqa: E402
from bench.common import Api as BaseApi  # noqa: E402
from hack.localcluster.cluster import BIN_DIR, K8S_VERSION, LocalCluster, free_port, log_tail  # noqa: E402

LABEL_JOB = "finetune.dev/job-name"
OPERATOR_RESOURCES = (
    "finetunejobs",
    "pods",
    "services",
    "configmaps",
    "events",
    "persistentvolumeclaims",
    "poddisruptionbudgets",
)
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY")
SETTLE_SECONDS = 3.0


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


# -- Prometheus text --------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str, names: tuple[str, ...]) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if not line or line[0] == "#" or not line.startswith(names):
            continue
        m = _SAMPLE.match(line)
        if m and m.group(1) in names:
            out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


RequestKey = tuple[str, str, str, str]  # verb, resource, subresource, code


class Api(BaseApi):
    """The shared client plus what this benchmark reads."""

    resources: tuple[str, ...] = OPERATOR_RESOURCES

    def requests_total(self) -> Counter[RequestKey]:
        """apiserver_request_total for the operator's resources, watches excluded."""
        status, data = self.request("GET", "/metrics")
        if status != 200:
            raise RuntimeError(f"GET /metrics: HTTP {status}")
        out: Counter[RequestKey] = Counter()
        for _, lab, v in parse_prometheus(data.decode(), ("apiserver_request_total",)):
            if lab.get("resource") in self.resources and lab.get("verb") not in ("WATCH", "CONNECT"):
                out[(lab["verb"], lab["resource"], lab.get("subresource", ""), lab.get("code", ""))] += int(v)
        return out

    def watches(self, scope: str) -> dict[str, float]:
        """Open watches by resource, at ``scope`` (namespace: the operator's; cluster: kube-controller-manager's)."""
        _, data = self.request("GET", "/metrics")
        out: dict[str, float] = {}
        for _, lab, v in parse_prometheus(data.decode(), ("apiserver_longrunning_requests",)):
            if lab.get("verb") == "WATCH" and lab.get("scope") == scope:
                out[lab.get("resource", "")] = out.get(lab.get("resource", ""), 0) + v
        return out


class Observed:
    """What the benchmark's own watches saw: pods per job (with arrival times) and job statuses."""

    def __init__(self, pod_label: str = LABEL_JOB) -> None:
        self.pod_label = pod_label
        self.lock = threading.Lock()
        self.pods: dict[str, dict[str, tuple[float, str]]] = {}  # job -> pod -> (seen, creationTimestamp)
        self.status: dict[str, dict[str, Any]] = {}
        self.job_created: dict[str, str] = {}  # job -> creationTimestamp
        self.job_modified = 0
        self.pod_events: Counter[str] = Counter()

    def on_pod(self, type_: str, obj: dict[str, Any], seen: float) -> None:
        meta = obj.get("metadata") or {}
        job = (meta.get("labels") or {}).get(self.pod_label)
        with self.lock:
            self.pod_events[type_] += 1
            if job and type_ == "ADDED":
                self.pods.setdefault(job, {}).setdefault(meta["name"], (seen, meta.get("creationTimestamp", "")))

    def on_job(self, type_: str, obj: dict[str, Any], _seen: float) -> None:
        meta = obj.get("metadata") or {}
        with self.lock:
            if type_ == "MODIFIED":
                self.job_modified += 1
            if type_ in ("ADDED", "MODIFIED"):
                self.job_created[meta["name"]] = meta.get("creationTimestamp", "")
                self.status[meta["name"]] = obj.get("status") or {}

    def pod_count(self) -> int:
        with self.lock:
            return sum(len(p) for p in self.pods.values())


class Operator:
    """The operator as a subprocess (its own process group), logging to a file in the cluster dir."""

    def __init__(self, kubeconfig: str, log: Path, resync_seconds: int, *, verbose: bool = False) -> None:
        self.metrics_port = free_port()
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "FINETUNE_RESYNC_SECONDS": str(resync_seconds),
            "FINETUNE_METRICS_PORT": str(self.metrics_port),
            "FINETUNE_HEALTH_PORT": str(free_port()),
            "FINETUNE_DEFAULT_IMAGE": "trainer:bench",
        }
        env.pop("KUBECONFIG", None)
        env.pop("FINETUNE_WATCH_NAMESPACES", None)
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "finetune_operator.cli",
                    "operator",
                    "--standalone",
                    "--kubeconfig",
                    kubeconfig,
                    "--namespace",
                    NAMESPACE,
                    *(["--verbose"] if verbose else []),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=env,
                start_new_session=True,
            )

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited with code {self.proc.returncode}; log tail:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        names = (
            "finetune_operator_status_writes_total",
            "finetune_operator_pods_created_total",
            "finetune_operator_pods_deleted_total",
            "finetune_operator_reconcile_errors_total",
            "finetune_operator_reconcile_duration_seconds_count",
            "finetune_operator_reconcile_duration_seconds_sum",
        )
        return {n: v for n, _, v in parse_prometheus(text, names)}

    def metrics_ready(self) -> bool:
        try:
            return bool(self.metrics())
        except OSError:
            return False

    def proc_status(self) -> dict[str, float]:
        """Peak and current RSS (MiB) and CPU seconds used so far."""
        st = Path(f"/proc/{self.proc.pid}/status").read_text()
        kb = {k: int(v.split()[0]) for k, v in (ln.split(":", 1) for ln in st.splitlines()) if k in ("VmHWM", "VmRSS")}
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return {"peak_rss_mib": kb["VmHWM"] / 1024, "rss_mib": kb["VmRSS"] / 1024, "cpu_seconds": cpu}

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@dataclass
class Target:
    """The operator the benchmark drives and the job kind it creates; finetune-operator by default
    (bench/peer_operator.py drives Kubeflow's training operator through the same run)."""

    name: str = "finetune-operator"
    crd_files: tuple[Path, ...] = (ROOT / "crds" / "finetune.dev_finetunejobs.yaml",)
    group: str = GROUP
    version: str = VERSION
    plural: str = PLURAL
    pod_label: str = LABEL_JOB
    manifest: Callable[[str, int], dict[str, Any]] = job_manifest
    settled: Callable[[dict[str, Any]], bool] = field(default=lambda s: bool(s.get("attemptStartTime")))
    prepare: Callable[[LocalCluster, Api], None] = field(default=lambda cluster, api: None)
    start: Callable[[LocalCluster, Path, argparse.Namespace], Any] | None = None  # None: our operator

    def start_operator(self, cluster: LocalCluster, log: Path, args: argparse.Namespace) -> Any:
        if self.start is not None:
            return self.start(cluster, log, args)
        return Operator(cluster.kubeconfig, log, args.resync_seconds, verbose=args.operator_verbose)


def delta(after: Counter[RequestKey], before: Counter[RequestKey]) -> Counter[RequestKey]:
    d: Counter[RequestKey] = Counter()
    for k, v in after.items():
        if v - before.get(k, 0):
            d[k] = v - before.get(k, 0)
    return d


def by_call(d: Counter[RequestKey]) -> dict[str, int]:
    """'VERB resource[/subresource]' -> count, with non-2xx codes named."""
    out: Counter[str] = Counter()
    for (verb, res, sub, code), v in d.items():
        name = f"{verb} {res}{'/' + sub if sub else ''}"
        out[name] += v
        if not code.startswith("2"):
            out[f"{name} (HTTP {code})"] += v
    return dict(sorted(out.items()))


def run(args: argparse.Namespace, target: Target | None = None) -> dict[str, Any]:
    target = target or Target()
    group, version, plural = target.group, target.version, target.plural
    result: dict[str, Any] = {
        "operator": target.name,
        "jobs": args.jobs,
        "nodes": args.nodes,
        "workers": args.workers,
        "resync_seconds": args.resync_seconds,
        "kubernetes": K8S_VERSION,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
    }
    cluster = LocalCluster()
    operator: Operator | None = None
    watchers: list[Watcher] = []
    ok = False
    try:
        t0 = time.monotonic()
        cluster.start()
        api = Api(cluster)
        api.resources = (*OPERATOR_RESOURCES, plural)
        kubectl = [str(BIN_DIR / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"]
        for crd in target.crd_files:
            subprocess.run([*kubectl, "apply", "--server-side", "-f", str(crd)], check=True, capture_output=True)

        def established() -> bool:
            crd = api.get_json(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{group}") or {}
            conds = (crd.get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)

        wait_for(established, timeout=120, what=f"crd/{plural}.{group} to be Established", check=cluster.check)
        status, body = api.request(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
        if status != 201:
            raise RuntimeError(f"creating namespace {NAMESPACE}: HTTP {status} {body[:300]!r}")
        jobs_path = f"/apis/{group}/{version}/namespaces/{NAMESPACE}/{plural}"
        # Pods are rejected until the namespace's default ServiceAccount exists; the CR endpoint may
        # lag Established by a moment.
        wait_for(
            lambda: api.get_json(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"),
            timeout=60,
            what="the default ServiceAccount",
            check=cluster.check,
        )
        wait_for(lambda: api.get_json(jobs_path), timeout=60, what=f"the {plural} endpoint", check=cluster.check)
        # kube-controller-manager's garbage collector discovers new resources every 30 s. Until it watches
        # FineTuneJobs, every owner reference to one is a "virtual node" it GETs to check that the owner
        # exists: ~100 GETs of other clients inside the measured windows. Wait for its watch first.
        wait_for(
            lambda: api.watches("cluster").get(plural, 0) >= 1,
            timeout=90,
            interval=1,
            what=f"kube-controller-manager to watch {plural}",
            check=cluster.check,
        )

        target.prepare(cluster, api)
        operator = target.start_operator(cluster, Path(cluster.state_dir) / "logs" / "operator.log", args)
        op = operator

        def check() -> None:
            cluster.check()
            op.check()
            for w in watchers:
                if w.error:
                    raise RuntimeError(f"benchmark watch failed: {w.error!r}")

        wait_for(op.metrics_ready, timeout=60, what="the operator's metrics endpoint", check=check)
        wait_for(
            lambda: (w := api.watches("namespace")).get("pods", 0) >= 1 and w.get(plural, 0) >= 1,
            timeout=60,
            what=f"the operator's watches on pods and {plural}",
            check=check,
        )
        result["setup_seconds"] = round(time.monotonic() - t0, 1)
        result["operator_rss_mib_idle"] = round(op.proc_status()["rss_mib"], 1)

        seen = Observed(target.pod_label)
        rv_pods = (api.get_json(f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1") or {})["metadata"]["resourceVersion"]
        rv_jobs = (api.get_json(jobs_path + "?limit=1") or {})["metadata"]["resourceVersion"]
        watchers.append(
            Watcher(
                api,
                f"/api/v1/namespaces/{NAMESPACE}/pods?watch=1&resourceVersion={rv_pods}"
                f"&labelSelector={target.pod_label.replace('/', '%2F')}&timeoutSeconds=3600",
                seen.on_pod,
            )
        )
        watchers.append(Watcher(api, f"{jobs_path}?watch=1&resourceVersion={rv_jobs}&timeoutSeconds=3600", seen.on_job))
        for w in watchers:
            w.start()
            w.ready.wait(30)
        check()

        # -- the ramp -----------------------------------------------------------------------------------
        names = [f"scale-{i:03d}" for i in range(args.jobs)]
        sent: dict[str, float] = {}
        before_req, before_op, before_proc = api.requests_total(), op.metrics(), op.proc_status()

        def create(name: str) -> None:
            sent[name] = time.monotonic()
            status, body = api.request("POST", jobs_path, target.manifest(name, args.nodes))
            if status != 201:
                raise RuntimeError(f"creating {name}: HTTP {status} {body[:300]!r}")

        start = time.monotonic()
        with ThreadPoolExecutor(args.workers) as pool:
            list(pool.map(create, names))
        creates_done = time.monotonic() - start
        want: int = args.jobs * args.nodes

        def all_pods() -> bool:
            return seen.pod_count() >= want

        wait_for(all_pods, timeout=args.timeout, what=f"{want} pods", check=check, interval=0.1)
        all_pods_at = time.monotonic()

        # Settled: every job has a status and the operator made no write for SETTLE_SECONDS.
        last_writes, last_change = -1, time.monotonic()

        def settled() -> bool:
            nonlocal last_writes, last_change
            with seen.lock:
                statuses = [seen.status.get(n, {}) for n in names]
            writes = sum(v for k, v in api.requests_total().items() if k[0] in WRITE_VERBS)
            if writes != last_writes:
                last_writes, last_change = writes, time.monotonic()
            return all(target.settled(s) for s in statuses) and time.monotonic() - last_change >= SETTLE_SECONDS

        wait_for(settled, timeout=args.timeout, what="the operator to settle", check=check, interval=0.5)
        ramp_end = time.monotonic()
        after_req, after_op, after_proc = api.requests_total(), op.metrics(), op.proc_status()

        with seen.lock:
            last_pod = {j: max(t for t, _ in pods.values()) for j, pods in seen.pods.items()}
            server_side = [
                _ts_diff(seen.job_created.get(j, ""), max(c for _, c in pods.values())) for j, pods in seen.pods.items()
            ]
            states = Counter(str(seen.status.get(n, {}).get("state")) for n in names)
        per_job = [last_pod[n] - sent[n] for n in names]
        ramp = delta(after_req, before_req)
        ours = Counter({("POST", plural, "", "201"): args.jobs})
        operator_ramp = delta(ramp, ours)
        ramp_calls = by_call(operator_ramp)
        total_ops = sum(operator_ramp.values())
        result["ramp"] = {
            "creates_sent_seconds": round(creates_done, 2),
            "all_pods_seconds": round(max(last_pod.values()) - start, 2),
            "per_job_p50_seconds": round(percentile(per_job, 50), 2),
            "per_job_p95_seconds": round(percentile(per_job, 95), 2),
            "per_job_max_seconds": round(max(per_job), 2),
            "per_job_server_side_p50_seconds": percentile([s for s in server_side if s is not None], 50),
            "per_job_server_side_max_seconds": max(s for s in server_side if s is not None),
            "settled_seconds": round(ramp_end - start, 2),
            "job_states": dict(states),
            "operator_requests": total_ops,
            "operator_requests_per_job": round(total_ops / args.jobs, 1),
            "operator_writes_per_job": round(
                sum(v for k, v in operator_ramp.items() if k[0] in WRITE_VERBS) / args.jobs, 1
            ),
            "requests_by_call": ramp_calls,
            "resync_ticks": ramp_calls.get(f"LIST {plural}", 0),
            "operator_metrics": {k: after_op[k] - before_op.get(k, 0) for k in after_op},
            "operator_cpu_seconds": round(after_proc["cpu_seconds"] - before_proc["cpu_seconds"], 1),
            "loadavg_after": os.getloadavg(),
        }
        _ = all_pods_at

        # -- the quiet window -----------------------------------------------------------------------------
        with seen.lock:
            modified_before, pod_events_before = seen.job_modified, sum(seen.pod_events.values())
        q_req, q_op, q_proc = api.requests_total(), op.metrics(), op.proc_status()
        q_start = time.monotonic()
        window = args.quiet_ticks * args.resync_seconds + 1
        timeline: list[tuple[float, dict[str, int]]] = []  # when in the window the requests came
        prev = q_req
        while time.monotonic() - q_start < window:  # the measurement is this window itself
            check()
            time.sleep(0.5)
            now_req = api.requests_total()
            if d := by_call(delta(now_req, prev)):
                timeline.append((round(time.monotonic() - q_start, 1), d))
            prev = now_req
        q_after, q_op_after, q_proc_after = api.requests_total(), op.metrics(), op.proc_status()
        quiet = by_call(delta(q_after, q_req))
        # Backstop periods in the window (the watch-cached operator lists jobs only every 10th tick, so its LISTs
        # no longer count the ticks).
        ticks = args.quiet_ticks
        writes = sum(v for k, v in delta(q_after, q_req).items() if k[0] in WRITE_VERBS)
        reads = sum(v for k, v in delta(q_after, q_req).items() if k[0] not in WRITE_VERBS)
        with seen.lock:
            modified = seen.job_modified - modified_before
            pod_events = sum(seen.pod_events.values()) - pod_events_before
        result["quiet"] = {
            "window_seconds": round(time.monotonic() - q_start, 1),
            "ticks": ticks,
            "writes": writes,
            "writes_per_tick": round(writes / ticks, 2) if ticks else None,
            "reads_per_tick": round(reads / ticks, 1) if ticks else None,
            "requests_by_call": quiet,
            "job_modified_events": modified,
            "timeline": timeline,
            "pod_events": pod_events,
            "operator_metrics": {k: q_op_after[k] - q_op.get(k, 0) for k in q_op_after},
            "operator_cpu_seconds_per_tick": round((q_proc_after["cpu_seconds"] - q_proc["cpu_seconds"]) / ticks, 2)
            if ticks
            else None,
        }
        result["operator_peak_rss_mib"] = round(q_proc_after["peak_rss_mib"], 1)
        result["operator_rss_mib_end"] = round(q_proc_after["rss_mib"], 1)
        result["loadavg_after"] = os.getloadavg()
        ok = True
        return result
    except BaseException:
        print(f"\nbenchmark failed; logs kept in {cluster.state_dir}/logs", file=sys.stderr)
        if operator:
            print(f"--- operator log tail:\n{operator.tail()}", file=sys.stderr)
        print(f"--- kube-apiserver log tail:\n{log_tail(cluster.state_dir, 'kube-apiserver', 15)}", file=sys.stderr)
        raise
    finally:
        for w in watchers:
            w.close()
        if operator:
            operator.stop()
        cluster.stop(keep_logs=args.keep_logs or not ok)
        if args.keep_logs:
            print(f"logs kept in {cluster.state_dir}/logs", file=sys.stderr)


def _ts_diff(a: str, b: str) -> int | None:
    """Seconds between two creationTimestamps (1 s resolution)."""
    if not a or not b:
        return None
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return int(time.mktime(time.strptime(b, fmt)) - time.mktime(time.strptime(a, fmt)))


def report(r: dict[str, Any]) -> str:
    ramp, quiet = r["ramp"], r["quiet"]
    rows = [
        ("jobs x nodes", f"{r['jobs']} x {r['nodes']} = {r['jobs'] * r['nodes']} pods", ""),
        ("all pods exist (first create sent -> last pod seen)", f"{ramp['all_pods_seconds']} s", "< 60 s"),
        (
            "per job: create sent -> last pod seen, p50 / p95 / max",
            f"{ramp['per_job_p50_seconds']} / {ramp['per_job_p95_seconds']} / {ramp['per_job_max_seconds']} s",
            "",
        ),
        (
            "  (server clock, 1 s resolution: p50 / max)",
            f"{ramp['per_job_server_side_p50_seconds']} / {ramp['per_job_server_side_max_seconds']} s",
            "",
        ),
        ("creates sent by the benchmark", f"{ramp['creates_sent_seconds']} s ({r['workers']} threads)", ""),
        ("operator settled (no write for 3 s)", f"{ramp['settled_seconds']} s", ""),
        (
            "operator API requests per job during the ramp",
            f"{ramp['operator_requests_per_job']} ({ramp['operator_writes_per_job']} writes)",
            "",
        ),
        ("  backstop ticks inside the ramp", str(ramp["resync_ticks"]), ""),
        ("operator CPU during the ramp", f"{ramp['operator_cpu_seconds']} s", ""),
        (
            f"quiet: writes per tick ({quiet['ticks']} ticks of {r['resync_seconds']} s)",
            f"{quiet['writes_per_tick']} ({quiet['writes']} writes)",
            "0",
        ),
        ("quiet: reads per tick", str(quiet["reads_per_tick"]), ""),
        ("quiet: operator CPU per tick", f"{quiet['operator_cpu_seconds_per_tick']} s", ""),
        ("operator peak RSS (VmHWM)", f"{r['operator_peak_rss_mib']} MiB", "< 200 MB"),
        (
            "  RSS when idle before the ramp / at the end",
            f"{r['operator_rss_mib_idle']} / {r['operator_rss_mib_end']} MiB",
            "",
        ),
        ("load average before / after", f"{r['loadavg_before'][0]:.2f} / {r['loadavg_after'][0]:.2f}", ""),
    ]
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    lines = [f"{'':{w0}}  {'measured':{w1}}  target", *(f"{a:{w0}}  {b:{w1}}  {c}" for a, b, c in rows)]
    lines.append("")
    lines.append(
        "operator requests during the ramp: " + ", ".join(f"{k} {v}" for k, v in ramp["requests_by_call"].items())
    )
    lines.append(
        "operator counters during the ramp: "
        + ", ".join(f"{k.removeprefix('finetune_operator_')} {v:g}" for k, v in ramp["operator_metrics"].items())
    )
    for label, part in (("ramp", ramp), ("quiet window", quiet)):
        passes = int(part["operator_metrics"].get("finetune_operator_reconcile_duration_seconds_count", 0))
        lists = part["requests_by_call"].get("LIST pods", 0)
        lines.append(
            f"{label}: operator reconcile passes {passes} (its histogram), LIST pods {lists} (apiserver; one per "
            "pass with FINETUNE_WATCH_CACHE=0, fewer with the watch cache)"
        )
    lines.append("job states after the ramp: " + ", ".join(f"{k} {v}" for k, v in ramp["job_states"].items()))
    lines.append("requests in the quiet window: " + ", ".join(f"{k} {v}" for k, v in quiet["requests_by_call"].items()))
    lines.append(
        f"job MODIFIED / pod events seen in the quiet window: {quiet['job_modified_events']} / {quiet['pod_events']}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--workers", type=int, default=16, help="threads creating the jobs")
    ap.add_argument(
        "--resync-seconds", type=int, default=5, help="the operator's backstop period (FINETUNE_RESYNC_SECONDS)"
    )
    ap.add_argument("--quiet-ticks", type=int, default=6, help="backstop periods in the quiet window")
    ap.add_argument("--timeout", type=float, default=180, help="give up on the ramp after this many seconds")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--keep-logs", action="store_true", help="keep the cluster's and the operator's logs")
    ap.add_argument("--operator-verbose", action="store_true", help="run the operator with --verbose (slower)")
    args = ap.parse_args(argv)

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # so that the cluster and the operator are stopped

    signal.signal(signal.SIGTERM, on_term)
    r = run(args)
    print(report(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
