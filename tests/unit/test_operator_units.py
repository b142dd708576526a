"""Pure layers of the operator: spec parsing, builders, failure classification, lifecycle decisions."""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from finetune_operator.builders import JobRef, build_pod, env_contract, trainer_config
from finetune_operator.failures import classify_pod, waiting_problem
from finetune_operator.settings import Settings
from finetune_operator.spec import SpecError, parse_spec
from finetune_operator.status import Progress, ts

from tests.unit.factories import NOW, REF, STARTED, base_spec, decided, job, pod, running
from tests.waiting import wait_for

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "finetune.dev_finetunejobs.yaml").read_text())
SPEC_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
# -- spec ------------------------------------------------------------------------------------------------


def _crd_default(path: list[str]) -> Any:
    """The CRD's default, or for a field a runtime's template may set (which the API server must not default) the
    default its description documents ("Default `X` unless the job's runtime sets one")."""
    node = SPEC_SCHEMA
    for p in path:
        node = node["properties"][p]
    if "default" in node:
        return node["default"]
    documented = re.search(r"Default `([^`]+)` unless the job's runtime sets one", node.get("description", ""))
    return yaml.safe_load(documented.group(1)) if documented else None


@pytest.mark.parametrize(
    ("crd_path", "attr"),
    [
        (["task"], lambda s: s.task),
        (["acceleration"], lambda s: s.acceleration),
        (["nodes"], lambda s: s.nodes),
        (["maxRestarts"], lambda s: s.max_restarts),
        (["terminationGracePeriodSeconds"], lambda s: s.termination_grace_period_seconds),
        (["rendezvousTimeoutSeconds"], lambda s: s.rendezvous_timeout_seconds),
        (["shmSize"], lambda s: s.shm_size),
        (["training", "perDeviceBatchSize"], lambda s: s.training.per_device_batch_size),
        (["training", "gradientAccumulationSteps"], lambda s: s.training.gradient_accumulation_steps),
        (["training", "learningRate"], lambda s: s.training.learning_rate),
        (["training", "maxSeqLength"], lambda s: s.training.max_seq_length),
        (["training", "precision"], lambda s: s.training.precision),
        (["training", "seed"], lambda s: s.training.seed),
        (["training", "checkpointEverySteps"], lambda s: s.training.checkpoint_every_steps),
        (["training", "keepCheckpoints"], lambda s: s.training.keep_checkpoints),
        (["dataset", "split"], lambda s: s.dataset.split),
        (["dataset", "textField"], lambda s: s.dataset.text_field),
        (["dataset", "labelField"], lambda s: s.dataset.label_field),
    ],
    ids=lambda x: ".".join(x) if isinstance(x, list) else "",
)
def test_parser_defaults_agree_with_the_crd(crd_path, attr) -> None:  # type: ignore[no-untyped-def]
    assert attr(parse_spec(base_spec())) == _crd_default(crd_path)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (base_spec(model={"path": "/m", "name": "bert"}), "spec.model"),
        (base_spec(dataset={}), "spec.dataset"),
        (base_spec(training={"maxSteps": 1, "epochs": 1}), "spec.training"),
        (base_spec(training={"extraArgs": {"learning_rate": 1}}), "spec.training.extraArgs.learning_rate"),
        (base_spec(procsPerNode=2, resources={"limits": {"nvidia.com/gpu": 4}}), "spec.procsPerNode"),
        (base_spec(env=[{"name": "PET_NNODES", "value": "9"}]), "spec.env[0].name"),
        (
            base_spec(podTemplate={"volumes": [{"name": "x", "mountPath": "/etc/finetune/x", "emptyDir": {}}]}),
            "spec.podTemplate.volumes[0].mountPath",
        ),
        (
            base_spec(podTemplate={"volumes": [{"name": "output", "mountPath": "/data", "emptyDir": {}}]}),
            "spec.podTemplate.volumes",
        ),
        (
            base_spec(task="causal-lm", training={"lora": {"r": 4, "quantization": "4bit"}}),
            "spec.training.lora.quantization",
        ),
        (
            base_spec(
                task="causal-lm",
                resources={"limits": {"nvidia.com/gpu": 1}},
                model={"name": "m", "initFromConfig": True},
                training={"lora": {"r": 4, "quantization": "4bit"}},
            ),
            "spec.training.lora.quantization",
        ),
        (base_spec(task="causal-lm", acceleration="ort", training={"sharding": "fsdp"}), "spec.training.sharding"),
        (base_spec(output={"claimName": "o", "pushToHub": {"repo": "a/b"}}), "spec.output.pushToHub.secretRef"),
    ],
    ids=[
        "model-both",
        "dataset-none",
        "epochs-and-steps",
        "managed-arg",
        "procs-vs-gpus",
        "reserved-env",
        "mount-overlap",
        "volume-name-clash",
        "qlora-without-gpus",
        "qlora-random-init",
        "fsdp-on-ort",
        "push-without-token",
    ],
)
def test_semantic_errors_name_the_field(spec, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError) as e:
        parse_spec(spec)
    assert e.value.field == field


def test_procs_per_node_derives_from_gpus() -> None:
    s = parse_spec(base_spec(nodes=2, resources={"limits": {"nvidia.com/gpu": 8}}))
    assert (s.procs_per_node, s.gpus_per_node, s.world_size) == (8, 8, 16)
    assert parse_spec(base_spec()).training.epochs is None
    assert parse_spec(base_spec(training={})).training.epochs == 1.0


# -- builders ---------------------------------------------------------------------------------------------


def test_env_contract_world_size_counts_processes() -> None:
    spec = parse_spec(base_spec(nodes=3, resources={"limits": {"nvidia.com/gpu": 4}}))
    env = {e["name"]: e["value"] for e in env_contract(REF, spec, rank=2, attempt=5)}
    assert env["WORLD_SIZE"] == "12" and env["PET_NPROC_PER_NODE"] == "4" and env["NODE_RANK"] == "2"
    assert env["FINETUNE_ATTEMPT"] == "5" and env["MASTER_ADDR"] == "ft-node-0.ft"


def test_platform_defaults_for_trainer_pods_sit_under_the_jobs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's trainer.nodeSelector/tolerations/priorityClassName/imagePullSecrets, read from the env the chart
    writes: the job's node labels win key by key, tolerations and pull secrets add up, the priority class is the
    job's when it names one."""
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    monkeypatch.setenv("FINETUNE_TRAINER_NODE_SELECTOR", '{"pool": "gpu", "zone": "a"}')
    monkeypatch.setenv(
        "FINETUNE_TRAINER_TOLERATIONS", '[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]'
    )
    monkeypatch.setenv("FINETUNE_TRAINER_PRIORITY_CLASS", "training")
    monkeypatch.setenv("FINETUNE_TRAINER_IMAGE_PULL_SECRETS", "registry-cred")
    settings = Settings.from_env()
    bare = build_pod(REF, parse_spec(base_spec()), rank=0, attempt=0, settings=settings)["spec"]
    assert bare["nodeSelector"] == {"pool": "gpu", "zone": "a"} and bare["tolerations"] == [gpu]
    assert bare["priorityClassName"] == "training" and bare["imagePullSecrets"] == [{"name": "registry-cred"}]
    spot = {"key": "spot", "operator": "Exists"}
    own = parse_spec(
        base_spec(
            podTemplate={
                "nodeSelector": {"zone": "b"},
                "tolerations": [spot, gpu],
                "priorityClassName": "urgent",
                "imagePullSecrets": [{"name": "team-cred"}],
            }
        )
    )
    mine = build_pod(REF, own, rank=0, attempt=0, settings=settings)["spec"]
    assert mine["nodeSelector"] == {"pool": "gpu", "zone": "b"}
    assert mine["tolerations"] == [spot, gpu]  # no duplicate of the platform's
    assert mine["priorityClassName"] == "urgent"
    assert mine["imagePullSecrets"] == [{"name": "team-cred"}, {"name": "registry-cred"}]
    monkeypatch.setenv("FINETUNE_TRAINER_TOLERATIONS", '{"not": "a list"}')
    with pytest.raises(ValueError, match="FINETUNE_TRAINER_TOLERATIONS: expected a JSON list"):
        Settings.from_env()


def test_backstop_stale_limit_is_read_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env().backstop_stale_seconds == 120
    monkeypatch.setenv("FINETUNE_BACKSTOP_STALE_SECONDS", "30")
    assert Settings.from_env().backstop_stale_seconds == 30
    monkeypatch.setenv("FINETUNE_BACKSTOP_STALE_SECONDS", "0")  # would fail every liveness check: a restart loop
    with pytest.raises(ValueError, match="FINETUNE_BACKSTOP_STALE_SECONDS=0: must be at least 2"):
        Settings.from_env()


