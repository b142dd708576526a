"""Runtimes: the precedence rule (finetune_operator.runtimes.merge), which runtime a job gets, the guardrail layers and
what an attempt records, decided through the same pure core the controller runs."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from finetune_operator import runtimes
from finetune_operator.placement import Topology
from finetune_operator.runtimes import CLUSTER_KIND, NAMESPACED_KIND, Choice, choose, merge, read_runtime, resolve
from finetune_operator.settings import Settings
from finetune_operator.spec import RuntimeRef, SpecError
from finetune_operator.state import read_job

from tests.unit.factories import NOW, STARTED, base_spec, decided, job, running

pytestmark = pytest.mark.unit


def runtime(
    name: str = "gpu",
    *,
    kind: str = CLUSTER_KIND,
    generation: int = 3,
    default: bool = False,
    created: str = "2026-12-01T00:00:00Z",
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "generation": generation, "uid": f"rt-{name}", "creationTimestamp": created}
    if kind == NAMESPACED_KIND:
        meta["namespace"] = "ns"
    if default:
        meta["annotations"] = {runtimes.DEFAULT_ANNOTATION: "true"}
    return {"apiVersion": "finetune.dev/v1alpha1", "kind": kind, "metadata": meta, "spec": spec}


TEMPLATE = {
    "podTemplate": {
        "nodeSelector": {"pool": "a100", "zone": "z1"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "batch",
        "volumes": [{"name": "hf", "mountPath": "/hf", "persistentVolumeClaim": {"claimName": "hf-cache"}}],
    },
    "resources": {"limits": {"nvidia.com/gpu": 8, "memory": "512Gi"}},
    "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "NCCL_IB_HCA", "value": "mlx5"}],
    "queueName": "team-a",
    "training": {"precision": "bf16", "checkpointEverySteps": 200},
    "output": {
        "volumeClaimTemplate": {
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Ti"}}}
        }
    },
}


def test_a_field_the_job_sets_wins_maps_merge_by_key_lists_by_name_tolerations_add_up() -> None:
    own = base_spec(
        podTemplate={
            "nodeSelector": {"zone": "z2"},
            "tolerations": [{"key": "spot", "operator": "Exists"}],
            "volumes": [{"name": "hf", "mountPath": "/hf", "persistentVolumeClaim": {"claimName": "mine"}}],
        },
        resources={"limits": {"nvidia.com/gpu": 4}},
        env=[{"name": "NCCL_DEBUG", "value": "INFO"}],
        training={"maxSteps": 10, "precision": "fp16"},
    )
    merged, sources = merge(own, TEMPLATE)
    pt = merged["podTemplate"]
    assert pt["nodeSelector"] == {"pool": "a100", "zone": "z2"}  # key by key, the job's key wins
    assert pt["tolerations"] == [TEMPLATE["podTemplate"]["tolerations"][0], {"key": "spot", "operator": "Exists"}]
    assert pt["volumes"] == own["podTemplate"]["volumes"]  # by name: the job's entry wins
    assert pt["priorityClassName"] == "batch"  # the job left it out
    assert merged["resources"] == {"limits": {"nvidia.com/gpu": 4, "memory": "512Gi"}}
    assert merged["env"] == [{"name": "NCCL_IB_HCA", "value": "mlx5"}, {"name": "NCCL_DEBUG", "value": "INFO"}]
    assert merged["training"] == {"maxSteps": 10, "precision": "fp16", "checkpointEverySteps": 200}
    assert merged["output"] == {"claimName": "o"}  # the job names its claim: no template added
    assert merged["queueName"] == "team-a"
    assert sources["podTemplate.nodeSelector"] == "job + runtime"
    assert sources["podTemplate.priorityClassName"] == "runtime"
    assert sources["training.precision"] == "job"
    assert "output.volumeClaimTemplate" in sources and sources["output.volumeClaimTemplate"] == "job"
    assert own["podTemplate"]["nodeSelector"] == {"zone": "z2"}  # the job's spec itself is left alone


def test_a_job_without_an_output_claim_takes_the_runtimes_template() -> None:
    own = base_spec()
    del own["output"]
    with pytest.raises(SpecError, match=r"spec\.output: set spec\.output\.claimName"):
        resolve(own, Choice(None, "none"), Settings())
    eff = resolve(own, Choice(read_runtime(runtime(template=TEMPLATE)), "spec.runtimeRef"), Settings())
    assert eff.spec.output.template == TEMPLATE["output"]["volumeClaimTemplate"]
    assert {
        "field": "spec.output.volumeClaimTemplate",
        "source": "runtime: spec.template",
    }.items() <= next(v.to_wire() for v in eff.values if v.field == "spec.output.volumeClaimTemplate").items()


def test_which_runtime_the_namespace_default_before_the_clusters_the_newest_of_several() -> None:
    ref = RuntimeRef("gpu")
    missing = choose(ref, "ns", named=None)
    assert missing.runtime is None and missing.error is not None
    assert "ClusterFineTuneRuntime 'gpu' does not exist in the cluster" in missing.error
    ns_missing = choose(RuntimeRef("mine", NAMESPACED_KIND), "ns", named=None)
    assert "FineTuneRuntime 'mine' does not exist in namespace ns" in (ns_missing.error or "")
    named = choose(ref, "ns", named=runtime(), namespaced=[runtime("other", kind=NAMESPACED_KIND, default=True)])
    assert named.runtime is not None and named.runtime.name == "gpu" and named.how == "spec.runtimeRef"
    old, new = (runtime("old", default=True, created="2026-01-01T00:00:00Z"), runtime("new", default=True))
    cluster = choose(None, "ns", namespaced=[runtime("plain", kind=NAMESPACED_KIND)], cluster=[old, new, runtime("x")])
    assert cluster.runtime is not None and cluster.runtime.name == "new"
    assert cluster.how == "the cluster's default (newest of 2 defaults)"
    local = choose(None, "ns", namespaced=[runtime("team", kind=NAMESPACED_KIND, default=True)], cluster=[new])
    assert local.runtime is not None and (local.runtime.name, local.how) == ("team", "the namespace's default")
    assert choose(None, "ns", cluster=[runtime("x")]) == Choice(None, "none")


def test_effective_values_name_their_sources() -> None:
    helm = Settings(trainer_tolerations=({"key": "legacy", "operator": "Exists"},), allowed_schedulers=("volcano",))
    rt = runtime(images={"default": "registry.corp/ml/trainer:2"}, template=TEMPLATE, guardrails={"maxNodesPerJob": 4})
    eff = resolve(base_spec(training={"maxSteps": 10, "precision": "fp32"}), Choice(read_runtime(rt), "x"), helm)
    shown = {(v.field, v.source) for v in eff.values}
    label = "runtime"
    assert ("spec.image", f"{label}: spec.images.default") in shown
    assert ("spec.training.precision", "job") in shown
    assert ("spec.queueName", f"{label}: spec.template") in shown
    assert ("spec.podTemplate.tolerations", "Helm value trainer.tolerations (deprecated: set it in a runtime)") in shown
    assert ("guardrails.allowedSchedulers", "Helm value") in shown
    assert ("guardrails.maxNodesPerJob", f"{label}: spec.guardrails") in shown
    assert eff.settings.default_image == "registry.corp/ml/trainer:2" and eff.settings.ort_image == Settings.ort_image
    assert eff.spec.training.precision == "fp32" and eff.spec.gpus_per_node == 8


def test_a_bad_value_from_the_runtime_names_the_runtime() -> None:
    rt = runtime(
        template={"training": {"precision": "bf16"}, "shmSize": "2Gi", "resources": {"limits": {"memory": "1Gi"}}}
    )
    with pytest.raises(SpecError) as e:
        resolve(base_spec(), Choice(read_runtime(rt), "spec.runtimeRef"), Settings())
    assert "spec.shmSize" in str(e.value) and "the value comes from ClusterFineTuneRuntime gpu" in str(e.value)


# -- through the reconcile decision ---------------------------------------------------------------------------------


def chosen(obj: dict[str, Any]) -> Any:
    return runtimes.Choice(read_runtime(obj), "spec.runtimeRef")


def observed(obj: dict[str, Any] | None, ref: str = "gpu") -> Any:
    from finetune_operator.admission import Observed

    return Observed(runtime=choose(RuntimeRef(ref), "ns", named=obj))


def trainer_pods(plan: Any) -> list[dict[str, Any]]:
    return [o for o in plan.create if o["kind"] == "Pod"]


def test_an_attempt_runs_with_its_runtime_and_records_it() -> None:
    rt = runtime(images={"default": "registry.corp/ml/trainer:2"}, template=TEMPLATE)
    plan = decided(job(runtimeRef={"name": "gpu"}, nodes=2), observed=observed(rt))
    assert plan.status.state == "Created"
    pods = trainer_pods(plan)
    spec0 = pods[0]["spec"]
    assert spec0["containers"][0]["image"] == "registry.corp/ml/trainer:2"
    assert spec0["nodeSelector"] == {"pool": "a100", "zone": "z1"} and spec0["priorityClassName"] == "batch"
    assert spec0["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert {"name": "NCCL_IB_HCA", "value": "mlx5"} in spec0["containers"][0]["env"]
    assert pods[0]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    config = next(o for o in plan.create if o["kind"] == "ConfigMap")
    assert '"bf16"' in config["data"]["config.json"]
    record = plan.status.runtime
    assert record is not None
    assert {k: record[k] for k in ("kind", "name", "generation", "attempt", "chosenBy")} == {
        "kind": CLUSTER_KIND,
        "name": "gpu",
        "generation": 3,
        "attempt": 0,
        "chosenBy": "spec.runtimeRef",
    }
    assert any("runtime ClusterFineTuneRuntime gpu (generation 3)" in e.message for e in plan.events)
    # every later pass of the attempt reads the spec it was built from, whatever the runtime says now
    later = read_job(job(plan.status, runtimeRef={"name": "gpu"}, nodes=2))
    assert later.spec is not None and later.spec.gpus_per_node == 8 and later.spec.training.precision == "bf16"


def test_an_edited_runtime_applies_to_the_next_attempt_never_to_the_running_one() -> None:
    first = decided(job(runtimeRef={"name": "gpu"}, nodes=2), observed=observed(runtime(template=TEMPLATE)))
    st = first.status
    st.state, st.attempt_start_time = "Running", STARTED_TIME
    edited = runtime(generation=4, template={**TEMPLATE, "queueName": "team-b"})
    watching = decided(
        job(st, runtimeRef={"name": "gpu"}, nodes=2), [running(0), running(1)], observed=observed(edited)
    )
    assert watching.create == [] and watching.status.runtime == st.runtime  # the running attempt is untouched
    failed = decided(
        job(st, runtimeRef={"name": "gpu"}, nodes=2),
        [running(0), running(1, phase="Failed", code=1)],
        observed=observed(edited),
    )
    assert failed.status.state == "Restarting"
    nxt = decided(job(failed.status, runtimeRef={"name": "gpu"}, nodes=2), observed=observed(edited))
    assert (
        nxt.status.runtime is not None and nxt.status.runtime["generation"] == 4 and nxt.status.runtime["attempt"] == 1
    )
    assert trainer_pods(nxt)[0]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-b"


def test_a_runtime_gone_between_attempts_is_waited_for_then_the_job_fails() -> None:
    """A Helm upgrade (or a GitOps sync) deletes and re-creates the chart's runtimes: an attempt that would start in
    between waits, up to the operator's waiting timeout, rather than failing or running without the runtime. A name
    that never existed fails at once."""
    typo = decided(job(runtimeRef={"name": "gpu"}), observed=observed(None))
    assert typo.status.state == "Failed" and typo.status.failure is not None
    assert typo.status.failure.reason == "RuntimeNotFound" and "does not exist" in typo.status.failure.message
    first = decided(job(runtimeRef={"name": "gpu"}, nodes=2), observed=observed(runtime(template=TEMPLATE)))
    st = first.status
    st.state, st.attempt_start_time = "Running", STARTED_TIME
    failed = decided(job(st, runtimeRef={"name": "gpu"}, nodes=2), [running(0), running(1, phase="Failed", code=1)])
    settings = Settings(waiting_timeout_seconds=60)
    gone = decided(job(failed.status, runtimeRef={"name": "gpu"}, nodes=2), observed=observed(None), settings=settings)
    assert gone.status.state == "Restarting" and gone.create == []  # failure: the last attempt's, kept
    created = gone.status.condition("Created")
    assert created is not None and (created.status, created.reason) == (False, "RuntimeNotFound")
    assert "waits for it" in created.message and gone.requeue_after is not None and gone.requeue_after <= 5
    later = decided(
        job(gone.status, runtimeRef={"name": "gpu"}, nodes=2),
        observed=observed(None),
        settings=settings,
        now=NOW + timedelta(seconds=30),
    )
    assert later.status.state == "Restarting" and later.create == []
    back = decided(job(later.status, runtimeRef={"name": "gpu"}, nodes=2), observed=observed(runtime(generation=1)))
    assert back.status.state == "Created" and back.status.runtime is not None and back.status.runtime["generation"] == 1
    timed_out = decided(
        job(later.status, runtimeRef={"name": "gpu"}, nodes=2),
        observed=observed(None),
        settings=settings,
        now=NOW + timedelta(seconds=61),
    )
    assert timed_out.status.state == "Failed" and timed_out.status.failure is not None
    assert timed_out.status.failure.reason == "RuntimeNotFound" and "waited 61s" in timed_out.status.failure.message


def test_a_default_runtime_gone_between_attempts_is_waited_for_another_default_is_taken() -> None:
    from finetune_operator.admission import Observed

    def defaults(*found: dict[str, Any]) -> Any:
        return Observed(runtime=choose(None, "ns", cluster=list(found)))

    first = decided(job(nodes=2), observed=defaults(runtime(default=True, template=TEMPLATE)))
    assert first.status.runtime is not None and first.status.runtime["chosenBy"] == "the cluster's default"
    st = first.status
    st.state, st.attempt_start_time = "Running", STARTED_TIME
    failed = decided(job(st, nodes=2), [running(0), running(1, phase="Failed", code=1)])
    none_left = decided(job(failed.status, nodes=2), observed=defaults())
    waiting = none_left.status.condition("Created")
    assert none_left.create == [] and waiting is not None and waiting.reason == "RuntimeNotFound"
    other = decided(job(failed.status, nodes=2), observed=defaults(runtime("l4", default=True)))
    assert other.status.state == "Created" and other.status.runtime is not None and other.status.runtime["name"] == "l4"


def test_between_attempts_a_job_reads_as_its_own_spec_not_the_last_attempts_runtime() -> None:
    """A suspended job that switches runtimes is not judged by the template of the attempt that ended."""
    first = decided(job(runtimeRef={"name": "gpu"}), observed=observed(runtime(template={"shmSize": "64Gi"})))
    st = first.status
    st.state, st.attempt_start_time = "Running", STARTED_TIME
    suspended = decided(job(st, runtimeRef={"name": "gpu"}, suspend=True), [running(0)])
    assert suspended.status.state == "Suspended"
    switched = job(suspended.status, runtimeRef={"name": "l4"}, suspend=True, resources={"limits": {"memory": "40Gi"}})
    assert read_job(switched).spec is not None  # 64Gi of shm over a 40Gi limit would have been refused
    assert decided(switched).status.state == "Suspended"


def test_a_resource_the_job_names_takes_nothing_from_the_runtime_in_either_map() -> None:
    template = {
        "resources": {"limits": {"nvidia.com/gpu": 8, "memory": "900Gi"}, "requests": {"cpu": "64", "memory": "900Gi"}}
    }
    merged, _ = merge(base_spec(resources={"limits": {"nvidia.com/gpu": 1, "memory": "100Gi"}}), template)
    assert merged["resources"] == {"limits": {"nvidia.com/gpu": 1, "memory": "100Gi"}, "requests": {"cpu": "64"}}


def test_a_cluster_runtime_may_be_kept_to_some_namespaces() -> None:
    team = runtime("team-a-h100", allowedNamespaces=["team-a"], default=True)
    refused = choose(RuntimeRef("team-a-h100"), "ns", named=team)
    assert refused.runtime is None and refused.error is not None and "is not for namespace ns" in refused.error
    assert choose(RuntimeRef("team-a-h100"), "team-a", named=team).runtime is not None
    assert choose(None, "ns", cluster=[team]) == Choice(None, "none")  # nor its default elsewhere


def test_with_an_image_allowlist_a_runtimes_code_loading_env_is_refused_too() -> None:
    """Env from a ConfigMap and volumes are read in the job's namespace, where the tenant writes them: the image pins
    judge the effective spec, a cluster runtime's values included."""
    rt = runtime(
        template={"env": [{"name": "LD_LIBRARY_PATH", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}]}
    )
    helm = Settings(allowed_image_prefixes=("registry.corp/ml",), default_image="registry.corp/ml/trainer:1")
    plan = decided(job(runtimeRef={"name": "gpu"}), observed=observed(rt), settings=helm)
    assert plan.status.failure is not None and "spec.env[0].name: LD_LIBRARY_PATH" in plan.status.failure.message


