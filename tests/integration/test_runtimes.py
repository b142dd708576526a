"""Runtimes on a real control plane: the API server's schema and CEL for both runtime kinds, and the operator (a
subprocess) choosing a job's runtime, merging it, applying its guardrails, recording the generation an attempt was
admitted with, and reading the runtime again for the next attempt only.

Real: kube-apiserver (schemas, CEL, printer columns), kube-scheduler, kube-controller-manager, etcd, the operator and
the ``finetune`` client. No kubelet is needed: every check is on the pods the operator creates (they stay Pending), and
a gang restart is caused by deleting a pod, as an eviction would. A module of its own (its own control plane), since
a cluster's default runtime applies to every job of the cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from finetune_operator.client import FineTuneClient
from finetune_operator.k8s import Kube
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.conftest import Cluster
from tests.integration.harness import GROUP, VERSION, Jobs, make_job
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
CLUSTER, NAMESPACED = "clusterfinetuneruntimes", "finetuneruntimes"


class Runtimes:
    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.co, self.ns = client.CustomObjectsApi(api), ns

    def create(self, plural: str, name: str, spec: dict[str, Any], *, default: bool = False) -> dict[str, Any]:
        kind = "ClusterFineTuneRuntime" if plural == CLUSTER else "FineTuneRuntime"
        meta: dict[str, Any] = {"name": name}
        if default:
            meta["annotations"] = {"finetune.dev/is-default-runtime": "true"}
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": meta, "spec": spec}
        if plural == CLUSTER:
            return dict(self.co.create_cluster_custom_object(GROUP, VERSION, plural, body))
        return dict(self.co.create_namespaced_custom_object(GROUP, VERSION, self.ns, plural, body))

    def patch(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(self.co.patch_cluster_custom_object(GROUP, VERSION, CLUSTER, name, {"spec": spec}))

    def delete_all(self) -> None:
        for rt in self.co.list_cluster_custom_object(GROUP, VERSION, CLUSTER)["items"]:
            self.co.delete_cluster_custom_object(GROUP, VERSION, CLUSTER, rt["metadata"]["name"])


@pytest.fixture
def operator_env() -> dict[str, str]:
    return {"FINETUNE_WAITING_TIMEOUT_SECONDS": "10"}  # how long a next attempt waits for a runtime that went away


@pytest.fixture
def rts(api: client.ApiClient, ns: str) -> Iterator[Runtimes]:
    r = Runtimes(api, ns)
    yield r
    r.delete_all()  # cluster-scoped: they would be every later job's defaults


GPU_POOL = {
    "description": "the A100 pool",
    "images": {"default": "registry.corp/ml/trainer:2"},
    "template": {
        "podTemplate": {"nodeSelector": {"pool": "a100"}, "labels": {"team": "platform"}},
        "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
        "training": {"checkpointEverySteps": 7},
        "shmSize": "2Gi",
    },
    "guardrails": {"maxNodesPerJob": 2},
}


def pod_of(jobs: Jobs, name: str, attempt: int, nodes: int = 1) -> Any:
    return jobs.wait_pods(name, nodes, attempt=attempt)[0]


def runtime_of(jobs: Jobs, name: str, attempt: int) -> dict[str, Any]:
    """The runtime recorded for an attempt: the operator writes the status after it creates the attempt's pods, so a
    reader that saw the pods may still read the previous record for a moment."""
    return wait_for(
        lambda: (r := jobs.status(name).get("runtime")) and r.get("attempt") == attempt and r,
        timeout=30,
        what=f"{name}'s runtime record for attempt {attempt}",
    )


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"guardrails": {"maxNodesPerJob": -1}}, ["maxNodesPerJob", "0"]),
        ({"images": {"default": ""}}, ["images.default"]),
        ({"template": {"queueName": "Team_A"}}, ["queueName"]),
        ({"template": {"training": {"precision": "fp8"}}}, ["precision", "fp8"]),
        (
            {"template": {"podTemplate": {"volumes": [{"name": "v", "mountPath": "/data/../usr", "emptyDir": {}}]}}},
            ["mountPath"],
        ),
    ],
    ids=["negative-limit", "empty-image", "bad-queue", "bad-precision", "mount-path-not-normal"],
)
def test_the_api_server_refuses_a_bad_runtime_naming_the_field(
    rts: Runtimes, spec: dict[str, Any], words: list[str]
) -> None:
    """The template's schema is the FineTuneJob's own (copied by hack/runtime_crd.py), CEL rules included."""
    with pytest.raises(ApiException) as e:
        rts.create(CLUSTER, "bad", spec)
    assert e.value.status == 422 and all(w in e.value.body for w in words), e.value.body


def test_defaults_and_precedence_job_over_namespace_runtime_over_cluster_runtime(
    jobs: Jobs, rts: Runtimes, operator: None, sched: Cluster
) -> None:
    rts.create(CLUSTER, "pool", GPU_POOL, default=True)
    # no runtime named, the cluster's default: its images, pod defaults and training defaults; the job's own win
    jobs.create(make_job("plain").set("podTemplate", {"nodeSelector": {"pool": "h100"}}).build())
    pod = pod_of(jobs, "plain", 0)
    assert pod.spec.containers[0].image == "registry.corp/ml/trainer:2"
    assert pod.spec.node_selector == {"pool": "h100"}  # the job's key wins
    assert pod.metadata.labels["team"] == "platform"
    assert any(e.name == "NCCL_DEBUG" and e.value == "WARN" for e in pod.spec.containers[0].env)
    record = runtime_of(jobs, "plain", 0)
    assert record["name"] == "pool" and record["chosenBy"] == "the cluster's default"
    assert record["generation"] == 1
    config = client.CoreV1Api(jobs.core.api_client).read_namespaced_config_map("plain-config", jobs.ns)
    assert json.loads(config.data["config.json"])["training"]["checkpointEverySteps"] == 5  # the job's own value
    # the namespace's default comes before the cluster's
    rts.create(NAMESPACED, "team", {"template": {"podTemplate": {"labels": {"team": "mine"}}}}, default=True)
    jobs.create(make_job("local").build())
    pod = pod_of(jobs, "local", 0)
    assert pod.metadata.labels["team"] == "mine" and pod.spec.containers[0].image != "registry.corp/ml/trainer:2"
    assert runtime_of(jobs, "local", 0)["chosenBy"] == "the namespace's default"
    # ...and the cluster default's guardrails still bind its jobs: a namespace's admins narrow them, never drop them
    jobs.create(make_job("wide").nodes(3).build())
    failure = jobs.wait_state("wide", "Failed")["failure"]
    assert "the cluster's default under a namespace's runtime: spec.guardrails.maxNodesPerJob" in failure["message"]
    assert jobs.pods("wide") == []
    # a job that names the cluster's runtime gets it, whatever the defaults; kubectl shows it
    jobs.create(make_job("named").set("runtimeRef", {"name": "pool"}).build())
    assert pod_of(jobs, "named", 0).metadata.labels["team"] == "platform"
    wide = sched.run_kubectl("get", "ftj", "named", "-n", jobs.ns, "-o", "wide")
    assert "RUNTIME" in wide and "pool" in wide


def test_a_runtimes_guardrail_refuses_a_job_naming_the_field_and_the_runtime(
    jobs: Jobs, rts: Runtimes, operator: None
) -> None:
    rts.create(CLUSTER, "pool", GPU_POOL)
    jobs.create(make_job("big").nodes(3).set("runtimeRef", {"name": "pool"}).build())
    status = jobs.wait_state("big", "Failed")
    assert status["failure"]["reason"] == "QuotaExceeded"
    assert "spec.nodes=3" in status["failure"]["message"]
    assert "ClusterFineTuneRuntime pool (generation 1): spec.guardrails.maxNodesPerJob" in status["failure"]["message"]
    assert jobs.pods("big") == []


def test_an_edited_runtime_leaves_the_running_attempt_alone_and_the_next_one_uses_it(
    jobs: Jobs, rts: Runtimes, operator: None
) -> None:
    rts.create(CLUSTER, "pool", GPU_POOL)
    jobs.create(make_job("edit").nodes(2).set("runtimeRef", {"name": "pool"}).build())
    first = jobs.wait_pods("edit", 2, attempt=0)
    assert first[0].spec.node_selector == {"pool": "a100"}
    edited = rts.patch("pool", {"template": {"podTemplate": {"nodeSelector": {"pool": "h100"}}}})
    assert edited["metadata"]["generation"] == 2
    # the attempt that runs is untouched: same pods, same record, after a pass that read the job again
    jobs.patch("edit", {"ttlSecondsAfterFinished": 3600})
    wait_for(lambda: jobs.status("edit").get("observedGeneration") == 2, timeout=30, what="a pass after the edit")
    assert [p.metadata.uid for p in jobs.live_pods("edit")] == [p.metadata.uid for p in first]
    assert jobs.status("edit")["runtime"]["generation"] == 1
    # a gang restart (a rank's pod is gone, as after an eviction): the next attempt reads the runtime again
    jobs.core.delete_namespaced_pod(first[1].metadata.name, jobs.ns, grace_period_seconds=0)
    second = jobs.wait_pods("edit", 2, attempt=1, timeout=90)
    assert second[0].spec.node_selector == {"pool": "h100"}
    assert runtime_of(jobs, "edit", 1)["generation"] == 2
    # deleted, as a Helm upgrade of the chart's runtimes does for a moment: the attempt that runs goes on; the next one
    # waits for it and starts when it is back
    rts.delete_all()
    jobs.core.delete_namespaced_pod(second[0].metadata.name, jobs.ns, grace_period_seconds=0)
    waiting = wait_for(
        lambda: (c := jobs.condition("edit", "Created")) and c["reason"] == "RuntimeNotFound" and c,
        timeout=60,
        what="the next attempt waiting for its runtime",
    )
    assert "does not exist" in waiting["message"] and jobs.live_pods("edit") == []
    rts.create(CLUSTER, "pool", GPU_POOL)
    third = jobs.wait_pods("edit", 2, attempt=2, timeout=90)
    assert third[0].spec.node_selector == {"pool": "a100"} and runtime_of(jobs, "edit", 2)["generation"] == 1
    # gone for longer than the operator's waiting timeout (10 s here): the job fails and says why
    rts.delete_all()
    jobs.core.delete_namespaced_pod(third[0].metadata.name, jobs.ns, grace_period_seconds=0)
    status = jobs.wait_state("edit", "Failed", timeout=90)
    assert status["failure"]["reason"] == "RuntimeNotFound"
    assert "spec.runtimeRef: ClusterFineTuneRuntime 'pool' does not exist" in status["failure"]["message"]
    assert "waited" in status["failure"]["message"]


def test_the_client_shows_effective_values_and_checks_the_runtime_before_submitting(jobs: Jobs, rts: Runtimes) -> None:
    """finetune validate's work (the Python client): the runtime's template merged, each value's source, and its
    guardrails and a missing runtime refused before anything is created."""
    rts.create(CLUSTER, "pool", GPU_POOL)
    ftc = FineTuneClient(jobs.ns, kube=Kube(jobs.core.api_client))
    job = make_job("check").set("runtimeRef", {"name": "pool"}).build()
    job["metadata"]["namespace"] = jobs.ns
    eff = ftc.effective(job)
    assert eff is not None and eff.runtime is not None and eff.runtime.name == "pool"
    shown = {v.field: (v.value, v.source) for v in eff.values}
    assert shown["spec.image"] == ("registry.corp/ml/trainer:2", "runtime: spec.images.default")
    assert shown["spec.shmSize"] == ("2Gi", "runtime: spec.template")
    assert shown["spec.training.checkpointEverySteps"] == ("5", "job")
    _, errors = ftc.check(make_job("wide").nodes(3).set("runtimeRef", {"name": "pool"}).build())
    assert any("spec.guardrails.maxNodesPerJob" in e for e in errors), errors
    _, errors = ftc.check(make_job("typo").set("runtimeRef", {"name": "pol"}).build())
    assert any("spec.runtimeRef" in e and "'pol' does not exist" in e for e in errors), errors
    assert [(r.kind, r.name) for r in ftc.runtimes()] == [("ClusterFineTuneRuntime", "pool")]


def test_a_cluster_runtime_kept_to_some_namespaces_and_an_output_that_cannot_come_or_go(
    jobs: Jobs, rts: Runtimes, operator: None
) -> None:
    rts.create(CLUSTER, "team-b-only", {**GPU_POOL, "allowedNamespaces": ["team-b"]})
    jobs.create(make_job("elsewhere").set("runtimeRef", {"name": "team-b-only"}).build())
    status = jobs.wait_state("elsewhere", "Failed")
    assert status["failure"]["reason"] == "RuntimeNotFound"
    assert f"is not for namespace {jobs.ns}" in status["failure"]["message"] and jobs.pods("elsewhere") == []
    # spec.output may be left out for the runtime's claim template, but never added or removed later: the next
    # attempt would lose its checkpoints
    with pytest.raises(ApiException) as e:
        jobs.patch("elsewhere", {"output": None})  # a merge patch: null removes the field
    assert e.value.status == 422 and "spec.output is immutable" in e.value.body
