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

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from finetune_operator.client import FineTuneClient, InvalidManifest
from finetune_operator.k8s import Kube
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
    create_cluster_queue,
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


# -- topology-aware placement ------------------------------------------------------------------------------------
BLOCK = "topology.finetune.dev/block"
TAS_NODE = "topology.finetune.dev/tas"  # the TAS flavor's node label: only the block nodes below carry it


@dataclass
class TasTier:
    jobs: Jobs
    kq: Kueue
    nodes: GpuNodes

    def block_of(self, node: str) -> str:
        return f"b{self.nodes.names.index(node) // 4}"

    def placed(self, job: str, nodes: int) -> list[Any]:
        """The job's ranks, rank 0 first, once Kueue lifted their gates and each is bound to a node."""

        def bound() -> list[Any] | None:
            pods = [p for p in self.jobs.live_pods(job) if p.spec.node_name]
            return pods if len(pods) == nodes else None

        return sorted(
            wait_for(bound, timeout=90, what=f"{job}'s {nodes} ranks placed"),
            key=lambda p: int(p.metadata.labels["finetune.dev/node-rank"]),
        )


@pytest.fixture
def tas(
    request: pytest.FixtureRequest, kueue: LocalKueue, sched: Cluster, api: client.ApiClient, ns: str, *, operator: None
) -> Iterator[TasTier]:
    """Eight 8-GPU nodes in two blocks of four (b0: nodes 0-3, b1: 4-7), a Kueue Topology (block, then hostname),
    a ResourceFlavor ``tas`` on it for those nodes, and LocalQueue ``team`` on a ClusterQueue with all their GPUs
    under that flavor; the operator."""
    nodes = GpuNodes(api, f"tas-{ns[-4:]}", count=8, labels=lambda i: {BLOCK: f"b{i // 4}", TAS_NODE: "true"}).start()
    co = client.CustomObjectsApi(api)
    topology = f"blocks-{ns[-6:]}"
    flavor = f"tas-{ns[-6:]}"
    co.create_cluster_custom_object(
        *KQ,
        "topologies",
        {
            "apiVersion": "/".join(KQ),
            "kind": "Topology",
            "metadata": {"name": topology},
            "spec": {"levels": [{"nodeLabel": BLOCK}, {"nodeLabel": "kubernetes.io/hostname"}]},
        },
    )
    co.create_cluster_custom_object(
        *KQ,
        "resourceflavors",
        {
            "apiVersion": "/".join(KQ),
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            "spec": {"nodeLabels": {TAS_NODE: "true"}, "topologyName": topology},
        },
    )
    quota = {"cpu": "1000", "memory": "10Ti", "nvidia.com/gpu": "64"}
    with namespace_queues(request, kueue, sched, api, ns=ns, quota=quota, flavor=flavor):
        yield TasTier(Jobs(api, ns), Kueue(api, ns), nodes)
    nodes.stop()
    co.delete_cluster_custom_object(*KQ, "resourceflavors", flavor)
    co.delete_cluster_custom_object(*KQ, "topologies", topology)


def topology_job(name: str, nodes: int, topology: dict[str, Any]) -> dict[str, Any]:
    return gpu_job(name, nodes=nodes).set("queueName", "team").set("topology", topology).build()


def runs(domains: list[str]) -> list[str]:
    """The domains in rank order with consecutive repeats folded: each domain once when the ranks are in order."""
    return [d for i, d in enumerate(domains) if i == 0 or domains[i - 1] != d]


def test_a_required_topology_places_the_whole_gang_in_one_block_in_rank_order(tas: TasTier) -> None:
    """A 4-node job that requires one block runs there (Kueue's TAS, its gate lifted with the domain's node selector)
    with each rank's index as Kueue's pod group index; the status names each rank's block."""
    submitted = time.monotonic()
    tas.jobs.create(topology_job("req", 4, {"required": BLOCK}))
    pods = tas.placed("req", 4)
    print(json.dumps({"tas_required_4_ranks_submit_to_all_placed_s": round(time.monotonic() - submitted, 1)}))
    blocks = [tas.block_of(p.spec.node_name) for p in pods]
    assert len(set(blocks)) == 1, blocks
    for rank, pod in enumerate(pods):
        assert pod.metadata.labels["kueue.x-k8s.io/pod-group-pod-index"] == str(rank)
        assert pod.metadata.annotations["kueue.x-k8s.io/podset-required-topology"] == BLOCK
        assert pod.spec.node_selector.get("kubernetes.io/hostname") == pod.spec.node_name  # Kueue's assignment
    tas.jobs.wait_state("req", "Running", timeout=60)
    placed = wait_for(lambda: tas.jobs.status("req").get("placement"), timeout=60, what="status.placement")
    assert placed == {"attempt": 0, "level": BLOCK, "domains": blocks}, placed


