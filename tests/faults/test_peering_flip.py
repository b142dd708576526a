"""Fault injection: a peering flip with a stale store. Two replicas run with kopf's peering; the active one (higher
priority) is frozen (SIGSTOP: a long GC pause, a node under memory pressure), the standby takes over and the job
changes under it (suspended, resumed: a new attempt runs); then the frozen replica wakes with everything it cached
before, sees it has the higher priority and is active again, deciding its first passes from that stale store.

Real: the API server, etcd, kopf's peering and both operator replicas (subprocesses). Mocked: the kubelet (FakeKubelet
writes pod status).

The invariants: the woken replica deletes none of the new attempt's pods and starts no attempt of its own; no
attempt's pods are created while another attempt's exist; each rank once per attempt.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from hack.operator_process import OperatorProcess
from tests.faults.harness import Observed, PodWatch
from tests.integration.harness import FakeKubelet, Jobs, make_job
from tests.waiting import wait_for

pytestmark = pytest.mark.faults
ROOT = Path(__file__).resolve().parents[2]
PEERING_CRDS = ROOT / "charts" / "finetune-operator" / "crds" / "kopf-peering-crds.yaml"
LIFETIME = 10  # seconds: a peer silent this long is gone for the others


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _active(port: int) -> bool:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return False
    return any(line == "finetune_operator_backstop_active 1.0" for line in text.splitlines())


def test_a_replica_woken_with_a_stale_store_destroys_nothing(cluster, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    cluster.run_kubectl("apply", "--server-side", "-f", str(PEERING_CRDS))
    cluster.run_kubectl(
        "apply",
        "-f",
        "-",
        input="apiVersion: kopf.dev/v1\nkind: KopfPeering\nmetadata:\n"
        f"  name: finetune-operator\n  namespace: {namespace}\n",
    )
    jobs, kubelet = Jobs(api_client, namespace), FakeKubelet(api_client, namespace)
    seen = Observed()
    pod_watch = PodWatch(api_client, namespace, seen)
    pod_watch.start()
    ports = {"high": _free_port(), "low": _free_port()}
    ops = {
        role: OperatorProcess(
            cluster.kubeconfig,
            namespace,
            standalone=False,
            FINETUNE_METRICS_PORT=str(ports[role]),
            FINETUNE_PEERING_PRIORITY=priority,
            FINETUNE_PEERING_LIFETIME_SECONDS=str(LIFETIME),
        ).start()
        for role, priority in (("high", "200"), ("low", "100"))
    }
    high = ops["high"]
    assert high.proc is not None
    try:
        wait_for(lambda: _active(ports["high"]) and not _active(ports["low"]), timeout=60, what="the high replica")
        jobs.create(make_job("flip").nodes(2).max_restarts(2).build())
        for p in jobs.wait_pods("flip", 2, attempt=0):
            kubelet.run(p.metadata.name)
        jobs.wait_state("flip", "Running", timeout=60)
        time.sleep(2)  # the high replica's store holds the running attempt 0

        os.killpg(high.proc.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        wait_for(lambda: _active(ports["low"]), timeout=LIFETIME * 6, what="the low replica to take over")
        took_over = time.monotonic() - frozen
        jobs.patch("flip", {"suspend": True})
        jobs.wait_state("flip", "Suspended", timeout=60)
        wait_for(lambda: not jobs.pods("flip"), timeout=60, what="the suspended attempt's pods to go")
        jobs.patch("flip", {"suspend": False})
        current = jobs.wait_pods("flip", 2, attempt=1)
        for p in current:
            kubelet.run(p.metadata.name)
        jobs.wait_state("flip", "Running", timeout=60)
        uids = sorted(p.metadata.uid for p in current)

        log_at_wake = len(high.output())
        os.killpg(high.proc.pid, signal.SIGCONT)  # wakes with attempt 0 running in its store
        woke = time.monotonic()
        wait_for(lambda: _active(ports["high"]), timeout=LIFETIME * 6, what="the woken replica to be active again")
        active_again = time.monotonic() - woke
        time.sleep(LIFETIME)  # its passes from the stale store, then from what it reads
        after = jobs.pods("flip")
        status = jobs.status("flip")
        woken_log = high.output()[log_at_wake:]
    finally:
        if high.proc is not None and high.proc.poll() is None:
            os.killpg(high.proc.pid, signal.SIGCONT)
        pod_watch.stop.set()
        for op in ops.values():
            op.stop()
    print(
        json.dumps(
            {
                "scenario": "peering flip: the active replica frozen, the job suspended and resumed, then it wakes",
                "standby_took_over_s": round(took_over, 1),
                "woken_replica_active_again_s": round(active_again, 1),
                "stale_passes_refused": woken_log.count("conflict on"),
                "overlaps": len(seen.overlaps),
                "pods_created": seen.pods_created["flip"],
            }
        )
    )
    assert sorted(p.metadata.uid for p in after) == uids, "the woken replica replaced the running attempt's pods"
    assert all(p.metadata.deletion_timestamp is None for p in after)
    assert status["state"] == "Running" and status["attempt"] == 1, status
    assert seen.overlaps == [], seen.overlaps
    assert seen.attempts["flip"] == {0, 1} and seen.pods_created["flip"] == 4
