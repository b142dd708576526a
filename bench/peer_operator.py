"""Side by side with the peer: finetune-operator and Kubeflow's training operator (v1.9.4, the `training-operator.v1`
controller most platform teams run) on the same workload, each alone on a fresh local control plane, alternating.

    python -m bench.peer_operator                      # 3 rounds x (ours, peer default flags, peer tuned)
    python -m bench.peer_operator --rounds 1 --jobs 20 --json /tmp/peer.json

The peer is built from the Go module proxy once (``go install …/cmd/training-operator.v1@v1.9.4``, a few minutes;
cached under ``~/.cache/finetune-operator/peers``) and runs as a local process: PyTorchJob only, its CRD from the
module, leader election off, its admission webhook served but not registered (v1.9.4 cannot turn it off; it needs a
certificate pair on disk and an empty Secret, which the benchmark makes). Each round runs ours, the peer with its
default client rate limit (20 requests/s, burst 30) and the peer with ``--kube-api-qps=500 --kube-api-burst=1000``
(the one to beat). The workload is ``bench/operator_scale.py``'s: N jobs of 4 pods (FineTuneJob ``nodes: 4``;
PyTorchJob 1 Master + 3 Workers) created at once, no kubelet, then a quiet window; requests are counted on the API
server for every resource either operator touches. The table gives, per figure, the range over rounds and the
ratio ours / tuned peer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import NAMESPACE  # noqa: E402
from bench.operator_scale import Api, Operator, Target, run  # noqa: E402
from hack.localcluster.cluster import LocalCluster, free_port  # noqa: E402

PEER_MODULE = "github.com/kubeflow/training-operator"
PEER_VERSION = "v1.9.4"
PEER_LABEL = "training.kubeflow.org/job-name"
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # hard-coded in the peer's certificate rotator
CACHE = Path(os.environ.get("FINETUNE_CACHE", Path.home() / ".cache" / "finetune-operator")) / "peers"


def build_peer() -> Path:
    """The peer's binary, built from the Go module proxy on first use."""
    gobin = CACHE / f"training-operator-{PEER_VERSION}" / "bin"
    binary = gobin / "training-operator.v1"
    if not binary.exists():
        print(f"building {PEER_MODULE} {PEER_VERSION} (once, a few minutes)", file=sys.stderr, flush=True)
        env = {**os.environ, "GOBIN": str(gobin), "CGO_ENABLED": "0"}
        subprocess.run(["go", "install", f"{PEER_MODULE}/cmd/training-operator.v1@{PEER_VERSION}"], env=env, check=True)
    return binary


def peer_crd() -> Path:
    moddir = subprocess.run(
        ["go", "mod", "download", "-json", f"{PEER_MODULE}@{PEER_VERSION}"], capture_output=True, text=True, check=True
    )
    return Path(json.loads(moddir.stdout)["Dir"]) / "manifests" / "base" / "crds" / "kubeflow.org_pytorchjobs.yaml"


def pytorchjob(name: str, nodes: int) -> dict[str, Any]:
    def replicas(n: int) -> dict[str, Any]:
        # The container must be named "pytorch" (the peer looks its port up by that name).
        return {
            "replicas": n,
            "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [{"name": "pytorch", "image": "trainer:bench"}]}},
        }

    specs = {"Master": replicas(1)}
    if nodes > 1:
        specs["Worker"] = replicas(nodes - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {"pytorchReplicaSpecs": specs},
    }


def prepare_peer(cluster: LocalCluster, api: Api) -> None:
    """The empty Secret the peer's certificate rotator fills, and the serving pair its webhook server reads."""
    status, body = api.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "training-operator-webhook-cert"}},
    )
    if status not in (201, 409):
        raise RuntimeError(f"creating the peer's webhook Secret: HTTP {status} {body[:200]!r}")
    CERT_DIR.mkdir(parents=True, exist_ok=True)
    if not (CERT_DIR / "tls.crt").exists():
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "365",
                "-subj",
                "/CN=localhost",
                "-keyout",
                str(CERT_DIR / "tls.key"),
                "-out",
                str(CERT_DIR / "tls.crt"),
            ],
            check=True,
            capture_output=True,
        )


