"""The FineTuneJob spec, typed and parsed once.

The API server has already applied the CRD's schema, defaults and CEL rules to what the operator
reads; ``finetune run-local`` reads manifests the API server never saw, so the same defaults are
applied here (a unit test checks they agree with the CRD). What the schema cannot express — checks
that need the whole spec or the operator's settings — raises :class:`SpecError`, which names the field
and the fix, and becomes the ``InvalidSpec`` condition.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

TASKS = ("sequence-classification", "token-classification", "question-answering", "causal-lm", "seq2seq")
ACCELERATIONS = ("auto", "ort", "compile", "none")
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
GPU_RESOURCE = "nvidia.com/gpu"
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 54  # "<name>-node-511" must fit a 63-character DNS label

# Env names the operator owns (the rendezvous contract); the CRD rejects them too.
RESERVED_ENV = frozenset({
    "NNODES", "NPROC_PER_NODE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK",
    "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HF_TOKEN",
})
RESERVED_ENV_PREFIXES = ("PET_", "FINETUNE_", "TORCHELASTIC_")

# TrainingArguments fields the operator sets from typed fields: extraArgs may not override them.
MANAGED_TRAINING_ARGS = {
    "output_dir": "spec.output",
    "per_device_train_batch_size": "spec.training.perDeviceBatchSize",
    "gradient_accumulation_steps": "spec.training.gradientAccumulationSteps",
    "learning_rate": "spec.training.learningRate",
    "num_train_epochs": "spec.training.epochs",
    "max_steps": "spec.training.maxSteps",
    "seed": "spec.training.seed",
    "save_steps": "spec.training.checkpointEverySteps",
    "save_total_limit": "spec.training.keepCheckpoints",
    "bf16": "spec.training.precision",
    "fp16": "spec.training.precision",
    "torch_compile": "spec.acceleration",
    "eval_strategy": "spec.training.evaluation.strategy",
    "evaluation_strategy": "spec.training.evaluation.strategy",
    "eval_steps": "spec.training.evaluation.everySteps",
    "resume_from_checkpoint": "(automatic: the newest complete checkpoint)",
}
RESERVED_MOUNTS = ("/etc/finetune", "/output", "/dev/shm", "/tmp")


class SpecError(ValueError):
    """A spec the schema accepted but the operator cannot run; names the field and the fix."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path
        self.message = message


@dataclass(frozen=True)
class Model:
    name: str | None = None
    path: str | None = None
    revision: str | None = None
    init_from_config: bool = False
    trust_remote_code: bool = False


@dataclass(frozen=True)
class Dataset:
    name: str | None = None
    config: str | None = None
    split: str = "train"
    eval_split: str | None = None
    path: str | None = None
    format: str | None = None
    text_field: str = "text"
    text_pair_field: str | None = None
    label_field: str | None = "label"


@dataclass(frozen=True)
class Evaluation:
    strategy: str = "no"
    every_steps: int | None = None


@dataclass(frozen=True)
class Lora:
    r: int
    alpha: int | None = None
    dropout: float = 0.05
    target_modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class Training:
    epochs: float | None = None
    max_steps: int | None = None
    per_device_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-5
    max_seq_length: int = 512
    precision: str = "auto"
    seed: int = 42
    checkpoint_every_steps: int = 500
    keep_checkpoints: int = 2
    evaluation: Evaluation = field(default_factory=Evaluation)
    extra_args: dict[str, Any] = field(default_factory=dict)
    lora: Lora | None = None


@dataclass(frozen=True)
class Output:
    claim_name: str
    path: str | None = None


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str = "token"


@dataclass(frozen=True)
class ExtraVolume:
    name: str
    mount_path: str
    read_only: bool
    source: dict[str, Any]  # exactly one of persistentVolumeClaim / configMap / secret / emptyDir


@dataclass(frozen=True)
class PodTemplate:
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: dict[str, Any] | None = None
    priority_class_name: str | None = None
    scheduler_name: str | None = None
    service_account_name: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    volumes: tuple[ExtraVolume, ...] = ()


@dataclass(frozen=True)
class JobSpec:
    """A FineTuneJob's spec after defaults; ``procs_per_node`` is already resolved."""

    model: Model
    dataset: Dataset
    output: Output
    task: str = "sequence-classification"
    training: Training = field(default_factory=Training)
    acceleration: str = "auto"
    nodes: int = 1
    procs_per_node: int = 1
    gpus_per_node: int = 0
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    image: str | None = None
    image_pull_policy: str | None = None
    env: tuple[dict[str, Any], ...] = ()
    hf_token: SecretKeyRef | None = None
    max_restarts: int = 3
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = None
    suspend: bool = False
    termination_grace_period_seconds: int = 120
    rendezvous_timeout_seconds: int = 300
    shm_size: str = "1Gi"
    queue_name: str | None = None
    pod_template: PodTemplate = field(default_factory=PodTemplate)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def _get(d: dict[str, Any], key: str, default: Any = None) -> Any:
    v = d.get(key)
    return default if v is None else v


