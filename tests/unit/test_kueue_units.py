"""Kueue's plain pod groups in the pure core: the attempt's labels and annotations, Kueue's Workload read, a gated gang
queued with Kueue's message and then admitted, the clocks (deadline, GPU-seconds) that start at admission, and Kueue's
eviction of a running gang counted as a disruption."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from finetune_operator.admission import Observed
from finetune_operator.builders import build_pod
from finetune_operator.failures import classify_pod
from finetune_operator.kueue import group_name, pod_metadata, read_workload
from finetune_operator.settings import Settings
from finetune_operator.spec import SpecError, parse_spec
from finetune_operator.status import ts

from tests.unit.factories import NOW, REF, STARTED, base_spec, decided, job, running

pytestmark = pytest.mark.unit
LATER = NOW + timedelta(minutes=5)
PENDING = read_workload(
    {
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": "insufficient quota for nvidia.com/gpu",
                }
            ]
        }
    }
)


def gated(rank: int, attempt: int = 0, queue: str | None = "team") -> dict[str, Any]:
    p = running(rank, attempt, phase="Pending")
    p["spec"] = {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}, {"name": "kueue.x-k8s.io/topology"}]}
    p["status"]["containerStatuses"] = []
    if queue:
        p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = queue
    return p


def queued_job(**status: Any) -> dict[str, Any]:
    return job({**STARTED, "state": "Created", **status}, nodes=2, queueName="team")


def queued_status(**over: Any) -> dict[str, Any]:
    """A job whose attempt 0 was created at NOW - 1 min (when the job started) and is queued since."""
    return {
        **STARTED,
        "state": "Created",
        **over,
        "conditions": [
            {"type": "Queued", "status": "True", "reason": "Pending", "message": "m", "lastTransitionTime": ts(NOW)}
        ],
    }


def test_an_attempt_is_one_pod_group_whose_pods_are_never_replaced() -> None:
    pod = build_pod(REF, parse_spec(base_spec(nodes=2, queueName="team")), rank=1, attempt=3, settings=Settings())
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team"
    group = pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"]
    assert group == "ft-attempt-3-uid-1" == group_name("ft", 3, REF.uid)
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    # the group finishes (and gives its quota back) once its pods are terminal: a restart is the next group
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/retriable-in-group"] == "false"
    # the same job created again (a new uid) never meets the first one's Workloads; every name fits a label value
    assert group_name("ft", 3, "0f1e2d3c-aaaa") != group_name("ft", 3, "9a8b7c6d-aaaa")
    long = [group_name("a" * 54, a, "0f1e2d3c-aaaa") for a in (12, 13, 99999)]
    assert all(len(g) <= 63 for g in long) and len(set(long)) == 3


def test_without_a_queue_name_the_pods_still_form_one_group() -> None:
    """Kueue also queues pods that name no queue (a namespace's LocalQueue "default"): they must still be one gang."""
    labels, annotations = pod_metadata(None, "ft", "uid-1", 0, 4)
    assert labels == {"kueue.x-k8s.io/pod-group-name": "ft-attempt-0-uid-1"}
    assert annotations == {"kueue.x-k8s.io/pod-group-total-count": "4", "kueue.x-k8s.io/retriable-in-group": "false"}


@pytest.mark.parametrize("name", ["Team", "team_a", "-team", "team.", "q" * 64, ""])
def test_a_queue_name_that_is_no_label_value_is_refused(name: str) -> None:
    with pytest.raises(SpecError, match=r"spec\.queueName"):
        parse_spec(base_spec(queueName=name))
    assert parse_spec(base_spec(queueName="team-a.gpu")).queue_name == "team-a.gpu"


def test_the_workload_read_gives_kueues_reason_and_message() -> None:
    assert not read_workload(None).admitted
    assert (PENDING.admitted, PENDING.reason) == (False, "Pending") and "insufficient quota" in PENDING.message
    admitted = {
        "status": {
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "The workload is admitted"},
            ]
        }
    }
    assert read_workload(admitted).admitted
    # quota reserved, admission checks pending: what holds it now is the Admitted condition's
    checks = read_workload(
        {
            "status": {
                "conditions": [
                    {
                        "type": "QuotaReserved",
                        "status": "True",
                        "reason": "QuotaReserved",
                        "message": "Quota reserved in cq",
                    },
                    {
                        "type": "Admitted",
                        "status": "False",
                        "reason": "Pending",
                        "message": "waiting for admission check prov",
                    },
                ]
            }
        }
    )
    assert (checks.admitted, checks.message) == (False, "waiting for admission check prov")
    evicted = read_workload(
        {
            "status": {
                "conditions": [
                    {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "insufficient quota"},
                    {
                        "type": "Evicted",
                        "status": "True",
                        "reason": "Preempted",
                        "message": "Preempted to accommodate b",
                    },
                ]
            }
        }
    )
    assert (evicted.reason, evicted.message) == ("Preempted", "Preempted to accommodate b")


