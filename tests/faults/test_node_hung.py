"""Fault injection: a node hangs on a deletion while it still reports Ready.

The node stays Ready but its kubelet does not finish a deletion (a hung unmount, a slow checkpoint). The old
processes may still run there, so the pod is never force-deleted: the next attempt waits until the kubelet finishes,
then proceeds. (A lost node, where the pod is force-deleted, runs on real nodes: tests/realnodes/test_node_loss.py.)

Real: the API server (graceful deletion of bound pods, Bindings, Node objects), etcd, the garbage collector and the
operator. Mocked: the kubelets (tests/integration/gpunodes.GpuNodes), since a kubelet that hangs on a deletion while
it keeps reporting Ready cannot be made to happen on demand on a real one.
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
from tests.integration.gpunodes import GpuNodes
from tests.integration.harness import FakeKubelet, Jobs, OperatorProcess, make_job
from tests.waiting import wait_for

pytestmark = pytest.mark.faults
FORCE_AFTER = 3  # seconds past the grace period and of NotReady (operator.forceDelete.afterSeconds)
GRACE = 2  # the jobs' terminationGracePeriodSeconds


class Binder(threading.Thread):
    """The scheduler's part: binds each unbound trainer pod to a node, rank r to the r-th node."""

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
                    names = self.nodes.names
                    node = names[int(pod.metadata.labels["finetune.dev/node-rank"]) % len(names)]
                    self.core.create_namespaced_binding(
                        self.ns,
                        {
                            "apiVersion": "v1",
                            "kind": "Binding",
                            "metadata": {"name": pod.metadata.name},
                            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                        },
                        _preload_content=False,
                    )


def _node_of(jobs: Jobs, name: str) -> str:
    return str(jobs.core.read_namespaced_pod(name, jobs.ns).spec.node_name)


def _finish(jobs: Jobs, kubelet: FakeKubelet, job: str, attempt: int) -> dict[str, Any]:
    pods = jobs.wait_pods(job, 2, attempt=attempt)
    wait_for(lambda: jobs.state(job) == "Running", timeout=30, what=f"{job} attempt {attempt} running")
    for p in pods:
        kubelet.exit(p.metadata.name, 0)
    return jobs.wait_state(job, "Succeeded", timeout=30)


def test_a_pod_on_a_hung_node_is_never_force_deleted(cluster, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    nodes = GpuNodes(api_client, f"faults-{namespace[-5:]}", count=3, gpus=0, taint=False).start()
    jobs, seen, kubelet = Jobs(api_client, namespace), Observed(), FakeKubelet(api_client, namespace)
    podwatch, binder = PodWatch(api_client, namespace, seen), Binder(api_client, namespace, nodes)
    podwatch.start()
    binder.start()
    op = OperatorProcess(cluster.kubeconfig, namespace, FINETUNE_FORCE_DELETE_AFTER_SECONDS=str(FORCE_AFTER)).start()
    try:
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
    figures = {
        "scenario": "node hung",
        "force_delete_after_s": FORCE_AFTER,
        "grace_s": GRACE,
        "hung": {
            "force_deleted_events": hung_events.count("ForceDeleted"),
            "old_pod_kept": held,
            "next_attempt_before_the_old_was_gone": early,
        },
        "violations": len(seen.overlaps) + len(early) + hung_events.count("ForceDeleted"),
    }
    print(json.dumps(figures))
    if out := os.environ.get("FAULTS_REPORT"):
        Path(out).with_suffix(".node-hung.json").write_text(json.dumps(figures, indent=2))
    assert seen.overlaps == [], seen.overlaps
    assert held == ["hung-node-0"] and early == [], "a pod on a node that reports Ready was force-deleted"
    assert hung_events.count("ForceDeleted") == 0 and (hung_final["restarts"], hung_final["disruptions"]) == (1, 0)