def test_no_field_a_template_may_set_has_an_api_server_default() -> None:
    """A default the API server fills in counts as set by the job: the runtime's value would never apply. (A parent
    object may default to {}: that sets none of its fields.)"""
    crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "finetune.dev_finetunejobs.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for path in runtimes.TEMPLATE_FIELDS:
        node, parts = spec, path.split(".")
        for depth, part in enumerate(parts):
            node = node["properties"][part]
            leaf = depth == len(parts) - 1
            assert "default" not in node or (not leaf and node["default"] == {}), path


def test_namespace_totals_count_the_gpus_a_runtime_gave_an_admitted_job() -> None:
    from finetune_operator.admission import usage_of

    first = decided(job(runtimeRef={"name": "gpu"}, nodes=2), observed=observed(runtime(template=TEMPLATE)))
    other = job(first.status, runtimeRef={"name": "gpu"}, nodes=2, uid="uid-2")
    other["status"]["state"] = "Created"
    held = usage_of([other], exclude_uid="uid-1")
    assert (held.jobs, held.nodes, held.gpus) == (1, 2, 16)


def test_both_guardrail_layers_apply_and_name_where_they_are_set() -> None:
    strict = runtime(guardrails={"maxNodesPerJob": 2, "allowTrustRemoteCode": False})
    over = decided(job(runtimeRef={"name": "gpu"}, nodes=3), observed=observed(strict))
    assert over.status.state == "Failed" and over.status.failure is not None
    assert over.status.failure.reason == "QuotaExceeded"
    assert "ClusterFineTuneRuntime gpu (generation 3): spec.guardrails.maxNodesPerJob" in over.status.failure.message
    # the operator's own guardrails still bind a job whose runtime sets none
    helm = Settings(max_nodes_per_job=1)
    loose = decided(job(runtimeRef={"name": "gpu"}, nodes=2), observed=observed(runtime()), settings=helm)
    assert loose.status.failure is not None and "Helm value guardrails.maxNodesPerJob" in loose.status.failure.message
    remote = decided(
        job(runtimeRef={"name": "gpu"}, model={"path": "/m", "trustRemoteCode": True}), observed=observed(strict)
    )
    assert remote.status.failure is not None and "spec.guardrails.allowTrustRemoteCode" in remote.status.failure.message


