"""The PodGroups the operator makes for a gang scheduler, taken by the real API server against each scheduler's own CRD
(with strict field validation: a field the scheduler's API types do not have is refused), and their life: one group per
attempt with minMember = the attempt's nodes, named by every rank, created before the ranks; the next attempt's group
replaces the previous one.

Real: kube-apiserver, etcd, the operator as a subprocess, the CRDs of the scheduler-plugins PodGroup and of Volcano's
(generated from ``volcano.sh/apis``, hack/gangschedulers). Not run: Volcano's scheduler (its module is not served by the
Go module proxy); the coscheduling scheduler binds real ranks in tests/realnodes/test_gang.py. No scheduler runs here,
so the pods stay Pending; ``FakeKubelet`` ends one as a lost rank would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from finetune_operator.builders import JobRef, build_pod_group
from finetune_operator.settings import Settings
from finetune_operator.spec import parse_spec
from kubernetes import client

from hack.gangschedulers import crd
from hack.operator_process import OperatorProcess
from tests.integration.harness import FakeKubelet, Jobs, make_job
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.gangschedulers]
API = {"coscheduling": ("scheduling.x-k8s.io", "v1alpha1"), "volcano": ("scheduling.volcano.sh", "v1beta1")}


@pytest.fixture(scope="module")
def crds(cluster) -> None:  # type: ignore[no-untyped-def]
    for name in ("scheduling.x-k8s.io_podgroups", "scheduling.volcano.sh_podgroups"):
        cluster.run_kubectl("apply", "--server-side", "-f", "-", input=json.dumps(crd(name)))
    cluster.run_kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/podgroups.scheduling.x-k8s.io",
        "crd/podgroups.scheduling.volcano.sh",
    )


@pytest.fixture
def volcano_operator(request, cluster, namespace, crds) -> Iterator[OperatorProcess]:  # type: ignore[no-untyped-def]
    op = OperatorProcess(cluster.kubeconfig, namespace, FINETUNE_GANG_SCHEDULER="volcano").start()
    yield op
    op.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print("==== operator log (tail) ====\n" + "\n".join(op.output().splitlines()[-80:]))


def groups(api: client.ApiClient, namespace: str, scheduler: str) -> dict[str, dict[str, Any]]:
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(*API[scheduler], namespace, "podgroups")
    return {g["metadata"]["name"]: g for g in items["items"]}


@pytest.mark.parametrize("scheduler", ["coscheduling", "volcano"])
def test_the_scheduler_crd_takes_the_operators_podgroup(api_client, namespace, crds, scheduler) -> None:  # type: ignore[no-untyped-def]
    """Created with strict field validation: every field is one of the scheduler's API types (the owner reference
    aside: no such FineTuneJob exists here); read back with its name and minMember."""
    spec = parse_spec(make_job("ft").nodes(4).set("gangScheduling", {"scheduler": scheduler}).build()["spec"])
    group = build_pod_group(JobRef("ft", namespace, "0" * 8), spec, attempt=2, settings=Settings())
    assert group is not None
    group["metadata"]["ownerReferences"] = []  # no such FineTuneJob here: the owner reference is the operator's test
    made = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        *API[scheduler], namespace, "podgroups", group, field_validation="Strict"
    )
    assert made["spec"]["minMember"] == 4 and made["metadata"]["name"] == group["metadata"]["name"], made


def test_each_attempt_is_a_volcano_podgroup_its_ranks_name(api_client, namespace, volcano_operator) -> None:  # type: ignore[no-untyped-def]
    """With the chart's gangScheduling.scheduler=volcano: attempt 0's group (minMember 2) exists when its ranks do,
    each rank names it and goes to the volcano scheduler; a rank lost is a gang restart, whose attempt 1 has a group of
    its own while attempt 0's is deleted. A job that opts out (scheduler none) gets neither."""
    jobs = Jobs(api_client, namespace)
    jobs.create(make_job("vc").nodes(2).build())
    ranks = jobs.wait_pods("vc", 2)
    (first,) = groups(api_client, namespace, "volcano")
    assert groups(api_client, namespace, "volcano")[first]["spec"] == {"minMember": 2}
    for pod in ranks:
        assert pod.metadata.annotations["scheduling.k8s.io/group-name"] == first
        assert pod.spec.scheduler_name == "volcano"
    FakeKubelet(api_client, namespace).exit(ranks[1].metadata.name, 137)  # a rank killed: the gang restarts
    regrouped = wait_for(
        lambda: first not in (g := groups(api_client, namespace, "volcano")) and len(g) == 1 and g,
        timeout=60,
        what="attempt 1's group replacing attempt 0's",
    )
    (second,) = regrouped
    again = wait_for(
        lambda: (
            len(p := [x for x in jobs.live_pods("vc") if x.metadata.labels["finetune.dev/attempt"] == "1"]) == 2 and p
        ),
        timeout=60,
        what="attempt 1's ranks",
    )
    assert {p.metadata.annotations["scheduling.k8s.io/group-name"] for p in again} == {second}
    jobs.create(make_job("plain").nodes(2).set("gangScheduling", {"scheduler": "none"}).build())
    plain = jobs.wait_pods("plain", 2)
    assert all(p.spec.scheduler_name == "default-scheduler" for p in plain)
    assert all("scheduling.k8s.io/group-name" not in (p.metadata.annotations or {}) for p in plain)
    assert set(groups(api_client, namespace, "volcano")) == {second}
