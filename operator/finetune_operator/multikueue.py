"""Pure: dispatching FineTuneJobs across clusters with Kueue's MultiKueue (docs/placement.md), through its generic
adapter for custom jobs (``multiKueue.externalFrameworks: [{name: FineTuneJob.v1alpha1.finetune.dev}]``).

On the manager cluster a job with ``spec.managedBy: kueue.x-k8s.io/multikueue`` runs nowhere: the operator creates
its Workload (the job's ``spec.queueName``, one PodSet of ``spec.nodes`` trainer pods, owned by the job) and nothing
else; the status is the worker's copy's, which MultiKueue copies whole (the operator writes it only when the job is
suspended or resumed, when there is no copy to copy from). Once the manager's ClusterQueue reserves quota and a
worker's Kueue admits the copy of that Workload, MultiKueue creates the job on the worker without ``managedBy``, with
its origin label and the Workload's name (``kueue.x-k8s.io/prebuilt-workload-name``, a label or an annotation).

On the worker those say Kueue has admitted the job already, as that Workload: the operator runs it as any job
but keeps its pods out of Kueue's queues (no queue label), so its quota is counted once, and when the job finishes it
marks the Workload ``Finished``, which gives the worker's quota back and tells the manager (MultiKueue then copies the
final status and removes the worker's objects). Deleting the job on the manager deletes its Workload (owner
reference), and MultiKueue deletes the worker's copy.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

MANAGED_BY = "kueue.x-k8s.io/multikueue"
# The Workload MultiKueue admitted a worker's copy as: an annotation from Kueue v0.18 (its WorkloadIdentifierAnnotations
# gate, on by default), a label before (jobframework.SetPrebuiltWorkloadName); both are read, the annotation first.
PREBUILT_KEY = "kueue.x-k8s.io/prebuilt-workload-name"
ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"  # on what MultiKueue creates on a worker: the copy, its Workload
API_VERSION = "kueue.x-k8s.io/v1beta2"
KIND = "Workload"
POD_SET = "trainers"


def workload_name(job: str, uid: str) -> str:
    """The manager's Workload of a dispatched job: one per job (MultiKueue runs it, restarts and all, on one worker),
    a piece of the uid keeping a job created again under the same name apart; at most 63 characters."""
    name = f"finetunejob-{job}-{uid[:6]}"
    if len(name) > 63:  # 12 + 35 + 1 + 8 + 1 + 6 = 63
        name = f"finetunejob-{job[:35]}-{hashlib.sha256(job.encode()).hexdigest()[:8]}-{uid[:6]}"
    return name


def workload(
    *, name: str, namespace: str, owner: dict[str, Any], queue: str, nodes: int, pod: dict[str, Any]
) -> dict[str, Any]:
    """The manager-side Workload: ``nodes`` pods shaped as the job's rank 0 (``pod``: a trainer Pod the builders
    made), in LocalQueue ``queue``, controlled by the job (MultiKueue finds the job, and its adapter, by it)."""
    template = {"metadata": {"labels": dict(pod["metadata"].get("labels") or {})}, "spec": pod["spec"]}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "ownerReferences": [owner]},
        "spec": {"queueName": queue, "podSets": [{"name": POD_SET, "count": nodes, "template": template}]},
    }


def claimed(labels: dict[str, str], annotations: dict[str, str]) -> str | None:
    """The Workload a job says MultiKueue admitted it as (the marks MultiKueue puts on a worker's copy: its origin
    label and the Workload's name), or None."""
    name = annotations.get(PREBUILT_KEY) or labels.get(PREBUILT_KEY)
    return name if name and labels.get(ORIGIN_LABEL) else None


def admitted_copy(workload: dict[str, Any] | None, nodes: int) -> bool:
    """Whether ``workload`` (read from the worker's API server) is what MultiKueue made for a copy of ``nodes`` ranks:
    MultiKueue's origin label, admitted by the worker's Kueue, not finished, one PodSet of that size. A label a tenant
    wrote on a job cannot make one (tenants do not create Workloads): an unverified copy is queued as any job."""
    if not workload or not made_by_multikueue(workload):
        return False
    pod_sets = (workload.get("spec") or {}).get("podSets") or []
    conditions = {c.get("type"): c.get("status") for c in (workload.get("status") or {}).get("conditions") or []}
    sized = sum(int(ps.get("count") or 0) for ps in pod_sets) == nodes
    return sized and conditions.get("Admitted") == "True" and conditions.get("Finished") != "True"


def made_by_multikueue(workload: dict[str, Any]) -> bool:
    """``workload`` carries MultiKueue's origin label: MultiKueue made it on this worker (tenants create no Workloads;
    Kueue's own for plain pods carry no such label)."""
    return bool(((workload.get("metadata") or {}).get("labels") or {}).get(ORIGIN_LABEL))


def is_finished(workload: dict[str, Any] | None) -> bool:
    return any(
        c.get("type") == "Finished" and c.get("status") == "True"
        for c in ((workload or {}).get("status") or {}).get("conditions") or []
    )


def finished(name: str, state: str, message: str, now: datetime) -> dict[str, Any]:
    """The server-side apply body of the status that marks a worker's Workload Finished as the job ended (Succeeded or
    Failed): the condition alone, merged by its type into Kueue's own (the list is a map keyed by type)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "status": {
            "conditions": [
                {
                    "type": "Finished",
                    "status": "True",
                    "reason": "Succeeded" if state == "Succeeded" else "Failed",
                    "message": (message or f"the FineTuneJob {state.lower()}")[:1024],
                    "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            ]
        },
    }