def test_allowlists_judge_what_the_job_asks_for_not_what_its_runtime_adds() -> None:
    rt = runtime(
        template={"podTemplate": {"tolerations": [{"key": "dedicated", "operator": "Exists"}], "schedulerName": "kai"}},
        guardrails={"allowedTolerationKeys": ["spot"], "allowedSchedulers": ["volcano"]},
    )
    ok = decided(job(runtimeRef={"name": "gpu"}), observed=observed(rt))
    assert ok.status.state == "Created"
    assert trainer_pods(ok)[0]["spec"]["schedulerName"] == "kai"
    refused = decided(
        job(runtimeRef={"name": "gpu"}, podTemplate={"tolerations": [{"key": "team-b", "operator": "Exists"}]}),
        observed=observed(rt),
    )
    assert refused.status.failure is not None
    assert "spec.podTemplate.tolerations[0].key: team-b" in refused.status.failure.message
    assert "spec.guardrails.allowedTolerationKeys" in refused.status.failure.message


def test_the_runtimes_queue_satisfies_a_required_queue_and_its_image_is_judged_by_the_helm_allowlist() -> None:
    rt = runtime(images={"default": "docker.io/x/trainer:1"}, template={"queueName": "team-a"})
    helm = Settings(require_queue_name=True, allowed_image_prefixes=("registry.corp/ml",))
    plan = decided(job(runtimeRef={"name": "gpu"}), observed=observed(rt), settings=helm)
    assert plan.status.failure is not None
    assert "docker.io/x/trainer:1" in plan.status.failure.message
    assert "ClusterFineTuneRuntime gpu (generation 3): spec.images.default" in plan.status.failure.message
    good = runtime(images={"default": "registry.corp/ml/trainer:1"}, template={"queueName": "team-a"})
    assert decided(job(runtimeRef={"name": "gpu"}), observed=observed(good), settings=helm).status.state == "Created"


