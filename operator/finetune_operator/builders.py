"""Pure builders: a parsed FineTuneJob in, Kubernetes objects (plain dicts) out. No I/O here.

Objects per job J with N nodes (docs/architecture.md, "Names and objects"; trainer-image/README.md, "Env
contract"): headless Service ``J``, ConfigMap ``J-config`` with the trainer's config JSON, and Pods
``J-node-0 … J-node-(N-1)`` carrying the rendezvous env contract.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any

from finetune_operator import gang, kueue, multikueue, placement
from finetune_operator.settings import (
    API_VERSION,
    CONFIG_DIR,
    CONFIG_FILE,
    CONFIG_VERSION,
    KIND,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_RANK,
    MASTER_PORT,
    METRICS_PORT,
    OUTPUT_MOUNT,
    Settings,
)
from finetune_operator.spec import CACHE_MOUNT, KUEUE_PRIORITY_LABEL, JobSpec

CONTAINER = "trainer"
COMPONENT_LABEL = "app.kubernetes.io/component"
PLACEHOLDER = "placeholder"  # the component of an elastic job's placeholder pods


@dataclass(frozen=True)
class JobRef:
    """Identity of a FineTuneJob, enough to name and own its children."""

    name: str
    namespace: str
    uid: str

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def pod_name(job: str, rank: int) -> str:
    return f"{job}-node-{rank}"


def config_map_name(job: str) -> str:
    return f"{job}-config"


def output_claim_name(job: str, spec: JobSpec) -> str:
    """The existing claim the job names, or ``<job>-output``, which the operator creates from the template."""
    return spec.output.claim_name or f"{job}-output"


def master_addr(job: str) -> str:
    return f"{pod_name(job, 0)}.{job}"


def output_path(ref: JobRef, spec: JobSpec) -> str:
    sub = spec.output.path or f"{ref.namespace}/{ref.name}"
    return f"{OUTPUT_MOUNT}/{sub}"


def selector_labels(job: str) -> dict[str, str]:
    return {LABEL_JOB: job}


def common_labels(job: str, component: str) -> dict[str, str]:
    return {
        LABEL_JOB: job,
        "app.kubernetes.io/name": "finetune-trainer",
        "app.kubernetes.io/instance": job,
        COMPONENT_LABEL: component,
        "app.kubernetes.io/managed-by": "finetune-operator",
    }


def _meta(ref: JobRef, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ref.namespace,
        "labels": labels,
        "ownerReferences": [ref.owner_reference()],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def build_service(ref: JobRef) -> dict[str, Any]:
    """Headless Service J: gives rank 0 the stable name ``J-node-0.J`` before it is ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(ref, ref.name, common_labels(ref.name, "rendezvous")),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(ref.name),
            "ports": [
                {"name": "rendezvous", "port": MASTER_PORT, "targetPort": MASTER_PORT},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT},
            ],
        },
    }


def build_network_policy(ref: JobRef, spec: JobSpec, settings: Settings) -> dict[str, Any] | None:
    """NetworkPolicy J: the gang's pods accept connections from each other on every port (rendezvous, NCCL/gloo),
    and on the metrics port from ``settings.metrics_from`` (NetworkPolicyPeers; empty: from anywhere, so the operator's
    progress scrape and any Prometheus keep working). Everything else is refused: the rendezvous store is
    unauthenticated. Egress is open except to the instance metadata (unless ``spec.output.s3.allowInstanceMetadata``).
    None when switched off, or for hostNetwork pods, which no NetworkPolicy applies to."""
    if not settings.network_policy or spec.network.host_network:
        return None
    metrics: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": METRICS_PORT}]}
    if settings.metrics_from:
        metrics["from"] = [dict(peer) for peer in settings.metrics_from]
    policy: dict[str, Any] = {
        "podSelector": {"matchLabels": selector_labels(ref.name)},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {"matchLabels": selector_labels(ref.name)}}]}, metrics],
    }
    if not instance_metadata_allowed(spec):
        # Egress anywhere (every pod of the cluster, and any address by IP block: CNIs such as Cilium match pods only
        # by selector), except the instance metadata, where the node's IAM role lives.
        policy["policyTypes"] = ["Ingress", "Egress"]
        policy["egress"] = [
            {
                "to": [
                    {"namespaceSelector": {}},
                    *({"ipBlock": {"cidr": cidr, "except": [meta]}} for cidr, meta in METADATA_CIDRS),
                ]
            }
        ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(ref, ref.name, common_labels(ref.name, "network-policy")),
        "spec": policy,
    }


