"""Gang admission with a real Kueue: quota-aware queueing, whole-gang admission, preemption, gang restarts and
suspend that give quota back, and no Workload left behind by a deleted job.

Real: Kueue's controller manager (hack/kueue: built from the Go module proxy, its pod webhook and plain-pod-group
integration on), kube-apiserver, kube-scheduler, kube-controller-manager (garbage collector), etcd and the operator
as a subprocess. Mocked, because they cannot exist on these machines: GPUs and the kubelet (``GpuNodes``: four 8-GPU
Nodes and a stand-in that runs the pods the scheduler binds, and on deletion lets them exit 143 as the trainer does
after its SIGTERM checkpoint; ``FakeKubelet`` writes a rank's exit). That the trainer saves a checkpoint on that
SIGTERM and the next attempt resumes from it is shown with real training in tests/e2e; here, that a preempted gang
is stopped with its full grace period (the time the checkpoint takes), not counted as a failure, and requeued.

One ClusterQueue per test holds GPU quota for one 2-node gang (16 GPUs); every job below is 2 nodes x 8 GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hack.kueue import LocalKueue
from tests.conftest import Cluster
from tests.integration.gpucluster import gpu_job
from tests.integration.gpunodes import GpuNodes
from tests.integration.harness import FakeKubelet, Jobs
from tests.kueueobjects import (
    KQ,
    Kueue,
    create_local_queue,
    namespace_queues,
    queued_condition,
    queued_labels,
    running_kueue,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kueue, pytest.mark.gpu_nodes(4)]
GRACE = 45  # the jobs' terminationGracePeriodSeconds: a preempted gang must get all of it
# PodGC, as in every cluster: a deleted pod that was never scheduled (a queued gang's, gated) is marked Failed and
# removed by it; Kueue then finishes the group and lifts its finalizer. Every pod here is bound to a Node that exists.
EXTRA_CONTROLLERS = ("pod-garbage-collector-controller",)


@pytest.fixture(scope="module")
def kueue(sched: Cluster, api: client.ApiClient) -> Iterator[LocalKueue]:
    with running_kueue(sched, api) as kq:
        yield kq


@pytest.fixture
def queue(
    request: pytest.FixtureRequest, kueue: LocalKueue, sched: Cluster, api: client.ApiClient, ns: str
) -> Iterator[str]:
    """LocalQueue ``team`` in the test's namespace (managed by Kueue), on a ClusterQueue of its own with 16 GPUs."""
    gpus = {"cpu": "1000", "memory": "10Ti", "nvidia.com/gpu": "16"}
    with namespace_queues(request, kueue, sched, api, ns=ns, quota=gpus) as local_queue:
        yield local_queue


def queued_job(name: str, *, priority: str | None = None) -> dict[str, Any]:
    j = gpu_job(name, nodes=2).set("queueName", "team").set("terminationGracePeriodSeconds", GRACE)
    j.obj["spec"]["podTemplate"]["labels"] = queued_labels(priority)
    return j.build()


@dataclass
class Tier:
    api: client.ApiClient
    ns: str
    jobs: Jobs
    kq: Kueue
    nodes: GpuNodes


@pytest.fixture
def t(api: client.ApiClient, ns: str, jobs: Jobs, nodes: GpuNodes, *, queue: str, operator: None) -> Tier:
    """The test's namespace with LocalQueue ``team``, four GPU nodes and the operator."""
    return Tier(api, ns, jobs, Kueue(api, ns), nodes)


def finish(t: Tier, job: str, code: int = 0) -> None:
    """The job's running ranks exit with ``code``, as the kubelet would report it."""
    kubelet = FakeKubelet(t.api, t.ns)
    for pod in t.jobs.live_pods(job):
        kubelet.exit(pod.metadata.name, code)


def counts(st: dict[str, Any]) -> tuple[int, int, int]:
    """(attempt, restarts, disruptions) of a status (a zero is not written)."""
    return st.get("attempt", 0), st.get("restarts", 0), st.get("disruptions", 0)


def gated(jobs: Jobs, job: str) -> list[str]:
    return [
        p.metadata.name
        for p in jobs.live_pods(job)
        if any(g.name == "kueue.x-k8s.io/admission" for g in p.spec.scheduling_gates or [])
    ]


