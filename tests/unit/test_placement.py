"""spec.topology, as the operator reads, builds, checks and reports it: the request parsed with each mistake named,
Kueue's annotations on every rank (the rank label as the pod group's index), the queue followed to its Topology and a
request it cannot honour refused before any pod, and each rank's domain in the status. Kueue itself places the pods in
tests/integration/test_kueue.py."""

from __future__ import annotations

from typing import Any

import pytest
from finetune_operator import placement
from finetune_operator.admission import Observed
from finetune_operator.builders import JobRef, build_placeholder, build_pod
from finetune_operator.placement import QueueTopology, Topology, check, read_queue_topology
from finetune_operator.render import placement_line
from finetune_operator.settings import LABEL_RANK, Settings
from finetune_operator.spec import SpecError, parse_spec
from finetune_operator.status import Placement, Status

from tests.unit.factories import STARTED, base_spec, decided, job, running

pytestmark = pytest.mark.unit
BLOCK = "cloud.google.com/gce-topology-block"


def errors_of(spec: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as e:
        parse_spec(spec)
    return dict(e.value.errors)


@pytest.mark.parametrize(
    ("topology", "field", "says"),
    [
        ({}, "spec.topology", "exactly one of required"),
        ({"required": BLOCK, "preferred": BLOCK}, "spec.topology", "got required, preferred"),
        ({"required": "not a label!"}, "spec.topology.required", "must be a node label key"),
        ({"preferred": 3}, "spec.topology.preferred", "must be a node label key"),
        ({"unconstrained": False}, "spec.topology.unconstrained", "must be true"),
        ({"required": BLOCK, "rack": "x"}, "spec.topology.rack", "unknown field"),
        ("block", "spec.topology", "must be an object"),
    ],
)
def test_a_wrong_topology_names_its_field(topology: Any, field: str, says: str) -> None:
    found = errors_of(base_spec(topology=topology))
    assert says in found[field], found


def test_an_elastic_job_takes_only_an_unconstrained_topology() -> None:
    elastic = {"nodes": 4, "elastic": {"minNodes": 2}}
    found = errors_of(base_spec(topology={"required": BLOCK}, **elastic))
    assert "unconstrained: true" in found["spec.topology.required"], found
    assert parse_spec(base_spec(topology={"unconstrained": True}, **elastic)).topology == Topology("unconstrained")
    assert parse_spec(base_spec(topology={"preferred": BLOCK})).topology == Topology("preferred", BLOCK)


def test_every_rank_carries_the_request_and_names_its_rank_label_as_the_group_index() -> None:
    spec = parse_spec(base_spec(nodes=4, topology={"required": BLOCK}))
    ref = JobRef("ft", "ns", "uid-1")
    for rank in range(4):
        pod = build_pod(ref, spec, rank=rank, attempt=0, settings=Settings())
        notes, labels = pod["metadata"]["annotations"], pod["metadata"]["labels"]
        assert notes[placement.REQUIRED_ANNOTATION] == BLOCK and notes[placement.INDEX_LABEL_ANNOTATION] == LABEL_RANK
        assert labels[LABEL_RANK] == str(rank)
    plain = build_pod(ref, parse_spec(base_spec(nodes=4)), rank=0, attempt=0, settings=Settings())
    assert not {placement.REQUIRED_ANNOTATION, placement.INDEX_LABEL_ANNOTATION} & set(plain["metadata"]["annotations"])


def test_an_elastic_jobs_ranks_and_placeholders_are_unconstrained() -> None:
    spec = parse_spec(base_spec(nodes=4, elastic={"minNodes": 2}, topology={"unconstrained": True}))
    ref = JobRef("ft", "ns", "uid-1")
    rank = build_pod(ref, spec, rank=1, attempt=0, settings=Settings())["metadata"]["annotations"]
    held = build_placeholder(ref, spec, index=0, count=1, attempt=0, settings=Settings())["metadata"]["annotations"]
    assert rank[placement.UNCONSTRAINED_ANNOTATION] == "true" and rank[placement.INDEX_LABEL_ANNOTATION] == LABEL_RANK
    assert held[placement.UNCONSTRAINED_ANNOTATION] == "true"


KUEUE = {
    ("localqueues", "team", "ns"): {"spec": {"clusterQueue": "gpus"}},
    ("localqueues", "default", "ns"): {"spec": {"clusterQueue": "cpus"}},
    ("clusterqueues", "gpus", None): {
        "spec": {"resourceGroups": [{"flavors": [{"name": "h100"}, {"name": "spot"}]}, {"flavors": [{"name": "h100"}]}]}
    },
    ("clusterqueues", "cpus", None): {"spec": {"resourceGroups": [{"flavors": [{"name": "plain"}]}]}},
    ("resourceflavors", "h100", None): {"spec": {"topologyName": "dc"}},
    ("resourceflavors", "spot", None): {"spec": {}},
    ("resourceflavors", "plain", None): {"spec": {}},
    ("topologies", "dc", None): {"spec": {"levels": [{"nodeLabel": BLOCK}, {"nodeLabel": "kubernetes.io/hostname"}]}},
}


def read(objects: dict[tuple[str, str, str | None], dict[str, Any]]) -> Any:
    """Kueue's objects as the API server would answer the operator's GETs (None: not found)."""
    return lambda plural, name, ns: objects.get((plural, name, ns))


def test_the_queue_is_followed_to_its_topology_levels() -> None:
    qt = read_queue_topology(read(KUEUE), "ns", "team")
    assert qt == QueueTopology("team", "gpus", {"h100": (BLOCK, "kubernetes.io/hostname")})
    assert check(Topology("required", BLOCK), qt) is None
    assert check(Topology("unconstrained"), qt) is None
    why = check(Topology("preferred", "rack"), qt)
    assert why is not None and why.startswith("spec.topology.preferred: rack is not a level of the Topology")
    assert f"its levels are {BLOCK}, kubernetes.io/hostname" in why


def test_a_queue_that_cannot_place_the_job_is_named() -> None:
    """No topology-aware flavor; a LocalQueue that does not exist (the namespace's default one when queueName is
    unset); a Topology a flavor names that is gone. A queue the operator may not read is not judged."""
    plain = check(Topology("required", BLOCK), read_queue_topology(read(KUEUE), "ns", None))
    assert plain is not None and "ClusterQueue cpus (of LocalQueue default) has no topology-aware" in plain
    gone = check(Topology("required", BLOCK), read_queue_topology(read(KUEUE), "other", None))
    assert gone is not None and gone.startswith("spec.queueName: Kueue cannot place the job (spec.topology.required)")
    assert "LocalQueue default does not exist in namespace other (spec.queueName is not set" in gone
    flavorless = {k: v for k, v in KUEUE.items() if k[0] != "resourceflavors"}
    lost_flavor = check(Topology("required", BLOCK), read_queue_topology(read(flavorless), "ns", "team"))
    assert lost_flavor is not None and "ResourceFlavor h100 of ClusterQueue gpus does not exist" in lost_flavor
    broken = {k: v for k, v in KUEUE.items() if k[0] != "topologies"}
    lost = check(Topology("required", BLOCK), read_queue_topology(read(broken), "ns", "team"))
    assert lost is not None and "Topology dc of ResourceFlavor h100 does not exist" in lost

    def forbidden(plural: str, name: str, ns: str | None) -> dict[str, Any] | None:
        raise PermissionError("localqueues is forbidden")

    qt = read_queue_topology(forbidden, "ns", "team")
    assert qt.unreadable and check(Topology("required", BLOCK), qt) is None
    assert qt.problem == "localqueues is forbidden"  # the controller's one warning says why

    def no_kueue(plural: str, name: str, ns: str | None) -> dict[str, Any] | None:
        raise LookupError("Kueue is not installed (the API server serves no kueue.x-k8s.io)")

    nowhere = check(Topology("required", BLOCK), read_queue_topology(no_kueue, "ns", "team"))
    assert nowhere is not None and nowhere.startswith("spec.topology.required: Kueue cannot place the job: Kueue is")


def test_a_job_its_queue_cannot_place_fails_before_any_pod() -> None:
    qt = read_queue_topology(read(KUEUE), "ns", "team")
    plan = decided(job(nodes=2, queueName="team", topology={"required": "rack"}), observed=Observed(queue_topology=qt))
    assert plan.create == [] and plan.status.state == "Failed", plan.status
    assert plan.status.failure is not None and plan.status.failure.reason == "InvalidSpec"
    assert plan.status.failure.message.startswith("spec.topology.required: rack is not a level")
    ok = decided(job(nodes=2, queueName="team", topology={"required": BLOCK}), observed=Observed(queue_topology=qt))
    assert [o["kind"] for o in ok.create].count("Pod") == 2


def bound(rank: int, node: str, selector: dict[str, str]) -> dict[str, Any]:
    p = running(rank)
    p["spec"] = {"nodeName": node, "nodeSelector": selector}
    return p


def test_the_status_names_each_ranks_domain_once_every_rank_is_placed() -> None:
    """From the node selector Kueue wrote when it lifted the gate, else from the node's labels as the controller read
    them; not before every rank is bound, and once per attempt."""
    spec = {"nodes": 3, "queueName": "team", "topology": {"preferred": BLOCK}}
    pods = [
        bound(0, "n0", {BLOCK: "b1", "kubernetes.io/hostname": "n0"}),
        bound(1, "n1", {"kubernetes.io/hostname": "n1"}),
        bound(2, "n5", {"kubernetes.io/hostname": "n5"}),
    ]
    labels = {"n1": {BLOCK: "b1"}, "n5": {BLOCK: "b2"}}
    plan = decided(job(STARTED, **spec), pods, observed=Observed(node_labels=labels))
    assert plan.status.placement == Placement(0, BLOCK, ("b1", "b1", "b2"))
    assert decided(job(STARTED, **spec), pods).status.placement is None  # the nodes were not read
    assert decided(job(STARTED, **spec), pods[:2], observed=Observed(node_labels=labels)).status.placement is None
    wire = Status.from_wire(plan.status.to_wire())
    assert wire.placement == plan.status.placement
    assert placement_line(plan.status.to_wire()["placement"], 0) == f"{BLOCK}: b1 (ranks 0-1), b2 (rank 2)"
    assert placement_line(plan.status.to_wire()["placement"], 1) == ""  # an earlier attempt's record


def test_a_pass_that_ends_the_attempt_records_no_placement_for_the_next() -> None:
    """A rank failed: the pass restarts the gang (attempt 1); the old pods' domains are not attempt 1's."""
    spec = {"nodes": 2, "queueName": "team", "topology": {"preferred": BLOCK}}
    failed = bound(1, "n1", {BLOCK: "b1"})
    failed["status"] = {
        "phase": "Failed",
        "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}],
    }
    plan = decided(job(STARTED, **spec), [bound(0, "n0", {BLOCK: "b1"}), failed])
    assert plan.status.attempt == 1 and plan.status.placement is None, plan.status


def test_the_queue_is_judged_before_the_first_pod_only() -> None:
    """A restart of a job that ran is not failed by a queue edited meanwhile (Kueue judges the gang it queues)."""
    qt = read_queue_topology(read(KUEUE), "ns", "team")
    restarting = {"attempt": 1, "state": "Restarting", "startTime": "2026-11-30T11:00:00Z"}
    plan = decided(
        job(restarting, nodes=2, queueName="team", topology={"required": "rack"}), observed=Observed(queue_topology=qt)
    )
    assert [o["kind"] for o in plan.create].count("Pod") == 2, plan.status


def test_with_a_topology_kueue_picks_the_nodes_without_the_operators_anti_affinity() -> None:
    gpus = {"nodes": 2, "resources": {"limits": {"nvidia.com/gpu": 4}}}
    apart = build_pod(JobRef("ft", "ns", "u"), parse_spec(base_spec(**gpus)), rank=0, attempt=0, settings=Settings())
    assert "podAntiAffinity" in apart["spec"]["affinity"]
    placed = parse_spec(base_spec(topology={"required": BLOCK}, **gpus))
    pod = build_pod(JobRef("ft", "ns", "u"), placed, rank=0, attempt=0, settings=Settings())
    assert "podAntiAffinity" not in (pod["spec"].get("affinity") or {})
