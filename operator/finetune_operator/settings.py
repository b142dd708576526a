"""Operator settings, read once at start-up from the environment (the Helm chart sets them)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

GROUP = "finetune.dev"
VERSION = "v1alpha1"
PLURAL = "finetunejobs"
KIND = "FineTuneJob"
API_VERSION = f"{GROUP}/{VERSION}"

# Labels on every child object.
LABEL_JOB = "finetune.dev/job-name"
LABEL_RANK = "finetune.dev/node-rank"
LABEL_ATTEMPT = "finetune.dev/attempt"

MASTER_PORT = 29500
METRICS_PORT = 9400
CONFIG_DIR = "/etc/finetune"
CONFIG_FILE = "config.json"
OUTPUT_MOUNT = "/output"
CONFIG_VERSION = "1.6"

# Trainer exit codes (trainer-image/README.md): the operator classifies failures on them.
EXIT_CONFIG_ERROR = 78
EXIT_RENDEZVOUS_TIMEOUT = 75
EXIT_TERMINATED = 143  # SIGTERM: checkpoint saved, restartable
EXIT_CUDA_OOM = 77  # the GPU ran out of memory: the same settings would again
EXIT_EXPORT_FAILED = 74  # trained, but pushing the model out failed; the model is on the claim
EXIT_OUTPUT_FULL = 73  # the output volume is full: the next attempt would fail at the same save


def _int(name: str, default: int) -> int:
    v = os.environ.get(name)
    return int(v) if v else default


def _at_least(name: str, default: int, least: int) -> int:
    v = _int(name, default)
    if v < least:
        raise ValueError(f"{name}={v}: must be at least {least}")
    return v


def _choice(name: str, default: str, allowed: tuple[str, ...]) -> str:
    v = os.environ.get(name) or default
    if v not in allowed:
        raise ValueError(f"{name}={v!r}: expected one of {', '.join(allowed)}")
    return v


def _peers(name: str) -> tuple[dict[str, Any], ...]:
    """A JSON list of NetworkPolicyPeer objects (the chart writes it with toJson)."""
    raw = os.environ.get(name, "").strip()
    peers = json.loads(raw) if raw else []
    if not isinstance(peers, list) or not all(isinstance(p, dict) for p in peers):
        raise ValueError(f"{name}: expected a JSON list of NetworkPolicyPeer objects, got {raw!r}")
    return tuple(peers)


def _json_env(name: str, kind: type, what: str) -> Any:
    """A JSON value of type ``kind`` from the environment (the chart writes it with toJson); empty: ``kind()``."""
    raw = os.environ.get(name, "").strip()
    value = json.loads(raw) if raw else kind()
    if not isinstance(value, kind):
        raise ValueError(f"{name}: expected {what}, got {raw!r}")
    return value


def _id(name: str, default: int | None) -> int | None:
    """A user or group ID: unset, the default; empty, none (the platform assigns it); else a number ≥ 1 (never root)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    if raw.strip().lower() in ("", "none", "null"):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: give a numeric ID (not 0: trainers never run as root), or empty") from None
    if value < 1:
        raise ValueError(f"{name}={raw!r}: trainers never run as root; give an ID of 1 or more, or empty")
    return value


def _list(name: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in os.environ.get(name, "").split(",") if x.strip())