def test_pod_is_restricted_and_uses_references_for_secrets() -> None:
    spec = parse_spec(
        base_spec(
            nodes=2, hfTokenSecretRef={"name": "hf"}, resources={"limits": {"nvidia.com/gpu": 1}}, queueName="team-a"
        )
    )
    pod = build_pod(REF, spec, rank=1, attempt=2, settings=Settings())
    c = pod["spec"]["containers"][0]
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in c["env"]
    assert pod["spec"]["affinity"]["podAntiAffinity"]  # multi-node GPU job: one trainer per machine
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "ft-attempt-2-uid-1"
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    assert c["terminationMessagePolicy"] == "File"  # the trainer's own message, never a tail of its log


def test_trainer_config_resolves_output_and_lora_alpha() -> None:
    spec = parse_spec(base_spec(training={"maxSteps": 5, "lora": {"r": 4}}))
    cfg = trainer_config(REF, spec)
    assert cfg["output"] == {"path": "/output/ns/ft"}
    assert cfg["training"]["lora"] == {
        "r": 4,
        "alpha": 8,
        "dropout": 0.05,
        "targetModules": [],
        "quantization": None,
        "merge": False,
    }


def test_exports_reach_the_trainer_config_and_credentials_only_by_reference() -> None:
    spec = parse_spec(
        base_spec(
            task="causal-lm",
            resources={"limits": {"nvidia.com/gpu": 1}},
            training={
                "maxSteps": 5,
                "lora": {"r": 8, "quantization": "4bit", "merge": True},
                "sharding": "none",
                "activationCheckpointing": True,
            },
            output={
                "claimName": "o",
                "pushToHub": {"repo": "acme/m", "secretRef": {"name": "hub", "key": "write"}},
                "s3": {"uri": "s3://bucket/runs", "endpoint": "http://minio:9000", "secretRef": {"name": "s3"}},
            },
        )
    )
    cfg = trainer_config(REF, spec)
    assert cfg["output"] == {
        "path": "/output/ns/ft",
        "pushToHub": {"repo": "acme/m", "private": True, "endpoint": None},
        "s3": {"uri": "s3://bucket/runs", "endpoint": "http://minio:9000", "region": None},
    }
    assert cfg["training"]["lora"]["quantization"] == "4bit" and cfg["training"]["lora"]["merge"] is True
    assert cfg["training"]["activationCheckpointing"] is True and cfg["training"]["sharding"] == "none"
    env = build_pod(REF, spec, rank=0, attempt=0, settings=Settings())["spec"]["containers"][0]["env"]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]
    }
    assert refs == {
        "FINETUNE_HUB_TOKEN": {"name": "hub", "key": "write"},
        "AWS_ACCESS_KEY_ID": {"name": "s3", "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": "s3", "key": "AWS_SECRET_ACCESS_KEY"},
        "AWS_SESSION_TOKEN": {"name": "s3", "key": "AWS_SESSION_TOKEN", "optional": True},
    }
    assert not any("value" in e and e["name"].startswith(("AWS_ACCESS", "AWS_SECRET", "FINETUNE_HUB")) for e in env)
    # the export runs on rank 0: no other rank gets the write credentials; no rank reaches the node's IAM role
    two = parse_spec({**base_spec(nodes=2), "output": spec_output(spec)})
    rank1 = build_pod(REF, two, rank=1, attempt=0, settings=Settings())["spec"]["containers"][0]["env"]
    assert not [e for e in rank1 if e["name"] in refs]
    assert {"name": "AWS_EC2_METADATA_DISABLED", "value": "true"} in env and {
        "name": "AWS_EC2_METADATA_DISABLED",
        "value": "true",
    } in rank1
    allowed = parse_spec(base_spec(output={"claimName": "o", "s3": {"uri": "s3://b/p", "allowInstanceMetadata": True}}))
    env = build_pod(REF, allowed, rank=0, attempt=0, settings=Settings())["spec"]["containers"][0]["env"]
    assert "AWS_EC2_METADATA_DISABLED" not in {e["name"] for e in env}


def spec_output(spec: Any) -> dict[str, Any]:
    return {
        "claimName": "o",
        "pushToHub": {"repo": spec.output.push_to_hub.repo, "secretRef": {"name": "hub"}},
        "s3": {"uri": spec.output.s3.uri, "secretRef": {"name": "s3"}},
    }


# -- failures ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "reason", "disruption", "permanent"),
    [
        (pod("Failed", code=137, reason="OOMKilled"), "OOMKilled", False, False),
        (
            pod("Failed", code=78, message='{"reason":"ConfigError","message":"dataset.textField: no"}'),
            "ConfigError",
            False,
            True,
        ),
        (pod("Failed", code=75), "RendezvousTimeout", False, False),
        (
            pod("Failed", code=77, message='{"reason":"CUDAOutOfMemory","message":"the GPU ran out of memory"}'),
            "CUDAOutOfMemory",
            False,
            True,
        ),
        (pod("Failed", code=1), "TrainingError", False, False),
        (
            pod("Failed", code=74, message='{"reason":"ExportFailed","message":"push to the Hub repo"}'),
            "ExportFailed",
            False,
            True,
        ),
        (pod("Failed", code=143), "Terminated", True, False),
        (pod("Failed", pod_reason="Evicted"), "Evicted", True, False),
        (
            pod(
                "Running",
                conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
            ),
            "Preempted",
            True,
            False,
        ),
        (pod("Running", deleting=True), "PodDeleted", True, False),
    ],
    ids=["oom", "config", "rendezvous", "cuda-oom", "crash", "export", "sigterm", "evicted", "preempted", "deleted"],
)
def test_classify(p, reason, disruption, permanent) -> None:  # type: ignore[no-untyped-def]
    f = classify_pod(p)
    assert f is not None and (f.reason, f.disruption, f.permanent) == (reason, disruption, permanent)


def test_healthy_pods_have_no_failure_and_waiting_is_explained() -> None:
    assert classify_pod(pod("Running")) is None and classify_pod(pod("Succeeded", code=0)) is None
    w = waiting_problem(pod("Pending", waiting="ImagePullBackOff"))
    assert w is not None and w.fatal
    unsched = pod(
        "Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes have nvidia.com/gpu",
            }
        ],
    )
    w = waiting_problem(unsched)
    assert w is not None and not w.fatal and "nvidia.com/gpu" in w.message


# -- decisions --------------------------------------------------------------------------------------------


def test_first_pass_creates_the_gang_and_a_quiet_pass_writes_nothing() -> None:
    plan = decided(job(nodes=2), [])
    assert [o["kind"] for o in plan.create] == ["NetworkPolicy", "Service", "ConfigMap", "Pod", "Pod"]
    assert plan.status.state == "Created"
    again = decided(job(plan.status, nodes=2), [running(0), running(1)])
    quiet = decided(job(again.status, nodes=2), [running(0), running(1)], now=NOW + timedelta(minutes=5))
    assert quiet.status == again.status and not quiet.create and not quiet.delete and not quiet.events


def test_failure_restarts_whole_gang_and_waits_for_old_pods() -> None:
    plan = decided(job(dict(STARTED), nodes=2), [running(0), running(1, phase="Failed", code=1)])
    assert sorted(d.name for d in plan.delete) == ["ft-node-0", "ft-node-1"]
    assert (plan.status.attempt, plan.status.restarts, plan.status.state) == (1, 1, "Restarting")
    # Old pods still terminating: nothing is created under the same names yet.
    wait = decided(job(plan.status, nodes=2), [running(0), running(1, phase="Failed", code=1)])
    assert wait.create == [] and wait.status.state == "Restarting"
    nxt = decided(job(wait.status, nodes=2), [], now=NOW + timedelta(seconds=3))
    assert [p["metadata"]["labels"]["finetune.dev/attempt"] for p in nxt.create if p["kind"] == "Pod"] == ["1", "1"]
    assert nxt.status.last_restart_gap_seconds == 3.0


def test_a_failure_restart_stops_survivors_with_a_short_grace_a_disruption_with_the_full_one() -> None:
    """After a failure no collective checkpoint is possible (a rank is gone): the survivors get a short grace. After a
    disruption the ranks save on SIGTERM: the pods' own grace period."""
    failed = decided(job(dict(STARTED), nodes=2), [running(0), running(1, phase="Failed", code=1)])
    assert {d.name: d.grace_seconds for d in failed.delete} == {"ft-node-0": 15, "ft-node-1": 15}
    short_spec = decided(
        job(dict(STARTED), nodes=2, terminationGracePeriodSeconds=5), [running(0), running(1, phase="Failed", code=1)]
    )
    assert {d.grace_seconds for d in short_spec.delete} == {5}  # never longer than the job's own
    zero = decided(
        job(dict(STARTED), nodes=2, terminationGracePeriodSeconds=0), [running(0), running(1, phase="Failed", code=1)]
    )
    assert {d.grace_seconds for d in zero.delete} == {1}  # 0 would remove the pods before their processes stop
    evicted = decided(job(dict(STARTED), nodes=2), [running(0, pod_reason="Evicted", phase="Failed"), running(1)])
    assert evicted.status.disruptions == 1
    assert {d.grace_seconds for d in evicted.delete} == {None}