def test_a_gang_waits_for_quota_and_is_admitted_whole(t: Tier) -> None:
    t.jobs.create(queued_job("a"))
    t.jobs.wait_state("a", "Running", timeout=90)
    assert t.kq.condition(t.kq.wl("a", 0), "Admitted") and t.kq.reserving() == [t.kq.wl("a", 0)]
    t.kq.wait_reserved("nvidia.com/gpu", 16)
    t.jobs.create(queued_job("b"))
    cond = queued_condition(t.jobs, "b", "insufficient")
    assert "insufficient" in cond["message"] and "nvidia.com/gpu" in cond["message"], cond  # Kueue's own words
    assert t.kq.wl("b", 0) in cond["message"] and "LocalQueue team" in cond["message"]
    st = t.jobs.status("b")
    assert st["state"] == "Created" and st["reason"] == "Queued", st
    assert len(wait_for(lambda: len(g := gated(t.jobs, "b")) == 2 and g, timeout=30, what="b's two pods gated")) == 2
    assert all(not p.spec.node_name for p in t.jobs.live_pods("b"))  # none of the gang is placed before the whole is
    assert "Queued" in {e.reason for e in t.jobs.events("b")}

    finish(t, "a")
    assert t.jobs.wait_state("a", "Succeeded", timeout=60)["state"] == "Succeeded"
    wait_for(lambda: t.kq.condition(t.kq.wl("a", 0), "Finished"), timeout=60, what="a's Workload finished")
    st = t.jobs.wait_state("b", "Running", timeout=90)
    queued = t.jobs.condition("b", "Queued")
    assert queued is not None and queued["status"] == "False" and queued["reason"] == "Admitted", queued
    assert counts(st) == (0, 0, 0), st
    assert t.kq.reserving() == [t.kq.wl("b", 0)]


def test_jobs_without_a_queue_name_join_the_namespaces_default_local_queue_whole(t: Tier) -> None:
    """No spec.queueName in a namespace with a LocalQueue named "default": Kueue gives the pods that queue; they are
    still one pod group, queued (the job says so) and admitted whole."""
    create_local_queue(t.api, t.ns, "default")
    t.jobs.create(queued_job("a"))
    t.jobs.wait_state("a", "Running", timeout=90)
    t.jobs.create(gpu_job("d", nodes=2).set("terminationGracePeriodSeconds", GRACE).build())
    cond = queued_condition(t.jobs, "d", "insufficient")
    assert "LocalQueue default" in cond["message"] and t.kq.wl("d", 0) in cond["message"], cond
    labels = [p.metadata.labels for p in t.jobs.live_pods("d")]
    assert [(lb["kueue.x-k8s.io/queue-name"], lb["kueue.x-k8s.io/pod-group-name"]) for lb in labels] == [
        ("default", t.kq.wl("d", 0))
    ] * 2
    assert len(gated(t.jobs, "d")) == 2

    finish(t, "a")
    st = t.jobs.wait_state("d", "Running", timeout=90)
    queued = t.jobs.condition("d", "Queued")
    assert queued is not None and (queued["status"], queued["reason"]) == ("False", "Admitted"), (queued, st)
    assert t.kq.reserving() == [t.kq.wl("d", 0)]