def build_output_claim(ref: JobRef, spec: JobSpec) -> dict[str, Any] | None:
    """The job's output claim from ``spec.output.volumeClaimTemplate``; owned by the job (deleted with it) unless
    ``reclaimPolicy: Retain``, in which case it outlives the job and a job of the same name resumes from it."""
    template = spec.output.template
    if template is None:
        return None
    tmeta = template.get("metadata") or {}
    labels = {**(tmeta.get("labels") or {}), **common_labels(ref.name, "output")}
    meta = _meta(ref, output_claim_name(ref.name, spec), labels, dict(tmeta.get("annotations") or {}) or None)
    if spec.output.reclaim_policy == "Retain":
        del meta["ownerReferences"]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": dict(template["spec"])}


def build_pdb(ref: JobRef, spec: JobSpec) -> dict[str, Any] | None:
    """``spec.podDisruptionBudget.enabled``: no voluntary eviction (drain) may take a rank of a running gang.
    Pods that are not running yet may still be evicted (``AlwaysAllow``), so a drain never waits on a Pending
    pod. The operator's own gang restarts delete pods directly and are not affected."""
    if not spec.pod_disruption_budget:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(ref, ref.name, common_labels(ref.name, "disruption-budget")),
        "spec": {
            "minAvailable": spec.nodes,
            "selector": {  # the ranks, never an elastic job's placeholders (they must not hold up a drain)
                "matchLabels": selector_labels(ref.name),
                "matchExpressions": [{"key": COMPONENT_LABEL, "operator": "NotIn", "values": [PLACEHOLDER]}],
            },
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def hf_home(spec: JobSpec) -> str:
    return f"{CACHE_MOUNT}/huggingface" if spec.cache else "/tmp/huggingface"


def trainer_config(ref: JobRef, spec: JobSpec) -> dict[str, Any]:
    """The config JSON contract read by the trainer (trainer-image/.../config.schema.json)."""
    t = spec.training
    return {
        "configVersion": CONFIG_VERSION,
        "job": {"name": ref.name, "namespace": ref.namespace},
        "task": spec.task,
        "model": {
            "name": spec.model.name,
            "path": spec.model.path,
            "revision": spec.model.revision,
            "initFromConfig": spec.model.init_from_config,
            "trustRemoteCode": spec.model.trust_remote_code,
        },
        "dataset": {
            "name": spec.dataset.name,
            "config": spec.dataset.config,
            "split": spec.dataset.split,
            "evalSplit": spec.dataset.eval_split,
            "path": spec.dataset.path,
            "format": spec.dataset.format,
            "textField": spec.dataset.text_field,
            "textPairField": spec.dataset.text_pair_field,
            "labelField": spec.dataset.label_field,
            "messagesField": spec.dataset.messages_field,
            "promptField": spec.dataset.prompt_field,
            "completionField": spec.dataset.completion_field,
            "chosenField": spec.dataset.chosen_field,
            "rejectedField": spec.dataset.rejected_field,
        },
        "training": {
            "epochs": t.epochs,
            "maxSteps": t.max_steps,
            "perDeviceBatchSize": t.per_device_batch_size,
            "gradientAccumulationSteps": t.gradient_accumulation_steps,
            "learningRate": t.learning_rate,
            "maxSeqLength": t.max_seq_length,
            "precision": t.precision,
            "seed": t.seed,
            "checkpointEverySteps": t.checkpoint_every_steps,
            "keepCheckpoints": t.keep_checkpoints,
            "evaluation": {"strategy": t.evaluation.strategy, "everySteps": t.evaluation.every_steps},
            "extraArgs": _with_ddp_timeout(t.extra_args, spec.active_deadline_seconds),
            "lora": None
            if t.lora is None
            else {
                "r": t.lora.r,
                "alpha": t.lora.alpha if t.lora.alpha is not None else 2 * t.lora.r,
                "dropout": t.lora.dropout,
                "targetModules": list(t.lora.target_modules),
                "quantization": t.lora.quantization,
                "merge": t.lora.merge,
            },
            "packing": t.packing,
            "lossOn": t.loss_on,
            "sharding": t.sharding,
            "activationCheckpointing": t.activation_checkpointing,
            "dpo": None if t.dpo is None else {"beta": t.dpo.beta, "lossType": t.dpo.loss_type},
            "grpo": None if t.grpo is None else t.grpo.config(),
            "kernels": t.kernels,
            **({"globalBatchSize": t.global_batch_size} if t.global_batch_size is not None else {}),
        },
        "acceleration": spec.acceleration,
        **({"evaluation": spec.evaluation.config()} if spec.evaluation else {}),  # optional (since 1.6)
        "output": _output_config(ref, spec),
        "metrics": {"port": METRICS_PORT},
        "preflight": {"timeoutSeconds": spec.rendezvous_timeout_seconds},
        **({"cache": {"path": hf_home(spec)}} if spec.cache else {}),  # optional (config 1.x minor addition)
    }


def _output_config(ref: JobRef, spec: JobSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"path": output_path(ref, spec)}
    hub, s3 = spec.output.push_to_hub, spec.output.s3
    if hub:
        out["pushToHub"] = {"repo": hub.repo, "private": hub.private, "endpoint": hub.endpoint}
    if s3:
        out["s3"] = {"uri": s3.uri, "endpoint": s3.endpoint, "region": s3.region}
    return out


METADATA_DISABLED_ENV = "AWS_EC2_METADATA_DISABLED"
# The instance-metadata addresses (IPv4, and IPv6 on Nitro instances) the job's NetworkPolicy denies by default.
METADATA_CIDRS = (("0.0.0.0/0", "169.254.169.254/32"), ("::/0", "fd00:ec2::254/128"))


def instance_metadata_allowed(spec: JobSpec) -> bool:
    return bool(spec.output.s3 and spec.output.s3.allow_instance_metadata)


def export_env(spec: JobSpec) -> list[dict[str, Any]]:
    """Export credentials, by Secret reference only (the operator never reads them); rank 0's pod only, where the
    launcher keeps them out of the training processes' environment (finetune_trainer.export.SECRET_ENV)."""
    env: list[dict[str, Any]] = []
    hub, s3 = spec.output.push_to_hub, spec.output.s3
    if hub and hub.secret:
        env.append(
            {
                "name": "FINETUNE_HUB_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": hub.secret.name, "key": hub.secret.key}},
            }
        )
    if s3 and s3.secret_name:
        for key, optional in (
            ("AWS_ACCESS_KEY_ID", False),
            ("AWS_SECRET_ACCESS_KEY", False),
            ("AWS_SESSION_TOKEN", True),
        ):
            ref: dict[str, Any] = {"name": s3.secret_name, "key": key}
            if optional:
                ref["optional"] = True
            env.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
    return env


