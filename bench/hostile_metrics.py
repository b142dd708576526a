"""The operator under 1,000 running jobs whose rank 0 serves a hostile metrics page, beside a few healthy jobs.

    python bench/hostile_metrics.py                         # 1,000 hostile jobs, 20 healthy ones, 90 s windows
    python bench/hostile_metrics.py --jobs 100 --window 45 --json /tmp/hostile.json

On a fresh local control plane (hack/localcluster; no kubelet: the benchmark writes the pods' status as one would)
with the operator as a subprocess (``finetune operator --standalone``, progress interval 15 s, as the chart's
default), two phases in one run, so the comparison holds on a noisy machine:

1. **quiet**: ``--healthy`` jobs whose rank 0 serves the trainer's real exporter with a step that moves every second,
   and ``--jobs`` jobs whose page is healthy but never moves;
2. **hostile**: the same healthy jobs, and ``--jobs`` new jobs whose page is hostile, a third each: one that
   trickles a byte every 0.2 s without end, one of 1 MiB of padding, one of absurd values (an int64 overflow, NaN,
   1e300, a negative step).

Every page is served on the trainer's port 9400 of its own loopback address (127.0.0.10-13), which the pods report as
their IP. Per phase: how far behind the healthy jobs' ``status.progress.step`` is (seconds of steps: p50, p95, max,
sampled every 5 s over the window), how many status writes and reconcile passes the operator made, its CPU and peak
memory, and how many jobs its scraper put in the slow lane. Everything is stopped and removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import GROUP, NAMESPACE, PLURAL, VERSION, Api, job_manifest, wait_for  # noqa: E402
from bench.operator_scale import Operator, parse_prometheus, percentile  # noqa: E402
from hack.localcluster.cluster import BIN_DIR, LocalCluster  # noqa: E402
from hack.metrics_pages import T0, serve  # noqa: E402

HEALTHY_IP, STILL_IP, TRICKLE_IP, HUGE_IP, ABSURD_IP = (f"127.0.0.{i}" for i in (10, 11, 12, 13, 14))
JOBS = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def run_pods(api: Api, names: list[str], ip_of: dict[str, str]) -> None:
    """What a kubelet writes when it runs each job's one pod: Running, Ready, the pod IP."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def one(name: str) -> None:
        status = {
            "phase": "Running",
            "podIP": ip_of[name],
            "startTime": now,
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "trainer",
                    "ready": True,
                    "restartCount": 0,
                    "image": "trainer:bench",
                    "imageID": "",
                    "state": {"running": {"startedAt": now}},
                }
            ],
        }
        code, body = api.request(
            "PATCH", f"{PODS}/{name}-node-0/status", {"status": status}, "application/merge-patch+json"
        )
        if code != 200:
            raise RuntimeError(f"running {name}: HTTP {code} {body[:200]!r}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))


def lag(api: Api, healthy: list[str]) -> list[float]:
    """Seconds of steps the healthy jobs' status is behind their page."""
    now_step = time.time() - T0
    out = []
    for name in healthy:
        st = (api.get_json(f"{JOBS}/{name}") or {}).get("status") or {}
        step = (st.get("progress") or {}).get("step")
        out.append(now_step - step if step is not None else float("inf"))
    return out


def phase(api: Api, op: Operator, healthy: list[str], window: float) -> dict[str, Any]:
    before_m, before_p = op.metrics(), op.proc_status()
    samples: list[float] = []
    end = time.monotonic() + window
    while time.monotonic() < end:
        time.sleep(5)
        op.check()
        samples += lag(api, healthy)
    after_m, after_p = op.metrics(), op.proc_status()
    finite = [s for s in samples if s != float("inf")]
    return {
        "healthy_lag_s": {
            "p50": round(percentile(finite, 50), 1) if finite else None,
            "p95": round(percentile(finite, 95), 1) if finite else None,
            "max": round(max(finite), 1) if finite else None,
            "never_scraped": len(samples) - len(finite),
            "samples": len(samples),
        },
        "status_writes": after_m["finetune_operator_status_writes_total"]
        - before_m["finetune_operator_status_writes_total"],
        "passes": after_m["finetune_operator_reconcile_duration_seconds_count"]
        - before_m["finetune_operator_reconcile_duration_seconds_count"],
        "operator_cpu_s": round(after_p["cpu_seconds"] - before_p["cpu_seconds"], 1),
        "operator_peak_rss_mib": round(after_p["peak_rss_mib"], 1),
        "slow_lane_jobs": slow_lane(op),
    }


def slow_lane(op: Operator) -> float | None:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5) as r:
        found = parse_prometheus(r.read().decode(), ("finetune_operator_scrapes_slow",))
    return found[0][2] if found else None