def test_a_preferred_topology_spreads_only_when_no_block_has_room(tas: TasTier) -> None:
    """Three ranks hold one block (b0 or b1, Kueue's choice), leaving one node there and four in the other. A
    preferred 4-node job lands whole in the free block, although five nodes are free over both; once it is gone, a
    preferred 5-node job must spread: four ranks in one block and one in the other, consecutive ranks together. A
    required 5-node job would never fit in one block: Kueue keeps it queued and says why."""
    tas.jobs.create(topology_job("hold", 3, {"required": BLOCK}))
    held = {tas.block_of(p.spec.node_name) for p in tas.placed("hold", 3)}
    assert len(held) == 1, held
    tas.jobs.create(topology_job("whole", 4, {"preferred": BLOCK}))
    whole = [tas.block_of(p.spec.node_name) for p in tas.placed("whole", 4)]
    assert len(set(whole)) == 1 and set(whole) != held, (whole, held)
    tas.jobs.delete("whole")
    wait_for(lambda: not tas.jobs.live_pods("whole"), timeout=60, what="whole's ranks gone")
    tas.jobs.create(topology_job("spread", 5, {"preferred": BLOCK}))
    spread = [tas.block_of(p.spec.node_name) for p in tas.placed("spread", 5)]
    assert sorted(spread.count(b) for b in set(spread)) == [1, 4] and len(runs(spread)) == 2, spread
    placed = wait_for(lambda: tas.jobs.status("spread").get("placement"), timeout=60, what="status.placement")
    assert placed["domains"] == spread, placed
    tas.jobs.delete("spread")
    tas.jobs.create(topology_job("never", 5, {"required": BLOCK}))
    cond = queued_condition(tas.jobs, "never", timeout=90)
    assert tas.kq.wl("never", 0) in cond["message"], cond  # Kueue's own words on the gang's Workload
    assert tas.jobs.status("never")["state"] == "Created" and not any(
        p.spec.node_name for p in tas.jobs.live_pods("never")
    ), cond


def test_a_topology_the_queue_cannot_honour_is_refused_before_any_pod(tas: TasTier, api: client.ApiClient) -> None:
    """A level that is not in the queue's Topology, and a queue whose ClusterQueue has no topology-aware flavor, are
    refused with the field named and no pod created; so is a queue that does not exist."""
    rack = topology_job("rack", 2, {"required": "topology.finetune.dev/rack"})
    with pytest.raises(InvalidManifest) as e:  # `finetune validate` and `submit` make the operator's check first
        FineTuneClient(tas.jobs.ns, kube=Kube(api)).validate(json.loads(json.dumps(rack)))
    assert "spec.topology.required: topology.finetune.dev/rack is not a level" in str(e.value), e.value
    tas.jobs.create(rack)
    st = tas.jobs.wait_state("rack", "Failed", timeout=60)
    assert st["failure"]["reason"] == "InvalidSpec", st
    msg = st["failure"]["message"]
    assert msg.startswith("spec.topology.required: topology.finetune.dev/rack is not a level") and BLOCK in msg, msg
    missing = gpu_job("lost", nodes=1).set("queueName", "nowhere").set("topology", {"preferred": BLOCK}).build()
    tas.jobs.create(missing)
    st = tas.jobs.wait_state("lost", "Failed", timeout=60)
    assert st["failure"]["message"].startswith("spec.queueName: Kueue cannot place the job (spec.topology.preferred)")
    assert "LocalQueue nowhere does not exist" in st["failure"]["message"], st
    plain_cq = f"plain-{tas.jobs.ns}"
    create_cluster_queue(api, plain_cq, tas.jobs.ns, {"nvidia.com/gpu": "8"})  # the flavor without a topology
    create_local_queue(api, tas.jobs.ns, "plain", cluster_queue=plain_cq)
    plain = gpu_job("plain", nodes=1).set("queueName", "plain").set("topology", {"required": BLOCK}).build()
    tas.jobs.create(plain)
    st = tas.jobs.wait_state("plain", "Failed", timeout=60)
    assert "has no topology-aware ResourceFlavor" in st["failure"]["message"], st
    assert not tas.jobs.live_pods("rack") and not tas.jobs.live_pods("lost") and not tas.jobs.live_pods("plain")
    client.CustomObjectsApi(api).delete_cluster_custom_object(*KQ, "clusterqueues", plain_cq)
