"""MultiKueue dispatch as the operator decides it: on the manager a job with spec.managedBy gets its Workload (the
job's queue, one PodSet of its ranks, owned by the job) and nothing else, not even a status write; on the worker the
copy labelled with its Workload runs with its pods outside Kueue's queues, and marks the Workload Finished when it
ends. Kueue and MultiKueue themselves run in tests/integration/test_multikueue.py."""

from __future__ import annotations

from typing import Any

import pytest
from finetune_operator.admission import Observed
from finetune_operator.multikueue import MANAGED_BY, ORIGIN_LABEL, PREBUILT_KEY, admitted_copy, workload_name
from finetune_operator.spec import SpecError, parse_spec
from finetune_operator.state import read_job

from tests.unit.factories import STARTED, base_spec, decided, job, running

pytestmark = pytest.mark.unit


def test_managed_by_takes_only_multikueue_with_a_queue_and_a_fixed_size() -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(base_spec(managedBy="someone-else"))
    assert "the only value is kueue.x-k8s.io/multikueue" in dict(e.value.errors)["spec.managedBy"]
    with pytest.raises(SpecError) as e:
        parse_spec(base_spec(managedBy=MANAGED_BY, nodes=2, elastic={"minNodes": 1}))
    found = dict(e.value.errors)
    assert "spec.queueName" in found and "spec.elastic" in found, found
    assert parse_spec(base_spec(managedBy=MANAGED_BY, queueName="team")).managed_by == MANAGED_BY


def test_on_the_manager_the_job_is_its_workload_and_nothing_else() -> None:
    wire = job(nodes=3, managedBy=MANAGED_BY, queueName="team")
    plan = decided(wire)
    (wl,) = plan.create
    assert wl["kind"] == "Workload" and wl["metadata"]["name"] == workload_name("ft", "uid-1")
    assert wl["metadata"]["ownerReferences"][0]["kind"] == "FineTuneJob"
    assert wl["metadata"]["ownerReferences"][0]["controller"] is True
    (pod_set,) = wl["spec"]["podSets"]
    assert wl["spec"]["queueName"] == "team" and pod_set["count"] == 3
    assert pod_set["template"]["spec"]["containers"][0]["name"] == "trainer"
    assert plan.keep_status and not plan.delete and not plan.events


def worker_copy(status: Any = None, **spec: Any) -> dict[str, Any]:
    wire = job(status, nodes=2, queueName="team", **spec)
    wire["metadata"]["labels"] = {PREBUILT_KEY: "finetunejob-ft-uid-1", ORIGIN_LABEL: "multikueue"}
    return wire


def queue_labels(plan: Any) -> list[str | None]:
    return [o["metadata"]["labels"].get("kueue.x-k8s.io/queue-name") for o in plan.create if o["kind"] == "Pod"]


def test_on_the_worker_the_copy_runs_outside_kueues_queues_once_its_workload_is_checked() -> None:
    """Admitted as MultiKueue's Workload (the controller read it: admitted_copy): no queue label. A copy whose
    Workload was not confirmed, or a job that carries only the prebuilt label (a tenant's), is queued as any job."""
    plan = decided(worker_copy(), observed=Observed(admitted_copy=True))
    assert queue_labels(plan) == [None, None] and not plan.keep_status
    assert read_job(worker_copy()).spec.queue_name == "team"  # type: ignore[union-attr]  # its guardrails see it
    assert queue_labels(decided(worker_copy())) == ["team", "team"]
    forged = job(nodes=2, queueName="team")
    forged["metadata"]["labels"] = {PREBUILT_KEY: "someone-elses"}
    assert read_job(forged).prebuilt_workload is None


def test_the_copys_workload_is_named_by_kueues_annotation_or_its_earlier_label() -> None:
    """Kueue v0.18 names the Workload in an annotation (WorkloadIdentifierAnnotations, on by default), earlier ones
    in a label; the annotation wins where both are set. Either way the origin label makes it MultiKueue's copy."""
    annotated = job(nodes=2, queueName="team")
    annotated["metadata"]["labels"] = {ORIGIN_LABEL: "multikueue"}
    annotated["metadata"]["annotations"] = {PREBUILT_KEY: "finetunejob-ft-uid-1"}
    assert read_job(annotated).prebuilt_workload == "finetunejob-ft-uid-1"
    annotated["metadata"]["labels"][PREBUILT_KEY] = "older"
    assert read_job(annotated).prebuilt_workload == "finetunejob-ft-uid-1"
    del annotated["metadata"]["labels"][ORIGIN_LABEL]
    assert read_job(annotated).prebuilt_workload is None