@dataclass(frozen=True)
class Settings:
    """Everything configurable about the operator; one instance, built at start-up."""

    default_image: str = "ghcr.io/finetune-operator/trainer:0.1.0"  # the current stack: every acceleration but ort
    ort_image: str = "ghcr.io/finetune-operator/trainer-ort:0.1.0"  # the frozen ONNX Runtime stack: acceleration ort
    image_pull_policy: str = "IfNotPresent"
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    resync_seconds: int = 30
    watch_cache: bool = True  # passes read jobs and pods from the watches (finetune_operator.store), not the API
    max_disruptions: int = 20  # eviction/preemption restarts, not counted in maxRestarts, bounded
    waiting_timeout_seconds: int = 600  # image pull / container config errors before the job fails
    # A pod still terminating this long after its grace period is force-deleted when its node is lost
    # (state.node_lost: gone, out-of-service, or with force_delete 'not-ready' NotReady that long).
    restart_force_delete_after_seconds: int = 30
    force_delete: str = "not-ready"  # not-ready | out-of-service | never
    failure_restart_grace_seconds: int = 15  # ranks stopped after a peer failed: nothing can be saved
    progress_interval_seconds: int = 15
    metrics_port: int = 8080
    peering_lifetime_seconds: int = 60  # kopf peering: a crashed active replica blocks fail-over this long
    health_port: int = 8081
    backstop_stale_seconds: int = 120  # the liveness probe fails when the backstop loop has not ticked for this long
    failpoints_dir: str = ""  # fault tests only (finetune_operator.failpoints); empty: off
    # The trainer pods' user (and group) and fsGroup; None leaves them out for the platform to assign (OpenShift's
    # restricted-v2 SCC gives each namespace a UID range and refuses a runAsUser outside it).
    run_as_user: int | None = 1000
    fs_group: int | None = 1000
    # Tenant guardrails (empty / 0: no limit).
    allowed_image_prefixes: tuple[str, ...] = ()
    allowed_priority_classes: tuple[str, ...] = ()
    allow_trust_remote_code: bool = True  # False: spec.model.trustRemoteCode is refused
    require_queue_name: bool = False  # True: every job must name a Kueue LocalQueue (spec.queueName)
    gang_scheduler: str = ""  # "", coscheduling or volcano: the gang scheduler of jobs that name none (gang.py)
    gang_scheduler_name: str = ""  # its pods' schedulerName ("": the scheduler's usual name)
    allowed_service_accounts: tuple[str, ...] = ()  # spec.podTemplate.serviceAccountName must be one of these
    allowed_toleration_keys: tuple[str, ...] = ()  # every toleration of spec.podTemplate must have one of these keys
    allowed_schedulers: tuple[str, ...] = ()  # spec.podTemplate.schedulerName must be one of these
    max_nodes_per_job: int = 0
    max_gpus_per_job: int = 0
    max_nodes_per_namespace: int = 0  # across the namespace's active jobs; a job over it waits (QuotaExceeded)
    max_gpus_per_namespace: int = 0
    # A NetworkPolicy per job (builders.build_network_policy): ranks reach each other, the metrics port is reachable
    # from metrics_from (NetworkPolicyPeers; empty: from anywhere), nothing else reaches the trainer pods.
    network_policy: bool = True
    metrics_from: tuple[dict[str, Any], ...] = ()
    # Platform defaults for every trainer pod (builders.build_pod): the job's own values win where both set one.
    trainer_node_selector: tuple[tuple[str, str], ...] = ()  # merged under the job's spec.podTemplate.nodeSelector
    trainer_tolerations: tuple[dict[str, Any], ...] = ()  # added to the job's tolerations
    trainer_priority_class: str = ""  # when the job sets no priorityClassName
    trainer_image_pull_secrets: tuple[str, ...] = ()  # added to the job's imagePullSecrets
    # An elastic job's placeholder pods (builders.build_placeholder) run at this PriorityClass, below every trainer's,
    # so that they hold a node for a grow without ever keeping another workload from it; empty: the trainer's own.
    placeholder_priority_class: str = ""
    # The least spec.elastic.resizeCooldownSeconds and unschedulableSeconds a job may ask for: below them an
    # autoscaler's delay shrinks the gang, and a flapping node restarts it again and again.
    elastic_min_resize_cooldown_seconds: int = 60
    elastic_min_unschedulable_seconds: int = 30

    def trainer_image(self, *, acceleration: str, image: str | None) -> str:
        """The trainer image of a job: its own ``spec.image``, else the ONNX Runtime image for ``ort`` (the only
        stack ORTTrainer runs on), else the default image on the current stack."""
        if image:
            return image
        return self.ort_image if acceleration == "ort" else self.default_image

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            default_image=os.environ.get("FINETUNE_DEFAULT_IMAGE", cls.default_image),
            ort_image=os.environ.get("FINETUNE_ORT_IMAGE", cls.ort_image),
            image_pull_policy=os.environ.get("FINETUNE_IMAGE_PULL_POLICY", cls.image_pull_policy),
            namespaces=_list("FINETUNE_WATCH_NAMESPACES"),
            resync_seconds=_int("FINETUNE_RESYNC_SECONDS", cls.resync_seconds),
            watch_cache=os.environ.get("FINETUNE_WATCH_CACHE", "1").lower() not in ("0", "false", "no"),
            max_disruptions=_int("FINETUNE_MAX_DISRUPTIONS", cls.max_disruptions),
            waiting_timeout_seconds=_int("FINETUNE_WAITING_TIMEOUT_SECONDS", cls.waiting_timeout_seconds),
            restart_force_delete_after_seconds=_int(
                "FINETUNE_FORCE_DELETE_AFTER_SECONDS", cls.restart_force_delete_after_seconds
            ),
            force_delete=_choice("FINETUNE_FORCE_DELETE", cls.force_delete, ("not-ready", "out-of-service", "never")),
            failure_restart_grace_seconds=_int(
                "FINETUNE_FAILURE_RESTART_GRACE_SECONDS", cls.failure_restart_grace_seconds
            ),
            progress_interval_seconds=_int("FINETUNE_PROGRESS_INTERVAL_SECONDS", cls.progress_interval_seconds),
            metrics_port=_int("FINETUNE_METRICS_PORT", cls.metrics_port),
            peering_lifetime_seconds=_int("FINETUNE_PEERING_LIFETIME_SECONDS", cls.peering_lifetime_seconds),
            health_port=_int("FINETUNE_HEALTH_PORT", cls.health_port),
            backstop_stale_seconds=_at_least("FINETUNE_BACKSTOP_STALE_SECONDS", cls.backstop_stale_seconds, 2),
            failpoints_dir=os.environ.get("FINETUNE_FAILPOINTS_DIR", ""),
            allowed_image_prefixes=_list("FINETUNE_ALLOWED_IMAGE_PREFIXES"),
            allowed_priority_classes=_list("FINETUNE_ALLOWED_PRIORITY_CLASSES"),
            require_queue_name=os.environ.get("FINETUNE_REQUIRE_QUEUE_NAME", "false").lower() in ("1", "true", "yes"),
            gang_scheduler=_choice("FINETUNE_GANG_SCHEDULER", cls.gang_scheduler, ("", "coscheduling", "volcano")),
            gang_scheduler_name=os.environ.get("FINETUNE_GANG_SCHEDULER_NAME", cls.gang_scheduler_name),
            allowed_service_accounts=_list("FINETUNE_ALLOWED_SERVICE_ACCOUNTS"),
            allowed_toleration_keys=_list("FINETUNE_ALLOWED_TOLERATION_KEYS"),
            allowed_schedulers=_list("FINETUNE_ALLOWED_SCHEDULERS"),
            allow_trust_remote_code=os.environ.get("FINETUNE_ALLOW_TRUST_REMOTE_CODE", "true").lower()
            not in ("0", "false", "no"),
            max_nodes_per_job=_int("FINETUNE_MAX_NODES_PER_JOB", 0),
            max_gpus_per_job=_int("FINETUNE_MAX_GPUS_PER_JOB", 0),
            max_nodes_per_namespace=_int("FINETUNE_MAX_NODES_PER_NAMESPACE", 0),
            max_gpus_per_namespace=_int("FINETUNE_MAX_GPUS_PER_NAMESPACE", 0),
            network_policy=os.environ.get("FINETUNE_NETWORK_POLICY", "true").lower() not in ("0", "false", "no"),
            metrics_from=_peers("FINETUNE_NETWORK_POLICY_METRICS_FROM"),
            trainer_node_selector=tuple(
                sorted(
                    (str(k), str(v))
                    for k, v in _json_env(
                        "FINETUNE_TRAINER_NODE_SELECTOR", dict, "a JSON object of node labels"
                    ).items()
                )
            ),
            trainer_tolerations=tuple(_json_env("FINETUNE_TRAINER_TOLERATIONS", list, "a JSON list of tolerations")),
            trainer_priority_class=os.environ.get("FINETUNE_TRAINER_PRIORITY_CLASS", ""),
            trainer_image_pull_secrets=_list("FINETUNE_TRAINER_IMAGE_PULL_SECRETS"),
            placeholder_priority_class=os.environ.get("FINETUNE_PLACEHOLDER_PRIORITY_CLASS", ""),
            elastic_min_resize_cooldown_seconds=_int(
                "FINETUNE_ELASTIC_MIN_RESIZE_COOLDOWN_SECONDS", cls.elastic_min_resize_cooldown_seconds
            ),
            elastic_min_unschedulable_seconds=_int(
                "FINETUNE_ELASTIC_MIN_UNSCHEDULABLE_SECONDS", cls.elastic_min_unschedulable_seconds
            ),
            run_as_user=_id("FINETUNE_TRAINER_RUN_AS_USER", cls.run_as_user),
            fs_group=_id("FINETUNE_TRAINER_FS_GROUP", cls.fs_group),
        )
