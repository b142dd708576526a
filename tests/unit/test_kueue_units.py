"""Kueue's plain pod groups in the pure core: the attempt's labels and annotations, Kueue's Workload read, a gated gang
queued with Kueue's message and then admitted, and Kueue's eviction of a running gang counted as a disruption."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from finetune_operator.admission import Observed
from finetune_operator.builders import build_pod
from finetune_operator.failures import classify_pod
from finetune_operator.kueue import group_name, pod_metadata, read_workload
from finetune_operator.settings import Settings
from finetune_operator.spec import parse_spec
from finetune_operator.status import ts

from tests.unit.factories import NOW, REF, STARTED, base_spec, decided, job, running

pytestmark = pytest.mark.unit
LATER = NOW + timedelta(minutes=5)


def gated(rank: int, attempt: int = 0) -> dict[str, Any]:
    p = running(rank, attempt, phase="Pending")
    p["spec"] = {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}
    p["status"]["containerStatuses"] = []
    return p


def queued_job(**status: Any) -> dict[str, Any]:
    return job({**STARTED, "state": "Created", **status}, nodes=2, queueName="team")


def test_an_attempt_is_one_pod_group_whose_pods_are_never_replaced() -> None:
    pod = build_pod(REF, parse_spec(base_spec(nodes=2, queueName="team")), rank=1, attempt=3, settings=Settings())
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team"
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "ft-attempt-3" == group_name("ft", 3)
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    # the group finishes (and gives its quota back) once its pods are terminal: a restart is the next group
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/retriable-in-group"] == "false"
    assert pod_metadata(None, "ft", 0, 2) == ({}, {})
    assert len(group_name("a" * 60, 12)) <= 63 and group_name("a" * 60, 12) != group_name("a" * 60, 13)


def test_the_workload_read_gives_kueues_reason_and_message() -> None:
    assert not read_workload(None).admitted
    pending = {"status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                          "message": "couldn't assign flavors to pod set main: insufficient quota"}]}}
    st = read_workload(pending)
    assert (st.admitted, st.reason) == (False, "Pending") and "insufficient quota" in st.message
    admitted = {"status": {"conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                                          {"type": "Admitted", "status": "True", "reason": "Admitted",
                                           "message": "The workload is admitted"}]}}
    assert read_workload(admitted).admitted


def test_a_gated_gang_is_queued_with_kueues_message_then_admitted() -> None:
    queue = read_workload({"status": {"conditions": [{"type": "QuotaReserved", "status": "False",
                                                      "reason": "Pending", "message": "insufficient quota for gpu"}]}})
    plan = decided(queued_job(), [gated(0), gated(1)], observed=Observed(queue=queue))
    cond = plan.status.condition("Queued")
    assert cond is not None and cond.status and cond.reason == "Pending"
    assert "ft-attempt-0" in cond.message and "LocalQueue team" in cond.message and "insufficient" in cond.message
    assert plan.status.state == "Created" and plan.status.reason() == "Queued"
    assert [e.reason for e in plan.events] == ["Queued"] and plan.requeue_after is not None
    assert not plan.create and not plan.delete  # queued: nothing to do but wait, however long

    again = decided(job({**plan.status.to_wire()}, nodes=2, queueName="team"), [gated(0), gated(1)], now=LATER,
                    observed=Observed(queue=queue))
    assert again.events == []  # one event per wait, not per pass

    admitted = decided(job({**plan.status.to_wire()}, nodes=2, queueName="team"), [running(0), running(1)],
                       now=LATER)
    cond = admitted.status.condition("Queued")
    assert cond is not None and not cond.status and cond.reason == "Admitted"
    assert admitted.status.state == "Running" and "Admitted" in [e.reason for e in admitted.events]
    # the attempt, and the deadline of a job queued since it started, count from the admission
    assert admitted.status.attempt_start_time == LATER and admitted.status.start_time == LATER


def test_a_restart_while_queued_clears_the_queued_condition() -> None:
    status = {**STARTED, "state": "Created", "conditions": [{"type": "Queued", "status": "True", "reason": "Pending",
                                                             "message": "m", "lastTransitionTime": ts(NOW)}]}
    plan = decided(job(status, nodes=2, queueName="team"), [gated(0), running(1, phase="Failed", code=1)])
    cond = plan.status.condition("Queued")
    assert plan.status.state == "Restarting" and cond is not None and not cond.status


def test_kueues_eviction_of_a_running_gang_is_a_disruption() -> None:
    pod = running(0, deleting=True, conditions=[{
        "type": "TerminationTarget", "status": "True", "reason": "WorkloadEvicted",
        "message": "Preempted to accommodate a workload (UID: 1) due to prioritization in the ClusterQueue"}])
    pod["spec"] = {"nodeName": "gpu-0"}
    failure = classify_pod(pod)
    assert failure is not None and failure.disruption and failure.reason == "Preempted"
    assert failure.message.startswith("preempted: Kueue evicted the attempt's Workload: Preempted")
    plan = decided(job(STARTED, nodes=2, queueName="team"), [pod, running(1)])
    assert plan.status.disruptions == 1 and plan.status.restarts == 0 and plan.status.attempt == 1
    assert all(d.grace_seconds is None for d in plan.delete)  # the pods' own grace: time to checkpoint