def _stuck(rank: int, *, attempt: int = 0, overdue_s: float, node: str = "n1") -> dict[str, Any]:
    """A pod of ``attempt`` whose deletion deadline (deletionTimestamp) passed ``overdue_s`` ago, on ``node``."""
    p = running(rank, attempt)
    p["metadata"]["deletionTimestamp"] = ts(NOW - timedelta(seconds=overdue_s))
    p["spec"] = {"nodeName": node}
    return p


def test_a_pod_stuck_terminating_on_a_live_node_is_never_force_deleted() -> None:
    """Force deletion frees the pod's name for the next attempt while its processes may still run: on a node that
    reports Ready they may (a slow checkpoint, a hung NFS mount), so the old attempt is waited for."""
    restarting = dict(STARTED, attempt=1, state="Restarting", attemptStartTime=None)
    plan = decided(job(restarting, nodes=2), [_stuck(0, overdue_s=600), _stuck(1, overdue_s=600)])
    assert plan.delete == [] and plan.create == [] and plan.status.state == "Restarting"


def test_a_pass_that_died_between_its_status_write_and_its_last_delete_is_finished_by_the_next() -> None:
    """A gang restart writes the status (attempt 1, Restarting) before it deletes the old attempt's pods; the API
    server going away after the status write and the first delete leaves a rank of attempt 0 alive. The next pass
    deletes it (the restart is not counted again) and creates nothing until every pod of attempt 0 is gone."""
    after_status_write = dict(STARTED, attempt=1, restarts=1, state="Restarting", attemptStartTime=None)
    rank2 = running(2, 0)
    plan = decided(job(after_status_write, nodes=3), [rank2])
    assert [d.name for d in plan.delete] == ["ft-node-2"] and plan.create == []
    assert plan.status.restarts == 1 and plan.status.attempt == 1 and plan.status.state == "Restarting"
    plan = decided(job(after_status_write, nodes=3), [])  # gone: the attempt starts
    assert len([o for o in plan.create if o["kind"] == "Pod"]) == 3 and plan.status.restarts == 1


def test_a_never_scheduled_pod_left_half_deleted_by_an_api_server_crash_is_finished() -> None:
    """kube-apiserver deletes an unscheduled pod in two writes (deletionTimestamp, then removal); killed in between,
    it leaves a pod marked deleting that no kubelet will ever remove (found by the control-plane fault tier: the
    next attempt then waited for ever). It cannot run anywhere, so the deletion is finished at once, with grace 0; a
    pod with finalizers is left to them."""
    restarting = dict(STARTED, attempt=1, state="Restarting", attemptStartTime=None)
    unbound = _stuck(2, overdue_s=-25)  # its deadline still ahead: no waiting for it
    del unbound["spec"]
    held = _stuck(1, overdue_s=-25)
    del held["spec"]
    held["metadata"]["finalizers"] = ["example.com/audit"]
    plan = decided(job(restarting, nodes=3), [unbound, held, _stuck(0, overdue_s=-25)])
    assert [(d.name, d.grace_seconds) for d in plan.delete] == [("ft-node-2", 0)]
    assert plan.events == []  # nothing ran: nothing to warn about


def test_a_pod_stuck_terminating_on_a_lost_node_is_force_deleted_with_an_event() -> None:
    from finetune_operator.admission import Observed

    restarting = dict(STARTED, attempt=1, state="Restarting", attemptStartTime=None)
    pods = [_stuck(0, overdue_s=600, node="gone"), _stuck(1, overdue_s=5, node="gone"), _stuck(2, overdue_s=600)]
    plan = decided(job(restarting, nodes=3), pods, observed=Observed(lost_nodes={"gone": "the node is gone"}))
    # only the overdue pod on the lost node; the one on the lost node still within the threshold waits
    assert [(d.name, d.grace_seconds) for d in plan.delete] == [("ft-node-0", 0)]
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "ForceDeleted")]
    assert "the node is gone" in plan.events[0].message and "node gone" in plan.events[0].message


