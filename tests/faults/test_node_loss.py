"""Fault injection: a node is lost under a running gang, and another node hangs on a deletion while it still reports
Ready.

Lost node: its kubelet stops; as the node lifecycle controller and its taint-based eviction would, the node turns
Ready=Unknown and its pod is deleted, which no kubelet will ever confirm. The operator must restart the gang (a
disruption, not counted), force-delete the stuck pod once the node has been NotReady past the threshold (one
ForceDeleted event), and only then create the next attempt under the same names.

Hung node: the node stays Ready but its kubelet does not finish a deletion (a hung unmount, a slow checkpoint). The
old processes may still run there, so the pod is never force-deleted: the next attempt waits until the kubelet
finishes, then proceeds.

Real: the API server (graceful deletion of bound pods, Bindings, Node objects), etcd, the garbage collector and the
operator. Mocked: the kubelets and the node lifecycle controller (tests/integration/gpunodes.GpuNodes and
set_ready), since neither can run here (the control plane's node-lifecycle controllers are off: no heartbeats).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.faults.harness import Observed, PodWatch
from tests.integration.gpunodes import GpuNodes, set_ready
from tests.integration.harness import FakeKubelet, Jobs, OperatorProcess, make_job
from tests.waiting import wait_for

pytestmark = pytest.mark.faults
FORCE_AFTER = 3  # seconds past the grace period and of NotReady (operator.forceDelete.afterSeconds)
GRACE = 2  # the jobs' terminationGracePeriodSeconds


class Binder(threading.Thread):
    """The scheduler's part: binds each unbound trainer pod to a node not lost, rank r to the r-th such node."""

    def __init__(self, api: client.ApiClient, namespace: str, nodes: GpuNodes) -> None:
        super().__init__(daemon=True)
        self.core, self.ns, self.nodes = client.CoreV1Api(api), namespace, nodes
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            with contextlib.suppress(Exception):
                for pod in self.core.list_namespaced_pod(self.ns, label_selector="finetune.dev/job-name").items:
                    if pod.spec.node_name or pod.metadata.deletion_timestamp:
                        continue
                    live = [n for n in self.nodes.names if n not in self.nodes.lost]
                    node = live[int(pod.metadata.labels["finetune.dev/node-rank"]) % len(live)]
                    self.core.create_namespaced_binding(self.ns, {
                        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod.metadata.name},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": node}}, _preload_content=False)


def _node_of(jobs: Jobs, name: str) -> str:
    return str(jobs.core.read_namespaced_pod(name, jobs.ns).spec.node_name)


def _finish(jobs: Jobs, kubelet: FakeKubelet, job: str, attempt: int) -> dict[str, Any]:
    pods = jobs.wait_pods(job, 2, attempt=attempt)
    wait_for(lambda: jobs.state(job) == "Running", timeout=30, what=f"{job} attempt {attempt} running")
    for p in pods:
        kubelet.exit(p.metadata.name, 0)
    return jobs.wait_state(job, "Succeeded", timeout=30)


def test_node_lost_and_node_hung(cluster, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    core = client.CoreV1Api(api_client)
    nodes = GpuNodes(api_client, f"faults-{namespace[-5:]}", count=3, gpus=0, taint=False).start()
    jobs, seen, kubelet = Jobs(api_client, namespace), Observed(), FakeKubelet(api_client, namespace)
    podwatch, binder = PodWatch(api_client, namespace, seen), Binder(api_client, namespace, nodes)
    podwatch.start()
    binder.start()
    op = OperatorProcess(cluster.kubeconfig, namespace, FINETUNE_FORCE_DELETE_AFTER_SECONDS=str(FORCE_AFTER)).start()
    figures: dict[str, Any] = {}
    try:
        # -- a lost node ---------------------------------------------------------------------------------
        jobs.create(make_job("lost").nodes(2).set("terminationGracePeriodSeconds", GRACE).build())
        jobs.wait_pods("lost", 2, attempt=0)
        wait_for(lambda: jobs.state("lost") == "Running", timeout=30, what="lost attempt 0 running")
        gone = _node_of(jobs, "lost-node-1")
        nodes.lost.add(gone)
        t0 = time.monotonic()
        set_ready(core, gone, "Unknown")
        core.delete_namespaced_pod("lost-node-1", namespace)  # the taint-based eviction (grace from the pod)
        wait_for(lambda: jobs.status("lost").get("attempt") == 1, timeout=30, what="the gang restart")
        detect = time.monotonic() - t0
        wait_for(lambda: not any(p.metadata.name == "lost-node-1" and p.metadata.labels["finetune.dev/attempt"] == "0"
                                 for p in jobs.pods("lost")), timeout=60, what="the stuck pod to be force-deleted")
        forced = time.monotonic() - t0
        jobs.wait_pods("lost", 2, attempt=1)
        wait_for(lambda: jobs.state("lost") == "Running", timeout=30, what="lost attempt 1 running")
        recovered = time.monotonic() - t0
        lost_final = _finish(jobs, kubelet, "lost", 1)
        lost_events = [e.reason for e in jobs.events("lost")]

        # -- a hung node (still Ready) -----------------------------------------------------------------
        jobs.create(make_job("hung").nodes(2).set("terminationGracePeriodSeconds", GRACE).build())
        jobs.wait_pods("hung", 2, attempt=0)
        wait_for(lambda: jobs.state("hung") == "Running", timeout=30, what="hung attempt 0 running")
        slow = _node_of(jobs, "hung-node-0")
        nodes.hung.add(slow)
        kubelet.exit("hung-node-1", 1, message="RuntimeError: injected")
        wait_for(lambda: jobs.status("hung").get("attempt") == 1, timeout=30, what="the gang restart")
        time.sleep(GRACE + 3 * FORCE_AFTER)  # well past the threshold: a force deletion would have happened
        held = [p.metadata.name for p in jobs.pods("hung") if p.metadata.labels["finetune.dev/attempt"] == "0"]
        early = [p.metadata.name for p in jobs.pods("hung") if p.metadata.labels["finetune.dev/attempt"] == "1"]
        nodes.hung.discard(slow)  # the kubelet finishes the deletion
        hung_final = _finish(jobs, kubelet, "hung", 1)
        hung_events = [e.reason for e in jobs.events("hung")]
    finally:
        op.stop()
        podwatch.stop.set()
        binder.stop.set()
        nodes.stop()
    figures = {"scenario": "node lost / node hung", "force_delete_after_s": FORCE_AFTER, "grace_s": GRACE,
               "lost": {"time_to_detect_s": round(detect, 2), "force_deleted_after_s": round(forced, 2),
                        "recovered_after_s": round(recovered, 2), "force_deleted_events":
                        lost_events.count("ForceDeleted")},
               "hung": {"force_deleted_events": hung_events.count("ForceDeleted"), "old_pod_kept": held,
                        "next_attempt_before_the_old_was_gone": early},
               "violations": len(seen.overlaps) + len(early) + hung_events.count("ForceDeleted")
               + abs(lost_events.count("ForceDeleted") - 1)}
    print(json.dumps(figures))
    if out := os.environ.get("FAULTS_REPORT"):
        Path(out).with_suffix(".node-loss.json").write_text(json.dumps(figures, indent=2))
    assert seen.overlaps == [], seen.overlaps
    assert (lost_final["disruptions"], lost_final["restarts"]) == (1, 0)
    assert lost_events.count("ForceDeleted") == 1
    assert held == ["hung-node-0"] and early == [], "a pod on a node that reports Ready was force-deleted"
    assert hung_events.count("ForceDeleted") == 0 and (hung_final["restarts"], hung_final["disruptions"]) == (1, 0)
