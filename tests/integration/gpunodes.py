"""Fake GPU nodes for scheduling tests: Node objects that advertise ``nvidia.com/gpu`` (optionally tainted as GPU
Operator clusters do), plus a kubelet stand-in for the pods the real kube-scheduler binds to them.

Mocked, because it cannot exist on these machines: GPUs and the kubelet. Real: the kube-scheduler that decides
where (and whether) each pod goes, the API server's quota and Pod Security admission, and the operator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class GpuNodes:
    """``count`` nodes ``<prefix>-<i>`` with ``gpus`` each. While started, pods bound to them become Running
    (with an IP), and a deleted pod exits 143 (SIGTERM) and has its deletion completed, as a kubelet would; except on
    a node in ``lost`` (no kubelet any more) or ``hung`` (deletions never finish)."""

    def __init__(
        self,
        api: client.ApiClient,
        prefix: str,
        *,
        count: int,
        gpus: int = 8,
        taint: bool = True,
        labels: Callable[[int], dict[str, str]] | None = None,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.names = [f"{prefix}-{i}" for i in range(count)]
        self.gpus, self.taint = gpus, taint
        self.labels = labels or (lambda i: {})  # node i's labels besides the usual ones (a topology domain, say)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.hold_running: set[str] = set()  # pod names left Pending even when bound (tests that need it)
        self.lost: set[str] = set()  # nodes whose kubelet is gone: nothing on them changes any more
        self.hung: set[str] = set()  # nodes still Ready whose kubelet does not finish deletions (a hung unmount)
        self.hold_deleting: set[str] = set()  # uids of pods whose deletion waits (a test reads them terminating)

    def start(self) -> GpuNodes:
        for i, name in enumerate(self.names):
            body: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "nvidia.com/gpu.present": "true",
                        **self.labels(i),
                    },
                },
            }
            if self.taint:
                body["spec"] = {"taints": [GPU_TAINT]}
            self.core.create_node(body)
            cap = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(self.gpus)}
            self.core.patch_node_status(
                name,
                {
                    "status": {
                        "capacity": cap,
                        "allocatable": cap,
                        "conditions": [
                            {
                                "type": "Ready",
                                "status": "True",
                                "reason": "KubeletReady",
                                "message": "fake",
                                "lastHeartbeatTime": _now(),
                                "lastTransitionTime": _now(),
                            }
                        ],
                        "addresses": [{"type": "InternalIP", "address": f"10.201.0.{i + 1}"}],
                    }
                },
            )
            # The TaintNodesByCondition admission plugin gives every new Node node.kubernetes.io/not-ready, which
            # the node-lifecycle controller (off here: no heartbeats) would lift once the node reports Ready.
            node = self.core.read_node(name)
            node.spec.taints = [t for t in node.spec.taints or [] if t.key != "node.kubernetes.io/not-ready"]
            self.core.replace_node(name, node)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for name in self.names:
            for pod in self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items:
                self._finish_deletion(pod)
            try:
                self.core.delete_node(name)
            except ApiException as e:
                if e.status != 404:
                    raise

    def pods_on(self, node: str) -> list[Any]:
        return list(self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items)

    def _finish_deletion(self, pod: Any) -> None:
        try:
            self.core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod.metadata.uid)
                ),
            )
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            for node in self.names:
                if node in self.lost:
                    continue
                try:
                    for pod in self.pods_on(node):
                        self._step(pod, node)
                except ApiException:
                    continue  # a pod went away between list and write: the next round sees it

    def _step(self, pod: Any, node: str) -> None:
        name, ns = pod.metadata.name, pod.metadata.namespace
        if pod.metadata.deletion_timestamp:
            if node in self.hung or pod.metadata.uid in self.hold_deleting:
                return
            if pod.status.phase not in ("Succeeded", "Failed"):  # SIGTERM: the trainer checkpoints and exits 143
                term = {"exitCode": 143, "reason": "Error", "startedAt": _now(), "finishedAt": _now()}
                self.core.patch_namespaced_pod_status(
                    name,
                    ns,
                    {
                        "status": {
                            "phase": "Failed",
                            "containerStatuses": [
                                {
                                    "name": "trainer",
                                    "ready": False,
                                    "restartCount": 0,
                                    "image": "trainer:test",
                                    "imageID": "",
                                    "state": {"terminated": term},
                                }
                            ],
                        }
                    },
                )
            self._finish_deletion(pod)
            return
        if pod.status.phase == "Pending" and name not in self.hold_running:
            ip = f"10.201.{self.names.index(node) + 1}.{abs(hash(pod.metadata.uid)) % 250 + 2}"
            self.core.patch_namespaced_pod_status(
                name,
                ns,
                {
                    "status": {
                        "phase": "Running",
                        "podIP": ip,
                        "hostIP": f"10.201.0.{self.names.index(node) + 1}",
                        "startTime": _now(),
                        "conditions": [{"type": "Ready", "status": "True"}],
                        "containerStatuses": [
                            {
                                "name": "trainer",
                                "ready": True,
                                "restartCount": 0,
                                "image": "trainer:test",
                                "imageID": "",
                                "state": {"running": {"startedAt": _now()}},
                            }
                        ],
                    }
                },
            )


def set_ready(core: client.CoreV1Api, node: str, status: str) -> None:
    """The node's Ready condition, as the node lifecycle controller writes it when the kubelet stops reporting
    (Unknown) or the kubelet itself (True, False)."""
    core.patch_node_status(
        node,
        {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": status,
                        "reason": "NodeStatusUnknown" if status == "Unknown" else "KubeletReady",
                        "message": "set by the test",
                        "lastHeartbeatTime": _now(),
                        "lastTransitionTime": _now(),
                    }
                ]
            }
        },
    )