@pytest.mark.parametrize(
    ("node", "mode", "lost"),
    [
        (None, "not-ready", True),
        (
            {"spec": {"taints": [{"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}]}},
            "out-of-service",
            True,
        ),
        (
            {
                "status": {
                    "conditions": [
                        {"type": "Ready", "status": "Unknown", "lastTransitionTime": ts(NOW - timedelta(seconds=60))}
                    ]
                }
            },
            "not-ready",
            True,
        ),
        (
            {
                "status": {
                    "conditions": [
                        {"type": "Ready", "status": "Unknown", "lastTransitionTime": ts(NOW - timedelta(seconds=10))}
                    ]
                }
            },
            "not-ready",
            False,
        ),
        (
            {
                "status": {
                    "conditions": [
                        {"type": "Ready", "status": "False", "lastTransitionTime": ts(NOW - timedelta(seconds=60))}
                    ]
                }
            },
            "out-of-service",
            False,
        ),
        (
            {
                "status": {
                    "conditions": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": ts(NOW - timedelta(seconds=600))}
                    ]
                }
            },
            "not-ready",
            False,
        ),
        (None, "never", False),
    ],
    ids=[
        "deleted",
        "out-of-service",
        "unknown-long-enough",
        "unknown-briefly",
        "not-ready-but-strict",
        "ready",
        "never",
    ],
)
def test_node_lost(node, mode, lost) -> None:  # type: ignore[no-untyped-def]
    from finetune_operator.state import node_lost

    assert (node_lost(node, mode=mode, now=NOW, after_seconds=30) is not None) is lost


def test_layering_builders_and_decisions_do_no_io() -> None:
    """The pure layers (docs/design.md, Layers) never import the API client or kopf."""
    pure = [
        "builders",
        "reconcile",
        "spec",
        "failures",
        "settings",
        "admission",
        "guardrails",
        "render",
        "status",
        "state",
        "progress",
        "kueue",
        "placement",
        "gang",
        "multikueue",
    ]
    for mod in pure:
        tree = ast.parse((ROOT / "operator" / "finetune_operator" / f"{mod}.py").read_text())
        imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {m for m in imported if m.split(".")[0] in ("kubernetes", "kopf")}, mod
    handlers = [p.name for p in (ROOT / "operator" / "finetune_operator").glob("*.py") if "kopf.on." in p.read_text()]
    assert handlers == ["handlers.py"]


# -- progress ---------------------------------------------------------------------------------------------


def test_progress_from_the_trainers_real_metrics_page() -> None:
    from finetune_operator.progress import parse_metrics
    from finetune_trainer.metrics import TrainerMetrics  # the real exporter, not a hand-written page
    from prometheus_client import generate_latest

    m = TrainerMetrics(namespace="ns", job="ft", node_rank=0)
    m.step.set(120)
    m.total_steps.set(300)
    m.epoch.set(0.4)
    m.loss.set(0.6931)
    m.samples_per_second.set(50.04321)  # whole-job rates are reported to a tenth
    m.tokens_per_second.set(6400.0)
    m.eta.set(3725)
    m.checkpoint_last_step.set(100)
    p = parse_metrics(generate_latest(m.registry).decode(), nodes=2)
    assert p is not None and p.to_wire() == {  # mfu is NaN on CPU: left out
        "step": 120,
        "totalSteps": 300,
        "stepOfTotal": "120/300",
        "epoch": 0.4,
        "loss": 0.6931,
        "samplesPerSecond": 100.1,
        "tokensPerSecond": 12800.0,
        "etaSeconds": 3725,
        "eta": "1h2m",
        "lastCheckpointStep": 100,
    }
    m.reward_accuracy.set(0.8125)  # task dpo: the trainer's rewards reach the status as they are
    m.reward_margin.set(0.25)
    p = parse_metrics(generate_latest(m.registry).decode(), nodes=2)
    assert p is not None and (p.reward_accuracy, p.reward_margin) == (0.8125, 0.25)
    assert {"rewardAccuracy": 0.8125, "rewardMargin": 0.25}.items() <= p.to_wire().items()


def test_usage_and_gpu_seconds_count_what_the_attempt_was_admitted_with_not_an_edited_spec() -> None:
    """The API server refuses edits of spec.resources while an attempt runs (tests/integration/test_crd_validation.py);
    an edit that lands between the pods' creation and the status write still counts for nothing: the namespace's
    usage and the GPU-seconds read the resources the attempt was admitted with (status.runtime.resources)."""
    from finetune_operator.admission import usage_of

    gpus = {"nodes": 2, "resources": {"limits": {"nvidia.com/gpu": 8}}}
    admitted = decided(job(**gpus))
    assert admitted.status.runtime is not None and admitted.status.runtime["resources"] == gpus["resources"]
    running_status = admitted.status.to_wire() | {"state": "Running"}
    edited = job(running_status, nodes=2, resources={"limits": {"cpu": "1"}})
    assert usage_of([edited], exclude_uid="another").gpus == 16  # not 0
    # restarting: the attempt's start is cleared, its pods may still be terminating: still what it was admitted with
    restarting = job(running_status | {"state": "Restarting", "attemptStartTime": None, "attempt": 1}, nodes=2,
                     resources={"limits": {"cpu": "1"}})  # fmt: skip
    assert usage_of([restarting], exclude_uid="another").gpus == 16  # not 0
    hour_later = admitted.status.attempt_start_time + timedelta(hours=1)
    done = decided(
        edited, [running(0, phase="Succeeded", code=0), running(1, phase="Succeeded", code=0)], now=hour_later
    )
    assert done.status.state == "Succeeded" and done.status.gpu_seconds_used == 2 * 8 * 3600


def test_restart_accounts_lost_steps_and_gpu_seconds() -> None:
    st = dict(STARTED, progress={"step": 130, "lastCheckpointStep": 100, "samplesPerSecond": 64.0})
    spec = {
        "nodes": 2,
        "resources": {"limits": {"nvidia.com/gpu": 4}},
        "training": {"maxSteps": 500, "perDeviceBatchSize": 8},
    }
    plan = decided(job(st, **spec), [running(0), running(1, phase="Failed", code=1)])
    assert plan.status.progress.steps_lost_to_restarts == 30
    assert plan.status.gpu_seconds_used == 60 * 4 * 2  # one minute on 2 nodes x 4 GPUs
    # 64 samples/s over a global batch of 8 x 8 processes = 1 step/s: 30 lost steps = 30 s on 8 GPUs.
    assert plan.status.gpu_seconds_lost == 30 * 8
    # the job now stands at its checkpoint: a second restart before attempt 1 reports loses nothing more
    assert (plan.status.progress.step, plan.status.progress.samples_per_second) == (100, None)
    restarted = plan.status.to_wire()
    restarted.update(attemptStartTime=ts(NOW), state="Running")
    again = decided(job(restarted, **spec), [running(0, attempt=1), running(1, attempt=1, phase="Failed", code=1)])
    assert again.status.progress.steps_lost_to_restarts == 30 and again.status.restarts == 2


def test_slow_rates_keep_their_digits() -> None:
    """A tenth is enough for a column of thousands, not for a job that makes 0.03 samples/s: rounded to 0.0 the lost
    GPU-seconds of its restarts would no longer be counted."""
    from finetune_operator.progress import parse_metrics

    page = (
        "finetune_train_total_steps 10\nfinetune_train_step 1\nfinetune_train_samples_per_second 0.0151234\n"
        "finetune_train_tokens_per_second 1234.5678\n"
    )
    p = parse_metrics(page, nodes=2)
    assert p is not None and (p.samples_per_second, p.tokens_per_second) == (0.0302, 2469.1)


def test_a_succeeded_job_shows_its_last_step_not_the_last_scrape() -> None:
    """Rank 0's last scrape saw step 112 of 150; then every rank exited 0. The status (and the Step column) says
    150/150 with no time left, not 112/150."""
    st = dict(
        STARTED,
        progress={
            "step": 112,
            "totalSteps": 150,
            "stepOfTotal": "112/150",
            "etaSeconds": 9,
            "eta": "9s",
            "samplesPerSecond": 2702.2,
        },
    )
    plan = decided(job(st, nodes=2), [running(r, phase="Succeeded", code=0) for r in (0, 1)])
    assert plan.status.state == "Succeeded"
    p = plan.status.progress
    assert (p.step, p.step_of_total, p.eta_seconds, p.eta) == (150, "150/150", 0, "0s")


def test_a_disrupted_rank_already_gone_is_not_blamed_on_its_peers() -> None:
    """Rank 1 was evicted and its pod is gone before the operator looked (the operator was restarting); rank 0's
    workers stopped by the ranks' SIGTERM agreement, so its launcher exited 143 too. The restart is a disruption
    whoever is looked at, never a counted TrainingError (with maxRestarts 0 that would fail the job)."""
    plan = decided(job(STARTED, nodes=2, maxRestarts=0), [running(0, phase="Failed", code=143)])
    assert (plan.status.restarts or 0, plan.status.disruptions) == (0, 1), plan.status
    assert plan.status.failure is not None and plan.status.failure.reason == "Terminated"
    assert plan.status.state == "Restarting"


def test_progress_is_merged_only_while_running_and_idle_scrapes_write_nothing() -> None:
    st = dict(STARTED)
    scraped = Progress(step=5, total_steps=10, step_of_total="5/10")
    first = decided(job(st, nodes=2), [running(0), running(1)], progress=scraped)
    assert first.status.progress.update_time == NOW
    again = decided(
        job(first.status, nodes=2), [running(0), running(1)], now=NOW + timedelta(seconds=15), progress=scraped
    )
    assert again.status == first.status


# -- robustness of the status, deletes and peering ----------------------------------------


def test_pods_of_a_deleted_namesake_are_not_ours() -> None:
    """delete + re-apply under the same name: the old job's finished pods must not make the new one Succeed."""
    old_pod = running(0, phase="Succeeded", code=0)
    old_pod["metadata"]["ownerReferences"] = [{"uid": "old-uid", "controller": True}]
    plan = decided(job(dict(STARTED)), [old_pod])
    assert plan.status.state != "Succeeded" and plan.delete == []


def test_a_new_job_waits_for_a_deleted_namesakes_pods() -> None:
    """kubectl delete + apply while the old job's pods still checkpoint: the new job (another uid) creates nothing under
    the names they hold, counts nothing against its restarts or disruptions, and says what it waits for, once."""
    old_pod = running(1, phase="Running", owner="old-uid")
    plan = decided(job(nodes=2), [old_pod])
    assert plan.create == [] and plan.delete == [] and plan.requeue_after == 2.0
    created = plan.status.condition("Created")
    assert created is not None and (created.status, created.reason) == (False, "PreviousJobTerminating")
    assert "ft-node-1" in created.message and [e.reason for e in plan.events] == ["PreviousJobTerminating"]
    again = decided(job(plan.status, nodes=2), [old_pod])
    assert again.events == [] and again.status.disruptions == 0 and again.status.restarts == 0
    gone = decided(job(again.status, nodes=2), [])
    assert [o["kind"] for o in gone.create] == ["NetworkPolicy", "Service", "ConfigMap", "Pod", "Pod"]
    assert gone.status.condition("Created").status  # type: ignore[union-attr]


def test_a_finished_job_stays_finished_when_its_spec_is_edited() -> None:
    done = dict(STARTED, state="Succeeded", completionTime=ts(NOW))
    edited = job(done, podTemplate={"volumes": [{"name": "x", "mountPath": "/output/x", "emptyDir": {}}]})
    plan = decided(edited, [])
    assert plan.status.state == "Succeeded" and not plan.events


def test_a_rank_that_finished_first_keeps_the_job_running() -> None:
    plan = decided(job(dict(STARTED), nodes=2), [running(0), running(1, phase="Succeeded", code=0)])
    assert plan.status.state == "Running"


def test_resume_restarts_the_deadline_clock() -> None:
    suspended = dict(
        STARTED, state="Suspended", attemptStartTime=None, attempt=1, startTime=ts(NOW - timedelta(hours=5))
    )
    del suspended["attemptStartTime"]
    plan = decided(job(suspended, activeDeadlineSeconds=3600), [])
    assert plan.status.state == "Created" and plan.status.start_time == NOW


def test_network_policy_admits_the_gang_and_the_metrics_scrape_only() -> None:
    from finetune_operator.builders import build_network_policy

    ref, spec = JobRef(name="ft", namespace="ns", uid="u"), parse_spec(base_spec(nodes=2))
    policy = build_network_policy(ref, spec, Settings())
    assert policy is not None and policy["spec"]["podSelector"] == {"matchLabels": {"finetune.dev/job-name": "ft"}}
    gang, metrics = policy["spec"]["ingress"]
    assert gang == {"from": [{"podSelector": {"matchLabels": {"finetune.dev/job-name": "ft"}}}]}
    assert metrics == {"ports": [{"protocol": "TCP", "port": 9400}]}  # from anywhere unless narrowed
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    narrowed = build_network_policy(ref, spec, Settings(metrics_from=(prometheus,)))
    assert narrowed is not None and narrowed["spec"]["ingress"][1]["from"] == [prometheus]
    assert build_network_policy(ref, spec, Settings(network_policy=False)) is None
    # egress anywhere but the instance metadata (the node's IAM role), pods matched by selector for CNIs that need it
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["egress"] == [
        {
            "to": [
                {"namespaceSelector": {}},
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}},
                {"ipBlock": {"cidr": "::/0", "except": ["fd00:ec2::254/128"]}},
            ]
        }
    ]
    opted = parse_spec(base_spec(output={"claimName": "o", "s3": {"uri": "s3://b/p", "allowInstanceMetadata": True}}))
    open_egress = build_network_policy(ref, opted, Settings())
    assert open_egress is not None and open_egress["spec"]["policyTypes"] == ["Ingress"]
    host = parse_spec(base_spec(nodes=2, network={"hostNetwork": True}))
    assert build_network_policy(ref, host, Settings()) is None  # no NetworkPolicy applies to hostNetwork pods


def test_kueue_group_label_fits_63_characters() -> None:
    spec = parse_spec(base_spec(queueName="q"))
    pod = build_pod(JobRef(name="a" * 54, namespace="ns", uid="u"), spec, rank=0, attempt=12, settings=Settings())
    assert len(pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"]) <= 63


@pytest.mark.parametrize(
    ("peers", "active"),
    [
        ({"me": (7, 0)}, True),
        ({"me": (7, 0), "other": (3, 0)}, True),
        ({"me": (7, 0), "other": (9, 0)}, False),
        ({"me": (7, 0), "other": (9, 600)}, True),  # the higher one is dead (last seen 10 min ago)
        ({"me": (7, 0), "twin": (7, 0)}, False),  # equal priorities freeze every replica in kopf
        ({}, False),  # not yet registered
    ],
    ids=["alone", "highest", "standby", "higher-dead", "equal", "unregistered"],
)
def test_peering_gate(peers, active) -> None:  # type: ignore[no-untyped-def]
    from finetune_operator.peering import peering_active

    status = {
        k: {"priority": p, "lifetime": 60, "lastseen": (NOW - timedelta(seconds=age)).isoformat()}
        for k, (p, age) in peers.items()
    }
    assert peering_active(status, own_priority=7, now=NOW) is active


def _peering(*peers: tuple[int, int]) -> dict[str, Any]:
    return {
        "status": {
            f"p{i}": {"priority": p, "lifetime": 60, "lastseen": (NOW - timedelta(seconds=age)).isoformat()}
            for i, (p, age) in enumerate(peers)
        }
    }


@pytest.mark.parametrize(
    ("objects", "active", "missing"),
    [
        ({"a": _peering((7, 0)), "b": _peering((7, 0), (3, 0))}, True, []),
        ({"a": None, "b": _peering((7, 0))}, True, ["a"]),  # the first namespace's object deleted: the others decide
        ({"a": _peering((7, 0)), "b": _peering((7, 0), (9, 0))}, False, []),  # a higher peer anywhere pauses, as kopf
        (
            {"a": None, "b": None},
            True,
            ["a", "b"],
        ),  # nothing to coordinate through: kopf runs, and so does the backstop
        ({None: _peering((7, 0), (9, 0))}, False, []),  # cluster-wide
    ],
    ids=["all-agree", "one-missing", "higher-in-one", "all-missing", "cluster-standby"],
)
def test_backstop_follows_kopf_over_every_namespace(objects, active, missing) -> None:  # type: ignore[no-untyped-def]
    """Namespaced mode: the backstop runs exactly where kopf's handlers run. A missing peering object is reported,
    and never turns the backstop off in every namespace."""
    from finetune_operator.peering import backstop_active

    assert backstop_active(objects, own_priority=7, now=NOW) == (active, missing)


def test_peering_priorities_of_replicas_do_not_tie() -> None:
    """Replicas of a Deployment (names as the ReplicaSet controller draws them) get distinct priorities: a tie pauses
    every replica. 5,000 names in 10,000 values (the former crc32 range) would tie almost surely."""
    import random

    from finetune_operator.cli import peering_priority

    rng = random.Random(7)
    alphabet = "bcdfghjklmnpqrstvwxz2456789"  # the ReplicaSet/pod-name suffix alphabet
    names = {
        f"finetune-operator-{''.join(rng.choices(alphabet, k=10))}-{''.join(rng.choices(alphabet, k=5))}"
        for _ in range(5000)
    }
    priorities = {peering_priority(n) for n in names}
    assert len(priorities) == len(names)
    assert all(0 < p < 2**53 for p in priorities)  # exact as a JSON number in the peering object


def test_progress_waits_for_the_training_loop() -> None:
    from finetune_operator.progress import parse_metrics

    page = (
        "# TYPE finetune_train_step gauge\nfinetune_train_step 0\n# TYPE finetune_train_total_steps gauge\n"
        "finetune_train_total_steps 0\n"
    )
    assert parse_metrics(page, nodes=2) is None


def test_api_rejections_become_conditions_not_retry_loops() -> None:
    from finetune_operator.reconcile import create_rejected
    from finetune_operator.state import read_job

    def rejected(wire: dict[str, Any], code: int, message: str) -> Any:
        return create_rejected(
            read_job(wire), [], what="Pod ft-node-0", code=code, message=message, now=NOW, settings=Settings()
        )

    quota = rejected(
        job(dict(STARTED, state="Created")),
        403,
        'pods "ft-node-0" is forbidden: exceeded quota: gpu, requested: nvidia.com/gpu=8',
    )
    assert quota.status.state == "Created" and quota.requeue_after == 30.0
    assert [e.reason for e in quota.events] == ["QuotaExceeded"]
    unknown = rejected(
        job(dict(STARTED, state="Created")), 403, 'pods "ft-node-0" is forbidden: status unknown for quota: one-pod'
    )
    assert unknown.status.state == "Created" and unknown.requeue_after == 30.0
    # A job applied right after `helm install`: the owner-reference admission check does not serve the new kind yet.
    early = rejected(
        job(dict(STARTED)),
        403,
        'networkpolicies.networking.k8s.io "ft" is forbidden: cannot set blockOwnerDeletion in this case because '
        "cannot find RESTMapping for APIVersion finetune.dev/v1alpha1 Kind FineTuneJob: no matches for kind "
        '"FineTuneJob" in version "finetune.dev/v1alpha1"',
    )
    assert early.status.state != "Failed" and early.status.failure is None and early.requeue_after == 2.0
    created = early.status.condition("Created")
    assert created is not None and not created.status and created.reason == "CRDNotServedYet"
    assert [e.reason for e in early.events] == ["CRDNotServedYet"]
    bad = rejected(job(dict(STARTED)), 422, 'spec.containers[0].resources.requests: Invalid value: "1x"')
    assert bad.status.state == "Failed" and bad.status.failure.reason == "InvalidSpec"
    assert "resources.requests" in bad.status.failure.message


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("16Gi", True),
        ("500m", True),
        (2, True),
        ("1.5", True),
        ("1e3", True),
        ("1x", False),
        ("Gi", False),
        ("16 Gi", False),
    ],
)
def test_quantities_are_checked_before_any_pod_exists(value, ok) -> None:  # type: ignore[no-untyped-def]
    spec = base_spec(resources={"limits": {"cpu": value}})
    if ok:
        parse_spec(spec)
    else:
        with pytest.raises(SpecError) as e:
            parse_spec(spec)
        assert e.value.field == "spec.resources.limits['cpu']"


