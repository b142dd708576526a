"""The FineTuneJob spec, typed and parsed once.

The API server has already applied the CRD's schema, defaults and CEL rules to what the operator
reads; ``finetune run-local`` reads manifests the API server never saw, so the same defaults are
applied here (a unit test checks they agree with the CRD). What the schema cannot express — checks
that need the whole spec or the operator's settings — raises :class:`SpecError`, which names the field
and the fix, and becomes the ``InvalidSpec`` condition.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

TASKS = ("sequence-classification", "token-classification", "question-answering", "causal-lm", "seq2seq")
ACCELERATIONS = ("auto", "ort", "compile", "none")
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # MIG slices (mixed strategy), e.g. nvidia.com/mig-1g.10gb
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 54  # "<name>-node-511" must fit a 63-character DNS label
QUEUE_RE = re.compile(r"^(?=.{1,63}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # a LocalQueue name that is a label value

# Env names the operator owns (the rendezvous contract); the CRD rejects them too.
RESERVED_ENV = frozenset({
    "NNODES", "NPROC_PER_NODE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK",
    "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HF_TOKEN",
})
RESERVED_ENV_PREFIXES = ("PET_", "FINETUNE_", "TORCHELASTIC_")
# Env the NVIDIA container runtime reads to expose GPUs and driver capabilities: set by a tenant, they would reach
# GPUs the pod never requested (the device plugin sets them from the pod's nvidia.com/gpu request). Reserved too.
GPU_VISIBILITY_ENV = frozenset({
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES",
    "CUDA_VISIBLE_DEVICES",
})
# Env that loads code from outside the image (the dynamic linker, Python, CUDA and NCCL plugins, PATH for the
# trainer's own command); refused where the platform restricts images (guardrails).
CODE_LOADING_ENV = frozenset({"PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH", "PYTHONPATH",
                              "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "CUDA_INJECTION64_PATH",
                              "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN"})
KUEUE_PREFIX = "kueue.x-k8s.io/"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"  # a WorkloadPriorityClass: checked like priorityClassName

# TrainingArguments fields set from typed fields, so extraArgs may not (name → the field that sets it): from the
# trainer's config contract, of which contract.schema.json is the operator's copy (hack/contract.py).
MANAGED_TRAINING_ARGS: dict[str, str] = json.loads(
    resources.files("finetune_operator").joinpath("contract.schema.json").read_text(encoding="utf-8")
)["properties"]["training"]["properties"]["extraArgs"]["x-managedBy"]
RESERVED_MOUNTS = ("/etc/finetune", "/output", "/dev/shm", "/tmp")
CACHE_MOUNT = "/cache"  # the shared Hugging Face cache (spec.cache), when set
OPERATOR_VOLUMES = ("config", "output", "shm", "tmp", "hf-cache")


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
    messages_field: str | None = None  # causal-lm chat data
    prompt_field: str | None = None  # causal-lm prompt/completion data, with completion_field
    completion_field: str | None = None


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
    quantization: str | None = None  # "4bit": QLoRA (GPU only)
    merge: bool = False


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
    packing: bool = False
    loss_on: str = "completion"
    sharding: str = "none"  # "fsdp"
    activation_checkpointing: bool = False


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str = "token"


@dataclass(frozen=True)
class HubPush:
    repo: str
    private: bool = True
    endpoint: str | None = None
    secret: SecretKeyRef | None = None  # the write token; None: spec.hfTokenSecretRef


@dataclass(frozen=True)
class S3Export:
    uri: str
    endpoint: str | None = None
    region: str | None = None
    secret_name: str | None = None  # holds AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; None: the pod's own role


@dataclass(frozen=True)
class Output:
    claim_name: str | None = None  # an existing claim, or None: the operator creates <job>-output from the template
    path: str | None = None
    template: dict[str, Any] | None = None  # volumeClaimTemplate (metadata + spec), when the operator creates it
    reclaim_policy: str = "Delete"  # Delete: the claim is owned by the job; Retain: it outlives the job
    push_to_hub: HubPush | None = None
    s3: S3Export | None = None


@dataclass(frozen=True)
class Cache:
    claim_name: str  # a shared (ReadWriteMany) claim holding the Hugging Face cache, mounted at /cache


@dataclass(frozen=True)
class Network:
    host_network: bool = False  # needs a namespace that enforces the privileged Pod Security level
    rdma: bool = False  # adds the IPC_LOCK capability (pinned memory); RDMA devices come from spec.resources


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
    mig: bool = False  # the GPU is one MIG slice (several pods may share a physical GPU's node)
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
    cache: Cache | None = None
    network: Network = field(default_factory=Network)
    pod_disruption_budget: bool = False

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def _get(d: dict[str, Any], key: str, default: Any = None) -> Any:
    v = d.get(key)
    return default if v is None else v


QUANTITY_RE = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")


_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "m": 1e-3,
           "n": 1e-9, "u": 1e-6, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity_bytes(value: Any) -> float:
    """A Kubernetes quantity as a number (bytes for memory); the value must already match QUANTITY_RE."""
    m = re.match(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$", str(value))
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"not a quantity: {value!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def _check_quantity(field_path: str, value: Any) -> None:
    if isinstance(value, int) or QUANTITY_RE.match(str(value)):
        return
    raise SpecError(field_path, f"{value!r} is not a Kubernetes quantity; write it like 16Gi, 500m or 2")


def _gpus(resources: dict[str, dict[str, Any]]) -> tuple[int, bool]:
    """(GPUs per node, whether they are MIG slices): ``nvidia.com/gpu``, or one MIG slice (``nvidia.com/mig-*``),
    limits first (extended resources: requests, when given, must equal limits).

    A CUDA process enumerates a single MIG device, so a trainer pod gets at most one slice and runs one process;
    more slices mean more pods (``spec.nodes``)."""
    for section in ("limits", "requests"):
        values = resources.get(section) or {}
        names = [k for k in values if k == GPU_RESOURCE or k.startswith(MIG_RESOURCE_PREFIX)]
        if not names:
            continue
        counts = {}
        for name in names:
            try:
                counts[name] = int(str(values[name]))
            except ValueError as e:
                raise SpecError(f"spec.resources.{section}['{name}']",
                                f"must be a whole number of GPUs, got {values[name]!r}") from e
        mig = [n for n in names if n.startswith(MIG_RESOURCE_PREFIX) and counts[n]]
        if mig and (len(mig) > 1 or counts[mig[0]] > 1 or counts.get(GPU_RESOURCE)):
            raise SpecError(f"spec.resources.{section}['{mig[0]}']",
                            "a trainer pod takes at most one MIG slice (and no whole GPUs with it): a CUDA process "
                            "sees a single MIG device; ask for more slices with spec.nodes")
        return sum(counts.values()), bool(mig)
    return 0, False


ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")


def _parse_output(out: dict[str, Any], nodes: int) -> Output:
    path = out.get("path")
    if path is not None and any(seg in ("", ".", "..") for seg in str(path).split("/")):
        raise SpecError("spec.output.path", f"{path!r}: a directory inside the claim, without '.' or '..' segments "
                        "(it may not leave the claim or reach another job's directory)")
    claim, template = out.get("claimName"), out.get("volumeClaimTemplate")
    if (claim is None) == (template is None):
        raise SpecError("spec.output", "set exactly one of spec.output.claimName (an existing claim) or "
                        "spec.output.volumeClaimTemplate (the operator creates the claim)")
    if template is not None:
        pvc = template.get("spec") or {}
        modes = list(pvc.get("accessModes") or ())
        if not modes or any(m not in ACCESS_MODES for m in modes):
            raise SpecError("spec.output.volumeClaimTemplate.spec.accessModes",
                            f"must list access modes from {', '.join(ACCESS_MODES)}, got {modes!r}")
        if nodes > 1 and "ReadWriteMany" not in modes:
            raise SpecError("spec.output.volumeClaimTemplate.spec.accessModes",
                            f"must include ReadWriteMany: all {nodes} nodes write checkpoints into the claim "
                            "(or run on 1 node)")
        storage = ((pvc.get("resources") or {}).get("requests") or {}).get("storage")
        if storage is None:
            raise SpecError("spec.output.volumeClaimTemplate.spec.resources.requests.storage",
                            "is required: the size of the claim, for example 100Gi")
        _check_quantity("spec.output.volumeClaimTemplate.spec.resources.requests.storage", storage)
    hub, s3 = out.get("pushToHub"), out.get("s3")
    hub_secret = (hub or {}).get("secretRef")
    return Output(claim_name=claim, path=out.get("path"), template=template,
                  reclaim_policy=_get(out, "reclaimPolicy", "Delete"),
                  push_to_hub=HubPush(repo=hub["repo"], private=bool(_get(hub, "private", True)),
                                      endpoint=hub.get("endpoint"),
                                      secret=SecretKeyRef(hub_secret["name"], _get(hub_secret, "key", "token"))
                                      if hub_secret else None) if hub else None,
                  s3=S3Export(uri=s3["uri"], endpoint=s3.get("endpoint"), region=s3.get("region"),
                              secret_name=(s3.get("secretRef") or {}).get("name")) if s3 else None)


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
                      label_field=_get(d, "labelField", "label"), messages_field=d.get("messagesField"),
                      prompt_field=d.get("promptField"), completion_field=d.get("completionField"))
    if (dataset.name is None) == (dataset.path is None):
        raise SpecError("spec.dataset", "set exactly one of spec.dataset.name (Hub id) or spec.dataset.path")
    ev = _get(t, "evaluation", {})
    lora_d = t.get("lora")
    lora = None
    if lora_d is not None:
        lora = Lora(r=int(lora_d["r"]), alpha=lora_d.get("alpha"), dropout=float(_get(lora_d, "dropout", 0.05)),
                    target_modules=tuple(_get(lora_d, "targetModules", ())), quantization=lora_d.get("quantization"),
                    merge=bool(_get(lora_d, "merge", False)))
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
        packing=bool(_get(t, "packing", False)), loss_on=_get(t, "lossOn", "completion"),
        sharding=_get(t, "sharding", "none"), activation_checkpointing=bool(_get(t, "activationCheckpointing", False)),
    )
    task = _get(spec, "task", "sequence-classification")
    for key, value in (("messagesField", dataset.messages_field), ("promptField", dataset.prompt_field)):
        if value and task != "causal-lm":
            raise SpecError(f"spec.dataset.{key}",
                            f"chat and prompt/completion data are for task causal-lm, not {task}")
    if training.packing and task != "causal-lm":
        raise SpecError("spec.training.packing", f"packing is for task causal-lm, not {task}")
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
    shm = _get(spec, "shmSize", "1Gi")
    _check_quantity("spec.shmSize", shm)
    memory = (resources.get("limits") or {}).get("memory")
    if memory is not None and quantity_bytes(shm) >= quantity_bytes(memory):
        # /dev/shm is a tmpfs: what the trainer writes there counts against the container's memory limit.
        raise SpecError("spec.shmSize", f"{shm} is not below the memory limit {memory} "
                        "(spec.resources.limits.memory), and /dev/shm counts against it; lower shmSize or raise "
                        "the limit")
    gpus, mig = _gpus(resources)
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

    nodes = int(_get(spec, "nodes", 1))
    output = _parse_output(spec["output"], nodes)
    acceleration = _get(spec, "acceleration", "auto")
    if lora is not None and lora.quantization:
        if not gpus:
            raise SpecError("spec.training.lora.quantization", "QLoRA (4-bit base through bitsandbytes) trains on "
                            "GPUs only; request them in spec.resources.limits (nvidia.com/gpu) or remove the "
                            "quantization to train plain LoRA")
        if model.init_from_config:
            raise SpecError("spec.training.lora.quantization", "QLoRA quantizes pretrained weights as they load; "
                            "spec.model.initFromConfig has none. Point spec.model at saved weights")
        if training.sharding == "fsdp":
            raise SpecError("spec.training.sharding", "QLoRA and FSDP do not combine; drop one of them")
    for feature, field_path in (("QLoRA", "spec.training.lora.quantization"), ("FSDP", "spec.training.sharding")):
        used = (lora is not None and lora.quantization) if feature == "QLoRA" else training.sharding == "fsdp"
        if used and acceleration == "ort":
            raise SpecError(field_path, f"{feature} is not available with acceleration ort (ORTTrainer); set "
                            "spec.acceleration to auto, none or compile")
    tok = spec.get("hfTokenSecretRef")
    if output.push_to_hub and output.push_to_hub.secret is None and not tok:
        raise SpecError("spec.output.pushToHub.secretRef", "pushing to the Hub needs a token with write access: "
                        "name a Secret key holding one (or set spec.hfTokenSecretRef)")
    queue = spec.get("queueName")
    if queue is not None and not QUEUE_RE.match(str(queue)):
        raise SpecError("spec.queueName", f"{queue!r} must name a LocalQueue: at most 63 lowercase letters, digits, "
                        "'-' and '.', beginning and ending with a letter or digit (it becomes the pod label "
                        "kueue.x-k8s.io/queue-name)")
    cache_d = spec.get("cache")
    if cache_d is not None and not cache_d.get("claimName"):
        raise SpecError("spec.cache.claimName", "is required: a ReadWriteMany claim for the shared Hugging Face cache")
    cache = Cache(claim_name=cache_d["claimName"]) if cache_d is not None else None
    net = _get(spec, "network", {})
    pt = _get(spec, "podTemplate", {})
    volumes = []
    for i, v in enumerate(_get(pt, "volumes", ())):
        sources = {k: v[k] for k in ("persistentVolumeClaim", "configMap", "secret", "emptyDir") if k in v}
        if len(sources) != 1:
            raise SpecError(f"spec.podTemplate.volumes[{i}]", "needs exactly one of persistentVolumeClaim, "
                            "configMap, secret or emptyDir (other volume types are not allowed)")
        mp = str(v["mountPath"]).rstrip("/") or "/"
        for reserved in (*RESERVED_MOUNTS, *((CACHE_MOUNT,) if cache else ())):
            if mp == reserved or mp.startswith(reserved + "/") or reserved.startswith(mp + "/") or mp == "/":
                raise SpecError(f"spec.podTemplate.volumes[{i}].mountPath",
                                f"{v['mountPath']} overlaps {reserved}, which the operator mounts; pick another path")
        volumes.append(ExtraVolume(name=v["name"], mount_path=v["mountPath"],
                                   read_only=bool(v.get("readOnly", False)), source=sources))
    names = [v.name for v in volumes]
    if len(set(names)) != len(names) or set(OPERATOR_VOLUMES) & set(names):
        raise SpecError("spec.podTemplate.volumes", "volume names must be unique and not one of "
                        f"{', '.join(OPERATOR_VOLUMES)} (used by the operator)")
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

    return JobSpec(
        model=model, dataset=dataset, output=output,
        task=_get(spec, "task", "sequence-classification"), training=training,
        acceleration=acceleration, nodes=nodes, procs_per_node=int(procs),
        gpus_per_node=gpus, mig=mig, resources=resources, image=spec.get("image"),
        image_pull_policy=spec.get("imagePullPolicy"), env=env,
        hf_token=SecretKeyRef(name=tok["name"], key=_get(tok, "key", "token")) if tok else None,
        max_restarts=int(_get(spec, "maxRestarts", 3)),
        active_deadline_seconds=spec.get("activeDeadlineSeconds"),
        ttl_seconds_after_finished=spec.get("ttlSecondsAfterFinished"),
        suspend=bool(spec.get("suspend", False)),
        termination_grace_period_seconds=int(_get(spec, "terminationGracePeriodSeconds", 120)),
        rendezvous_timeout_seconds=int(_get(spec, "rendezvousTimeoutSeconds", 300)),
        shm_size=str(_get(spec, "shmSize", "1Gi")), queue_name=queue,
        pod_template=pod_template, cache=cache,
        network=Network(host_network=bool(net.get("hostNetwork", False)), rdma=bool(net.get("rdma", False))),
        pod_disruption_budget=bool((_get(spec, "podDisruptionBudget", {})).get("enabled", False)),
    )


def check_output_path(namespace: str, name: str, spec: JobSpec) -> None:
    """A job's default output directory is ``<namespace>/<name>`` in its claim: a ``spec.output.path`` may not reach
    into another job's (``<namespace>/<other>``), where it would overwrite that job's checkpoints and model."""
    path = spec.output.path
    if path is None:
        return
    first, _, rest = path.partition("/")
    if first == namespace and rest != name and not rest.startswith(name + "/"):
        raise SpecError("spec.output.path", f"{path!r} is inside {namespace}/, where each job of the namespace has its "
                        f"output directory; use {namespace}/{name}/… or a path that does not start with {namespace}/")


def check_name(name: str) -> None:
    if not NAME_RE.match(name) or len(name) > MAX_NAME:
        raise SpecError("metadata.name", f"{name!r} must be a DNS-1035 label of at most {MAX_NAME} characters")