class PeerOperator(Operator):
    """Kubeflow's training operator as a subprocess; the process accounting is the base class's."""

    def __init__(self, binary: Path, kubeconfig: str, log: Path, *, tuned: bool) -> None:
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.log = log
        flags = ["--kube-api-qps=500", "--kube-api-burst=1000"] if tuned else []
        env = {**os.environ, "MY_POD_NAMESPACE": NAMESPACE}
        env.pop("KUBECONFIG", None)
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    str(binary),
                    f"--kubeconfig={kubeconfig}",
                    "--enable-scheme=pytorchjob",
                    f"--namespace={NAMESPACE}",
                    f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
                    f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
                    f"--webhook-server-port={free_port()}",
                    "--leader-elect=false",
                    "--zap-log-level=info",
                    *flags,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def metrics(self) -> dict[str, float]:
        return {}

    def metrics_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False


def peer_target(binary: Path, crd: Path, *, tuned: bool) -> Target:
    return Target(
        name="peer, tuned" if tuned else "peer, default flags",
        crd_files=(crd,),
        group="kubeflow.org",
        version="v1",
        plural="pytorchjobs",
        pod_label=PEER_LABEL,
        manifest=pytorchjob,
        settled=lambda s: bool(s.get("startTime") or s.get("conditions")),
        prepare=prepare_peer,
        start=lambda cluster, log, args: PeerOperator(binary, cluster.kubeconfig, log, tuned=tuned),
    )


FIGURES: list[tuple[str, Any]] = [
    ("all pods exist (s)", lambda r: r["ramp"]["all_pods_seconds"]),
    ("per-job p50 (s)", lambda r: r["ramp"]["per_job_p50_seconds"]),
    ("per-job p95 (s)", lambda r: r["ramp"]["per_job_p95_seconds"]),
    ("API requests per job", lambda r: r["ramp"]["operator_requests_per_job"]),
    ("  of them writes", lambda r: r["ramp"]["operator_writes_per_job"]),
    ("operator CPU during the ramp (s)", lambda r: r["ramp"]["operator_cpu_seconds"]),
    ("operator peak RSS (MiB)", lambda r: r["operator_peak_rss_mib"]),
    ("operator RSS idle (MiB)", lambda r: r["operator_rss_mib_idle"]),
    ("reads per quiet backstop period", lambda r: r["quiet"]["reads_per_tick"]),
]


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    names = list(results)
    head = "| figure | " + " | ".join(names) + " | ours / tuned peer |"
    lines = [head, "|" + "---|" * (len(names) + 2)]
    for label, get in FIGURES:
        cells, mids = [], {}
        for n in names:
            vals = [get(r) for r in results[n] if get(r) is not None]
            cells.append(
                f"{min(vals):g}–{max(vals):g}"  # noqa: RUF001
                if len(vals) > 1 and min(vals) != max(vals)
                else (f"{vals[0]:g}" if vals else "—")
            )
            mids[n] = sorted(vals)[len(vals) // 2] if vals else None
        ours, peer = mids.get("finetune-operator"), mids.get("peer, tuned")
        ratio = f"{ours / peer:.2f}" if ours is not None and peer else "—"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--resync-seconds", type=int, default=30, help="our backstop period")
    ap.add_argument("--quiet-ticks", type=int, default=2, help="backstop periods in the quiet window")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json")
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--operator-verbose", action="store_true")
    ap.add_argument("--variants", default="ours,peer-default,peer-tuned")
    args = ap.parse_args(argv)
    binary, crd = build_peer(), peer_crd()
    targets = {
        "ours": Target(),
        "peer-default": peer_target(binary, crd, tuned=False),
        "peer-tuned": peer_target(binary, crd, tuned=True),
    }
    chosen = [targets[v] for v in args.variants.split(",")]
    results: dict[str, list[dict[str, Any]]] = {t.name: [] for t in chosen}
    for round_ in range(1, args.rounds + 1):
        for target in chosen:
            print(f"round {round_}: {target.name}", file=sys.stderr, flush=True)
            results[target.name].append(run(args, target))
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