PINNED = Settings(allowed_image_prefixes=("registry.corp/ml/",), default_image="registry.corp/ml/trainer:1")


@pytest.mark.parametrize(
    ("spec_over", "settings", "reason", "words"),
    [
        (
            {"image": "docker.io/evil/miner:1"},
            Settings(allowed_image_prefixes=("registry.corp/ml/",)),
            "InvalidSpec",
            ["spec.image", "registry.corp/ml/"],
        ),
        (
            {"podTemplate": {"priorityClassName": "system-cluster-critical"}},
            Settings(allowed_priority_classes=("train-low", "train-high")),
            "InvalidSpec",
            ["priorityClassName", "train-low"],
        ),
        (
            {"acceleration": "ort"},
            Settings(
                allowed_image_prefixes=("registry.corp/ml/",),
                default_image="registry.corp/ml/trainer:1",
                ort_image="docker.io/x/ort:1",
            ),
            "InvalidSpec",
            ["trainer image docker.io/x/ort:1", "trainer.ortImage", "registry.corp/ml/"],
        ),
        ({"nodes": 64}, Settings(max_nodes_per_job=16), "QuotaExceeded", ["spec.nodes=64", "16 nodes per job"]),
        (
            {"nodes": 64, "resources": {"limits": {"nvidia.com/gpu": 8}}},
            Settings(max_gpus_per_job=256),
            "QuotaExceeded",
            ["512 GPUs", "256 per job"],
        ),
        (
            {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]},
            Settings(),
            "InvalidSpec",
            ["spec.env[0].name", "NVIDIA_VISIBLE_DEVICES", "nvidia.com/gpu"],
        ),
        (
            {"env": [{"name": "PYTHONPATH", "value": "/data/evil"}]},
            PINNED,
            "InvalidSpec",
            ["spec.env[0].name", "PYTHONPATH", "guardrails.allowedImagePrefixes"],
        ),
        (
            {"podTemplate": {"volumes": [{"name": "x", "mountPath": "/opt/venv/lib", "emptyDir": {}}]}},
            PINNED,
            "InvalidSpec",
            ["spec.podTemplate.volumes[0].mountPath", "/opt/venv/lib", "guardrails.allowedImagePrefixes"],
        ),
        (
            {"image": "registry.corp/ml-evil/miner:1"},
            Settings(allowed_image_prefixes=("registry.corp/ml",)),
            "InvalidSpec",
            ["spec.image", "registry.corp/ml-evil/miner:1"],
        ),
        (
            {"model": {"name": "org/m", "trustRemoteCode": True}},
            Settings(allow_trust_remote_code=False),
            "InvalidSpec",
            ["spec.model.trustRemoteCode", "guardrails.allowTrustRemoteCode"],
        ),
        (
            {"podTemplate": {"labels": {"kueue.x-k8s.io/priority-class": "urgent"}}},
            Settings(allowed_priority_classes=("train-low",)),
            "InvalidSpec",
            ["kueue.x-k8s.io/priority-class", "urgent", "train-low"],
        ),
        (
            {"podTemplate": {"labels": {"kueue.x-k8s.io/queue-name": "q"}}},
            Settings(),
            "InvalidSpec",
            ["kueue.x-k8s.io/queue-name", "spec.queueName"],
        ),
        (
            {"output": {"claimName": "o", "path": "ns/other-job/ckpt"}},
            Settings(),
            "InvalidSpec",
            ["spec.output.path", "ns/other-job", "each job"],
        ),
        ({"output": {"claimName": "o", "path": "ns"}}, Settings(), "InvalidSpec", ["spec.output.path", "'ns'"]),
        (
            {"output": {"claimName": "shared-nfs", "path": "team-b/llama-sft"}},
            Settings(),
            "InvalidSpec",
            ["spec.output.path", "outside ns/", "ns/ft/"],
        ),
        (
            {"output": {"claimName": "o", "path": "runs/../ns/other"}},
            Settings(),
            "InvalidSpec",
            ["spec.output.path", ".."],
        ),
        ({}, Settings(require_queue_name=True), "InvalidSpec", ["spec.queueName", "guardrails.requireQueueName"]),
        (
            {"podTemplate": {"serviceAccountName": "admin"}},
            Settings(allowed_service_accounts=("trainer",)),
            "InvalidSpec",
            ["spec.podTemplate.serviceAccountName", "admin", "trainer", "guardrails.allowedServiceAccounts"],
        ),
        (
            {"podTemplate": {"serviceAccountName": "ci-deployer"}},
            Settings(),
            "InvalidSpec",
            ["spec.podTemplate.serviceAccountName", "ci-deployer", "guardrails.allowedServiceAccounts is empty"],
        ),
        (
            {
                "podTemplate": {
                    "tolerations": [{"key": "spot", "operator": "Exists"}, {"key": "team-b", "operator": "Exists"}]
                }
            },
            Settings(allowed_toleration_keys=("spot", "nvidia.com/gpu")),
            "InvalidSpec",
            [
                "spec.podTemplate.tolerations[1].key",
                "team-b",
                "spot, nvidia.com/gpu",
                "guardrails.allowedTolerationKeys",
            ],
        ),
        (
            {"podTemplate": {"tolerations": [{"operator": "Exists"}]}},
            Settings(allowed_toleration_keys=("spot",)),
            "InvalidSpec",
            ["spec.podTemplate.tolerations[0]", "every taint", "guardrails.allowedTolerationKeys"],
        ),
        (
            {"podTemplate": {"schedulerName": "my-scheduler"}},
            Settings(allowed_schedulers=("volcano",)),
            "InvalidSpec",
            ["spec.podTemplate.schedulerName", "my-scheduler", "volcano", "guardrails.allowedSchedulers"],
        ),
    ],
    ids=[
        "image",
        "priority-class",
        "ort-image",
        "nodes",
        "gpus",
        "gpu-visibility-env",
        "code-loading-env",
        "mount-over-image",
        "image-prefix-boundary",
        "trust-remote-code",
        "kueue-priority",
        "kueue-labels",
        "other-jobs-output",
        "namespace-dir-output",
        "other-namespace-output",
        "dot-dot-output",
        "queue-required",
        "service-account",
        "service-account-none-listed",
        "toleration-key",
        "toleration-without-key",
        "scheduler",
    ],
)
def test_guardrails_fail_the_job_naming_the_limit(spec_over, settings, reason, words) -> None:  # type: ignore[no-untyped-def]
    plan = decided(job(**spec_over), [], settings=settings)
    assert plan.status.state == "Failed" and plan.create == []
    assert plan.status.failure.reason == reason
    assert all(w in plan.status.failure.message for w in words), plan.status.failure.message
    again = decided(job(plan.status, **spec_over), [], settings=settings)
    assert again.status == plan.status and not again.events  # no retry storm