def test_a_gated_gang_is_queued_with_kueues_message_then_admitted() -> None:
    plan = decided(queued_job(), [gated(0), gated(1)], observed=Observed(queue=PENDING))
    cond = plan.status.condition("Queued")
    assert cond is not None and cond.status and cond.reason == "Pending"
    assert "ft-attempt-0-uid-1" in cond.message and "LocalQueue team" in cond.message
    assert "insufficient" in cond.message
    assert plan.status.state == "Created" and plan.status.reason() == "Queued"
    assert [e.reason for e in plan.events] == ["Queued"] and plan.requeue_after == 10.0
    assert not plan.create and not plan.delete  # queued: nothing to do but wait, however long

    again = decided(
        job({**plan.status.to_wire()}, nodes=2, queueName="team"),
        [gated(0), gated(1)],
        now=LATER,
        observed=Observed(queue=PENDING),
    )
    assert again.events == []  # one event per wait, not per pass
    # one rank's gates lifted, the other's not yet: still queued
    half = decided(
        job({**plan.status.to_wire()}, nodes=2, queueName="team"),
        [running(0), gated(1)],
        now=LATER,
        observed=Observed(queue=PENDING),
    )
    assert half.status.condition("Queued").status and half.status.state == "Created"  # type: ignore[union-attr]

    admitted = decided(job({**plan.status.to_wire()}, nodes=2, queueName="team"), [running(0), running(1)], now=LATER)
    cond = admitted.status.condition("Queued")
    assert cond is not None and not cond.status and cond.reason == "Admitted"
    assert admitted.status.state == "Running" and "Admitted" in [e.reason for e in admitted.events]
    # the attempt, and the deadline of a job queued since it started, count from the admission
    assert admitted.status.attempt_start_time == LATER and admitted.status.start_time == LATER


def test_pods_kueue_queued_without_a_queue_name_are_followed_too() -> None:
    """No spec.queueName, but Kueue gave the pods its default LocalQueue: the job says so, and admission clears it."""
    pods = [gated(0, queue="default"), gated(1, queue="default")]
    plan = decided(job({**STARTED, "state": "Created"}, nodes=2), pods, observed=Observed(queue=PENDING))
    cond = plan.status.condition("Queued")
    assert cond is not None and cond.status and "LocalQueue default" in cond.message
    admitted = decided(job({**plan.status.to_wire()}, nodes=2), [running(0), running(1)], now=LATER)
    cond = admitted.status.condition("Queued")
    assert cond is not None and not cond.status and admitted.status.state == "Running"


