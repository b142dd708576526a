"""Kueue's objects as the Kueue tiers use them (tests/integration/test_kueue.py with fake GPU nodes,
tests/realnodes/test_kueue.py with real training on real nodes): a real Kueue started for a control plane with its
ResourceFlavor and WorkloadPriorityClasses, a ClusterQueue and LocalQueue per test namespace, and reads of Workloads
and quota.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from finetune_operator.kueue import group_name
from kubernetes import client

from hack.kueue import LocalKueue
from tests.conftest import Cluster
from tests.integration.harness import GROUP, PLURAL, VERSION
from tests.waiting import wait_for

KQ = ("kueue.x-k8s.io", "v1beta2")
MANAGED = ("finetune.dev/kueue-test", "managed")  # the namespace label whose namespaces Kueue manages
FLAVOR = "default"
LOCAL_QUEUE = "team"
PRIORITIES = {"low": 100, "high": 1000}  # WorkloadPriorityClasses, named by the pod label kueue.x-k8s.io/priority-class


def _object(kind: str, name: str, **body: Any) -> dict[str, Any]:
    return {"apiVersion": "/".join(KQ), "kind": kind, "metadata": {"name": name}, **body}


@contextmanager
def running_kueue(c: Cluster, api: client.ApiClient) -> Iterator[LocalKueue]:
    """Kueue's controller manager for ``c``, with the ResourceFlavor and the priority classes; checked (it did not
    die) and stopped at the end."""
    kq = LocalKueue(c.kubeconfig, managed_label=MANAGED, kubectl=c.kubectl).start()
    co = client.CustomObjectsApi(api)
    co.create_cluster_custom_object(*KQ, "resourceflavors", _object("ResourceFlavor", FLAVOR))
    for name, value in PRIORITIES.items():
        co.create_cluster_custom_object(
            *KQ, "workloadpriorityclasses", _object("WorkloadPriorityClass", name, value=value)
        )
    try:
        yield kq
    finally:
        try:
            kq.check()
        finally:
            kq.stop()


def cluster_queue_name(ns: str) -> str:
    return f"cq-{ns}"


def create_cluster_queue(
    api: client.ApiClient, name: str, ns: str, quota: dict[str, str], flavor: str = FLAVOR
) -> None:
    """ClusterQueue ``name`` for namespace ``ns`` with ``quota`` of ``flavor`` (preemption of lower priorities
    within it)."""
    client.CustomObjectsApi(api).create_cluster_custom_object(
        *KQ,
        "clusterqueues",
        _object(
            "ClusterQueue",
            name,
            spec={
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": list(quota),
                        "flavors": [
                            {"name": flavor, "resources": [{"name": r, "nominalQuota": q} for r, q in quota.items()]}
                        ],
                    }
                ],
            },
        ),
    )


def create_queues(c: Cluster, api: client.ApiClient, ns: str, quota: dict[str, str], flavor: str = FLAVOR) -> str:
    """Label ``ns`` for Kueue, give it a ClusterQueue of its own with ``quota`` of ``flavor`` and LocalQueue
    ``team`` on it; returns the LocalQueue's name."""
    c.run_kubectl("label", "namespace", ns, f"{MANAGED[0]}={MANAGED[1]}")
    create_cluster_queue(api, cluster_queue_name(ns), ns, quota, flavor)
    return create_local_queue(api, ns, LOCAL_QUEUE)


def create_local_queue(api: client.ApiClient, ns: str, name: str, cluster_queue: str | None = None) -> str:
    """LocalQueue ``name`` in ``ns`` on ``cluster_queue`` (the namespace's by default), once Kueue has taken it in
    (Active)."""
    co = client.CustomObjectsApi(api)
    cq = cluster_queue or cluster_queue_name(ns)
    co.create_namespaced_custom_object(*KQ, ns, "localqueues", _object("LocalQueue", name, spec={"clusterQueue": cq}))

    def active() -> bool:
        lq = co.get_namespaced_custom_object(*KQ, ns, "localqueues", name)
        return any(
            c["type"] == "Active" and c["status"] == "True" for c in (lq.get("status") or {}).get("conditions", [])
        )

    wait_for(active, timeout=60, what=f"LocalQueue {ns}/{name} active")
    return name