QUANTITY_RE = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")


def _check_quantity(field_path: str, value: Any) -> None:
    if isinstance(value, int) or QUANTITY_RE.match(str(value)):
        return
    raise SpecError(field_path, f"{value!r} is not a Kubernetes quantity; write it like 16Gi, 500m or 2")


def _gpus(resources: dict[str, dict[str, Any]]) -> int:
    for section in ("limits", "requests"):
        v = (resources.get(section) or {}).get(GPU_RESOURCE)
        if v is not None:
            try:
                return int(str(v))
            except ValueError as e:
                raise SpecError(f"spec.resources.{section}['{GPU_RESOURCE}']",
                                f"must be a whole number of GPUs, got {v!r}") from e
    return 0


def parse_spec(spec: dict[str, Any]) -> JobSpec:
    """Parse a FineTuneJob ``spec`` (as the API server returns it, or a raw manifest's)."""
    if not isinstance(spec, dict):
        raise SpecError("spec", "must be an object")
    for required in ("model", "dataset", "output"):
        if not isinstance(spec.get(required), dict):
            raise SpecError(f"spec.{required}", "is required")
    m, d, t = spec["model"], spec["dataset"], _get(spec, "training", {})
    model = Model(name=m.get("name"), path=m.get("path"), revision=m.get("revision"),
                  init_from_config=bool(m.get("initFromConfig", False)),
                  trust_remote_code=bool(m.get("trustRemoteCode", False)))
    if (model.name is None) == (model.path is None):
        raise SpecError("spec.model", "set exactly one of spec.model.name (Hub id) or spec.model.path")
    dataset = Dataset(name=d.get("name"), config=d.get("config"), split=_get(d, "split", "train"),
                      eval_split=d.get("evalSplit"), path=d.get("path"), format=d.get("format"),
                      text_field=_get(d, "textField", "text"), text_pair_field=d.get("textPairField"),
                      label_field=_get(d, "labelField", "label"))
    if (dataset.name is None) == (dataset.path is None):
        raise SpecError("spec.dataset", "set exactly one of spec.dataset.name (Hub id) or spec.dataset.path")
    ev = _get(t, "evaluation", {})
    lora_d = t.get("lora")
    lora = None
    if lora_d is not None:
        lora = Lora(r=int(lora_d["r"]), alpha=lora_d.get("alpha"), dropout=float(_get(lora_d, "dropout", 0.05)),
                    target_modules=tuple(_get(lora_d, "targetModules", ())))
    training = Training(
        epochs=t.get("epochs"), max_steps=t.get("maxSteps"),
        per_device_batch_size=int(_get(t, "perDeviceBatchSize", 8)),
        gradient_accumulation_steps=int(_get(t, "gradientAccumulationSteps", 1)),
        learning_rate=float(_get(t, "learningRate", 5e-5)),
        max_seq_length=int(_get(t, "maxSeqLength", 512)),
        precision=_get(t, "precision", "auto"), seed=int(_get(t, "seed", 42)),
        checkpoint_every_steps=int(_get(t, "checkpointEverySteps", 500)),
        keep_checkpoints=int(_get(t, "keepCheckpoints", 2)),
        evaluation=Evaluation(strategy=_get(ev, "strategy", "no"), every_steps=ev.get("everySteps")),
        extra_args=dict(_get(t, "extraArgs", {})), lora=lora,
    )
    if training.epochs is not None and training.max_steps is not None:
        raise SpecError("spec.training", "set spec.training.epochs or spec.training.maxSteps, not both")
    if training.epochs is None and training.max_steps is None:
        training = Training(**{**training.__dict__, "epochs": 1.0})
    for key in training.extra_args:
        if key in MANAGED_TRAINING_ARGS:
            raise SpecError(f"spec.training.extraArgs.{key}",
                            f"is managed by the operator; set {MANAGED_TRAINING_ARGS[key]} instead")
    if training.evaluation.strategy != "no" and dataset.eval_split is None:
        raise SpecError("spec.dataset.evalSplit", "is required when spec.training.evaluation.strategy is "
                        f"{training.evaluation.strategy!r}")

    resources = {k: dict(v) for k, v in _get(spec, "resources", {}).items() if v}
    for section, values in resources.items():
        for name, value in values.items():
            _check_quantity(f"spec.resources.{section}['{name}']", value)
    _check_quantity("spec.shmSize", _get(spec, "shmSize", "1Gi"))
    gpus = _gpus(resources)
    procs = spec.get("procsPerNode")
    if procs is None:
        procs = gpus or 1
    elif gpus and int(procs) != gpus:
        raise SpecError("spec.procsPerNode", f"is {procs} but each node gets {gpus} GPUs; make them equal, "
                        "or leave procsPerNode unset to derive it from the GPUs")

    env = tuple(dict(e) for e in _get(spec, "env", ()))
    for i, e in enumerate(env):
        name = str(e.get("name", ""))
        if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
            raise SpecError(f"spec.env[{i}].name", f"{name} is reserved by the rendezvous contract; remove it")

    out = spec["output"]
    if not out.get("claimName"):
        raise SpecError("spec.output.claimName", "is required: the claim that holds checkpoints and the model")
    tok = spec.get("hfTokenSecretRef")
    pt = _get(spec, "podTemplate", {})
    volumes = []
    for i, v in enumerate(_get(pt, "volumes", ())):
        sources = {k: v[k] for k in ("persistentVolumeClaim", "configMap", "secret", "emptyDir") if k in v}
        if len(sources) != 1:
            raise SpecError(f"spec.podTemplate.volumes[{i}]", "needs exactly one of persistentVolumeClaim, "
                            "configMap, secret or emptyDir (other volume types are not allowed)")
        mp = str(v["mountPath"]).rstrip("/") or "/"
        for reserved in RESERVED_MOUNTS:
            if mp == reserved or mp.startswith(reserved + "/") or reserved.startswith(mp + "/") or mp == "/":
                raise SpecError(f"spec.podTemplate.volumes[{i}].mountPath",
                                f"{v['mountPath']} overlaps {reserved}, which the operator mounts; pick another path")
        volumes.append(ExtraVolume(name=v["name"], mount_path=v["mountPath"],
                                   read_only=bool(v.get("readOnly", False)), source=sources))
    names = [v.name for v in volumes]
    if len(set(names)) != len(names) or {"config", "output", "shm", "tmp"} & set(names):
        raise SpecError("spec.podTemplate.volumes", "volume names must be unique and not one of config, "
                        "output, shm, tmp (used by the operator)")
    pod_template = PodTemplate(
        labels=dict(_get(pt, "labels", {})), annotations=dict(_get(pt, "annotations", {})),
        node_selector=dict(_get(pt, "nodeSelector", {})), tolerations=tuple(_get(pt, "tolerations", ())),
        affinity=pt.get("affinity"), priority_class_name=pt.get("priorityClassName"),
        scheduler_name=pt.get("schedulerName"), service_account_name=pt.get("serviceAccountName"),
        image_pull_secrets=tuple(s["name"] for s in _get(pt, "imagePullSecrets", ())),
        volumes=tuple(volumes),
    )
    for k in pod_template.labels:
        if k.startswith("finetune.dev/"):
            raise SpecError(f"spec.podTemplate.labels['{k}']", "the finetune.dev/ prefix is reserved; rename it")
    nodes = int(_get(spec, "nodes", 1))
    return JobSpec(
        model=model, dataset=dataset, output=Output(claim_name=out["claimName"], path=out.get("path")),
        task=_get(spec, "task", "sequence-classification"), training=training,
        acceleration=_get(spec, "acceleration", "auto"), nodes=nodes, procs_per_node=int(procs),
        gpus_per_node=gpus, resources=resources, image=spec.get("image"),
        image_pull_policy=spec.get("imagePullPolicy"), env=env,
        hf_token=SecretKeyRef(name=tok["name"], key=_get(tok, "key", "token")) if tok else None,
        max_restarts=int(_get(spec, "maxRestarts", 3)),
        active_deadline_seconds=spec.get("activeDeadlineSeconds"),
        ttl_seconds_after_finished=spec.get("ttlSecondsAfterFinished"),
        suspend=bool(spec.get("suspend", False)),
        termination_grace_period_seconds=int(_get(spec, "terminationGracePeriodSeconds", 120)),
        rendezvous_timeout_seconds=int(_get(spec, "rendezvousTimeoutSeconds", 300)),
        shm_size=str(_get(spec, "shmSize", "1Gi")), queue_name=spec.get("queueName"),
        pod_template=pod_template,
    )


def check_name(name: str) -> None:
    if not NAME_RE.match(name) or len(name) > MAX_NAME:
        raise SpecError("metadata.name", f"{name!r} must be a DNS-1035 label of at most {MAX_NAME} characters")
