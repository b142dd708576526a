"""The operator on a real control plane WITH kube-scheduler and fake GPU nodes: scheduling (Unschedulable,
anti-affinity, taints), quotas, tenant guardrails, output claims, the gang's PodDisruptionBudget against the real
Eviction API, eviction -> restart not counted, and the Pod Security opt-ins of GPU networking.

Real: kube-apiserver (schema, CEL, quota and Pod Security admission, the Eviction API), kube-scheduler (every
placement and every Unschedulable reason below is its decision), kube-controller-manager (garbage collector,
resource quota, disruption controller), etcd, and the operator as a subprocess. Mocked, because they cannot exist
on these machines: GPUs and the kubelet (``GpuNodes`` registers Nodes advertising ``nvidia.com/gpu`` and writes the
status of pods the scheduler binds to them).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.conftest import Cluster
from tests.integration.gpucluster import Operator, bound_claim, gpu_job, make_ns
from tests.integration.gpunodes import GpuNodes
from tests.integration.harness import FakeKubelet, Jobs, make_job
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
GPU8 = {"limits": {"nvidia.com/gpu": 8}}


def scheduler_reason(jobs: Jobs, job: str, contains: str) -> str:
    def probe() -> str | None:
        cond = jobs.condition(job, "Created") or {}
        return str(cond["message"]) if cond.get("reason") == "Unschedulable" and contains in cond["message"] else None

    return wait_for(probe, timeout=60, what=f"{job}: Unschedulable with {contains!r}")


# -- scheduling -------------------------------------------------------------------------------------------------


@pytest.mark.gpu_nodes(1)
def test_gpus_that_run_out_or_a_missing_toleration_are_unschedulable(
    jobs: Jobs, nodes: GpuNodes, operator: None
) -> None:
    jobs.create(gpu_job("first").build())
    jobs.wait_state("first", "Running")
    assert jobs.pods("first")[0].spec.node_name == nodes.names[0]
    jobs.create(gpu_job("second").build())  # the node's 8 GPUs are taken
    assert "Insufficient nvidia.com/gpu" in scheduler_reason(jobs, "second", "nvidia.com/gpu")
    assert jobs.state("second") == "Created" and "Unschedulable" in {e.reason for e in jobs.events("second")}
    jobs.create(gpu_job("untolerated", gpus=1, tolerate=False).build())
    assert "untolerated taint" in scheduler_reason(jobs, "untolerated", "taint")


def test_multi_node_gpu_ranks_get_a_node_each(jobs: Jobs, nodes: GpuNodes, operator: None) -> None:
    # 3 ranks x 2 GPUs fit on one 8-GPU node by resources alone; the operator's anti-affinity spreads them,
    # so the two nodes hold two ranks and the third cannot be placed.
    jobs.create(gpu_job("spread", nodes=3, gpus=2).build())
    message = scheduler_reason(jobs, "spread", "anti-affinity")
    placed = wait_for(
        lambda: (p := [x.spec.node_name for x in jobs.live_pods("spread") if x.spec.node_name]) and len(p) == 2 and p,
        timeout=30,
        what="two ranks bound",
    )
    assert sorted(placed) == sorted(nodes.names), placed
    assert re.search(r"didn't match pod anti-affinity rules", message), message


def test_gpu_resource_quota_is_a_condition_not_a_failure(
    sched: Cluster, ns: str, jobs: Jobs, nodes: GpuNodes, operator: None
) -> None:
    sched.run_kubectl("create", "quota", "gpus", "--hard=requests.nvidia.com/gpu=8", "-n", ns)
    wait_for(
        lambda: (
            "nvidia.com/gpu" in sched.run_kubectl("get", "quota", "gpus", "-n", ns, "-o", "jsonpath={.status.hard}")
        ),
        timeout=30,
        what="the quota controller to publish the quota",
    )
    jobs.create(gpu_job("big", nodes=2).build())
    cond = wait_for(
        lambda: (c := jobs.condition("big", "Created")) and c.get("reason") == "QuotaExceeded" and c,
        timeout=60,
        what="a QuotaExceeded condition",
    )
    assert "exceeded quota: gpus" in cond["message"] and "nvidia.com/gpu" in cond["message"]
    # all or nothing: the rank created before the refusal does not sit on 8 GPUs waiting for its peer
    wait_for(lambda: jobs.live_pods("big") == [], timeout=30, what="the half-created gang to be removed")
    assert jobs.state("big") != "Failed"
    sched.run_kubectl("patch", "quota", "gpus", "-n", ns, "-p", '{"spec": {"hard": {"requests.nvidia.com/gpu": "16"}}}')
    st = jobs.wait_state("big", "Running", timeout=90)  # the next retry (every 30 s) admits the whole gang
    assert (st["attempt"], st["restarts"]) == (0, 0)


# -- tenant guardrails ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "operator_env",
    [
        {
            "FINETUNE_ALLOWED_IMAGE_PREFIXES": "registry.corp/ml/",
            "FINETUNE_DEFAULT_IMAGE": "registry.corp/ml/trainer:1",
            "FINETUNE_ALLOWED_PRIORITY_CLASSES": "batch-low",
            "FINETUNE_MAX_NODES_PER_JOB": "4",
            "FINETUNE_MAX_GPUS_PER_JOB": "16",
            "FINETUNE_ALLOWED_TOLERATION_KEYS": "spot,nvidia.com/gpu",
            "FINETUNE_ALLOWED_SCHEDULERS": "volcano",
        }
    ],
)
def test_each_per_job_guardrail_fails_the_job_naming_the_limit(jobs: Jobs, operator: None) -> None:
    cases = {
        "image": (make_job("image").set("image", "docker.io/x/miner:1"), "InvalidSpec", "allowedImagePrefixes"),
        "prio": (
            make_job("prio").set("podTemplate", {"priorityClassName": "vip"}),
            "InvalidSpec",
            "allowedPriorityClasses",
        ),
        "tolerate": (
            make_job("tolerate").set("podTemplate", {"tolerations": [{"key": "team-b", "operator": "Exists"}]}),
            "InvalidSpec",
            "allowedTolerationKeys",
        ),
        "sched": (
            make_job("sched").set("podTemplate", {"schedulerName": "my-scheduler"}),
            "InvalidSpec",
            "allowedSchedulers",
        ),
        "wide": (make_job("wide").nodes(8), "QuotaExceeded", "maxNodesPerJob"),
        "gpus": (gpu_job("gpus", nodes=3), "QuotaExceeded", "maxGpusPerJob"),
    }
    for builder, _, _ in cases.values():
        jobs.create(builder.build())
    jobs.create(gpu_job("fits", nodes=2).build())
    for name, (_, reason, value) in cases.items():
        st = jobs.wait_state(name, "Failed")
        assert st["failure"]["reason"] == reason and value in st["failure"]["message"], st["failure"]
        assert jobs.pods(name) == []
        # the event is posted just after the status write that made the job Failed
        wait_for(
            lambda n=name, r=reason: r in [e.reason for e in jobs.events(n)],
            timeout=10,  # type: ignore[misc]
            what=f"the {reason} event of {name}",
        )
        assert [e.reason for e in jobs.events(name)].count(reason) == 1
    wait_for(lambda: len(jobs.pods("fits")) == 2, timeout=30, what="the job within every limit to get its pods")


@pytest.mark.parametrize("operator_env", [{"FINETUNE_MAX_GPUS_PER_NAMESPACE": "16"}])
def test_namespace_gpu_total_queues_jobs_until_gpus_free(jobs: Jobs, nodes: GpuNodes, operator: None) -> None:
    jobs.create(gpu_job("a", nodes=2).build())
    jobs.wait_state("a", "Running")
    jobs.create(gpu_job("b").build())
    cond = wait_for(
        lambda: (c := jobs.condition("b", "Created")) and c.get("reason") == "QuotaExceeded" and c,
        timeout=30,
        what="b waits for the namespace's GPUs",
    )
    assert "guardrails.maxGpusPerNamespace" in cond["message"] and "hold 16" in cond["message"]
    assert jobs.pods("b") == [] and jobs.state("b") == "Pending"
    jobs.create(gpu_job("huge", nodes=3).build())  # over the namespace limit on its own: it can never start
    assert jobs.wait_state("huge", "Failed")["failure"]["reason"] == "QuotaExceeded"
    jobs.patch("a", {"suspend": True})  # a suspended job holds nothing
    jobs.wait_state("b", "Running", timeout=90)
    assert [e.reason for e in jobs.events("b")].count("QuotaExceeded") == 1


# -- storage ----------------------------------------------------------------------------------------------------


def test_claim_template_is_created_owned_and_collected(
    sched: Cluster, api: client.ApiClient, ns: str, jobs: Jobs, operator: None
) -> None:
    core = client.CoreV1Api(api)
    tmpl = {
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "nfs",
            "resources": {"requests": {"storage": "10Gi"}},
        }
    }
    jobs.create(make_job("owned").nodes(2).set("output", {"volumeClaimTemplate": tmpl}).build())
    jobs.create(make_job("kept").set("output", {"volumeClaimTemplate": tmpl, "reclaimPolicy": "Retain"}).build())
    pods = jobs.wait_pods("owned", 2)
    claim = wait_for(lambda: _claim(core, ns, "owned-output"), timeout=30, what="the owned claim")
    assert claim.spec.access_modes == ["ReadWriteMany"] and claim.spec.storage_class_name == "nfs"
    assert claim.metadata.owner_references[0].name == "owned"
    assert {v.persistent_volume_claim.claim_name for v in pods[0].spec.volumes if v.persistent_volume_claim} == {
        "owned-output"
    }
    kept = wait_for(lambda: _claim(core, ns, "kept-output"), timeout=30, what="the retained claim")
    assert not kept.metadata.owner_references
    jobs.delete("owned")
    jobs.delete("kept")
    wait_for(lambda: _claim(core, ns, "owned-output") is None, timeout=60, what="the GC to delete the owned claim")
    assert _claim(core, ns, "kept-output") is not None


def test_read_write_once_claim_with_two_nodes_is_invalid_spec(
    sched: Cluster, api: client.ApiClient, ns: str, jobs: Jobs, operator: None
) -> None:
    bound_claim(api, ns, "rwo", ("ReadWriteOnce",))
    jobs.create(make_job("two").nodes(2).set("output", {"claimName": "rwo"}).build())
    jobs.create(make_job("one").set("output", {"claimName": "rwo"}).build())
    st = jobs.wait_state("two", "Failed")
    assert st["failure"]["reason"] == "InvalidSpec" and "ReadWriteMany" in st["failure"]["message"]
    assert "spec.output.claimName" in st["failure"]["message"] and jobs.pods("two") == []
    assert len(jobs.wait_pods("one", 1)) == 1  # one node may use a ReadWriteOnce claim


def _claim(core: client.CoreV1Api, ns: str, name: str) -> Any:
    try:
        return core.read_namespaced_persistent_volume_claim(name, ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


# -- disruption -------------------------------------------------------------------------------------------------


def _evict(core: client.CoreV1Api, ns: str, pod: str) -> int:
    try:
        core.create_namespaced_pod_eviction(
            pod, ns, {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": ns}}
        )
        return 201
    except ApiException as e:
        return int(e.status)


def test_pdb_blocks_eviction_and_goes_when_the_job_finishes(
    api: client.ApiClient, ns: str, jobs: Jobs, nodes: GpuNodes, operator: None
) -> None:
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    jobs.create(gpu_job("blocked", nodes=2, gpus=4).set("podDisruptionBudget", {"enabled": True}).build())
    jobs.wait_state("blocked", "Running")
    pdb = policy.read_namespaced_pod_disruption_budget("blocked", ns)
    assert pdb.spec.min_available == 2 and pdb.metadata.owner_references[0].name == "blocked"
    wait_for(
        lambda: (policy.read_namespaced_pod_disruption_budget("blocked", ns).status.current_healthy or 0) == 2,
        timeout=60,
        what="the disruption controller to count both ranks healthy",
    )
    assert _evict(core, ns, "blocked-node-1") == 429  # the drain waits: the gang is not broken
    assert jobs.status("blocked")["disruptions"] == 0
    kubelet = FakeKubelet(api, ns)
    for p in jobs.live_pods("blocked"):
        kubelet.exit(p.metadata.name, 0)
    jobs.wait_state("blocked", "Succeeded")
    wait_for(
        lambda: not policy.list_namespaced_pod_disruption_budget(ns).items,
        timeout=30,
        what="the PDB to be deleted when the job finished",
    )


def test_eviction_restarts_the_gang_without_counting(
    api: client.ApiClient, ns: str, jobs: Jobs, nodes: GpuNodes, operator: None
) -> None:
    core = client.CoreV1Api(api)
    jobs.create(gpu_job("drained", nodes=2, gpus=4).max_restarts(0).set("terminationGracePeriodSeconds", 5).build())
    jobs.wait_state("drained", "Running")
    first = {p.metadata.name: p.metadata.uid for p in jobs.live_pods("drained")}
    assert _evict(core, ns, "drained-node-1") == 201  # the Eviction API, as kubectl drain uses it
    st = wait_for(
        lambda: (s := jobs.status("drained")).get("attempt") == 1 and s.get("state") == "Running" and s,
        timeout=90,
        what="a gang restart to attempt 1, running again",
    )
    assert (st["restarts"], st["disruptions"]) == (0, 1)  # maxRestarts 0 and still running: not counted
    assert st["failure"]["reason"] == "Evicted", st["failure"]  # the DisruptionTarget condition the API server set
    second = {p.metadata.name: p.metadata.uid for p in jobs.live_pods("drained")}
    assert second.keys() == first.keys() and not set(second.values()) & set(first.values())


# -- GPU networking ---------------------------------------------------------------------------------------------


def test_host_network_and_rdma_need_a_privileged_namespace(
    sched: Cluster, api: client.ApiClient, ns: str, jobs: Jobs, operator: None
) -> None:
    jobs.create(make_job("hostnet").set("network", {"hostNetwork": True, "rdma": True}).build())
    st = jobs.wait_state("hostnet", "Failed")
    assert st["failure"]["reason"] == "InvalidSpec"
    assert "hostNetwork" in st["failure"]["message"] and "enforce=privileged" in st["failure"]["message"]
    privileged = make_ns(sched, "privileged")
    op = Operator(sched, privileged)
    try:
        Jobs(api, privileged).create(make_job("hostnet").set("network", {"hostNetwork": True, "rdma": True}).build())
        (pod,) = Jobs(api, privileged).wait_pods("hostnet", 1)
        assert pod.spec.host_network and pod.spec.dns_policy == "ClusterFirstWithHostNet"
        assert pod.spec.containers[0].security_context.capabilities.add == ["IPC_LOCK"]
    finally:
        op.stop(False)
        sched.run_kubectl("delete", "namespace", privileged, "--wait=false", check=False)