def test_without_a_runtime_a_job_runs_as_before() -> None:
    plan = decided(job(nodes=2))
    assert plan.status.state == "Created" and plan.status.runtime is not None
    assert plan.status.runtime["chosenBy"] == "none" and "name" not in plan.status.runtime
    assert trainer_pods(plan)[0]["spec"]["containers"][0]["image"] == Settings.default_image


STARTED_TIME = read_job(job(dict(STARTED))).status.attempt_start_time


def test_a_job_with_no_output_claim_and_no_runtime_to_give_one_is_refused_naming_the_field() -> None:
    """The API server accepts a job without spec.output (its runtime may give the claim template); the operator
    refuses it when the attempt would start and nothing gives one."""
    wire = job()
    del wire["spec"]["output"]
    plan = decided(wire)
    assert plan.status.state == "Failed" and plan.create == []
    assert plan.status.failure is not None and plan.status.failure.reason == "InvalidSpec"
    assert plan.status.failure.message.startswith("spec.output: set spec.output.claimName")
    rt = runtime(template={"output": TEMPLATE["output"]})
    given = decided(wire, observed=observed(rt))
    assert given.status.state == "Created"
    claim = next(o for o in given.create if o["kind"] == "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == "ft-output" and claim["spec"]["resources"]["requests"]["storage"] == "1Ti"


def test_a_namespace_runtime_cannot_widen_the_operators_allowlists() -> None:
    """A FineTuneRuntime is written by the namespace's admins: what its template adds is judged by the operator's
    (Helm) allowlists as the job's own would be; a ClusterFineTuneRuntime's is the platform's."""
    helm = Settings(allowed_toleration_keys=("spot",), allowed_priority_classes=("batch",))
    widening = {"podTemplate": {"tolerations": [{"operator": "Exists"}], "priorityClassName": "system-node-critical"}}
    local = runtime("team", kind=NAMESPACED_KIND, template=widening)
    plan = decided(
        job(runtimeRef={"name": "team", "kind": NAMESPACED_KIND}),
        observed=_observed_ns(local),
        settings=helm,
    )
    assert plan.status.failure is not None and plan.create == []
    assert "system-node-critical" in plan.status.failure.message
    assert "Helm value guardrails.allowedPriorityClasses" in plan.status.failure.message
    keyless = runtime("team", kind=NAMESPACED_KIND, template={"podTemplate": {"tolerations": [{"operator": "Exists"}]}})
    refused = decided(
        job(runtimeRef={"name": "team", "kind": NAMESPACED_KIND}), observed=_observed_ns(keyless), settings=helm
    )
    assert refused.status.failure is not None and "every taint" in refused.status.failure.message
    platform = runtime(template=widening)
    assert (
        decided(job(runtimeRef={"name": "gpu"}), observed=observed(platform), settings=helm).status.state == "Created"
    )


def _observed_ns(obj: dict[str, Any]) -> Any:
    from finetune_operator.admission import Observed

    return Observed(runtime=choose(RuntimeRef(obj["metadata"]["name"], NAMESPACED_KIND), "ns", named=obj))


def test_an_error_from_mixing_the_job_and_its_runtime_names_the_runtime() -> None:
    rt = runtime(template={"resources": {"limits": {"nvidia.com/gpu": 1}}})
    with pytest.raises(SpecError) as e:
        resolve(base_spec(procsPerNode=4), Choice(read_runtime(rt), "spec.runtimeRef"), Settings())
    assert e.value.field == "spec.procsPerNode" and "with ClusterFineTuneRuntime gpu (generation 3)'s template" in str(
        e.value
    )
    own = base_spec(procsPerNode=4, resources={"limits": {"nvidia.com/gpu": 2}})
    with pytest.raises(SpecError) as e:
        resolve(own, Choice(read_runtime(rt), "spec.runtimeRef"), Settings())
    assert "ClusterFineTuneRuntime" not in str(e.value)  # the job's own error


def test_training_settings_a_runtime_gave_stay_those_of_the_first_attempt() -> None:
    """A namespace default made after admission, or an edited runtime, changes what the next attempt runs with (its
    image, its pods) but never the run's training settings: a run resumed in another precision or checkpoint cadence
    is not the run admitted (spec.training is immutable for the same reason). A setting the first attempt took from no
    runtime stays the operator's default."""
    from finetune_operator.admission import Observed

    def defaults(namespaced: list[dict[str, Any]], cluster: list[dict[str, Any]]) -> Any:
        return Observed(runtime=choose(None, "ns", namespaced=namespaced, cluster=cluster))

    cluster_default = runtime("c", default=True, template={"training": {"precision": "bf16"}})
    first = decided(job(nodes=2), observed=defaults([], [cluster_default]))
    assert first.status.runtime is not None
    assert first.status.runtime["training"]["training.precision"] == "bf16"
    assert first.status.runtime["training"]["training.checkpointEverySteps"] is None
    st = first.status
    st.state, st.attempt_start_time = "Running", STARTED_TIME
    evicted = decided(job(st, nodes=2), [running(0), running(1, phase="Failed", code=1)])
    assert evicted.status.state == "Restarting"
    changed = {"precision": "fp16", "checkpointEverySteps": 1000000, "keepCheckpoints": 1}
    namespace_default = runtime(
        "n", kind=NAMESPACED_KIND, default=True, template={"training": changed, "shmSize": "2Gi"}
    )
    nxt = decided(job(evicted.status, nodes=2), observed=defaults([namespace_default], [cluster_default]))
    assert nxt.status.state == "Created" and nxt.status.runtime is not None and nxt.status.runtime["name"] == "n"
    config = next(o for o in nxt.create if o["kind"] == "ConfigMap")["data"]["config.json"]
    assert '"precision": "bf16"' in config and "1000000" not in config, config
    assert nxt.status.runtime["training"] == first.status.runtime["training"]  # carried to every later attempt
    later = read_job(job(nxt.status, nodes=2))  # every later pass of the attempt reads the spec its pods run
    assert later.spec is not None and later.spec.training.precision == "bf16"
    assert later.spec.training.checkpoint_every_steps != 1000000
    pods = trainer_pods(nxt)
    shm = next(v for v in pods[0]["spec"]["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["sizeLimit"] == "2Gi"  # the pods take the new runtime
    # validate and `finetune status` say where the pinned value comes from
    shown = {v["field"]: v["source"] for v in nxt.status.runtime["values"]}
    assert shown["spec.training.precision"].endswith("(as at the job's first attempt)"), shown
    own = decided(
        job(evicted.status, nodes=2, training={"maxSteps": 10, "precision": "fp32"}),
        observed=defaults([], [cluster_default]),
    )
    assert own.status.runtime is not None  # a setting the job made itself is the job's, at every attempt
    assert {v["field"]: v["source"] for v in own.status.runtime["values"]}["spec.training.precision"] == "job"


def test_a_namespace_default_cannot_drop_the_cluster_defaults_guardrails() -> None:
    """The platform's cluster default sets guardrails; a namespace's admins make a default of their own without any:
    the cluster default's guardrails still judge every job of the namespace, and the namespace runtime's own values
    as the job's (its admins wrote them). Named explicitly with runtimeRef, the same. A cluster runtime the job names
    instead is the platform's own choice: its guardrails replace the default's."""
    from finetune_operator.admission import Observed

    platform = runtime("c", default=True, guardrails={"maxGpusPerJob": 8, "allowedSchedulers": ["default-scheduler"]})
    loose = runtime("n", kind=NAMESPACED_KIND, default=True)
    big = {"nodes": 2, "resources": {"limits": {"nvidia.com/gpu": 8}}}
    by_default = decided(
        job(**big), observed=Observed(runtime=choose(None, "ns", namespaced=[loose], cluster=[platform]))
    )
    assert by_default.status.state == "Failed" and by_default.status.failure is not None
    message = by_default.status.failure.message
    assert "ClusterFineTuneRuntime c (generation 3), the cluster's default" in message and "maxGpusPerJob" in message
    sched = runtime("n", kind=NAMESPACED_KIND, default=True, template={"podTemplate": {"schedulerName": "mine"}})
    small = decided(job(), observed=Observed(runtime=choose(None, "ns", namespaced=[sched], cluster=[platform])))
    assert small.status.failure is not None and "spec.podTemplate.schedulerName: mine" in small.status.failure.message
    named = choose(RuntimeRef("n", NAMESPACED_KIND), "ns", named=loose, cluster=[platform])
    assert named.floor is not None and named.floor.name == "c"
    assert decided(job(**big), observed=Observed(runtime=named)).status.state == "Failed"
    other = choose(RuntimeRef("gpu"), "ns", named=runtime(), cluster=[platform])
    assert other.floor is None and decided(job(**big), observed=Observed(runtime=other)).status.state == "Created"


def test_a_runtime_template_too_large_for_the_jobs_status_refuses_the_job_before_any_pod() -> None:
    """Each attempt copies the template into status.runtime: a namespace default of 40 env values of 32 KiB (which
    the runtime's schema allows) would make every status write of every job in the namespace fail after its pods were
    created. Refused at admission instead, naming the runtime and the fix."""
    huge = runtime(template={"env": [{"name": f"E{i:02}", "value": "x" * 32 * 1024} for i in range(40)]})
    plan = decided(job(runtimeRef={"name": "gpu"}), observed=observed(huge))
    assert plan.status.state == "Failed" and plan.create == [] and plan.status.failure is not None
    message = plan.status.failure.message
    assert plan.status.failure.reason == "InvalidSpec" and "ClusterFineTuneRuntime gpu (generation 3)" in message
    assert "1281 KiB, over the 64 KiB" in message and "by reference" in message, message
    fits = runtime(template={"env": [{"name": "E", "value": "x" * 32 * 1024}]})
    assert decided(job(runtimeRef={"name": "gpu"}), observed=observed(fits)).status.state == "Created"


def test_a_runtimes_topology_places_its_jobs_unless_a_job_sets_its_own_and_never_an_elastic_one() -> None:
    """spec.topology merges whole: the runtime's for a job without one, the job's own wins; a runtime's required
    topology on an elastic job is refused naming the field and the runtime."""
    rt = Choice(read_runtime(runtime(template={"topology": {"required": "rack"}})), "spec.runtimeRef")
    assert resolve(base_spec(nodes=2), rt, Settings()).spec.topology == Topology("required", "rack")
    own = base_spec(nodes=2, topology={"preferred": "block"})
    assert resolve(own, rt, Settings()).spec.topology == Topology("preferred", "block")
    with pytest.raises(SpecError) as e:
        resolve(base_spec(nodes=2, elastic={"minNodes": 1}), rt, Settings())
    assert e.value.field == "spec.topology.required" and "ClusterFineTuneRuntime gpu" in str(e.value), e.value