def _with_ddp_timeout(extra: dict[str, Any], deadline: int | None) -> dict[str, Any]:
    """A collective that hangs must time out well before the job's deadline (torch's default is 30 min), so the
    failure is a rank error that restarts the gang rather than a DeadlineExceeded. The user's value wins."""
    out = dict(extra)
    if deadline and "ddp_timeout" not in out:
        out["ddp_timeout"] = max(60, min(1800, deadline // 4))
    return out


CONFIG_DIGEST_ENV = "FINETUNE_CONFIG_SHA256"


def config_text(ref: JobRef, spec: JobSpec) -> str:
    """The trainer config file exactly as the ConfigMap holds it."""
    return json.dumps(trainer_config(ref, spec), indent=2, sort_keys=True)


def config_digest(ref: JobRef, spec: JobSpec) -> str:
    """sha256 of :func:`config_text`, in every pod's env (``FINETUNE_CONFIG_SHA256``, immutable once the pod exists):
    the launcher and every worker refuse a config file that is not the one admission judged (a tenant may edit the
    ConfigMap in its namespace; it may not edit a pod's env)."""
    return hashlib.sha256(config_text(ref, spec).encode()).hexdigest()


def build_config_map(ref: JobRef, spec: JobSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(ref, config_map_name(ref.name), common_labels(ref.name, "config")),
        "data": {CONFIG_FILE: config_text(ref, spec)},
    }


def env_contract(
    ref: JobRef, spec: JobSpec, *, rank: int, attempt: int, restarts_left: int = 0
) -> list[dict[str, str]]:
    """The rendezvous env of one pod (trainer-image/README.md, "Env contract"); torchrun reads every PET_* as a
    flag default. ``restarts_left``: what spec.maxRestarts leaves the attempt, which the trainer's agents may spend
    restarting every rank in place."""
    addr = master_addr(ref.name)
    pairs = [
        ("PET_NNODES", spec.nodes),
        ("NNODES", spec.nodes),
        ("PET_NPROC_PER_NODE", spec.procs_per_node),
        ("NPROC_PER_NODE", spec.procs_per_node),
        ("PET_NODE_RANK", rank),
        ("NODE_RANK", rank),
        ("PET_MASTER_ADDR", addr),
        ("MASTER_ADDR", addr),
        ("PET_MASTER_PORT", MASTER_PORT),
        ("MASTER_PORT", MASTER_PORT),
        ("WORLD_SIZE", spec.world_size),
        ("FINETUNE_JOB_NAME", ref.name),
        ("FINETUNE_NAMESPACE", ref.namespace),
        ("FINETUNE_ATTEMPT", attempt),
        ("FINETUNE_RESTARTS_IN_PLACE", restarts_left),
        ("FINETUNE_CONFIG", f"{CONFIG_DIR}/{CONFIG_FILE}"),
    ]
    return [{"name": k, "value": str(v)} for k, v in pairs]


def build_pod(
    ref: JobRef, spec: JobSpec, *, rank: int, attempt: int, settings: Settings, restarts_left: int = 0
) -> dict[str, Any]:
    name = pod_name(ref.name, rank)
    queue = None if spec.admitted_as else spec.queue_name  # a MultiKueue worker's copy is admitted already
    kueue_labels, kueue_annotations = kueue.pod_metadata(queue, ref.name, ref.uid, attempt, spec.nodes)
    gang_labels, gang_annotations = gang.pod_metadata(gang_of(spec, settings), pod_group_name(ref, attempt))
    labels = {
        **spec.pod_template.labels,
        **kueue_labels,
        **gang_labels,
        **common_labels(ref.name, "trainer"),
        LABEL_RANK: str(rank),
        LABEL_ATTEMPT: str(attempt),
    }
    annotations = {
        **spec.pod_template.annotations,
        **kueue_annotations,
        **gang_annotations,
        **placement.pod_annotations(spec.topology, LABEL_RANK),
    }

    env: list[dict[str, Any]] = list(env_contract(ref, spec, rank=rank, attempt=attempt, restarts_left=restarts_left))
    env.append({"name": CONFIG_DIGEST_ENV, "value": config_digest(ref, spec)})
    user_env_names = {e["name"] for e in spec.env}
    if "HF_HOME" not in user_env_names:
        env.append({"name": "HF_HOME", "value": hf_home(spec)})
    if spec.gpus_per_node > 0 and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in user_env_names:
        # A rank whose peer died raises instead of hanging in a collective until the NCCL watchdog fires.
        env.append({"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"})
    if not instance_metadata_allowed(spec) and METADATA_DISABLED_ENV not in user_env_names:
        # boto3 (the S3 export, and any code in the job) must not fall back to the node's IAM role, which every job
        # on the node shares; the job's NetworkPolicy also denies egress to the metadata address.
        env.append({"name": METADATA_DISABLED_ENV, "value": "true"})
    env.extend(spec.env)
    if spec.hf_token:
        env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": spec.hf_token.name, "key": spec.hf_token.key}}}
        )
    if rank == 0:  # the export runs on rank 0 only, after its training processes exited; no other rank gets them
        env.extend(export_env(spec))

    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "output", "mountPath": OUTPUT_MOUNT},
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_map_name(ref.name)}},
        {"name": "output", "persistentVolumeClaim": {"claimName": output_claim_name(ref.name, spec)}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if spec.cache:
        mounts.append({"name": "hf-cache", "mountPath": CACHE_MOUNT})
        volumes.append({"name": "hf-cache", "persistentVolumeClaim": {"claimName": spec.cache.claim_name}})
    for v in spec.pod_template.volumes:
        mounts.append({"name": v.name, "mountPath": v.mount_path, "readOnly": v.read_only})
        volumes.append({"name": v.name, **v.source})

    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": settings.trainer_image(acceleration=spec.acceleration, image=spec.image),
        "imagePullPolicy": spec.image_pull_policy or settings.image_pull_policy,
        "command": ["finetune-trainer"],
        "env": env,
        "ports": [
            {"name": "rendezvous", "containerPort": MASTER_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        "volumeMounts": mounts,
        # The trainer writes its own message; never a log tail, which may hold printed tokens or data rows and would
        # become readable in status.failure and Events by anyone with the view role.
        "terminationMessagePolicy": "File",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            # RDMA pins memory (IPC_LOCK): allowed only in a privileged namespace (Pod Security).
            "capabilities": {"drop": ["ALL"], **({"add": ["IPC_LOCK"]} if spec.network.rdma else {})},
        },
    }
    if spec.resources:
        # Quantities as strings: the CRD accepts `nvidia.com/gpu: 8`, a Pod's ResourceList wants "8".
        container["resources"] = {
            section: {k: str(v) for k, v in values.items()} for section, values in spec.resources.items()
        }

    pod_spec: dict[str, Any] = {
        "hostname": name,
        "subdomain": ref.name,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": spec.termination_grace_period_seconds,
        "enableServiceLinks": False,
        "automountServiceAccountToken": spec.pod_template.service_account_name is not None,
        "securityContext": {
            "runAsNonRoot": True,
            **({"runAsUser": settings.run_as_user, "runAsGroup": settings.run_as_user} if settings.run_as_user else {}),
            **({"fsGroup": settings.fs_group} if settings.fs_group else {}),
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if spec.network.host_network:  # NCCL over the node's own interfaces; the privileged Pod Security level only
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"  # J-node-0.J must still resolve
    pt = spec.pod_template
    if pt.service_account_name:
        pod_spec["serviceAccountName"] = pt.service_account_name
    # The platform's defaults (Helm trainer.*) under the job's own: its node labels win key by key, tolerations and
    # pull secrets add up, its priority class is used when the job names none.
    node_selector = {**dict(settings.trainer_node_selector), **dict(pt.node_selector or {})}
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    tolerations = [dict(t) for t in pt.tolerations or ()]
    tolerations += [dict(t) for t in settings.trainer_tolerations if dict(t) not in tolerations]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    affinity = dict(pt.affinity or {})
    spread = spec.topology is None  # with a topology, Kueue's TAS picks the nodes: an anti-affinity it does not
    # read could leave a rank it put beside another one Pending forever
    if spread and spec.nodes > 1 and spec.gpus_per_node > 0 and not spec.mig and "podAntiAffinity" not in affinity:
        # One trainer per machine for multi-node GPU jobs (whole GPUs): ranks on one node would share its PCIe
        # and network and turn a node failure into several rank failures. A user's own podAntiAffinity wins;
        # their node affinity (a GPU model, a zone) is kept alongside.
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": selector_labels(ref.name)}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    if affinity:
        pod_spec["affinity"] = affinity
    if pt.priority_class_name or settings.trainer_priority_class:
        pod_spec["priorityClassName"] = pt.priority_class_name or settings.trainer_priority_class
    scheduler = gang_of(spec, settings)
    if pt.scheduler_name:
        pod_spec["schedulerName"] = pt.scheduler_name
    elif scheduler is not None:  # the gang scheduler binds the ranks (and an elastic job's placeholders)
        pod_spec["schedulerName"] = gang.scheduler_name(scheduler)
    pull_secrets = list(pt.image_pull_secrets or ())
    pull_secrets += [s for s in settings.trainer_image_pull_secrets if s not in pull_secrets]
    if pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(ref, name, labels, annotations or None),
        "spec": pod_spec,
    }


def placeholder_name(job: str, index: int) -> str:
    return f"{job}-grow-{index}"


def gang_of(spec: JobSpec, settings: Settings) -> gang.GangScheduling | None:
    """The job's gang scheduler besides Kueue: its own, else the Helm default (gang.py)."""
    return gang.effective(spec.gang_scheduling, settings.gang_scheduler, settings.gang_scheduler_name)


def pod_group_name(ref: JobRef, attempt: int) -> str:
    """An attempt's PodGroup: named as its Kueue pod group (unique per job, attempt and uid; a label value)."""
    return kueue.group_name(ref.name, attempt, ref.uid)


def build_pod_group(ref: JobRef, spec: JobSpec, *, attempt: int, settings: Settings) -> dict[str, Any] | None:
    """The attempt's PodGroup for its gang scheduler (None without one): ``minMember`` = the attempt's nodes."""
    scheduler = gang_of(spec, settings)
    if scheduler is None:
        return None
    meta = _meta(ref, pod_group_name(ref, attempt), {**common_labels(ref.name, "gang"), LABEL_ATTEMPT: str(attempt)})
    return gang.pod_group(
        scheduler,
        name=meta["name"],
        namespace=ref.namespace,
        owner=meta["ownerReferences"][0],
        labels=meta["labels"],
        nodes=spec.nodes,
    )


def build_workload(ref: JobRef, spec: JobSpec, *, settings: Settings) -> dict[str, Any]:
    """The manager-side Workload of a job MultiKueue dispatches (multikueue.py): its pods shaped as rank 0's."""
    pod = build_pod(ref, spec, rank=0, attempt=0, settings=settings)
    assert spec.queue_name is not None  # spec._managed_by requires it
    return multikueue.workload(
        name=multikueue.workload_name(ref.name, ref.uid),
        namespace=ref.namespace,
        owner=ref.owner_reference(),
        queue=spec.queue_name,
        nodes=spec.nodes,
        pod=pod,
    )


def build_placeholder(
    ref: JobRef, spec: JobSpec, *, index: int, count: int, attempt: int, settings: Settings, generation: int = 0
) -> dict[str, Any]:
    """One placeholder of an elastic job running below spec.nodes (finetune_operator.elastic): a pod that asks the
    scheduler for what one more rank needs (the trainer pod's image, resources, node selector, tolerations, affinity,
    and one node per rank for multi-node GPU jobs) and only sleeps. Once it runs, a node fits a rank: the operator grows
    the gang and deletes it. It runs at the operator's placeholder PriorityClass, below the trainers, so anything that
    needs the node preempts it; it mounts nothing, gets no env and no service account token. It carries no Kueue
    priority (a WorkloadPriorityClass would let a pod that only sleeps preempt other Workloads), and ``generation``
    names its pod group (kueue.placeholder_group)."""
    rank = spec.nodes + index  # as the rank it stands for: its affinity keeps it off the nodes the gang holds
    pod = build_pod(ref, replace(spec, nodes=spec.nodes + count), rank=rank, attempt=attempt, settings=settings)
    kueue_labels, kueue_annotations = kueue.pod_metadata(
        spec.queue_name,
        ref.name,
        ref.uid,
        attempt,
        count,
        group=kueue.placeholder_group(ref.name, attempt, ref.uid, generation),
    )
    labels = {
        **{k: v for k, v in spec.pod_template.labels.items() if k != KUEUE_PRIORITY_LABEL},
        **kueue_labels,
        **common_labels(ref.name, PLACEHOLDER),
        LABEL_ATTEMPT: str(attempt),
    }
    if spec.topology is not None:  # an elastic job's topology is unconstrained (placement.topology_problems)
        kueue_annotations[placement.UNCONSTRAINED_ANNOTATION] = "true"
    pod["metadata"] = _meta(ref, placeholder_name(ref.name, index), labels, kueue_annotations)
    body = pod["spec"]
    (container,) = body["containers"]
    for key in ("env", "ports", "volumeMounts", "terminationMessagePolicy"):
        container.pop(key, None)
    container["command"] = ["sleep", "infinity"]
    container["name"] = "placeholder"
    for key in ("volumes", "hostname", "subdomain", "hostNetwork", "dnsPolicy", "serviceAccountName"):
        body.pop(key, None)
    body["automountServiceAccountToken"] = False
    body["terminationGracePeriodSeconds"] = 1  # sleep, as PID 1, ignores SIGTERM: nothing to wait for
    if settings.placeholder_priority_class:
        body["priorityClassName"] = settings.placeholder_priority_class
    return pod


def is_placeholder(obj: dict[str, Any]) -> bool:
    return obj.get("kind") == "Pod" and (obj["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == PLACEHOLDER


def build_pods(
    ref: JobRef, spec: JobSpec, *, attempt: int, settings: Settings, restarts_left: int = 0
) -> list[dict[str, Any]]:
    return [
        build_pod(ref, spec, rank=r, attempt=attempt, settings=settings, restarts_left=restarts_left)
        for r in range(spec.nodes)
    ]