def test_preemption_is_a_disruption_and_the_gang_requeues(t: Tier) -> None:
    t.jobs.create(queued_job("low", priority="low"))
    t.jobs.wait_state("low", "Running", timeout=90)
    victims = {p.metadata.name: p.metadata.uid for p in t.jobs.live_pods("low")}
    t.nodes.hold_deleting = set(victims.values())  # look at the preempted pods before they exit
    t.jobs.create(queued_job("high", priority="high"))

    def preempted() -> list[Any] | None:
        pods = [p for p in t.jobs.pods("low") if p.metadata.uid in victims.values()]
        return pods if len(pods) == 2 and all(p.metadata.deletion_timestamp for p in pods) else None

    pods = wait_for(preempted, timeout=90, what="Kueue to preempt low's gang")
    # Kueue marks each pod it stops, then deletes it; once one rank is stopped the operator may stop the rest of the
    # gang before Kueue comes to it (a gang restart either way): at least one carries Kueue's word, each the whole
    # grace period (time to checkpoint).
    targets = [c for p in pods for c in p.status.conditions or [] if c.type == "TerminationTarget"]
    assert targets and all(c.status == "True" and "Preempted" in (c.message or "") for c in targets), targets
    assert all(p.metadata.deletion_grace_period_seconds == GRACE for p in pods), pods
    t.nodes.hold_deleting = set()

    st = wait_for(lambda: (s := t.jobs.status("low")).get("attempt") == 1 and s, timeout=60, what="low's restart")
    assert counts(st)[1:] == (0, 1), st  # not counted against maxRestarts
    assert st["failure"]["reason"] == "Preempted" and "Kueue" in st["failure"]["message"], st["failure"]
    t.jobs.wait_state("high", "Running", timeout=90)
    cond = queued_condition(t.jobs, "low", "insufficient")  # the next attempt waits for re-admission, Kueue says why
    assert t.kq.wl("low", 1) in cond["message"] and "insufficient" in cond["message"], cond
    assert t.kq.reserving() == [t.kq.wl("high", 0)]  # the preempted attempt holds nothing, its successor waits

    finish(t, "high")
    st = t.jobs.wait_state("low", "Running", timeout=90)
    assert counts(st) == (1, 0, 1), st
    assert t.kq.reserving() == [t.kq.wl("low", 1)] and t.kq.condition(t.kq.wl("low", 1), "Admitted")


def test_a_gang_restart_gives_quota_back_and_takes_it_once(t: Tier) -> None:
    t.jobs.create(queued_job("r"))
    t.jobs.wait_state("r", "Running", timeout=90)
    first = t.jobs.live_pods("r")
    FakeKubelet(t.api, t.ns).exit(first[1].metadata.name, 1)  # rank 1 fails: a gang restart, counted
    st = wait_for(
        lambda: (s := t.jobs.status("r")).get("attempt") == 1 and s["state"] == "Running" and s,
        timeout=120,
        what="r's attempt 1 running",
    )
    assert counts(st)[1:] == (1, 0), st
    # Attempt 0's Workload finished once its pods were terminal; with the pods gone, the garbage collector removes it
    # (its owners are the pods).
    wl0 = t.kq.wl("r", 0)
    wait_for(
        lambda: t.kq.condition(wl0, "Finished") or wl0 not in t.kq.workloads(),
        timeout=60,
        what="attempt 0's Workload finished",
    )
    assert set(t.kq.workloads()) <= {wl0, t.kq.wl("r", 1)}  # one Workload per attempt
    assert t.kq.reserving() == [t.kq.wl("r", 1)]  # one gang's quota, not two
    t.kq.wait_reserved("nvidia.com/gpu", 16)
    # each attempt took the quota exactly once: the finished attempt was never admitted again
    assert [t.kq.reservations(t.kq.wl("r", a)) for a in (0, 1)] == [1, 1]


def test_suspend_gives_quota_back_and_a_deleted_queued_job_leaves_no_workload(t: Tier) -> None:
    t.jobs.create(queued_job("s"))
    t.jobs.wait_state("s", "Running", timeout=90)
    t.jobs.create(queued_job("waiting"))
    t.jobs.create(queued_job("gone"))
    queued_condition(t.jobs, "waiting", "insufficient")
    gone = t.kq.wl("gone", 0)
    queued_condition(t.jobs, "gone", "insufficient")  # Kueue's own words: its Workload exists and waits
    assert gone in t.kq.workloads()

    t.jobs.delete("gone")  # queued: its pods and its Workload go with it
    wait_for(
        lambda: gone not in t.kq.workloads() and not t.jobs.pods("gone"),
        timeout=90,
        what="the deleted job's pods and Workload to be gone",
    )

    t.jobs.patch("s", {"suspend": True})  # suspend: the pods go and the quota with them
    t.jobs.wait_state("s", "Suspended", timeout=60)
    t.jobs.wait_state("waiting", "Running", timeout=120)
    t.jobs.patch("s", {"suspend": False})  # resumed: queued again behind the job that took its place
    cond = queued_condition(t.jobs, "s")
    assert t.kq.wl("s", 1) in cond["message"], cond
    finish(t, "waiting")
    assert t.jobs.wait_state("s", "Running", timeout=120)["attempt"] == 1
    try:
        client.CustomObjectsApi(t.api).get_namespaced_custom_object(*KQ, t.ns, "workloads", gone)
        raise AssertionError(f"{gone} still exists")
    except ApiException as e:
        assert e.status == 404