def test_the_deadline_waits_for_the_first_admission_but_not_for_a_requeue() -> None:
    long_ago = ts(NOW - timedelta(hours=2))
    queued = queued_status(startTime=long_ago, attemptStartTime=long_ago)
    plan = decided(
        job(queued, nodes=2, queueName="team", activeDeadlineSeconds=3600),
        [gated(0), gated(1)],
        observed=Observed(queue=PENDING),
    )
    assert plan.status.state == "Created" and plan.status.failure is None and not plan.delete
    assert plan.status.condition("Queued").status  # type: ignore[union-attr]
    # queued again after a preemption: the job had started, its clock runs
    requeued = queued_status(
        startTime=long_ago, attemptStartTime=ts(NOW - timedelta(minutes=1)), attempt=1, disruptions=1
    )
    plan = decided(
        job(requeued, nodes=2, queueName="team", activeDeadlineSeconds=3600),
        [gated(0, attempt=1), gated(1, attempt=1)],
        observed=Observed(queue=PENDING),
    )
    assert plan.status.state == "Failed" and plan.status.failure.reason == "DeadlineExceeded"  # type: ignore[union-attr]
    # a deadline nearer than the queue's refresh is not put off by it
    soon = queued_status(
        startTime=ts(NOW - timedelta(minutes=59, seconds=58)),
        attemptStartTime=ts(NOW - timedelta(minutes=1)),
        attempt=1,
    )
    plan = decided(
        job(soon, nodes=2, queueName="team", activeDeadlineSeconds=3600),
        [gated(0, attempt=1), gated(1, attempt=1)],
        observed=Observed(queue=PENDING),
    )
    assert plan.requeue_after is not None and plan.requeue_after <= 2.0


def test_an_attempt_that_ends_in_the_queue_used_no_gpu() -> None:
    gpus = {"resources": {"limits": {"nvidia.com/gpu": 8}}}
    plan = decided(job(queued_status(), nodes=2, queueName="team", suspend=True, **gpus), [gated(0), gated(1)])
    assert plan.status.state == "Suspended" and not plan.status.gpu_seconds_used
    cond = plan.status.condition("Queued")
    assert cond is not None and not cond.status and cond.reason == "AttemptEnded"
    assert {d.name for d in plan.delete} == {"ft-node-0", "ft-node-1"}


def test_a_restart_while_queued_clears_the_queued_condition() -> None:
    plan = decided(job(queued_status(), nodes=2, queueName="team"), [gated(0), running(1, phase="Failed", code=1)])
    cond = plan.status.condition("Queued")
    assert plan.status.state == "Restarting" and cond is not None and not cond.status
    assert not plan.status.gpu_seconds_used


def test_a_rank_that_fails_as_it_is_admitted_is_charged_from_the_admission() -> None:
    gpus = {"resources": {"limits": {"nvidia.com/gpu": 8}}}
    plan = decided(
        job(queued_status(), nodes=2, queueName="team", **gpus), [running(0), running(1, phase="Failed", code=1)]
    )
    assert plan.status.state == "Restarting" and plan.status.restarts == 1
    assert "Admitted" in [e.reason for e in plan.events] and not plan.status.gpu_seconds_used


def test_kueues_eviction_of_a_running_gang_is_a_disruption() -> None:
    pod = running(
        0,
        deleting=True,
        conditions=[
            {
                "type": "TerminationTarget",
                "status": "True",
                "reason": "WorkloadEvictedDueToPreempted",
                "message": "Preempted to accommodate a workload (UID: 1) due to prioritization in the ClusterQueue",
            }
        ],
    )
    pod["spec"] = {"nodeName": "gpu-0"}
    failure = classify_pod(pod)
    assert failure is not None and failure.disruption and failure.reason == "Preempted"
    assert failure.message.startswith("preempted: Kueue stopped the attempt's pod group: Preempted")
    plan = decided(job(STARTED, nodes=2, queueName="team"), [pod, running(1)])
    assert plan.status.disruptions == 1 and plan.status.restarts == 0 and plan.status.attempt == 1
    assert [d.name for d in plan.delete] == ["ft-node-1"]  # the evicted rank is already going
    assert all(d.grace_seconds is None for d in plan.delete)  # the pods' own grace: time to checkpoint


def test_a_spec_made_invalid_while_queued_leaves_the_queue() -> None:
    wire = job(queued_status(), nodes=2, queueName="team")
    wire["spec"]["nodes"] = "two"  # not a number: the operator will not run it
    plan = decided(wire, [gated(0), gated(1)])
    cond = plan.status.condition("Queued")
    assert plan.status.state == "Failed" and cond is not None and not cond.status
