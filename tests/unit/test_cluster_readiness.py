"""Pure parts of the GPU-cluster features: output claims (template, access modes), namespace totals, the gang's
PodDisruptionBudget, GPU networking opt-ins, MIG resources, /dev/shm accounting and the shared Hugging Face cache."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from finetune_operator.admission import Observed, Usage, check_claims, check_namespace, usage_of
from finetune_operator.builders import JobRef, build_output_claim, build_pdb, build_pod, trainer_config
from finetune_operator.settings import Settings
from finetune_operator.spec import SpecError, parse_spec

from tests.unit.factories import NOW, base_spec, decided, job

pytestmark = pytest.mark.unit

REF = JobRef(name="ft", namespace="ns", uid="uid-1")
TEMPLATE = {
    "spec": {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "nfs",
        "resources": {"requests": {"storage": "50Gi"}},
    }
}
spec_dict = base_spec


def pvc(modes: list[str], *, bound: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"metadata": {"name": "o"}, "spec": {"accessModes": modes}}
    if bound is not None:
        out["status"] = {"phase": "Bound", "accessModes": bound}
    return out


GPU = {"limits": {"nvidia.com/gpu": 8}}


# -- output claims ---------------------------------------------------------------------------------------------


def test_claim_template_is_created_owned_by_the_job_before_the_pods() -> None:
    plan = decided(job(nodes=2, output={"volumeClaimTemplate": TEMPLATE}), [])
    assert [o["kind"] for o in plan.create] == [
        "PersistentVolumeClaim",
        "NetworkPolicy",
        "Service",
        "ConfigMap",
        "Pod",
        "Pod",
    ]
    claim = plan.create[0]
    assert claim["metadata"]["name"] == "ft-output"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert claim["spec"] == TEMPLATE["spec"]
    vols = {v["name"]: v for v in plan.create[4]["spec"]["volumes"]}
    assert vols["output"]["persistentVolumeClaim"] == {"claimName": "ft-output"}


def test_retained_claim_has_no_owner_so_it_outlives_the_job() -> None:
    spec = parse_spec(
        spec_dict(
            output={
                "volumeClaimTemplate": {**TEMPLATE, "metadata": {"labels": {"team": "a"}}},
                "reclaimPolicy": "Retain",
            }
        )
    )
    claim = build_output_claim(REF, spec)
    assert claim is not None and "ownerReferences" not in claim["metadata"]
    assert claim["metadata"]["labels"]["team"] == "a"
    assert claim["metadata"]["labels"]["finetune.dev/job-name"] == "ft"


@pytest.mark.parametrize(
    ("output", "nodes", "field"),
    [
        ({"claimName": "o", "volumeClaimTemplate": TEMPLATE}, 1, "spec.output"),
        ({}, 1, "spec.output"),
        (
            {"volumeClaimTemplate": {"spec": {**TEMPLATE["spec"], "accessModes": ["ReadWriteOnce"]}}},
            2,
            "spec.output.volumeClaimTemplate.spec.accessModes",
        ),
        (
            {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {}}}}},
            1,
            "spec.output.volumeClaimTemplate.spec.resources.requests.storage",
        ),
    ],
)
def test_bad_output_names_the_field(output: dict[str, Any], nodes: int, field: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(spec_dict(output=output, nodes=nodes))
    assert e.value.field == field


@pytest.mark.parametrize(
    ("claim", "nodes", "refused"),
    [
        (pvc(["ReadWriteOnce"]), 2, True),
        (pvc(["ReadWriteOncePod"]), 2, True),
        (pvc(["ReadWriteOnce"]), 1, False),
        (pvc(["ReadWriteMany"]), 4, False),
        (pvc(["ReadWriteMany", "ReadWriteOnce"]), 4, False),
        (pvc(["ReadOnlyMany"]), 1, True),
        (pvc(["ReadWriteMany"], bound=["ReadWriteOnce"]), 2, True),  # what the volume gave wins over the request
    ],
)
def test_existing_claim_access_modes(claim: dict[str, Any], nodes: int, refused: bool) -> None:
    v = check_claims("ft", parse_spec(spec_dict(nodes=nodes)), {"o": claim})
    assert (v is not None) == refused
    if v is not None:
        assert v.reason == "InvalidSpec" and "spec.output.claimName" in v.message and "claim o" in v.message


def test_rwo_claim_with_many_nodes_fails_the_job_before_any_pod() -> None:
    rwo = Observed(claims={"o": pvc(["ReadWriteOnce"])})
    plan = decided(job(nodes=2), [], now=NOW, settings=Settings(), observed=rwo)
    assert plan.create == []
    assert plan.status.state == "Failed" and plan.status.failure.reason == "InvalidSpec"
    assert "ReadWriteMany" in plan.status.failure.message
    # a claim the controller did not find is left to the scheduler (it reports Unschedulable)
    assert [o["kind"] for o in decided(job(nodes=2), []).create][-1] == "Pod"


def test_cache_claim_is_checked_too() -> None:
    spec = parse_spec(spec_dict(nodes=2, cache={"claimName": "hf"}))
    v = check_claims("ft", spec, {"o": pvc(["ReadWriteMany"]), "hf": pvc(["ReadWriteOnce"])})
    assert v is not None and "spec.cache.claimName" in v.message


# -- namespace totals ---------------------------------------------------------------------------------------------


def test_usage_counts_only_jobs_that_hold_pods() -> None:
    states = ["Running", "Restarting", "Created", "Pending", "Succeeded", "Failed", "Suspended"]
    others = [job({"state": s}, uid=f"u{i}", name=f"j{i}", nodes=2, resources=GPU) for i, s in enumerate(states)]
    itself = job({"state": "Running"}, nodes=3)
    assert usage_of([*others, itself], exclude_uid="uid-1") == Usage(jobs=3, nodes=6, gpus=48)


@pytest.mark.parametrize(
    ("usage", "nodes", "settings", "expect"),
    [
        (Usage(1, 2, 16), 2, Settings(max_gpus_per_namespace=32), None),
        (Usage(1, 2, 16), 3, Settings(max_gpus_per_namespace=32), "wait"),
        (Usage(0, 0, 0), 5, Settings(max_gpus_per_namespace=32), "never"),
        (Usage(2, 7, 0), 2, Settings(max_nodes_per_namespace=8), "wait"),
        (None, 64, Settings(max_nodes_per_namespace=8), None),  # nothing read: no limit configured
    ],
)
def test_namespace_limits(usage: Usage | None, nodes: int, settings: Settings, expect: str | None) -> None:
    a = check_namespace(parse_spec(spec_dict(nodes=nodes, resources=GPU)), usage, settings)
    assert (None if a is None else ("never" if a.permanent else "wait")) == expect
    if a is not None:
        assert a.violation.reason == "QuotaExceeded" and "guardrails.max" in a.violation.message


def test_job_over_the_namespace_total_waits_quietly_then_starts() -> None:
    settings = Settings(max_gpus_per_namespace=16)
    j = job(nodes=2, resources=GPU)
    held = Observed(usage=Usage(jobs=1, nodes=1, gpus=8))
    waiting = decided(j, [], settings=settings, observed=held)
    assert waiting.create == [] and waiting.requeue_after == 30.0
    assert waiting.status.state == "Pending"
    assert [(e.type, e.reason) for e in waiting.events] == [("Warning", "QuotaExceeded")]
    created = waiting.status.condition("Created")
    assert created is not None and (created.status, created.reason) == (False, "QuotaExceeded")
    later = NOW + timedelta(seconds=31)
    again = decided(job(waiting.status, nodes=2, resources=GPU), [], now=later, settings=settings, observed=held)
    assert again.events == [] and again.create == []  # still held: no event, no pods (no retry storm)
    assert replace(again.status, admission_retry_time=None) == replace(waiting.status, admission_retry_time=None)
    early = decided(
        job(waiting.status, nodes=2, resources=GPU),
        [],
        now=NOW + timedelta(seconds=5),
        settings=settings,
        observed=Observed(usage=Usage()),
    )
    assert early.create == [] and early.requeue_after == 25.0  # retries on the clock, not on every event
    free = decided(
        job(waiting.status, nodes=2, resources=GPU), [], now=later, settings=settings, observed=Observed(usage=Usage())
    )
    assert [o["kind"] for o in free.create][-2:] == ["Pod", "Pod"]
    assert free.status.admission_retry_time is None


# -- PodDisruptionBudget -----------------------------------------------------------------------------------------


def test_pdb_lives_while_the_gang_can_run() -> None:
    pdb_spec = {"podDisruptionBudget": {"enabled": True}}
    plan = decided(job(nodes=3, **pdb_spec), [])
    pdb = next(o for o in plan.create if o["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 3
    assert pdb["spec"]["selector"]["matchLabels"] == {"finetune.dev/job-name": "ft"}
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    suspended = decided(job(plan.status, nodes=3, suspend=True, **pdb_spec), [])
    assert suspended.delete_objects == [("PodDisruptionBudget", "ft")]
    # only on the transition: a finished job's later passes delete nothing more
    again = decided(job(suspended.status, nodes=3, suspend=True, **pdb_spec), [])
    assert again.delete_objects == []
    assert build_pdb(REF, parse_spec(spec_dict())) is None


# -- networking, MIG, shm, cache ---------------------------------------------------------------------------------


def test_default_pod_is_restricted_and_opt_ins_change_only_what_they_name() -> None:
    settings = Settings()
    plain = build_pod(REF, parse_spec(spec_dict()), rank=0, attempt=0, settings=settings)
    assert "hostNetwork" not in plain["spec"]
    assert plain["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    net = build_pod(
        REF, parse_spec(spec_dict(network={"hostNetwork": True, "rdma": True})), rank=0, attempt=0, settings=settings
    )
    assert (net["spec"]["hostNetwork"], net["spec"]["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert net["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert net["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] is True


def test_one_mig_slice_per_pod_and_no_anti_affinity() -> None:
    spec = parse_spec(spec_dict(nodes=3, resources={"limits": {"nvidia.com/mig-3g.40gb": 1}}))
    assert (spec.procs_per_node, spec.gpus_per_node, spec.mig) == (1, 1, True)
    pod = build_pod(REF, spec, rank=1, attempt=0, settings=Settings())
    assert "affinity" not in pod["spec"]  # slices of one GPU may serve several ranks
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": "1"}
    for limits in (
        {"nvidia.com/mig-1g.10gb": 2},
        {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-2g.20gb": 1},
        {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/gpu": 1},
    ):
        with pytest.raises(SpecError) as e:
            parse_spec(spec_dict(resources={"limits": limits}))
        assert "MIG" in e.value.message and e.value.field.startswith("spec.resources.limits")


def test_node_affinity_keeps_the_one_rank_per_node_rule() -> None:
    node_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu.model", "operator": "In", "values": ["H200"]}]}
                ]
            }
        }
    }
    spec = parse_spec(spec_dict(nodes=2, resources=GPU, podTemplate={"affinity": node_affinity}))
    affinity = build_pod(REF, spec, rank=0, attempt=0, settings=Settings())["spec"]["affinity"]
    assert affinity["nodeAffinity"] == node_affinity["nodeAffinity"] and "podAntiAffinity" in affinity
    own = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    spec = parse_spec(spec_dict(nodes=2, resources=GPU, podTemplate={"affinity": own}))
    assert build_pod(REF, spec, rank=0, attempt=0, settings=Settings())["spec"]["affinity"] == own


def test_quota_refusal_mid_gang_removes_the_ranks_already_created() -> None:
    from finetune_operator.reconcile import create_rejected
    from finetune_operator.state import read_job, read_pods
    from finetune_operator.status import ts

    created = {
        "metadata": {
            "name": "ft-node-0",
            "uid": "p0",
            "ownerReferences": [{"uid": "uid-1", "controller": True}],
            "labels": {"finetune.dev/attempt": "0", "finetune.dev/node-rank": "0"},
        }
    }
    foreign = {
        "metadata": {
            "name": "ft-node-1",
            "uid": "p1",
            "ownerReferences": [{"uid": "other", "controller": True}],
            "labels": {"finetune.dev/attempt": "0"},
        }
    }
    plan = create_rejected(
        read_job(job({"attempt": 0})),
        read_pods([created, foreign]),
        what="Pod ft-node-1",
        code=403,
        now=NOW,
        settings=Settings(),
        message='pods "ft-node-1" is forbidden: exceeded quota: gpus',
    )
    assert [d.name for d in plan.delete] == ["ft-node-0"] and plan.requeue_after == 30.0
    assert plan.status.state == "Pending"
    # the deleted rank's own events do not re-create the gang at once: the retry waits 30 s
    deleting = {"metadata": {**created["metadata"], "deletionTimestamp": ts(NOW)}}
    assert decided(job(plan.status), [deleting], now=NOW + timedelta(seconds=1), settings=Settings()).create == []
    assert decided(job(plan.status), [deleting], now=NOW + timedelta(seconds=31), settings=Settings()).create == []
    retry = decided(job(plan.status), [], now=NOW + timedelta(seconds=31), settings=Settings())
    assert [o["metadata"]["name"] for o in retry.create if o["kind"] == "Pod"] == ["ft-node-0"]
    pss = create_rejected(
        read_job(job({"attempt": 0}, podDisruptionBudget={"enabled": True})),
        [],
        what="Pod ft-node-0",
        code=403,
        now=NOW,
        settings=Settings(),
        message='pods "ft-node-0" is forbidden: violates PodSecurity "restricted:latest"',
    )
    assert pss.status.state == "Failed" and pss.delete_objects == [("PodDisruptionBudget", "ft")]
    assert pss.status.failure is not None and "enforce=privileged" in pss.status.failure.message


def test_a_retained_output_claim_is_checked_before_reuse() -> None:
    spec = parse_spec(spec_dict(nodes=2, output={"volumeClaimTemplate": TEMPLATE}))
    v = check_claims("ft", spec, {"ft-output": pvc(["ReadWriteOnce"])})
    assert v is not None and "spec.output.volumeClaimTemplate" in v.message and "ft-output" in v.message


@pytest.mark.parametrize(
    ("shm", "memory", "ok"),
    [("1Gi", "16Gi", True), ("16Gi", "16Gi", False), ("2G", "1Gi", False), ("512Mi", "1Gi", True)],
)
def test_shm_must_fit_under_the_memory_limit(shm: str, memory: str, ok: bool) -> None:
    spec = spec_dict(shmSize=shm, resources={"limits": {"memory": memory}})
    if ok:
        parse_spec(spec)
        return
    with pytest.raises(SpecError) as e:
        parse_spec(spec)
    assert e.value.field == "spec.shmSize" and memory in e.value.message


def test_shared_cache_is_mounted_and_named_in_the_config() -> None:
    spec = parse_spec(spec_dict(model={"name": "org/model"}, cache={"claimName": "hf"}))
    pod = build_pod(REF, spec, rank=0, attempt=0, settings=Settings())
    c = pod["spec"]["containers"][0]
    assert {"name": "hf-cache", "mountPath": "/cache"} in c["volumeMounts"]
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf"}} in pod["spec"]["volumes"]
    assert {"name": "HF_HOME", "value": "/cache/huggingface"} in c["env"]
    assert trainer_config(REF, spec)["cache"] == {"path": "/cache/huggingface"}
    assert "cache" not in trainer_config(REF, parse_spec(spec_dict()))
    with pytest.raises(SpecError) as e:
        parse_spec(
            spec_dict(
                cache={"claimName": "hf"},
                podTemplate={"volumes": [{"name": "x", "mountPath": "/cache/extra", "emptyDir": {}}]},
            )
        )
    assert e.value.field == "spec.podTemplate.volumes[0].mountPath"


def test_integer_quantities_reach_the_pod_as_strings() -> None:
    """The CRD accepts `nvidia.com/gpu: 8`; the Pod API's ResourceList takes quantity strings (the Python client
    refuses an int before sending), which crashed every pass of a GPU job until found by the scheduling tests."""
    spec = parse_spec(spec_dict(resources={"limits": {"nvidia.com/gpu": 8, "memory": "64Gi"}, "requests": {"cpu": 4}}))
    res = build_pod(REF, spec, rank=0, attempt=0, settings=Settings())["spec"]["containers"][0]["resources"]
    assert res == {"limits": {"nvidia.com/gpu": "8", "memory": "64Gi"}, "requests": {"cpu": "4"}}
