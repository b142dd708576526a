"""Elastic jobs, the pure part: the accumulation arithmetic, the spec's checks, and the sizing decisions of a reconcile
pass (shrink after a lost rank or ranks left unschedulable, grow when placeholders run, the cooldown, below min)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from finetune_operator.elastic import batch_at, sized
from finetune_operator.spec import SpecError, parse_spec
from finetune_operator.status import ts

from tests.unit.factories import NOW, STARTED, base_spec, decided, job, running

pytestmark = pytest.mark.unit

ELASTIC = {"minNodes": 1, "resizeCooldownSeconds": 60, "unschedulableSeconds": 30}


def elastic_job(status: dict[str, Any], *, nodes: int = 2, **over: Any) -> dict[str, Any]:
    training = over.pop("training", {"maxSteps": 100, "perDeviceBatchSize": 8, "gradientAccumulationSteps": 1})
    return job(status, nodes=nodes, elastic=over.pop("elastic", ELASTIC), training=training, **over)


def placeholder(index: int, attempt: int, phase: str = "Running", node: str = "n2") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"ft-grow-{index}",
            "uid": f"g{index}",
            "labels": {
                "finetune.dev/job-name": "ft",
                "app.kubernetes.io/component": "placeholder",
                "finetune.dev/attempt": str(attempt),
            },
            "ownerReferences": [{"uid": "uid-1", "controller": True}],
        },
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def on_node(p: dict[str, Any], node: str) -> dict[str, Any]:
    p["spec"] = {"nodeName": node}
    return p


# -- the accumulation arithmetic -------------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("accum", [1, 2, 3])
@pytest.mark.parametrize("procs", [1, 8])
def test_every_size_trains_the_asked_global_batch_or_the_nearest_whole_accumulation(
    nodes: int, accum: int, procs: int
) -> None:
    spec = parse_spec(
        base_spec(
            nodes=nodes,
            procsPerNode=procs,
            elastic={"minNodes": nodes},  # parse_spec refuses inexact sizes in [minNodes, nodes]: arithmetic alone
            training={"maxSteps": 10, "perDeviceBatchSize": 4, "gradientAccumulationSteps": accum},
        )
    )
    asked = 4 * accum * procs * nodes
    for size in range(1, nodes + 1):
        b = batch_at(spec, size)
        per_step = 4 * procs * size
        assert b.asked_global_batch_size == asked
        assert b.global_batch_size == b.gradient_accumulation_steps * per_step
        if asked % per_step == 0:
            assert b.exact and b.gradient_accumulation_steps == asked // per_step
        else:  # the nearest whole accumulation, the larger of two as near
            assert abs(b.global_batch_size - asked) <= per_step / 2
            assert not b.exact
    assert batch_at(spec, nodes).gradient_accumulation_steps == accum  # full size: the job's own


def test_an_inexact_size_takes_the_nearer_accumulation_and_the_larger_on_a_tie() -> None:
    # (parse_spec refuses such sizes within [minNodes, nodes]: batch_at's arithmetic alone, at sizes below minNodes)
    three = parse_spec(base_spec(nodes=3, elastic={"minNodes": 3}, training={"maxSteps": 1, "perDeviceBatchSize": 8}))
    # asked 24: two nodes give 16 or 32 rows per step, as near; the larger
    assert (batch_at(three, 2).gradient_accumulation_steps, batch_at(three, 2).global_batch_size) == (2, 32)
    five = parse_spec(base_spec(nodes=5, elastic={"minNodes": 5}, training={"maxSteps": 1, "perDeviceBatchSize": 8}))
    # asked 40: three nodes give 24 (16 short) or 48 (8 over): 48
    assert batch_at(five, 3).global_batch_size == 48
    # asked 40: four nodes give 32 (8 short) or 64 (24 over): 32
    assert batch_at(five, 4).global_batch_size == 32


def test_a_sized_spec_is_the_gang_its_config_and_its_batch_at_that_size() -> None:
    from finetune_operator.builders import JobRef, build_config_map, build_pods
    from finetune_operator.settings import Settings

    spec = parse_spec(base_spec(nodes=4, elastic={"minNodes": 4}, training={"maxSteps": 9, "perDeviceBatchSize": 2}))
    two = sized(spec, 2)
    ref = JobRef("ft", "ns", "uid-1")
    pods = build_pods(ref, two, attempt=3, settings=Settings())
    assert len(pods) == 2
    env = {e["name"]: e.get("value") for e in pods[1]["spec"]["containers"][0]["env"]}
    assert (env["WORLD_SIZE"], env["NNODES"], env["PET_NNODES"]) == ("2", "2", "2")
    training = json.loads(next(iter(build_config_map(ref, two)["data"].values())))["training"]
    assert (training["gradientAccumulationSteps"], training["globalBatchSize"]) == (2, 8)
    assert sized(parse_spec(base_spec(nodes=4)), 2).nodes == 4  # not elastic: the job's own spec


# -- the spec's checks -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("elastic", "field", "words"),
    [
        ({"minNodes": 3}, "spec.elastic.minNodes", "between 1 and spec.nodes (2)"),
        ({"minNodes": 0}, "spec.elastic.minNodes", "between 1 and spec.nodes"),
        ({}, "spec.elastic.minNodes", "is required"),
        ({"minNodes": 1, "resizeCooldownSeconds": -5}, "spec.elastic.resizeCooldownSeconds", "0 or more"),
        ({"minNodes": 1, "unschedulableSeconds": 0}, "spec.elastic.unschedulableSeconds", "1 or more"),
    ],
)
def test_a_bad_range_names_the_field_and_the_fix(elastic: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(base_spec(nodes=2, elastic=elastic))
    assert (field, True) in [(f, words in m) for f, m in e.value.errors], e.value.errors


# -- the decisions ---------------------------------------------------------------------------------------------------


def test_a_lost_rank_shrinks_the_next_attempt_to_the_survivors_with_the_global_batch_kept() -> None:
    plan = decided(
        elastic_job(dict(STARTED)), [running(0), on_node(running(1, pod_reason="Evicted", phase="Failed"), "n2")]
    )
    st = plan.status
    assert st.state == "Restarting" and st.attempt == 1 and st.disruptions == 1
    assert st.elastic is not None
    assert (st.elastic.current_nodes, st.elastic.desired_nodes, st.elastic.resizes) == (1, 2, 1)
    assert (st.elastic.gradient_accumulation_steps, st.elastic.global_batch_size) == (2, 16)
    resized = st.condition("Resized")
    assert resized is not None and resized.reason == "Shrunk" and "rank(s) 1 lost (Evicted)" in resized.message
    assert "Shrunk" in [e.reason for e in plan.events] and plan.resize == ("Shrunk", 0)

    # The next attempt: one pod, world size 1, the accumulation doubled.
    nxt = decided(elastic_job(st.to_wire()), [])
    pods = [o for o in nxt.create if o["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == ["ft-node-0"]
    config = json.loads(next(iter(next(o for o in nxt.create if o["kind"] == "ConfigMap")["data"].values())))
    assert config["training"]["gradientAccumulationSteps"] == 2 and config["training"]["globalBatchSize"] == 16
    assert nxt.status.wanted_nodes == 2  # the Nodes column: current/desired


def test_a_failure_that_is_no_disruption_restarts_at_the_same_size() -> None:
    plan = decided(elastic_job(dict(STARTED)), [running(0), running(1, phase="Failed", code=1)])
    assert plan.status.restarts == 1 and plan.status.elastic is not None
    assert plan.status.elastic.current_nodes == 2 and plan.resize is None


def test_never_below_min_nodes() -> None:
    plan = decided(
        elastic_job(
            dict(STARTED),
            nodes=3,
            elastic={"minNodes": 2},
            training={"maxSteps": 100, "perDeviceBatchSize": 8, "gradientAccumulationSteps": 2},  # exact at 2 and 3
        ),
        [
            running(0),
            running(1, pod_reason="Evicted", phase="Failed"),
            running(2, pod_reason="Evicted", phase="Failed"),
        ],
    )
    assert plan.status.elastic is not None and plan.status.elastic.current_nodes == 2


def shrunk(minutes_ago: float = 5) -> dict[str, Any]:
    """Status of a job running attempt 1 on one of its two nodes, resized ``minutes_ago``."""
    wire = dict(STARTED, attempt=1, state="Running", nodes="1/2", readyNodes=1)
    wire["elastic"] = {
        "currentNodes": 1,
        "desiredNodes": 2,
        "minNodes": 1,
        "gradientAccumulationSteps": 2,
        "globalBatchSize": 16,
        "askedGlobalBatchSize": 16,
        "resizes": 1,
        "lastResizeTime": ts(NOW - timedelta(minutes=minutes_ago)),
        "lastResize": "Shrunk",
    }
    return wire


def test_a_smaller_gang_keeps_a_placeholder_per_missing_rank() -> None:
    plan = decided(elastic_job(shrunk()), [running(0, attempt=1)])
    assert plan.status.state == "Running"
    (ph,) = [o for o in plan.create if o["kind"] == "Pod"]
    assert ph["metadata"]["name"] == "ft-grow-0"
    assert ph["metadata"]["labels"]["app.kubernetes.io/component"] == "placeholder"
    body = ph["spec"]
    assert body["containers"][0]["command"] == ["sleep", "infinity"] and "volumes" not in body
    assert body["automountServiceAccountToken"] is False and "env" not in body["containers"][0]
    # a full-size gang has none, and deletes any left
    full = decided(elastic_job(dict(STARTED)), [running(0), running(1), placeholder(0, 0)])
    assert not full.create and [d.name for d in full.delete] == ["ft-grow-0"]


def test_a_running_placeholder_grows_the_gang_at_an_agreed_step_after_the_cooldown() -> None:
    plan = decided(elastic_job(shrunk()), [running(0, attempt=1), placeholder(0, 1)])
    st = plan.status
    assert st.state == "Restarting" and st.attempt == 2 and (st.restarts, st.disruptions) == (0, 0)
    assert st.elastic is not None and (st.elastic.current_nodes, st.elastic.gradient_accumulation_steps) == (2, 1)
    deletes = {d.name: d.grace_seconds for d in plan.delete}
    assert deletes["ft-node-0"] is None  # the pod's own grace: the ranks agree on a step and checkpoint it
    assert "Grown" in [e.reason for e in plan.events] and plan.resize == ("Grown", 0)


def test_the_cooldown_holds_a_grow_back() -> None:
    plan = decided(elastic_job(shrunk(minutes_ago=0.5)), [running(0, attempt=1), placeholder(0, 1)])
    assert plan.status.state == "Running" and plan.status.attempt == 1
    assert plan.requeue_after is not None and plan.requeue_after <= 30
    assert plan.status.elastic is not None and plan.status.elastic.placeholders_running == 1


def test_a_pending_placeholder_is_no_capacity() -> None:
    plan = decided(elastic_job(shrunk()), [running(0, attempt=1), placeholder(0, 1, phase="Pending", node="")])
    assert plan.status.state == "Running" and plan.status.attempt == 1


def test_ranks_unschedulable_past_the_timeout_shrink_to_the_ranks_placed() -> None:
    waiting = {
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes"}]
    }
    old = dict(STARTED, state="Created", attemptStartTime=ts(NOW - timedelta(seconds=31)))
    plan = decided(
        elastic_job(old), [on_node(running(0, phase="Pending"), "n1"), running(1, phase="Pending", **waiting)]
    )
    st = plan.status
    assert st.state == "Restarting" and st.elastic is not None and st.elastic.current_nodes == 1
    assert st.condition("Resized") is not None and "unschedulable" in st.condition("Resized").message  # type: ignore[union-attr]
    # before the timeout: it waits
    young = dict(STARTED, state="Created", attemptStartTime=ts(NOW - timedelta(seconds=10)))
    plan = decided(
        elastic_job(young), [on_node(running(0, phase="Pending"), "n1"), running(1, phase="Pending", **waiting)]
    )
    assert plan.status.state == "Created" and plan.status.elastic is not None
    assert plan.status.elastic.current_nodes == 2


def test_below_min_nodes_the_job_waits_saying_so() -> None:
    waiting = {
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes"}]
    }
    old = dict(STARTED, state="Created", attemptStartTime=ts(NOW - timedelta(seconds=31)))
    plan = decided(
        elastic_job(old, elastic={"minNodes": 2, "unschedulableSeconds": 30}),
        [on_node(running(0, phase="Pending"), "n1"), running(1, phase="Pending", **waiting)],
    )
    created = plan.status.condition("Created")
    assert plan.status.state == "Created" and created is not None and created.reason == "BelowMinNodes"
    assert "spec.elastic.minNodes=2" in created.message and "BelowMinNodes" in [e.reason for e in plan.events]


def test_a_job_without_elastic_has_no_elastic_status_nor_placeholders() -> None:
    plan = decided(job(dict(STARTED), nodes=2), [running(0), running(1, pod_reason="Evicted", phase="Failed")])
    assert plan.status.elastic is None and plan.resize is None
    nxt = decided(job(plan.status.to_wire(), nodes=2), [])
    assert len([o for o in nxt.create if o["kind"] == "Pod"]) == 2


def test_the_next_attempt_waits_for_the_placeholders_to_go() -> None:
    """They hold what the grown gang's ranks need on their nodes."""
    between = dict(shrunk(), attempt=2, state="Restarting")
    del between["attemptStartTime"]
    plan = decided(elastic_job(between), [placeholder(0, 1)])
    assert not plan.create and [d.name for d in plan.delete] == ["ft-grow-0"]
    going = placeholder(0, 1)
    going["metadata"]["deletionTimestamp"] = ts(NOW)
    assert not decided(elastic_job(between), [going]).create
    assert [o["metadata"]["name"] for o in decided(elastic_job(between), []).create if o["kind"] == "Pod"]
