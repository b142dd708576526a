"""Dispatch across clusters with Kueue's MultiKueue: a FineTuneJob with ``spec.managedBy: kueue.x-k8s.io/multikueue``
submitted to a manager cluster runs on a worker cluster, its status shows on the manager, deleting it on the
manager removes the worker's copy, and suspending it there removes the copy until it is resumed.

Real: two control planes (kube-apiserver, etcd, kube-controller-manager), a real Kueue on each (hack/kueue; the
manager's with MultiKueue's generic adapter for FineTuneJob, ``multiKueue.externalFrameworks``), the MultiKueue
objects as a platform team writes them (the worker's kubeconfig in a Secret, MultiKueueCluster, MultiKueueConfig, an
AdmissionCheck on the manager's ClusterQueue), and the operator as a subprocess on each cluster. Mocked, because it
cannot exist here: the worker's kubelet (``FakeKubelet`` ends its ranks as the trainer would).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from finetune_operator.multikueue import MANAGED_BY, PREBUILT_KEY, workload_name
from kubernetes import client, config

from hack.kueue import NAMESPACE as KUEUE_NAMESPACE
from hack.kueue import LocalKueue
from hack.operator_process import OperatorProcess
from tests.conftest import Cluster, local_cluster
from tests.integration.harness import GROUP, PLURAL, VERSION, FakeKubelet, Jobs, make_job
from tests.kueueobjects import KQ, MANAGED
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kueue]
NS = "team-a"
QUEUE = "team"
FRAMEWORK = "FineTuneJob.v1alpha1.finetune.dev"


@dataclass
class Side:
    cluster: Cluster
    api: client.ApiClient
    kueue: LocalKueue
    jobs: Jobs


def _object(kind: str, name: str, namespace: str | None = None, **body: Any) -> dict[str, Any]:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "/".join(KQ), "kind": kind, "metadata": meta, **body}


def _queues(c: Cluster, *, checks: list[str]) -> None:
    """A ResourceFlavor, a ClusterQueue (with the admission checks named) and LocalQueue ``team`` in namespace NS."""
    cq: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "memory"],
                "flavors": [
                    {
                        "name": "default",
                        "resources": [
                            {"name": "cpu", "nominalQuota": "64"},
                            {"name": "memory", "nominalQuota": "256Gi"},
                        ],
                    }
                ],
            }
        ],
    }
    if checks:
        cq["admissionChecksStrategy"] = {"admissionChecks": [{"name": n} for n in checks]}
    objects = [
        _object("ResourceFlavor", "default"),
        _object("ClusterQueue", "cq", spec=cq),
        _object("LocalQueue", QUEUE, NS, spec={"clusterQueue": "cq"}),
    ]
    c.run_kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))


def _namespace(c: Cluster) -> None:
    c.run_kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": NS,
                    "labels": {"pod-security.kubernetes.io/enforce": "restricted", MANAGED[0]: MANAGED[1]},
                },
            }
        ),
    )


@pytest.fixture(scope="module")
def worker() -> Iterator[Side]:
    with local_cluster() as c:
        _namespace(c)
        kq = LocalKueue(c.kubeconfig, managed_label=MANAGED, kubectl=c.kubectl).start()
        try:
            _queues(c, checks=[])
            api = config.new_client_from_config(config_file=c.kubeconfig)
            yield Side(c, api, kq, Jobs(api, NS))
        finally:
            kq.stop()


@pytest.fixture(scope="module")
def manager(worker: Side) -> Iterator[Side]:
    with local_cluster() as c:
        _namespace(c)
        mk = {"multiKueue": {"externalFrameworks": [{"name": FRAMEWORK}], "gcInterval": "5s"}}
        kq = LocalKueue(c.kubeconfig, managed_label=MANAGED, kubectl=c.kubectl, extra_config=mk).start()
        try:
            kubeconfig = base64.b64encode(Path(worker.cluster.kubeconfig).read_bytes()).decode()
            objects = [
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "worker-1", "namespace": KUEUE_NAMESPACE},
                    "data": {"kubeconfig": kubeconfig},
                },
                _object(
                    "MultiKueueCluster",
                    "worker-1",
                    spec={"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": "worker-1"}}},
                ),
                _object("MultiKueueConfig", "workers", spec={"clusters": ["worker-1"]}),
                _object(
                    "AdmissionCheck",
                    "multikueue",
                    spec={
                        "controllerName": MANAGED_BY,
                        "parameters": {"apiGroup": KQ[0], "kind": "MultiKueueConfig", "name": "workers"},
                    },
                ),
            ]
            c.run_kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))
            _queues(c, checks=["multikueue"])
            api = config.new_client_from_config(config_file=c.kubeconfig)
            co = client.CustomObjectsApi(api)

            def active() -> bool:
                got = co.get_cluster_custom_object(*KQ, "multikueueclusters", "worker-1")
                return any(
                    x["type"] == "Active" and x["status"] == "True" for x in got.get("status", {}).get("conditions", [])
                )

            wait_for(active, timeout=60, what="the MultiKueueCluster active (Kueue reached the worker)")
            yield Side(c, api, kq, Jobs(api, NS))
        finally:
            kq.stop()


@pytest.fixture(scope="module")
def operators(manager: Side, worker: Side) -> Iterator[tuple[OperatorProcess, ...]]:
    ops = (
        OperatorProcess(manager.cluster.kubeconfig, NS).start(),
        OperatorProcess(worker.cluster.kubeconfig, NS).start(),
    )
    try:
        yield ops
    finally:
        for op in ops:
            op.stop()


def absent(side: Side, job: str) -> bool:
    try:
        side.jobs.get(job)
    except client.exceptions.ApiException as e:
        return e.status == 404
    return False


def dispatched(name: str, nodes: int = 2) -> dict[str, Any]:
    return make_job(name).nodes(nodes).set("queueName", QUEUE).set("managedBy", MANAGED_BY).build()


def test_a_job_submitted_to_the_manager_runs_on_the_worker_and_its_status_shows_on_the_manager(
    manager: Side, worker: Side, operators: Any
) -> None:
    """The manager's operator makes the job's Workload and no pod; Kueue reserves the manager's quota, MultiKueue
    has the worker's Kueue admit a copy and creates the job there, labelled with the Workload. The worker's operator
    runs it with its pods outside Kueue's queues (the quota counted once); once its ranks succeed, the worker's
    Workload is Finished, and the manager's job shows Succeeded (the worker's status)."""
    submitted = time.monotonic()
    job = manager.jobs.create(dispatched("remote"))
    uid = job["metadata"]["uid"]
    wl = workload_name("remote", uid)
    ranks = worker.jobs.wait_pods("remote", 2, timeout=120)
    placed = time.monotonic() - submitted
    copy = worker.jobs.get("remote")
    meta = copy["metadata"]
    # the Workload's name: a label with Kueue v0.17, an annotation from v0.18
    named = (meta.get("annotations") or {}).get(PREBUILT_KEY) or meta["labels"].get(PREBUILT_KEY)
    assert named == wl and "managedBy" not in copy["spec"], meta
    assert not manager.jobs.live_pods("remote")  # the manager runs nothing
    for pod in ranks:
        assert "kueue.x-k8s.io/queue-name" not in pod.metadata.labels  # admitted already, as the Workload
    kubelet = FakeKubelet(worker.api, NS)
    for pod in ranks:
        kubelet.run(pod.metadata.name)
    wait_for(lambda: manager.jobs.status("remote").get("state") == "Running", timeout=60, what="Running on the manager")
    for pod in ranks:
        kubelet.exit(pod.metadata.name, 0)
    worker.jobs.wait_state("remote", "Succeeded", timeout=60)
    st = wait_for(
        lambda: (s := manager.jobs.status("remote")).get("state") == "Succeeded" and s,
        timeout=90,
        what="the manager's job Succeeded",
    )
    # the worker operator's status, copied whole (the manager's operator writes none)
    assert st.get("completionTime") and st.get("attempt", 0) == 0 and st.get("observedGeneration") == 1, st
    co = client.CustomObjectsApi(manager.api)

    def finished() -> bool:  # the worker's Workload Finished (by the worker's operator), so the manager's
        conditions = (co.get_namespaced_custom_object(*KQ, NS, "workloads", wl).get("status") or {}).get("conditions")
        return any(c["type"] == "Finished" and c["status"] == "True" for c in conditions or [])

    wait_for(finished, timeout=60, what="the manager's Workload Finished")

    # MultiKueue removes the worker's objects once its Workload finished
    wait_for(lambda: absent(worker, "remote"), timeout=60, what="the worker's copy removed after it finished")
    assert manager.jobs.status("remote")["state"] == "Succeeded"  # the manager's job keeps the final status
    print(json.dumps({"multikueue_submit_to_ranks_on_worker_s": round(placed, 1)}))


def test_deleting_the_job_on_the_manager_removes_the_workers_copy(manager: Side, worker: Side, operators: Any) -> None:
    manager.jobs.create(dispatched("gone", nodes=1))
    worker.jobs.wait_pods("gone", 1, timeout=120)
    client.CustomObjectsApi(manager.api).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "gone")

    wait_for(lambda: absent(worker, "gone"), timeout=90, what="the worker's copy deleted")
    wait_for(lambda: not worker.jobs.live_pods("gone"), timeout=60, what="its ranks gone")


def test_suspending_on_the_manager_removes_the_copy_and_resuming_dispatches_again(
    manager: Side, worker: Side, operators: Any
) -> None:
    """Suspended, the manager's Workload goes (the operator deletes it), MultiKueue removes the worker's copy, and the
    manager's job says Suspended; resumed, a new Workload is dispatched and the worker runs a new copy."""
    co = client.CustomObjectsApi(manager.api)
    job = manager.jobs.create(dispatched("paused", nodes=1))
    wl = workload_name("paused", job["metadata"]["uid"])
    (first,) = worker.jobs.wait_pods("paused", 1, timeout=120)
    co.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "paused", {"spec": {"suspend": True}})
    wait_for(lambda: absent(worker, "paused"), timeout=90, what="the worker's copy removed")
    manager.jobs.wait_state("paused", "Suspended", timeout=60)

    def workload_gone() -> bool:
        try:
            co.get_namespaced_custom_object(*KQ, NS, "workloads", wl)
        except client.exceptions.ApiException as e:
            return e.status == 404
        return False

    wait_for(workload_gone, timeout=30, what="the manager's Workload deleted")
    co.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "paused", {"spec": {"suspend": False}})
    (again,) = worker.jobs.wait_pods("paused", 1, timeout=120)
    assert again.metadata.uid != first.metadata.uid  # a new copy's rank
    co.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "paused")
    wait_for(lambda: absent(worker, "paused"), timeout=90, what="the worker's copy deleted")