def test_an_elastic_gang_runs_smaller_while_kueue_admits_only_that_and_grows_when_it_admits_more(t: Tier) -> None:
    """An elastic job (2 nodes, min 1) preempted by a 1-node job of higher priority runs its next attempt on 1 node,
    its own Workload, which fits beside the other. Its placeholder is a pod group of its own: Kueue holds it while the
    quota is taken, and the job keeps training on 1 node; when the other job finishes, Kueue admits the placeholder,
    it runs, and the gang grows back to 2 nodes as a third Workload, admitted whole."""
    from finetune_operator.kueue import placeholder_group

    j = gpu_job("e", nodes=2).set("queueName", "team").set("terminationGracePeriodSeconds", GRACE)
    j.set("elastic", {"minNodes": 1, "resizeCooldownSeconds": 0})
    j.obj["spec"]["podTemplate"]["labels"] = queued_labels("low")
    t.jobs.create(j.build())
    t.jobs.wait_state("e", "Running", timeout=90)
    high = gpu_job("h", nodes=1).set("queueName", "team").set("terminationGracePeriodSeconds", GRACE)
    high.obj["spec"]["podTemplate"]["labels"] = queued_labels("high")
    t.jobs.create(high.build())

    def smaller() -> dict[str, Any] | None:
        st = t.jobs.status("e")
        ok = st.get("state") == "Running" and (st.get("elastic") or {}).get("currentNodes") == 1
        return st if ok and st.get("attempt") == 1 else None

    st = wait_for(smaller, timeout=120, what="e's attempt 1 running on one node")
    assert counts(st)[1:] == (0, 1) and st["nodes"] == "1/2", st
    assert st["elastic"]["gradientAccumulationSteps"] == 2 and st["elastic"]["lastResize"] == "Shrunk", st
    t.jobs.wait_state("h", "Running", timeout=90)
    uid = t.jobs.get("e")["metadata"]["uid"]
    grow = placeholder_group("e", 1, uid)
    wait_for(lambda: grow in t.kq.workloads(), timeout=60, what="the placeholder's Workload")
    cond = wait_for(
        lambda: next(
            (
                c
                for c in (t.kq.workloads()[grow].get("status") or {}).get("conditions", [])
                if c["type"] == "QuotaReserved"
            ),
            None,
        ),
        timeout=60,
        what="Kueue's word on the placeholder",
    )
    assert cond["status"] == "False" and "insufficient" in cond["message"], cond
    assert gated(t.jobs, "e") == ["e-grow-0"]  # held by Kueue; the gang trains on
    assert t.jobs.status("e")["attempt"] == 1
    assert sorted(t.kq.reserving()) == sorted([t.kq.wl("e", 1), t.kq.wl("h", 0)])

    finish(t, "h")
    t.jobs.wait_state("h", "Succeeded", timeout=60)

    def grown() -> dict[str, Any] | None:
        st = t.jobs.status("e")
        ok = st.get("state") == "Running" and (st.get("elastic") or {}).get("currentNodes") == 2
        return st if ok and st.get("attempt") == 2 else None

    st = wait_for(grown, timeout=180, what="e grown back to two nodes")
    assert counts(st) == (2, 0, 1) and st["elastic"]["resizes"] == 2 and st["nodes"] == "2/2", st
    assert t.kq.condition(grow, "Admitted") or grow not in t.kq.workloads()  # admitted, then finished and removed
    assert t.kq.reserving() == [t.kq.wl("e", 2)] and t.kq.condition(t.kq.wl("e", 2), "Admitted")
    assert {e.reason for e in t.jobs.events("e")} >= {"Shrunk", "Grown"}