def test_a_guardrail_applies_to_the_next_attempt_not_the_running_one() -> None:
    """A Helm change to the guardrails (or an upgrade with new rules) never kills an attempt that runs; the next
    attempt is refused."""
    strict = Settings(allowed_image_prefixes=("registry.corp/ml/",), default_image="registry.corp/ml/trainer:1")
    running_job = job(dict(STARTED), nodes=2)  # spec.image unset: the default image, now outside the list
    plan = decided(running_job, [running(0), running(1)], settings=strict)
    assert plan.status.state == "Running" and plan.delete == []
    restart = decided(
        job(dict(STARTED), nodes=2, image="docker.io/x/y:1"),
        [running(0), running(1, phase="Failed", code=1)],
        settings=strict,
    )
    assert restart.status.state == "Restarting"
    refused = decided(job(restart.status, nodes=2, image="docker.io/x/y:1"), [], settings=strict)
    assert refused.status.state == "Failed" and refused.status.failure is not None
    assert "spec.image" in refused.status.failure.message and refused.create == []


def test_guardrails_allow_what_is_allowed() -> None:
    s = Settings(
        allowed_image_prefixes=("registry.corp/ml/",),
        max_nodes_per_job=4,
        max_gpus_per_job=32,
        default_image="registry.corp/ml/trainer:1",
    )
    plan = decided(job(nodes=4, resources={"limits": {"nvidia.com/gpu": 8}}), [], settings=s)
    assert plan.status.state == "Created"
    # a prefix without its trailing slash is still a repository path; the code-loading env and mounts over the
    # image's files are refused only where images are pinned; the job's own directory is fine
    allowed = [
        ({"image": "registry.corp/ml/x:1"}, Settings(allowed_image_prefixes=("registry.corp/ml",))),
        ({"image": "registry.corp/ml:2"}, Settings(allowed_image_prefixes=("registry.corp/ml",))),
        ({"env": [{"name": "PYTHONPATH", "value": "/data/lib"}]}, Settings()),
        ({"podTemplate": {"volumes": [{"name": "d", "mountPath": "/data", "emptyDir": {}}]}}, PINNED),
        (
            {"podTemplate": {"labels": {"kueue.x-k8s.io/priority-class": "train-low"}}},
            Settings(allowed_priority_classes=("train-low",)),
        ),
        ({"output": {"claimName": "o", "path": "ns/ft/run-2"}}, Settings()),
        ({"image": "ghcr.io/org/trainer-cpu:1"}, Settings(allowed_image_prefixes=("ghcr.io/org/trainer-",))),
        ({"podTemplate": {"volumes": [{"name": "ca", "mountPath": "/etc/ssl/certs", "emptyDir": {}}]}}, PINNED),
        ({"podTemplate": {"labels": {"debug": "x"}}}, PINNED),
        ({"queueName": "team-a"}, Settings(require_queue_name=True)),
        ({"podTemplate": {"serviceAccountName": "trainer"}}, Settings(allowed_service_accounts=("trainer",))),
        ({}, Settings(allowed_service_accounts=("trainer",))),  # no ServiceAccount named: no token at all
        (
            {"podTemplate": {"tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]}},
            Settings(allowed_toleration_keys=("spot",)),
        ),
        ({"podTemplate": {"schedulerName": "volcano"}}, Settings(allowed_schedulers=("volcano",))),
        ({}, Settings(allowed_schedulers=("volcano",), allowed_toleration_keys=("spot",))),  # the defaults
    ]
    for over, settings in allowed:
        assert decided(job(**over), [], settings=settings).status.state == "Created", over


@pytest.mark.parametrize(
    ("over", "image"),
    [
        ({"acceleration": "ort"}, "reg/trainer-ort:2"),
        ({"acceleration": "none"}, "reg/trainer:2"),
        ({"acceleration": "compile"}, "reg/trainer:2"),
        ({"acceleration": "auto"}, "reg/trainer:2"),
        ({"acceleration": "ort", "image": "mine/ort:7"}, "mine/ort:7"),
        ({"acceleration": "none", "image": "mine/plain:7"}, "mine/plain:7"),
    ],
    ids=["ort", "none", "compile", "auto", "ort-own-image", "none-own-image"],
)
def test_acceleration_picks_the_trainer_image(over: dict[str, Any], image: str) -> None:
    s = Settings(default_image="reg/trainer:2", ort_image="reg/trainer-ort:2")
    pod = build_pod(REF, parse_spec(base_spec(**over)), rank=0, attempt=0, settings=s)
    assert pod["spec"]["containers"][0]["image"] == image


def test_gpu_jobs_get_nccl_async_errors_and_a_ddp_timeout_inside_the_deadline() -> None:
    spec = parse_spec(base_spec(nodes=2, resources={"limits": {"nvidia.com/gpu": 8}}, activeDeadlineSeconds=3600))
    env = {
        e["name"]: e.get("value")
        for e in build_pod(REF, spec, rank=0, attempt=0, settings=Settings())["spec"]["containers"][0]["env"]
    }
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert trainer_config(REF, spec)["training"]["extraArgs"]["ddp_timeout"] == 900
    mine = parse_spec(
        base_spec(
            activeDeadlineSeconds=3600,
            training={"maxSteps": 5, "extraArgs": {"ddp_timeout": 42}},
            env=[{"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "0"}],
        )
    )
    assert trainer_config(REF, mine)["training"]["extraArgs"]["ddp_timeout"] == 42
    cpu_env = [
        e["name"] for e in build_pod(REF, mine, rank=0, attempt=0, settings=Settings())["spec"]["containers"][0]["env"]
    ]
    assert cpu_env.count("TORCH_NCCL_ASYNC_ERROR_HANDLING") == 1  # the user's, not a second one


def test_time_to_first_step_warmup_and_rendezvous_reach_progress() -> None:
    from finetune_operator.progress import parse_metrics
    from finetune_trainer.metrics import TrainerMetrics
    from prometheus_client import generate_latest

    m = TrainerMetrics(namespace="ns", job="ft", node_rank=0)
    m.total_steps.set(10)
    m.time_to_first_step.set(41.5)
    m.rendezvous_duration.set(3.25)
    m.warmup.set(38.0)
    p = parse_metrics(generate_latest(m.registry).decode(), nodes=1)
    assert p is not None
    assert (p.time_to_first_step_seconds, p.warmup_seconds, p.rendezvous_seconds) == (41.5, 38.0, 3.25)
    assert (p.launcher_seconds, p.data_seconds, p.model_seconds) == (None,) * 3  # 0 until the trainer knows them
    m.startup_launcher.set(2.5)
    m.startup_data.set(0.125)
    m.startup_model.set(0.03)
    p = parse_metrics(generate_latest(m.registry).decode(), nodes=2)  # a start-up part is not a rate: not scaled
    assert p is not None and (p.launcher_seconds, p.data_seconds, p.model_seconds) == (2.5, 0.125, 0.03)
    assert {"launcherSeconds": 2.5, "dataSeconds": 0.125, "modelSeconds": 0.03}.items() <= p.to_wire().items()
    assert (p.eval_loss, p.eval_perplexity, p.eval_accuracy, p.eval_f1) == (None,) * 4  # NaN until an evaluation ran
    m.eval_loss.set(0.61234)
    m.eval_accuracy.set(0.75)
    p = parse_metrics(generate_latest(m.registry).decode(), nodes=4)
    assert p is not None and (p.eval_loss, p.eval_accuracy, p.eval_f1) == (0.6123, 0.75, None)  # not scaled by nodes


def test_what_a_run_trains_with_reaches_progress_known_values_and_bounded_text() -> None:
    """The trainer's choice series (auto settled: acceleration, kernels, why) becomes status.progress fields; a page
    that says anything (an unknown value, terminal escapes, a reason of megabytes) leaves no more than the schema
    holds."""
    from finetune_operator.progress import CHOICE_REASON_CHARS, parse_metrics
    from finetune_trainer import metrics
    from finetune_trainer.metrics import TrainerMetrics
    from prometheus_client import generate_latest

    crd = yaml.safe_load((ROOT / "crds" / "finetune.dev_finetunejobs.yaml").read_text())
    progress = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["progress"]
    bound = progress["properties"]["accelerationReason"]["maxLength"]
    assert metrics.CHOICE_REASON_CHARS == CHOICE_REASON_CHARS == bound
    m = TrainerMetrics(namespace="ns", job="ft", node_rank=0)
    m.total_steps.set(10)
    assert parse_metrics(generate_latest(m.registry).decode(), nodes=1).acceleration is None  # type: ignore[union-attr]
    m.set_choice("compile", "none", "auto: compile, estimated 700 s against eager 900 s")
    p = parse_metrics(generate_latest(m.registry).decode(), nodes=2)
    assert p is not None and (p.acceleration, p.kernels) == ("compile", "none")
    assert p.to_wire()["accelerationReason"] == "auto: compile, estimated 700 s against eager 900 s"
    m.set_choice("none", "liger", "auto: liger")  # a later choice replaces the earlier one
    p = parse_metrics(generate_latest(m.registry).decode(), nodes=1)
    assert p is not None and (p.acceleration, p.kernels, p.acceleration_reason) == ("none", "liger", "auto: liger")
    hostile = (
        "finetune_train_total_steps 10\n"
        'finetune_train_choice_info{acceleration="rm -rf",kernels="liger",reason="\x1b[2J' + "x" * 100_000 + '"} 1\n'
    )
    p = parse_metrics(hostile, nodes=1)
    assert p is not None and p.acceleration is None and p.kernels == "liger"
    assert p.acceleration_reason is not None and len(p.acceleration_reason) == CHOICE_REASON_CHARS
    assert "\x1b" not in p.acceleration_reason


def test_status_wire_form_is_the_crds_and_round_trips() -> None:
    """Every field of the typed status reaches the wire under the name the CRD's status schema declares (a misspelt
    key would be pruned by the API server), and reading the wire form back gives the same status."""
    from dataclasses import fields

    from finetune_operator.failures import Failure
    from finetune_operator.history import EvalPoint, History, TrainPoint
    from finetune_operator.status import Condition, Elastic, ModelEvaluation, Placement, Status

    schema = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    sample = {"int | None": 7, "float | None": 1.5, "str | None": "x", "dict[str, float] | None": {"format": 0.5}}
    progress = Progress(**{f.name: NOW if f.name == "update_time" else sample[str(f.type)] for f in fields(Progress)})
    full = Status(
        state="Running",
        observed_generation=3,
        ready_nodes=2,
        wanted_nodes=4,
        attempt=1,
        restarts=1,
        restarts_in_place=1,
        disruptions=2,
        start_time=NOW,
        attempt_start_time=NOW,
        restart_requested_time=NOW,
        completion_time=NOW,
        admission_retry_time=NOW,
        last_restart_gap_seconds=2.5,
        gpu_seconds_used=10.0,
        gpu_seconds_lost=1.0,
        progress=progress,
        history=History((TrainPoint(1, 5, 2.5, 10.0, 2e-5, 0.75),), (EvalPoint(1, 5, 1.25),)),
        failure=Failure("TrainingError", "exit code 1", rank=1, attempt=0, exit_code=1, pod_name="ft-node-1"),
        conditions=[Condition("Running", True, "AllRanksRunning", "ok", NOW, 3)],
        runtime={
            "attempt": 1,
            "kind": "ClusterFineTuneRuntime",
            "name": "gpu",
            "generation": 2,
            "uid": "u",
            "chosenBy": "spec.runtimeRef",
            "template": {"queueName": "q"},
            "resources": {"limits": {"nvidia.com/gpu": 8}},
            "training": {"training.precision": "bf16", "training.keepCheckpoints": None},
            "values": [{"field": "spec.queueName", "value": "q", "source": "job"}],
        },
        elastic=Elastic(
            current_nodes=1,
            desired_nodes=2,
            min_nodes=1,
            gradient_accumulation_steps=2,
            global_batch_size=32,
            asked_global_batch_size=32,
            resizes=1,
            steps_lost_to_resizes=3,
            idle_gpu_seconds=4.5,
            placeholders_running=1,
            placeholder_generation=2,
            grown_from=2,
            capacity_since=NOW,
            last_resize_time=NOW,
            last_resize="Shrunk",
        ),
        evaluation=ModelEvaluation(
            step=60,
            loss=0.5,
            perplexity=1.65,
            accuracy=0.75,
            f1=0.7,
            reward_accuracy=0.8,
            reward_margin=1.5,
            state="Succeeded",
            message="m",
            split="test",
            samples=80,
            scores={"correct": 0.9},
            completion_length=1.0,
            seconds=2.5,
        ),
        placement=Placement(attempt=1, level="rack", domains=("r1", "r1", "r2")),
    )
    wire = full.to_wire()
    assert set(wire) == set(schema)
    assert set(wire["placement"]) == set(schema["placement"]["properties"])
    assert set(wire["evaluation"]) == set(schema["evaluation"]["properties"])
    assert set(wire["progress"]) == set(schema["progress"]["properties"])
    for series in ("train", "eval"):
        assert set(wire["history"][series][0]) == set(schema["history"]["properties"][series]["items"]["properties"])
    assert set(wire["failure"]) == set(schema["failure"]["properties"])
    assert set(wire["runtime"]) == set(schema["runtime"]["properties"])
    assert set(wire["runtime"]["values"][0]) == set(schema["runtime"]["properties"]["values"]["items"]["properties"])
    assert set(wire["conditions"][0]) == set(schema["conditions"]["items"]["properties"])
    assert set(wire["elastic"]) == set(schema["elastic"]["properties"])
    assert wire["nodes"] == "2/4" and wire["conditions"][0]["status"] == "True"
    assert Status.from_wire(wire) == full


def test_trainer_ids_are_configurable_and_left_to_the_platform_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenShift's restricted-v2 SCC assigns each namespace's UIDs and refuses a fixed runAsUser outside them: an
    empty FINETUNE_TRAINER_RUN_AS_USER / FINETUNE_TRAINER_FS_GROUP leaves them out of the trainer pods (runAsNonRoot
    stays); a number sets them; root is refused with the variable named."""
    spec = parse_spec(base_spec())
    ctx = build_pod(REF, spec, rank=0, attempt=0, settings=Settings())["spec"]["securityContext"]
    assert (ctx["runAsUser"], ctx["runAsGroup"], ctx["fsGroup"]) == (1000, 1000, 1000)
    monkeypatch.setenv("FINETUNE_TRAINER_RUN_AS_USER", "")
    monkeypatch.setenv("FINETUNE_TRAINER_FS_GROUP", "")
    ctx = build_pod(REF, spec, rank=0, attempt=0, settings=Settings.from_env())["spec"]["securityContext"]
    assert ctx == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    monkeypatch.setenv("FINETUNE_TRAINER_RUN_AS_USER", "1000680000")
    monkeypatch.setenv("FINETUNE_TRAINER_FS_GROUP", "1000680000")
    ctx = build_pod(REF, spec, rank=0, attempt=0, settings=Settings.from_env())["spec"]["securityContext"]
    assert ctx["runAsUser"] == ctx["fsGroup"] == 1000680000
    monkeypatch.setenv("FINETUNE_TRAINER_RUN_AS_USER", "0")
    with pytest.raises(ValueError, match="FINETUNE_TRAINER_RUN_AS_USER='0': trainers never run as root"):
        Settings.from_env()


def test_a_replica_that_cannot_read_its_peering_objects_exports_an_inactive_backstop() -> None:
    """A peering read that always fails (RBAC, an API outage) keeps the backstop off, and the gauge the alert reads
    says so (it starts at 1 only until the first answer)."""
    from finetune_operator.cli import PeeringGate
    from finetune_operator.metrics import OperatorMetrics

    class Forbidden:
        def get_peering(self, name: str, namespace: str | None) -> dict[str, Any]:
            raise PermissionError("403: peerings.kopf.dev is forbidden")

    metrics = OperatorMetrics()
    gate = PeeringGate(Forbidden(), ("team-a",), priority=100, metrics=metrics, every=0.0)
    assert gate.read() is False
    assert metrics.backstop_active._value.get() == 0


def test_the_backstop_loop_never_waits_on_a_peering_read() -> None:
    """The gate's reads run on a thread of their own: while one hangs on the API server, the loop (whose heartbeat
    is the liveness probe's) gets the last answer at once; the answer changes once the read returns."""
    import threading

    from finetune_operator.cli import PeeringGate

    release, asked = threading.Event(), threading.Event()
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    class Hanging:
        def get_peering(self, name: str, namespace: str | None) -> dict[str, Any]:
            asked.set()
            release.wait()
            return {"status": {"me": {"priority": 100, "lastseen": now, "lifetime": 60}}}

    gate = PeeringGate(Hanging(), ("team-a",), priority=100, every=0.0)
    assert gate() is False  # the first answer, before any read returned
    assert asked.wait(10)
    assert gate() is False and gate() is False  # the read hangs; the loop is answered
    release.set()
    wait_for(lambda: gate() is True, timeout=10, what="the answer of the read that returned")  # its own live entry


@pytest.mark.parametrize(
    "name",
    ["NCCL_CONF_FILE", "HOME", "XDG_CACHE_HOME", "TRITON_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
     "TORCH_EXTENSIONS_DIR", "TORCH_HOME", "PYTHONPYCACHEPREFIX", "TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH",
     "TRITON_CUOBJDUMP_PATH", "TRITON_NVDISASM_PATH", "TRITON_LIBCUDA_PATH", "CUDA_CACHE_PATH"],
)  # fmt: skip
def test_env_that_points_code_caches_at_a_tenant_volume_is_refused_where_images_are_pinned(name: str) -> None:
    """NCCL reads its settings (a plugin among them) from NCCL_CONF_FILE; Triton loads compiled launchers from its
    cache ($HOME/.triton unless set), Inductor runs its cached generated code, torch loads built extensions and hub
    code, Python runs cached bytecode, Triton runs the ptxas, cuobjdump and nvdisasm it is pointed at and loads the
    libcuda named, and the CUDA driver loads JIT-compiled kernels from its cache: each pointed at a volume the tenant
    writes runs the tenant's code in an allowed image. Without pinned images the same env is the job's own
    business."""
    over = {
        "env": [{"name": name, "value": "/data/planted"}],
        "podTemplate": {"volumes": [{"name": "d", "mountPath": "/data", "emptyDir": {}}]},
    }
    plan = decided(job(**over), [], settings=PINNED)
    assert plan.status.state == "Failed" and plan.create == []
    assert plan.status.failure is not None and plan.status.failure.reason == "InvalidSpec"
    assert f"spec.env[0].name: {name} would load code from outside the image" in plan.status.failure.message
    assert decided(job(**over), [], settings=Settings()).status.state == "Created"


def test_a_grpo_runs_rewards_reach_progress_and_its_curve_well_formed_only() -> None:
    """GRPO's series (the trainer's own exporter, fed its callback's log) become status.progress fields and the
    history's reward curve; the rollout rate is the job's (all nodes); a page naming rewards the status cannot hold
    (a bad name, too many, a non-finite value) leaves only what the schema holds."""
    from finetune_operator.history import record, series
    from finetune_operator.progress import MAX_REWARD_FUNCTIONS, parse_metrics
    from finetune_trainer.metrics import BatchCounter, MetricsCallback, TrainerMetrics
    from prometheus_client import generate_latest

    crd = yaml.safe_load((ROOT / "crds" / "finetune.dev_finetunejobs.yaml").read_text())
    progress = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["progress"]
    assert progress["properties"]["rewardMeans"]["maxProperties"] == MAX_REWARD_FUNCTIONS
    m = TrainerMetrics(namespace="ns", job="ft", node_rank=0, rollouts=True)
    m.total_steps.set(10)
    m.step.set(4)
    cb = MetricsCallback(m, BatchCounter(None), nproc_per_node=1, launch_time=0.0, params=1, peak_flops_per_device=1.0)
    logs = {"reward": 1.25, "reward_std": 0.5, "rewards/format/mean": 1.0, "rewards/right/mean": 0.25}
    cb.on_log(None, type("State", (), {"global_step": 4})(), None, logs={**logs, "completions/mean_length": 3.0})
    m.rollout_tokens_per_second.set(120.0)
    p = parse_metrics(generate_latest(m.registry).decode(), nodes=2)
    assert p is not None and (p.reward_mean, p.completion_length, p.kl) == (1.25, 3.0, None)
    assert p.reward_means == {"format": 1.0, "right": 0.25} and p.rollout_tokens_per_second == 240.0
    assert p.to_wire()["rewardMeans"] == {"format": 1.0, "right": 0.25}
    assert cb.grpo_history == [
        {
            "step": 4,
            "reward": 1.25,
            "reward_std": 0.5,
            "completion_length": 3.0,
            "rewards": {"format": 1.0, "right": 0.25},
        }
    ]
    assert series(record(None, p, attempt=0).to_wire())["reward"] == [(0, 4, 1.25)]
    hostile = "finetune_train_total_steps 10\nfinetune_train_reward_mean 1\n" + "".join(
        f'finetune_train_reward_function_mean{{reward="{name}"}} {value}\n'
        for name, value in [("ok", "0.5"), ("\x1b[2J", "1"), ("nan-one", "NaN"), ("huge", "1e300")]
        + [(f"r{i:02d}", "1") for i in range(40)]
    )
    p = parse_metrics(hostile, nodes=1)
    assert p is not None and p.reward_means is not None and len(p.reward_means) == MAX_REWARD_FUNCTIONS
    assert "ok" in p.reward_means and not {"\x1b[2J", "nan-one", "huge"} & set(p.reward_means)