def create_running(api: Api, names: list[str], ip_of: dict[str, str], check: Any) -> None:
    with ThreadPoolExecutor(8) as pool:
        for code, body in pool.map(lambda n: api.request("POST", JOBS, job_manifest(n, 1)), names):
            if code != 201:
                raise RuntimeError(f"creating a job: HTTP {code} {body[:200]!r}")
    want = set(names)
    wait_for(
        lambda: want <= {p["metadata"]["labels"]["finetune.dev/job-name"] for p in api.items(PODS)},
        timeout=600,
        interval=1,
        what=f"pods of {len(names)} jobs",
        check=check,
    )
    run_pods(api, names, ip_of)
    wait_for(
        lambda: (
            sum(
                1
                for j in api.items(JOBS)
                if j["metadata"]["name"] in want and (j.get("status") or {}).get("state") == "Running"
            )
            == len(names)
        ),
        timeout=600,
        interval=2,
        what=f"{len(names)} jobs Running",
        check=check,
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    servers = [
        serve(HEALTHY_IP, "healthy"),
        serve(STILL_IP, "still"),
        serve(TRICKLE_IP, "trickle"),
        serve(HUGE_IP, "huge"),
        serve(ABSURD_IP, "absurd"),
    ]
    cluster = LocalCluster()
    op: Operator | None = None
    result: dict[str, Any] = {
        "jobs": args.jobs,
        "healthy": args.healthy,
        "window_s": args.window,
        "cpus": os.cpu_count(),
    }
    try:
        cluster.start()
        api = Api(cluster)
        kubectl = [str(BIN_DIR / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"]
        subprocess.run(
            [*kubectl, "apply", "--server-side", "-f", str(ROOT / "crds" / "finetune.dev_finetunejobs.yaml")],
            check=True,
            capture_output=True,
        )
        subprocess.run([*kubectl, "create", "namespace", NAMESPACE], check=True, capture_output=True)
        wait_for(
            lambda: api.get_json(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"),
            timeout=60,
            what="the default ServiceAccount",
            check=cluster.check,
        )
        wait_for(lambda: api.get_json(JOBS), timeout=60, what="the jobs endpoint", check=cluster.check)
        os.environ["FINETUNE_PROGRESS_INTERVAL_SECONDS"] = str(args.interval)
        op = operator = Operator(cluster.kubeconfig, Path(cluster.state_dir) / "logs" / "operator.log", 30)

        def check() -> None:  # ``operator``: not Optional, unlike ``op``, which the cleanup below reads
            cluster.check()
            operator.check()

        wait_for(op.metrics_ready, timeout=60, what="the operator's metrics endpoint", check=check)
        healthy = [f"healthy-{i:02d}" for i in range(args.healthy)]
        still = [f"still-{i:04d}" for i in range(args.jobs)]
        hostile = [f"hostile-{i:04d}" for i in range(args.jobs)]
        ip_of = {n: HEALTHY_IP for n in healthy} | {n: STILL_IP for n in still}
        ip_of |= {n: (TRICKLE_IP, HUGE_IP, ABSURD_IP)[i % 3] for i, n in enumerate(hostile)}

        create_running(api, healthy + still, ip_of, check)
        time.sleep(args.interval)  # every job scraped once
        result["quiet"] = phase(api, op, healthy, args.window)
        for name in still:  # the quiet jobs go; the hostile ones come
            api.request("DELETE", f"{JOBS}/{name}")
        create_running(api, hostile, ip_of, check)
        time.sleep(args.interval)
        result["hostile"] = phase(api, op, healthy, args.window)
        return result
    finally:
        if op is not None:
            op.stop()
        cluster.stop()
        for srv in servers:
            srv.shutdown()


def report(r: dict[str, Any]) -> str:
    lines = [f"{r['jobs']} jobs beside {r['healthy']} healthy ones, {r['window_s']} s windows, {r['cpus']} cpus"]
    for ph in ("quiet", "hostile"):
        p = r[ph]
        lag_s = p["healthy_lag_s"]
        lines.append(
            f"{ph:8s} healthy jobs behind by p50 {lag_s['p50']} s, p95 {lag_s['p95']} s, max {lag_s['max']} s "
            f"(never scraped {lag_s['never_scraped']}/{lag_s['samples']}); status writes {p['status_writes']:.0f}, "
            f"passes {p['passes']:.0f}, operator CPU {p['operator_cpu_s']} s, peak RSS {p['operator_peak_rss_mib']} "
            f"MiB, slow lane {p['slow_lane_jobs']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000, help="quiet jobs, then hostile jobs (default 1000)")
    ap.add_argument("--healthy", type=int, default=20, help="healthy jobs whose progress is measured (default 20)")
    ap.add_argument("--window", type=float, default=90, help="seconds measured per phase (default 90)")
    ap.add_argument("--interval", type=int, default=15, help="the operator's progress interval (default 15 s)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    r = run(args)
    print(report(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
