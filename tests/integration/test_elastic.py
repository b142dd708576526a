"""Elastic jobs against the real scheduler: ranks left unschedulable shrink the gang to the ranks placed, a placeholder
that the scheduler places grows it back, a node that flaps grows it at most once per cooldown, and below minNodes the
job waits, saying so.

Real: kube-apiserver (the CRD's rules), kube-scheduler (every placement, and every placeholder's: the proof of
capacity is its decision), kube-controller-manager, etcd, and the operator as a subprocess. Mocked, because they
cannot exist on these machines: GPUs and the kubelet (``GpuNodes``: two 8-GPU nodes whose stand-in runs the pods the
scheduler binds, and lets a deleted pod exit 143). The training itself across sizes is shown on real nodes
(tests/realnodes/test_elastic.py) and in the trainer tier (tests/trainer/test_elastic_resume.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from kubernetes import client

from tests.integration.gpucluster import gpu_job
from tests.integration.gpunodes import GpuNodes
from tests.integration.harness import Jobs
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
COOLDOWN = 15


def cordon(api: client.ApiClient, node: str, *, off: bool = True) -> None:
    client.CoreV1Api(api).patch_node(node, {"spec": {"unschedulable": off}})


def at_size(jobs: Jobs, job: str, attempt: int, nodes: int) -> dict[str, Any] | None:
    st = jobs.status(job)
    ok = st.get("state") == "Running" and st.get("attempt") == attempt
    return st if ok and (st.get("elastic") or {}).get("currentNodes") == nodes else None


def resized_at(st: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(st["elastic"]["lastResizeTime"].replace("Z", "+00:00"))


def test_below_min_nodes_the_job_waits_with_the_reason(
    api: client.ApiClient, jobs: Jobs, nodes: GpuNodes, operator: None
) -> None:
    cordon(api, nodes.names[1])
    j = gpu_job("f", nodes=2).set("elastic", {"minNodes": 2, "unschedulableSeconds": 3})
    jobs.create(j.build())
    cond = wait_for(
        lambda: (c := jobs.condition("f", "Created")) and c["reason"] == "BelowMinNodes" and c,
        timeout=60,
        what="f: BelowMinNodes",
    )
    assert "fewer than spec.elastic.minNodes=2" in cond["message"], cond
    st = jobs.status("f")
    assert st["state"] == "Created" and st.get("attempt", 0) == 0 and st["elastic"]["currentNodes"] == 2, st
    assert "BelowMinNodes" in {e.reason for e in jobs.events("f")}


def test_unschedulable_ranks_shrink_the_gang_and_a_flapping_node_grows_it_once_per_cooldown(
    api: client.ApiClient, jobs: Jobs, nodes: GpuNodes, operator: None
) -> None:
    a, b = nodes.names
    cordon(api, b)
    j = gpu_job("e", nodes=2).set(
        "elastic", {"minNodes": 1, "resizeCooldownSeconds": COOLDOWN, "unschedulableSeconds": 3}
    )
    jobs.create(j.build())
    st = wait_for(lambda: at_size(jobs, "e", 1, 1), timeout=60, what="e shrunk to the rank placed")
    resized = jobs.condition("e", "Resized")
    assert resized is not None and resized["reason"] == "Shrunk" and "unschedulable" in resized["message"], resized
    assert (st.get("restarts", 0), st.get("disruptions", 0), st["nodes"]) == (0, 0, "1/2"), st
    placeholder = wait_for(
        lambda: [p for p in jobs.live_pods("e") if p.metadata.name == "e-grow-0"], timeout=30, what="the placeholder"
    )[0]
    assert placeholder.spec.node_name is None  # no node for it: b is cordoned, a holds the gang's rank
    assert placeholder.spec.affinity.pod_anti_affinity is not None

    cordon(api, b, off=False)  # the node comes back
    grown = wait_for(lambda: at_size(jobs, "e", 2, 2), timeout=60 + COOLDOWN, what="e grown back to two nodes")
    assert (resized_at(grown) - resized_at(st)).total_seconds() >= COOLDOWN
    assert {p.spec.node_name for p in jobs.live_pods("e")} == {a, b}
    assert not [p for p in jobs.pods("e") if p.metadata.name.startswith("e-grow-")]

    # The node flaps: a rank is lost (its pod deleted), the gang shrinks at once, the placeholder runs at once (the node
    # is there), and the grow still waits for the cooldown.
    victim = next(p for p in jobs.live_pods("e") if p.metadata.name == "e-node-1")
    client.CoreV1Api(api).delete_namespaced_pod(victim.metadata.name, victim.metadata.namespace)
    small = wait_for(lambda: at_size(jobs, "e", 3, 1), timeout=60, what="e shrunk after the lost rank")
    assert small["disruptions"] == 1 and small["elastic"]["lastResize"] == "Shrunk", small
    again = wait_for(lambda: at_size(jobs, "e", 4, 2), timeout=60 + COOLDOWN, what="e grown again")
    assert (resized_at(again) - resized_at(small)).total_seconds() >= COOLDOWN
    assert again["elastic"]["resizes"] == 4 and again.get("restarts", 0) == 0, again
    reasons = [e.reason for e in jobs.events("e")]
    assert reasons.count("Shrunk") == 2 and reasons.count("Grown") == 2, reasons