def test_a_workload_is_a_copys_only_if_multikueue_made_it_for_that_size_and_kueue_admitted_it() -> None:
    admitted = {"type": "Admitted", "status": "True"}
    wl = {
        "metadata": {"labels": {ORIGIN_LABEL: "multikueue"}},
        "spec": {"podSets": [{"name": "trainers", "count": 2}]},
        "status": {"conditions": [admitted]},
    }
    assert admitted_copy(wl, 2)
    assert not admitted_copy(wl, 3)
    assert not admitted_copy({**wl, "metadata": {"labels": {}}}, 2)
    assert not admitted_copy({**wl, "status": {"conditions": []}}, 2)
    assert not admitted_copy({**wl, "status": {"conditions": [admitted, {"type": "Finished", "status": "True"}]}}, 2)
    assert not admitted_copy(None, 2)


def test_the_managers_workload_goes_when_suspended_and_is_not_made_again_once_finished() -> None:
    """Suspending deletes the Workload (MultiKueue then removes the worker's copy, whose status stops flowing): the
    manager says Suspended itself, once; resuming dispatches again and says so until the worker's status comes."""
    suspended = decided(job(STARTED, nodes=2, managedBy=MANAGED_BY, queueName="team", suspend=True))
    assert not suspended.create and suspended.delete_objects == [("Workload", workload_name("ft", "uid-1"))]
    assert not suspended.keep_status and suspended.status.state == "Suspended", suspended.status
    assert [e.reason for e in suspended.events] == ["Suspended"]
    again = decided(job(suspended.status, nodes=2, managedBy=MANAGED_BY, queueName="team", suspend=True))
    assert again.keep_status and again.delete_objects == suspended.delete_objects and not again.events
    resumed = decided(job(suspended.status, nodes=2, managedBy=MANAGED_BY, queueName="team"))
    assert [o["kind"] for o in resumed.create] == ["Workload"] and resumed.status.state == "Pending"
    assert not resumed.keep_status and resumed.status.condition("Suspended").status is False  # type: ignore[union-attr]
    done = decided(job({"state": "Succeeded"}, nodes=2, managedBy=MANAGED_BY, queueName="team"))
    assert not done.create and done.keep_status
    late = decided(job({"state": "Succeeded"}, nodes=2, managedBy=MANAGED_BY, queueName="team", suspend=True))
    assert late.keep_status and not late.delete_objects and not late.events  # finished stays finished


def test_the_managers_job_is_deleted_its_ttl_after_the_copy_finished() -> None:
    """ttlSecondsAfterFinished counts from the completionTime MultiKueue copied from the worker."""
    finished = {"state": "Succeeded", "completionTime": "2026-11-30T11:59:00Z"}
    waits = decided(job(finished, nodes=2, managedBy=MANAGED_BY, queueName="team", ttlSecondsAfterFinished=100))
    assert not waits.delete_job and waits.requeue_after == 40.0 and waits.keep_status
    gone = decided(job(finished, nodes=2, managedBy=MANAGED_BY, queueName="team", ttlSecondsAfterFinished=60))
    assert gone.delete_job
    kept = decided(job(finished, nodes=2, managedBy=MANAGED_BY, queueName="team"))
    assert not kept.delete_job and kept.requeue_after is None


def test_a_dispatched_job_holds_nothing_of_the_managers_namespace_limits() -> None:
    from finetune_operator.admission import usage_of

    running_copy = job({"state": "Running"}, nodes=4, managedBy=MANAGED_BY, queueName="team", uid="other")
    plain = job({"state": "Running"}, nodes=2, uid="plain")
    assert usage_of([running_copy, plain], exclude_uid="x").nodes == 2


def test_workload_names_fit_a_label_value() -> None:
    assert len(workload_name("j" * 54, "0123456789")) <= 63
    assert workload_name("short", "abcdef0123") == "finetunejob-short-abcdef"


def test_managed_by_takes_no_topology() -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(base_spec(managedBy=MANAGED_BY, queueName="team", topology={"preferred": "rack"}))
    assert "spec.topology" in dict(e.value.errors)


def test_a_worker_copy_that_ends_finishes_its_workload() -> None:
    done = [running(0, code=0, phase="Succeeded"), running(1, code=0, phase="Succeeded")]
    plan = decided(worker_copy(STARTED, ttlSecondsAfterFinished=0), done)
    assert plan.status.state == "Succeeded" and plan.finish_workload is not None
    assert not plan.delete_job  # MultiKueue removes the copy once its Workload finished: no TTL of its own
    assert plan.finish_workload["metadata"]["name"] == "finetunejob-ft-uid-1"
    (cond,) = plan.finish_workload["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Finished", "True", "Succeeded")
    running_plan = decided(worker_copy(STARTED), [running(0), running(1)])
    assert running_plan.finish_workload is None
    plain = decided(job(STARTED, nodes=2), done)
    assert plain.status.state == "Succeeded" and plain.finish_workload is None