@contextmanager
def namespace_queues(
    request: Any,
    kueue: LocalKueue,
    c: Cluster,
    api: client.ApiClient,
    *,
    ns: str,
    quota: dict[str, str],
    flavor: str = FLAVOR,
) -> Iterator[str]:
    """``create_queues`` for a test (``request``: its pytest request); when the test failed, Kueue's log and the
    namespace's Workloads are printed. At the end the ClusterQueue is deleted: it is cluster-scoped, while the
    namespace's deletion removes the pods, so (garbage collector) their Workloads, and the LocalQueue."""
    yield create_queues(c, api, ns, quota, flavor)
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print("==== kueue log (tail) ====\n" + kueue.log_tail(80))
        print(c.run_kubectl("get", "workloads.kueue.x-k8s.io", "-n", ns, "-o", "yaml", check=False))
    client.CustomObjectsApi(api).delete_cluster_custom_object(*KQ, "clusterqueues", cluster_queue_name(ns))


def queued_labels(priority: str | None) -> dict[str, str]:
    """The pod template labels that give a job's Workloads a WorkloadPriorityClass."""
    return {"kueue.x-k8s.io/priority-class": priority} if priority else {}


class Kueue:
    """Reads of Kueue's objects for one test namespace."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.co = client.CustomObjectsApi(api)
        self.ns = ns

    def wl(self, job: str, attempt: int) -> str:
        """The name of the Workload of ``job``'s ``attempt`` (its pod group's: the job's name, attempt and uid)."""
        uid = self.co.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, job)["metadata"]["uid"]
        return group_name(job, attempt, uid)

    def workloads(self) -> dict[str, dict[str, Any]]:
        items = self.co.list_namespaced_custom_object(*KQ, self.ns, "workloads")["items"]
        return {w["metadata"]["name"]: w for w in items}

    def condition(self, workload: str, ctype: str) -> bool:
        w = self.workloads().get(workload) or {}
        return any(c["type"] == ctype and c["status"] == "True" for c in (w.get("status") or {}).get("conditions", []))

    def reservations(self, workload: str) -> int:
        """How often Kueue reserved quota for ``workload`` (its QuotaReserved events)."""
        events = (
            client.CoreV1Api(self.co.api_client)
            .list_namespaced_event(self.ns, field_selector=f"involvedObject.name={workload},reason=QuotaReserved")
            .items
        )
        return sum(e.count or 1 for e in events)

    def reserving(self) -> list[str]:
        """The Workloads that hold quota now: reserved and not finished."""
        return sorted(
            name
            for name in self.workloads()
            if self.condition(name, "QuotaReserved") and not self.condition(name, "Finished")
        )

    def reserved(self, resource: str) -> int:
        """How much of ``resource`` the namespace's ClusterQueue has reserved now (whole units)."""
        cq = self.co.get_cluster_custom_object(*KQ, "clusterqueues", cluster_queue_name(self.ns))
        for flavor in (cq.get("status") or {}).get("flavorsReservation") or []:
            for r in flavor["resources"]:
                if r["name"] == resource:
                    return int(r["total"])
        return 0

    def wait_reserved(self, resource: str, amount: int) -> None:
        """The ClusterQueue's reservation of ``resource`` reaches ``amount`` (Kueue writes its status a moment after
        it admits)."""
        wait_for(
            lambda: self.reserved(resource) == amount,
            timeout=60,
            what=f"{amount} {resource} reserved in the ClusterQueue",
        )


def queued_condition(jobs: Any, job: str, says: str = "", timeout: float = 60) -> dict[str, Any]:
    """Condition Queued=True once its message has Kueue's ``says`` (the operator re-reads the Workload every 10 s).
    ``jobs``: a tests.integration.harness.Jobs."""
    return wait_for(
        lambda: (c := jobs.condition(job, "Queued")) and c["status"] == "True" and says in c["message"] and c,
        timeout=timeout,
        what=f"{job}: condition Queued=True saying {says!r}",
    )
