"""Pure checks that need the cluster's state, made before an attempt's pods are created: the access modes of
the claims a job names, and the namespace's totals across jobs (operator settings). No I/O here: the controller
reads the claims and the namespace's jobs, these functions decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from finetune_operator.builders import output_claim_name
from finetune_operator.guardrails import Violation
from finetune_operator.kueue import WorkloadState
from finetune_operator.placement import QueueTopology
from finetune_operator.runtimes import Choice, spec_of
from finetune_operator.settings import Settings
from finetune_operator.spec import JobSpec, SpecError

# States in which a job holds (or is about to hold again) its pods' resources.
HOLDING = ("Created", "Running", "Restarting")


@dataclass(frozen=True)
class Usage:
    """What the namespace's other active FineTuneJobs hold."""

    jobs: int = 0
    nodes: int = 0
    gpus: int = 0


@dataclass(frozen=True)
class Observed:
    """What the controller read besides the job and its pods: claims and namespace use before an attempt starts;
    the nodes of pods stuck terminating; the attempt's Kueue Workload while it waits for admission."""

    claims: dict[str, dict[str, Any]] = field(default_factory=dict)  # name → PVC, for the claims that exist
    usage: Usage | None = None  # None: no namespace limit configured, nothing was read
    lost_nodes: dict[str, str] = field(default_factory=dict)  # node → why its pods may be force-deleted
    down_nodes: dict[str, str] = field(default_factory=dict)  # node → why it is down (an elastic gang's, on a failure)
    nodes_unreadable: bool = False  # reading a node was refused (no `nodes: get`)
    queue: WorkloadState | None = None  # Kueue's word on the attempt's Workload, read while its pods are gated
    runtime: Choice | None = None  # the job's runtime, read before an attempt starts (None: not read, no runtime)
    queue_topology: QueueTopology | None = None  # what the job's Kueue queue offers (spec.topology), before an attempt
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)  # node → labels: where a topology's ranks run
    admitted_copy: bool = False  # a MultiKueue worker's copy whose Workload was read and is MultiKueue's, admitted


def claims_to_check(job: str, spec: JobSpec) -> list[tuple[str, str]]:
    """(field, claim name) of the claims a job mounts read-write and that all its nodes share. The template's
    claim is checked too: ``<job>-output`` may already exist (retained from an earlier job of the same name)."""
    field_path = "spec.output.claimName" if spec.output.template is None else "spec.output.volumeClaimTemplate"
    out = [(field_path, output_claim_name(job, spec))]
    if spec.cache is not None:
        out.append(("spec.cache.claimName", spec.cache.claim_name))
    return out


def access_modes(pvc: dict[str, Any]) -> list[str]:
    """A bound claim's actual modes (status), else the requested ones (spec)."""
    return list((pvc.get("status") or {}).get("accessModes") or (pvc.get("spec") or {}).get("accessModes") or ())


def check_claims(job: str, spec: JobSpec, claims: dict[str, dict[str, Any]]) -> Violation | None:
    """Every rank writes the output (and the rank-0 fetch writes the cache): a claim only one node can mount
    cannot hold a multi-node job, and a read-only claim cannot hold any. A claim that does not exist yet is
    not judged here; the scheduler reports it (Unschedulable) until it is created."""
    for field_path, name in claims_to_check(job, spec):
        pvc = claims.get(name)
        if pvc is None:
            continue
        modes = access_modes(pvc)
        if modes and not {"ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"} & set(modes):
            return Violation(
                "InvalidSpec",
                f"{field_path}: claim {name} is read-only ({', '.join(modes)}); the "
                "trainer writes into it: use a ReadWriteMany claim",
            )
        if spec.nodes > 1 and modes and "ReadWriteMany" not in modes:
            return Violation(
                "InvalidSpec",
                f"{field_path}: claim {name} is {', '.join(modes)} but the job's "
                f"{spec.nodes} nodes must all mount it; use a ReadWriteMany claim (NFS, CephFS, EFS, "
                "Filestore, Azure Files, …), let the operator create one with "
                "spec.output.volumeClaimTemplate, or run on 1 node",
            )
    return None


def _gpus_nodes(job: dict[str, Any]) -> tuple[int, int] | None:
    try:
        spec = spec_of(job, held=True)
    except (SpecError, KeyError, TypeError, ValueError):
        return None
    if spec.managed_by is not None:  # MultiKueue runs it on a worker (its status is the worker's copy's)
        return None
    return spec.nodes, spec.nodes * spec.gpus_per_node


def usage_of(jobs: list[dict[str, Any]], *, exclude_uid: str) -> Usage:
    """Sum what the namespace's active jobs hold, except the job being admitted."""
    n = nodes = gpus = 0
    for j in jobs:
        if j["metadata"].get("uid") == exclude_uid or (j.get("status") or {}).get("state") not in HOLDING:
            continue
        held = _gpus_nodes(j)
        if held is None:
            continue
        n, nodes, gpus = n + 1, nodes + held[0], gpus + held[1]
    return Usage(jobs=n, nodes=nodes, gpus=gpus)


@dataclass(frozen=True)
class Admission:
    violation: Violation
    permanent: bool  # True: the job alone is over the limit; False: it waits until others finish


def check_namespace(spec: JobSpec, usage: Usage | None, settings: Settings) -> Admission | None:
    """Namespace totals (``guardrails.maxNodesPerNamespace`` / ``maxGpusPerNamespace``) across active jobs."""
    if usage is None:
        return None
    gpus = spec.nodes * spec.gpus_per_node
    limits = (
        ("nodes", spec.nodes, usage.nodes, settings.max_nodes_per_namespace, "maxNodesPerNamespace"),
        ("GPUs", gpus, usage.gpus, settings.max_gpus_per_namespace, "maxGpusPerNamespace"),
    )
    for what, asked, held, limit, value in limits:
        if not limit or asked + held <= limit:
            continue
        if asked > limit:
            return Admission(
                Violation(
                    "QuotaExceeded",
                    f"the job asks for {asked} {what}, over the namespace "
                    f"limit of {limit} (Helm value guardrails.{value})",
                ),
                permanent=True,
            )
        return Admission(
            Violation(
                "QuotaExceeded",
                f"waiting: the job asks for {asked} {what} and the namespace's "
                f"{usage.jobs} active job(s) hold {held} of the limit of {limit} (Helm value "
                f"guardrails.{value}); it starts when enough are free",
            ),
            permanent=False,
        )
    return None
