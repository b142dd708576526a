"""The FineTuneJob spec, typed and parsed once.

The API server has already applied the CRD's schema, defaults and CEL rules to what the operator
reads; ``finetune run-local`` reads manifests the API server never saw, so the same defaults are
applied here (a unit test checks they agree with the CRD). What the schema cannot express — checks
that need the whole spec or the operator's settings — raises :class:`SpecError`, which names the field
and the fix, and becomes the ``InvalidSpec`` condition.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

from finetune_operator.gang import GangScheduling, parse_gang_scheduling
from finetune_operator.grpo import Grpo
from finetune_operator.grpo import parse as parse_grpo
from finetune_operator.grpo import problems as grpo_problems
from finetune_operator.multikueue import MANAGED_BY as MULTIKUEUE
from finetune_operator.placement import Topology, parse_topology, topology_problems
from finetune_operator.scoring import Scoring
from finetune_operator.scoring import parse as parse_scoring
from finetune_operator.scoring import problems as scoring_problems

TASKS = ("sequence-classification", "token-classification", "question-answering", "causal-lm", "seq2seq", "dpo", "grpo")
KERNELS = ("auto", "liger", "none")
DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "robust", "bco_pair", "sppo_hard", "nca_pair", "apo_zero", "apo_down")
ACCELERATIONS = ("auto", "ort", "compile", "none")
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # MIG slices (mixed strategy), e.g. nvidia.com/mig-1g.10gb
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 54  # "<name>-node-511" must fit a 63-character DNS label
QUEUE_RE = re.compile(r"^(?=.{1,63}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # a LocalQueue name that is a label value

# Env names the operator owns (the rendezvous contract); the CRD rejects them too.
RESERVED_ENV = frozenset(
    {
        "NNODES",
        "NPROC_PER_NODE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "HF_TOKEN",
    }
)
RESERVED_ENV_PREFIXES = ("PET_", "FINETUNE_", "TORCHELASTIC_")
# Env the NVIDIA container runtime reads to expose GPUs and driver capabilities: set by a tenant, they would reach
# GPUs the pod never requested (the device plugin sets them from the pod's nvidia.com/gpu request). Reserved too.
GPU_VISIBILITY_ENV = frozenset(
    {
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_MIG_MONITOR_DEVICES",
        "CUDA_VISIBLE_DEVICES",
    }
)
# Env that loads code from outside the image (the dynamic linker, Python, CUDA and NCCL plugins, PATH for the
# trainer's own command), or points a cache whose contents run as code at a tenant's volume (NCCL's config file, which
# may name a plugin; Python's bytecode cache; Triton's compiled launchers, under $HOME/.triton unless set; Inductor's
# generated code; torch's built extensions and hub code), or names a binary or library the stack runs (Triton's ptxas,
# cuobjdump, nvdisasm and libcuda; the CUDA driver's JIT cache of compiled kernels); refused where the platform
# restricts images (guardrails).
CODE_LOADING_ENV = frozenset(
    {
        "PATH",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "GCONV_PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONPYCACHEPREFIX",
        "CUDA_INJECTION64_PATH",
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "NCCL_PROFILER_PLUGIN",
        "NCCL_CONF_FILE",
        "HOME",
        "XDG_CACHE_HOME",
        "TRITON_HOME",
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
        "TORCH_EXTENSIONS_DIR",
        "TORCH_HOME",
        "TRITON_PTXAS_PATH",
        "TRITON_PTXAS_BLACKWELL_PATH",
        "TRITON_CUOBJDUMP_PATH",
        "TRITON_NVDISASM_PATH",
        "TRITON_LIBCUDA_PATH",
        "CUDA_CACHE_PATH",
    }
)
KUEUE_PREFIX = "kueue.x-k8s.io/"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"  # a WorkloadPriorityClass: checked like priorityClassName

# TrainingArguments fields set from typed fields, so extraArgs may not (name → the field that sets it): from the
# trainer's config contract, of which contract.schema.json is the operator's copy (hack/contract.py).
MANAGED_TRAINING_ARGS: dict[str, str] = json.loads(
    resources.files("finetune_operator").joinpath("contract.schema.json").read_text(encoding="utf-8")
)["properties"]["training"]["properties"]["extraArgs"]["x-managedBy"]
# What each trainer stack's TrainingArguments accepts (hack/training_args.py generates it from the stacks' locks):
# "default" for the default image, "ort" for the ONNX Runtime image.
TRAINING_ARGS: dict[str, dict[str, Any]] = json.loads(
    resources.files("finetune_operator").joinpath("training_args.json").read_text(encoding="utf-8")
)
RESERVED_MOUNTS = ("/etc/finetune", "/output", "/dev/shm", "/tmp")
CACHE_MOUNT = "/cache"  # the shared Hugging Face cache (spec.cache), when set
OPERATOR_VOLUMES = ("config", "output", "shm", "tmp", "hf-cache")


class SpecError(ValueError):
    """A spec the schema accepted but the operator cannot run; names the field and the fix. One error, or every error
    of a spec (:attr:`errors`, in the order the fields are read); ``field`` and ``message`` are the first's."""

    def __init__(self, field_path: str, message: str, *, more: tuple[tuple[str, str], ...] = ()) -> None:
        self.errors: tuple[tuple[str, str], ...] = ((field_path, message), *more)
        super().__init__("; ".join(f"{f}: {m}" for f, m in self.errors))
        self.field = field_path
        self.message = message

    def lines(self) -> list[str]:
        """Each error as ``field: message``."""
        return [f"{f}: {m}" for f, m in self.errors]


class _Errors:
    """Collects a spec's errors so a user sees all of them at once; conversions that fail record the field and
    return a default, so the checks after them still run."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str]] = []

    def add(self, field_path: str, message: str) -> None:
        self.found.append((field_path, message))

    def take(self, e: SpecError) -> None:
        self.found.extend(e.errors)

    def number(self, d: dict[str, Any], key: str, field_path: str, default: Any, kind: type) -> Any:
        """``d[key]`` as an int or a float (``kind``), ``default`` when absent; a value of another type is an error
        (the API server's schema refuses it too; ``finetune run-local`` and ``finetune validate --offline`` see raw
        manifests)."""
        v = d.get(key)
        if v is None:
            return default
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or (kind is int and isinstance(v, float) and not v.is_integer())
        ):
            what = "a whole number" if kind is int else "a number"
            self.add(field_path, f"must be {what}, got {v!r}")
            return default
        return kind(v)

    def flag(self, d: dict[str, Any], key: str, field_path: str, default: bool = False) -> bool:
        v = d.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            self.add(field_path, f"must be true or false, got {v!r}")
            return default
        return v

    def section(self, d: dict[str, Any], key: str, field_path: str) -> dict[str, Any]:
        v = d.get(key)
        if v is None:
            return {}
        if not isinstance(v, dict):
            self.add(field_path, f"must be an object, got {v!r}")
            return {}
        return v

    def raise_any(self) -> None:
        if self.found:
            (first_field, first_message), *more = self.found
            raise SpecError(first_field, first_message, more=tuple(more))


def paths_overlap(a: str, b: str) -> bool:
    """Two normal absolute paths where a mount at one would cover or sit inside the other."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def normal_path(path: str) -> bool:
    """An absolute path already in its normal form: one leading '/', no empty, '.' or '..' segment, no trailing '/'.
    The container runtime cleans a mount path before mounting it, so '//usr', '/data/../usr' or '/./opt' would land
    on '/usr' and '/opt' while a prefix check on the raw string lets them through: such paths are refused instead."""
    return path.startswith("/") and path != "/" and all(seg not in ("", ".", "..") for seg in path[1:].split("/"))


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
    chosen_field: str | None = None  # dpo preference pairs, with prompt_field and rejected_field
    rejected_field: str | None = None


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
class Dpo:
    beta: float = 0.1
    loss_type: str = "sigmoid"


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
    dpo: Dpo | None = None  # task dpo (defaults filled in there)
    grpo: Grpo | None = None  # task grpo (defaults filled in there; finetune_operator.grpo)
    kernels: str = "auto"  # "liger" (GPU only), "none", or "auto": where the trainer's auto table measured it faster
    global_batch_size: int | None = None  # an elastic job's, as asked at spec.nodes (elastic.sized); None: not elastic


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
    allow_instance_metadata: bool = False  # the node's IAM role through 169.254.169.254 (shared by every job)


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
class RuntimeRef:
    """spec.runtimeRef: the runtime (finetune_operator.runtimes) whose defaults and guardrails the job runs with."""

    name: str
    kind: str = "ClusterFineTuneRuntime"  # or FineTuneRuntime, in the job's namespace


def runtime_ref_of(ref: Any) -> RuntimeRef | None:
    """``spec.runtimeRef`` as written (None when it names no runtime), read alone: ``finetune validate`` looks the
    runtime up even when the rest of the spec holds errors; parse_spec reports what is wrong with it."""
    if not isinstance(ref, dict) or not ref.get("name"):
        return None
    return RuntimeRef(str(ref["name"]), str(ref.get("kind", "ClusterFineTuneRuntime")))


@dataclass(frozen=True)
class Elastic:
    """spec.elastic: the gang may run on fewer nodes than spec.nodes, down to ``min_nodes`` (finetune_operator.elastic,
    docs/elastic.md). spec.nodes stays the size the job asks for, and the one quota and guardrails judge."""

    min_nodes: int
    resize_cooldown_seconds: int = 300  # the least time between a resize and a grow after it
    unschedulable_seconds: int = 120  # ranks unschedulable this long: the next attempt runs on the ranks placed


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
    runtime_ref: RuntimeRef | None = None
    elastic: Elastic | None = None
    topology: Topology | None = None  # spec.topology: Kueue's topology-aware placement (finetune_operator.placement)
    gang_scheduling: GangScheduling | None = None  # spec.gangScheduling: a gang scheduler besides Kueue (gang.py)
    managed_by: str | None = None  # spec.managedBy: kueue.x-k8s.io/multikueue dispatches it (multikueue.py)
    admitted_as: str | None = None  # a worker's copy: the Workload Kueue admitted it as (not a spec field)
    evaluation: Scoring | None = None  # the evaluation stage after training (finetune_operator.scoring)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def _get(d: dict[str, Any], key: str, default: Any = None) -> Any:
    v = d.get(key)
    return default if v is None else v


QUANTITY_RE = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")


_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": 1e-3,
    "n": 1e-9,
    "u": 1e-6,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


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
                raise SpecError(
                    f"spec.resources.{section}['{name}']", f"must be a whole number of GPUs, got {values[name]!r}"
                ) from e
        mig = [n for n in names if n.startswith(MIG_RESOURCE_PREFIX) and counts[n]]
        if mig and (len(mig) > 1 or counts[mig[0]] > 1 or counts.get(GPU_RESOURCE)):
            raise SpecError(
                f"spec.resources.{section}['{mig[0]}']",
                "a trainer pod takes at most one MIG slice (and no whole GPUs with it): a CUDA process "
                "sees a single MIG device; ask for more slices with spec.nodes",
            )
        return sum(counts.values()), bool(mig)
    return 0, False


ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")


def _parse_output(out: dict[str, Any], nodes: int, errors: _Errors, *, complete: bool) -> Output:
    path = out.get("path")
    if path is not None and any(seg in ("", ".", "..") for seg in str(path).split("/")):
        errors.add(
            "spec.output.path",
            f"{path!r}: a directory inside the claim, without '.' or '..' segments "
            "(it may not leave the claim or reach another job's directory)",
        )
    claim, template = out.get("claimName"), out.get("volumeClaimTemplate")
    if claim is not None and template is not None:
        errors.add(
            "spec.output",
            "set one of spec.output.claimName (an existing claim) or spec.output.volumeClaimTemplate (the operator "
            "creates the claim), not both",
        )
    elif complete and claim is None and template is None:
        errors.add(
            "spec.output",
            "set spec.output.claimName (an existing claim) or spec.output.volumeClaimTemplate (the operator creates "
            "the claim), or run with a runtime whose template has an output claim template (spec.runtimeRef)",
        )
    if isinstance(template, dict):
        pvc = template.get("spec") or {}
        modes = list(pvc.get("accessModes") or ())
        if not modes or any(m not in ACCESS_MODES for m in modes):
            errors.add(
                "spec.output.volumeClaimTemplate.spec.accessModes",
                f"must list access modes from {', '.join(ACCESS_MODES)}, got {modes!r}",
            )
        elif nodes > 1 and "ReadWriteMany" not in modes:
            errors.add(
                "spec.output.volumeClaimTemplate.spec.accessModes",
                f"must include ReadWriteMany: all {nodes} nodes write checkpoints into the claim (or run on 1 node)",
            )
        storage = ((pvc.get("resources") or {}).get("requests") or {}).get("storage")
        if storage is None:
            errors.add(
                "spec.output.volumeClaimTemplate.spec.resources.requests.storage",
                "is required: the size of the claim, for example 100Gi",
            )
        else:
            try:
                _check_quantity("spec.output.volumeClaimTemplate.spec.resources.requests.storage", storage)
            except SpecError as e:
                errors.take(e)
    hub = errors.section(out, "pushToHub", "spec.output.pushToHub")
    s3 = errors.section(out, "s3", "spec.output.s3")
    hub_secret = hub.get("secretRef")
    if hub and not hub.get("repo"):
        errors.add("spec.output.pushToHub.repo", "is required: the Hub repository to push to, e.g. my-org/my-model")
    if s3 and not s3.get("uri"):
        errors.add("spec.output.s3.uri", "is required: where the model goes, e.g. s3://bucket/prefix")
    return Output(
        claim_name=claim,
        path=out.get("path"),
        template=template if isinstance(template, dict) else None,
        reclaim_policy=_get(out, "reclaimPolicy", "Delete"),
        push_to_hub=HubPush(
            repo=str(hub.get("repo", "")),
            private=bool(_get(hub, "private", True)),
            endpoint=hub.get("endpoint"),
            secret=SecretKeyRef(hub_secret["name"], _get(hub_secret, "key", "token")) if hub_secret else None,
        )
        if hub
        else None,
        s3=S3Export(
            uri=str(s3.get("uri", "")),
            endpoint=s3.get("endpoint"),
            region=s3.get("region"),
            secret_name=(s3.get("secretRef") or {}).get("name"),
            allow_instance_metadata=errors.flag(s3, "allowInstanceMetadata", "spec.output.s3.allowInstanceMetadata"),
        )
        if s3
        else None,
    )


def _preference(dataset: Dataset, training: Training, errors: _Errors) -> tuple[Dataset, Training]:
    """Task dpo: prompt, chosen and rejected columns (named prompt, chosen, rejected unless set), the DPO settings'
    defaults; chat or completion columns are another task's (and packing, refused for every task but causal-lm)."""
    for key, value in (("messagesField", dataset.messages_field), ("completionField", dataset.completion_field)):
        if value:
            errors.add(
                f"spec.dataset.{key}",
                "task dpo reads preference pairs (spec.dataset.promptField, chosenField, rejectedField); remove it",
            )
    dataset = replace(
        dataset,
        prompt_field=dataset.prompt_field or "prompt",
        chosen_field=dataset.chosen_field or "chosen",
        rejected_field=dataset.rejected_field or "rejected",
    )
    return dataset, replace(training, dpo=training.dpo or Dpo())


def _prompts(dataset: Dataset, training: Training, errors: _Errors) -> tuple[Dataset, Training]:
    """Task grpo: a prompt column (named prompt unless set) and the columns its rewards read; the model writes the
    completions, so chat and completion columns are another task's."""
    for key, value in (("messagesField", dataset.messages_field), ("completionField", dataset.completion_field)):
        if value:
            errors.add(
                f"spec.dataset.{key}",
                "task grpo reads prompts (spec.dataset.promptField) and generates the completions; remove it",
            )
    return replace(dataset, prompt_field=dataset.prompt_field or "prompt"), replace(
        training, grpo=training.grpo or Grpo()
    )


def _parse_training(t: dict[str, Any], errors: _Errors) -> Training:
    num, f = errors.number, "spec.training"
    ev = errors.section(t, "evaluation", f"{f}.evaluation")
    lora_d = errors.section(t, "lora", f"{f}.lora") if t.get("lora") is not None else None
    lora = None
    if lora_d is not None:
        r = num(lora_d, "r", f"{f}.lora.r", None, int)
        if r is None and "r" not in lora_d:
            errors.add(f"{f}.lora.r", "is required: the LoRA rank, for example 16")
        modules = _get(lora_d, "targetModules", ())
        if not isinstance(modules, list | tuple) or not all(isinstance(m, str) for m in modules):
            errors.add(f"{f}.lora.targetModules", f"must be a list of module names, got {modules!r}")
            modules = ()
        lora = Lora(
            r=r or 0,
            alpha=num(lora_d, "alpha", f"{f}.lora.alpha", None, int),
            dropout=num(lora_d, "dropout", f"{f}.lora.dropout", 0.05, float),
            target_modules=tuple(modules),
            quantization=lora_d.get("quantization"),
            merge=errors.flag(lora_d, "merge", f"{f}.lora.merge"),
        )
    extra = errors.section(t, "extraArgs", f"{f}.extraArgs")
    dpo = None
    if t.get("dpo") is not None:
        dpo_d = errors.section(t, "dpo", f"{f}.dpo")
        beta = num(dpo_d, "beta", f"{f}.dpo.beta", 0.1, float)
        if beta is not None and beta <= 0:
            errors.add(f"{f}.dpo.beta", f"must be greater than 0, got {beta}")
        loss_type = _get(dpo_d, "lossType", "sigmoid")
        if loss_type not in DPO_LOSS_TYPES:
            errors.add(f"{f}.dpo.lossType", f"must be one of {', '.join(DPO_LOSS_TYPES)}, got {loss_type!r}")
        dpo = Dpo(beta=beta if beta is not None else 0.1, loss_type=loss_type)
    grpo = None
    if t.get("grpo") is not None:
        grpo = parse_grpo(errors.section(t, "grpo", f"{f}.grpo"), errors.add)
    training = Training(
        epochs=num(t, "epochs", f"{f}.epochs", None, float),
        max_steps=num(t, "maxSteps", f"{f}.maxSteps", None, int),
        per_device_batch_size=num(t, "perDeviceBatchSize", f"{f}.perDeviceBatchSize", 8, int),
        gradient_accumulation_steps=num(t, "gradientAccumulationSteps", f"{f}.gradientAccumulationSteps", 1, int),
        learning_rate=num(t, "learningRate", f"{f}.learningRate", 5e-5, float),
        max_seq_length=num(t, "maxSeqLength", f"{f}.maxSeqLength", 512, int),
        precision=_get(t, "precision", "auto"),
        seed=num(t, "seed", f"{f}.seed", 42, int),
        checkpoint_every_steps=num(t, "checkpointEverySteps", f"{f}.checkpointEverySteps", 500, int),
        keep_checkpoints=num(t, "keepCheckpoints", f"{f}.keepCheckpoints", 2, int),
        evaluation=Evaluation(
            strategy=_get(ev, "strategy", "no"),
            every_steps=num(ev, "everySteps", f"{f}.evaluation.everySteps", None, int),
        ),
        extra_args=dict(extra),
        lora=lora,
        packing=errors.flag(t, "packing", f"{f}.packing"),
        loss_on=_get(t, "lossOn", "completion"),
        sharding=_get(t, "sharding", "none"),
        activation_checkpointing=errors.flag(t, "activationCheckpointing", f"{f}.activationCheckpointing"),
        dpo=dpo,
        grpo=grpo,
        kernels=_get(t, "kernels", "auto"),
    )
    if training.kernels not in KERNELS:
        errors.add(f"{f}.kernels", f"must be one of {', '.join(KERNELS)}, got {training.kernels!r}")
    if training.epochs is not None and training.max_steps is not None:
        errors.add(f, "set spec.training.epochs or spec.training.maxSteps, not both")
    if training.epochs is None and training.max_steps is None:
        training = Training(**{**training.__dict__, "epochs": 1.0})
    for key in training.extra_args:
        if key in MANAGED_TRAINING_ARGS:
            errors.add(f"{f}.extraArgs.{key}", f"is managed by the operator; set {MANAGED_TRAINING_ARGS[key]} instead")
    return training


def _managed_by(spec: dict[str, Any], errors: _Errors) -> str | None:
    """spec.managedBy: only MultiKueue's value (a job the operator runs itself leaves it out); it needs a queue, the
    manager's LocalQueue, a fixed size (MultiKueue admits one Workload for the job) and no topology."""
    value = spec.get("managedBy")
    if value is None:
        return None
    if value != MULTIKUEUE:
        errors.add("spec.managedBy", f"{value!r}: the only value is {MULTIKUEUE} (leave it out to run the job here)")
        return None
    if not spec.get("queueName"):
        errors.add("spec.queueName", f"is required with spec.managedBy {MULTIKUEUE}: the manager's LocalQueue")
    if spec.get("elastic") is not None:
        errors.add("spec.elastic", f"is not available with spec.managedBy {MULTIKUEUE}: remove one of them")
    if spec.get("topology") is not None:
        errors.add(
            "spec.topology",
            f"is not available with spec.managedBy {MULTIKUEUE}: the worker's copy runs outside its Kueue's queues "
            "(its Workload was admitted by MultiKueue); remove one of them",
        )
    return str(value)


def _parse_elastic(spec: dict[str, Any], nodes: int, errors: _Errors) -> Elastic | None:
    if spec.get("elastic") is None:
        return None
    e, f = errors.section(spec, "elastic", "spec.elastic"), "spec.elastic"
    least = errors.number(e, "minNodes", f"{f}.minNodes", None, int)
    if least is None:
        if "minNodes" not in e:
            errors.add(f"{f}.minNodes", "is required: the fewest nodes the job may train on (1 to spec.nodes)")
        return None
    if not 1 <= least <= nodes:
        errors.add(
            f"{f}.minNodes",
            f"is {least} but must be between 1 and spec.nodes ({nodes}): spec.nodes is the most the job runs on",
        )
    cooldown = errors.number(e, "resizeCooldownSeconds", f"{f}.resizeCooldownSeconds", 300, int)
    unschedulable = errors.number(e, "unschedulableSeconds", f"{f}.unschedulableSeconds", 120, int)
    if cooldown < 0:
        errors.add(f"{f}.resizeCooldownSeconds", f"must be 0 or more, got {cooldown}")
    if unschedulable < 1:
        errors.add(f"{f}.unschedulableSeconds", f"must be 1 or more, got {unschedulable}")
    return Elastic(min_nodes=least, resize_cooldown_seconds=cooldown, unschedulable_seconds=unschedulable)


def _parse_volumes(pt: dict[str, Any], cache: bool, errors: _Errors) -> tuple[ExtraVolume, ...]:
    volumes = []
    for i, v in enumerate(_get(pt, "volumes", ())):
        field_path = f"spec.podTemplate.volumes[{i}]"
        if not isinstance(v, dict):
            errors.add(field_path, f"must be an object, got {v!r}")
            continue
        sources = {k: v[k] for k in ("persistentVolumeClaim", "configMap", "secret", "emptyDir") if k in v}
        if len(sources) != 1:
            errors.add(
                field_path,
                "needs exactly one of persistentVolumeClaim, configMap, secret or emptyDir "
                "(other volume types are not allowed)",
            )
        raw = str(v.get("mountPath", ""))
        if not normal_path(raw):
            errors.add(
                f"{field_path}.mountPath",
                f"{raw!r} must be an absolute path in normal form: one leading "
                "'/', no empty, '.' or '..' segments and no trailing '/' (for example /data)",
            )
        else:
            for reserved in (*RESERVED_MOUNTS, *((CACHE_MOUNT,) if cache else ())):
                if paths_overlap(raw, reserved):
                    errors.add(
                        f"{field_path}.mountPath",
                        f"{raw} overlaps {reserved}, which the operator mounts; pick another path",
                    )
                    break
        volumes.append(
            ExtraVolume(
                name=str(v.get("name", "")), mount_path=raw, read_only=bool(v.get("readOnly", False)), source=sources
            )
        )
    names = [v.name for v in volumes]
    if len(set(names)) != len(names) or set(OPERATOR_VOLUMES) & set(names):
        errors.add(
            "spec.podTemplate.volumes",
            f"volume names must be unique and not one of {', '.join(OPERATOR_VOLUMES)} (used by the operator)",
        )
    return tuple(volumes)


def parse_spec(spec: dict[str, Any], *, complete: bool = True) -> JobSpec:
    """Parse a FineTuneJob ``spec`` (as the API server returns it, or a raw manifest's). Raises one
    :class:`SpecError` that holds every error found, each naming its field. ``complete=False``: the job's own spec,
    before its runtime's template is merged in (finetune_operator.runtimes), which may still give the output claim."""
    if not isinstance(spec, dict):
        raise SpecError("spec", "must be an object")
    errors = _Errors()
    for required in ("model", "dataset"):
        if not isinstance(spec.get(required), dict):
            errors.add(f"spec.{required}", "is required (an object)")
    m, d = spec.get("model") or {}, spec.get("dataset") or {}
    m, d = (m if isinstance(m, dict) else {}), (d if isinstance(d, dict) else {})
    t = errors.section(spec, "training", "spec.training")
    model = Model(
        name=m.get("name"),
        path=m.get("path"),
        revision=m.get("revision"),
        init_from_config=errors.flag(m, "initFromConfig", "spec.model.initFromConfig"),
        trust_remote_code=errors.flag(m, "trustRemoteCode", "spec.model.trustRemoteCode"),
    )
    if "model" in spec and isinstance(spec["model"], dict) and (model.name is None) == (model.path is None):
        errors.add("spec.model", "set exactly one of spec.model.name (Hub id) or spec.model.path")
    dataset = Dataset(
        name=d.get("name"),
        config=d.get("config"),
        split=_get(d, "split", "train"),
        eval_split=d.get("evalSplit"),
        path=d.get("path"),
        format=d.get("format"),
        text_field=_get(d, "textField", "text"),
        text_pair_field=d.get("textPairField"),
        label_field=_get(d, "labelField", "label"),
        messages_field=d.get("messagesField"),
        prompt_field=d.get("promptField"),
        completion_field=d.get("completionField"),
        chosen_field=d.get("chosenField"),
        rejected_field=d.get("rejectedField"),
    )
    if "dataset" in spec and isinstance(spec["dataset"], dict) and (dataset.name is None) == (dataset.path is None):
        errors.add("spec.dataset", "set exactly one of spec.dataset.name (Hub id) or spec.dataset.path")
    training = _parse_training(t, errors)
    task = _get(spec, "task", "sequence-classification")
    if task == "dpo":
        dataset, training = _preference(dataset, training, errors)
    if task == "grpo":
        dataset, training = _prompts(dataset, training, errors)
    for key, value in (("messagesField", dataset.messages_field), ("promptField", dataset.prompt_field)):
        if value and task not in ("causal-lm", "dpo", "grpo"):
            errors.add(f"spec.dataset.{key}", f"chat and prompt/completion data are for task causal-lm, not {task}")
    for key, value in (("chosenField", dataset.chosen_field), ("rejectedField", dataset.rejected_field)):
        if value and task != "dpo":
            errors.add(f"spec.dataset.{key}", f"preference pairs (chosen/rejected) are for task dpo, not {task}")
    if training.dpo is not None and task != "dpo":
        errors.add("spec.training.dpo", f"is for task dpo, not {task}; remove it or set spec.task: dpo")
    if training.grpo is not None and task != "grpo":
        errors.add("spec.training.grpo", f"is for task grpo, not {task}; remove it or set spec.task: grpo")
    if training.packing and task != "causal-lm":
        errors.add("spec.training.packing", f"packing is for task causal-lm, not {task}")
    if training.evaluation.strategy != "no" and dataset.eval_split is None:
        errors.add(
            "spec.dataset.evalSplit",
            f"is required when spec.training.evaluation.strategy is {training.evaluation.strategy!r}",
        )

    resources: dict[str, dict[str, Any]] = {}
    for section, values in errors.section(spec, "resources", "spec.resources").items():
        if values and not isinstance(values, dict):
            errors.add(f"spec.resources.{section}", f"must be a map of resource names to quantities, got {values!r}")
        elif values:
            resources[section] = dict(values)
    for section, values in resources.items():
        for name, value in values.items():
            try:
                _check_quantity(f"spec.resources.{section}['{name}']", value)
            except SpecError as e:
                errors.take(e)
    shm = _get(spec, "shmSize", "1Gi")
    memory = (resources.get("limits") or {}).get("memory")
    try:
        _check_quantity("spec.shmSize", shm)
        if memory is not None and QUANTITY_RE.match(str(memory)) and quantity_bytes(shm) >= quantity_bytes(memory):
            # /dev/shm is a tmpfs: what the trainer writes there counts against the container's memory limit.
            errors.add(
                "spec.shmSize",
                f"{shm} is not below the memory limit {memory} "
                "(spec.resources.limits.memory), and /dev/shm counts against it; lower shmSize or raise "
                "the limit",
            )
    except SpecError as bad:
        errors.take(bad)
    except ValueError as bad:
        errors.add("spec.shmSize", str(bad))
    gpus, mig = 0, False
    try:
        gpus, mig = _gpus(resources)
    except SpecError as bad:
        errors.take(bad)
    procs = errors.number(spec, "procsPerNode", "spec.procsPerNode", None, int)
    if procs is None:
        procs = gpus or 1
    elif gpus and procs != gpus:
        errors.add(
            "spec.procsPerNode",
            f"is {procs} but each node gets {gpus} GPUs; make them equal, "
            "or leave procsPerNode unset to derive it from the GPUs",
        )

    env = tuple(dict(item) for item in _get(spec, "env", ()) if isinstance(item, dict))
    for i, var in enumerate(env):
        name = str(var.get("name", ""))
        if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
            errors.add(f"spec.env[{i}].name", f"{name} is reserved by the rendezvous contract; remove it")
        elif name == "AWS_EC2_METADATA_DISABLED":
            errors.add(
                f"spec.env[{i}].name",
                f"{name} is set by the operator: the node's IAM role is off unless the job opts in with "
                "spec.output.s3.allowInstanceMetadata; remove it",
            )

    nodes = errors.number(spec, "nodes", "spec.nodes", 1, int)
    output = (
        _parse_output(errors.section(spec, "output", "spec.output"), nodes, errors, complete=complete)
        if spec.get("output") is not None or complete
        else Output()
    )
    acceleration = _get(spec, "acceleration", "auto")
    if training.kernels == "liger" and task not in ("causal-lm", "dpo"):
        errors.add(
            "spec.training.kernels",
            f"Liger's kernels are for language-model heads (task causal-lm or dpo), not {task}; set kernels to auto "
            "or none",
        )
    if training.kernels == "liger" and not gpus:
        errors.add(
            "spec.training.kernels",
            "Liger's kernels are Triton GPU kernels: request nvidia.com/gpu in spec.resources.limits, or set "
            "kernels to auto or none",
        )
    if training.kernels == "liger" and acceleration == "ort":
        errors.add(
            "spec.training.kernels",
            "Liger's kernels run on the default trainer image, not with acceleration ort; set spec.acceleration to "
            "auto, none or compile",
        )
    if task == "dpo" and acceleration == "ort":
        errors.add(
            "spec.acceleration",
            "task dpo runs on the default trainer image (TRL's DPOTrainer); acceleration ort cannot run it: use "
            "auto, compile or none",
        )
    if lora := training.lora:
        if lora.quantization and not gpus:
            errors.add(
                "spec.training.lora.quantization",
                "QLoRA (4-bit base through bitsandbytes) trains on "
                "GPUs only; request them in spec.resources.limits (nvidia.com/gpu) or remove the "
                "quantization to train plain LoRA",
            )
        if lora.quantization and model.init_from_config:
            errors.add(
                "spec.training.lora.quantization",
                "QLoRA quantizes pretrained weights as they load; "
                "spec.model.initFromConfig has none. Point spec.model at saved weights",
            )
        if lora.quantization and training.sharding == "fsdp":
            errors.add("spec.training.sharding", "QLoRA and FSDP do not combine; drop one of them")
    for feature, field_path in (("QLoRA", "spec.training.lora.quantization"), ("FSDP", "spec.training.sharding")):
        used = (lora is not None and lora.quantization) if feature == "QLoRA" else training.sharding == "fsdp"
        if used and acceleration == "ort":
            errors.add(
                field_path,
                f"{feature} is not available with acceleration ort (ORTTrainer); set "
                "spec.acceleration to auto, none or compile",
            )
    tok = errors.section(spec, "hfTokenSecretRef", "spec.hfTokenSecretRef")
    if output.push_to_hub and output.push_to_hub.secret is None and not tok:
        errors.add(
            "spec.output.pushToHub.secretRef",
            "pushing to the Hub needs a token with write access: "
            "name a Secret key holding one (or set spec.hfTokenSecretRef)",
        )
    queue = spec.get("queueName")
    if queue is not None and not QUEUE_RE.match(str(queue)):
        errors.add(
            "spec.queueName",
            f"{queue!r} must name a LocalQueue: at most 63 lowercase letters, digits, "
            "'-' and '.', beginning and ending with a letter or digit (it becomes the pod label "
            "kueue.x-k8s.io/queue-name)",
        )
    cache_d = spec.get("cache")
    if cache_d is not None and not (isinstance(cache_d, dict) and cache_d.get("claimName")):
        errors.add("spec.cache.claimName", "is required: a ReadWriteMany claim for the shared Hugging Face cache")
        cache_d = None
    cache = Cache(claim_name=cache_d["claimName"]) if cache_d is not None else None
    net = errors.section(spec, "network", "spec.network")
    pt = errors.section(spec, "podTemplate", "spec.podTemplate")
    pod_template = PodTemplate(
        labels=dict(_get(pt, "labels", {})),
        annotations=dict(_get(pt, "annotations", {})),
        node_selector=dict(_get(pt, "nodeSelector", {})),
        tolerations=tuple(_get(pt, "tolerations", ())),
        affinity=pt.get("affinity"),
        priority_class_name=pt.get("priorityClassName"),
        scheduler_name=pt.get("schedulerName"),
        service_account_name=pt.get("serviceAccountName"),
        image_pull_secrets=tuple(s["name"] for s in _get(pt, "imagePullSecrets", ()) if isinstance(s, dict)),
        volumes=_parse_volumes(pt, cache is not None, errors),
    )
    for k in pod_template.labels:
        if k.startswith("finetune.dev/"):
            errors.add(f"spec.podTemplate.labels['{k}']", "the finetune.dev/ prefix is reserved; rename it")
    ref = errors.section(spec, "runtimeRef", "spec.runtimeRef")
    if ref and not ref.get("name"):
        errors.add("spec.runtimeRef.name", "is required: the runtime's name (`finetune runtimes` lists them)")
    if ref and ref.get("kind", "ClusterFineTuneRuntime") not in ("ClusterFineTuneRuntime", "FineTuneRuntime"):
        errors.add("spec.runtimeRef.kind", f"{ref['kind']!r}: expected ClusterFineTuneRuntime or FineTuneRuntime")
    elastic = _parse_elastic(spec, nodes, errors)
    ev = errors.section(spec, "evaluation", "spec.evaluation") if spec.get("evaluation") is not None else None
    job_spec = JobSpec(
        evaluation=parse_scoring(ev, errors.add) if ev is not None else None,
        elastic=elastic,
        topology=(topology := parse_topology(spec.get("topology"), errors.add)),
        gang_scheduling=parse_gang_scheduling(spec.get("gangScheduling"), errors.add),
        managed_by=_managed_by(spec, errors),
        runtime_ref=runtime_ref_of(ref),
        model=model,
        dataset=dataset,
        output=output,
        task=task,
        training=training,
        acceleration=acceleration,
        nodes=nodes,
        procs_per_node=procs,
        gpus_per_node=gpus,
        mig=mig,
        resources=resources,
        image=spec.get("image"),
        image_pull_policy=spec.get("imagePullPolicy"),
        env=env,
        hf_token=SecretKeyRef(name=tok["name"], key=_get(tok, "key", "token")) if tok.get("name") else None,
        max_restarts=errors.number(spec, "maxRestarts", "spec.maxRestarts", 3, int),
        active_deadline_seconds=errors.number(spec, "activeDeadlineSeconds", "spec.activeDeadlineSeconds", None, int),
        ttl_seconds_after_finished=errors.number(
            spec, "ttlSecondsAfterFinished", "spec.ttlSecondsAfterFinished", None, int
        ),
        suspend=errors.flag(spec, "suspend", "spec.suspend"),
        termination_grace_period_seconds=errors.number(
            spec, "terminationGracePeriodSeconds", "spec.terminationGracePeriodSeconds", 120, int
        ),
        rendezvous_timeout_seconds=errors.number(
            spec, "rendezvousTimeoutSeconds", "spec.rendezvousTimeoutSeconds", 300, int
        ),
        shm_size=str(shm),
        queue_name=queue,
        pod_template=pod_template,
        cache=cache,
        network=Network(
            host_network=errors.flag(net, "hostNetwork", "spec.network.hostNetwork"),
            rdma=errors.flag(net, "rdma", "spec.network.rdma"),
        ),
        pod_disruption_budget=errors.flag(
            errors.section(spec, "podDisruptionBudget", "spec.podDisruptionBudget"),
            "enabled",
            "spec.podDisruptionBudget.enabled",
        ),
    )
    if task == "grpo":
        for field_path, message in grpo_problems(job_spec):
            errors.add(field_path, message)
    for field_path, message in (*scoring_problems(job_spec), *topology_problems(topology, elastic=elastic is not None)):
        errors.add(field_path, message)
    check_extra_args(job_spec, errors)
    errors.raise_any()
    return job_spec


def inexact_sizes(spec: JobSpec) -> list[int]:
    """The sizes in [minNodes, nodes] at which no whole gradient accumulation gives the global batch asked at
    spec.nodes: the rows per step of such a size do not divide it (per-device batch x processes x size)."""
    if spec.elastic is None:
        return []
    asked = spec.training.gradient_accumulation_steps * spec.nodes  # in micro-batches of one node's processes
    return [size for size in range(spec.elastic.min_nodes, spec.nodes) if asked % size]


def elastic_problems(spec: JobSpec, floors: tuple[int, int, str] | None = None) -> list[tuple[str, str]]:
    """(field, message) for an elastic job that could not keep its global batch exactly at every size, whose ranks
    would time out before it shrinks, or (``floors``: the least resizeCooldownSeconds and unschedulableSeconds the
    platform allows, and where they are set) that would resize at every hiccup. Judged when a job is first admitted
    (and by ``finetune validate``, without the floors, which are the operator's), never on a job that already runs:
    an operator upgrade or an edit of rendezvousTimeoutSeconds does not fail a running job."""
    el = spec.elastic
    if el is None or not 1 <= el.min_nodes <= spec.nodes:
        return []
    found: list[tuple[str, str]] = []
    if floors is not None:
        least_cooldown, least_unschedulable, where = floors
        for field_path, value, least, name in (
            (
                "spec.elastic.resizeCooldownSeconds",
                el.resize_cooldown_seconds,
                least_cooldown,
                "minResizeCooldownSeconds",
            ),
            (
                "spec.elastic.unschedulableSeconds",
                el.unschedulable_seconds,
                least_unschedulable,
                "minUnschedulableSeconds",
            ),
        ):
            if value < least:
                message = (
                    f"is {value}s, below the {least}s the platform allows ({where.format(name)}): shorter, an "
                    "autoscaler's delay shrinks the gang and a flapping node restarts it again and again; raise it, "
                    "or leave it out for the default"
                )
                found.append((field_path, message))
    if inexact := inexact_sizes(spec):
        asked = spec.training.gradient_accumulation_steps * spec.nodes
        fits = [s for s in range(1, spec.nodes + 1) if asked % s == 0]
        message = (
            f"the global batch (spec.nodes x gradientAccumulationSteps = {asked} micro-batches) cannot be kept "
            f"exactly at {', '.join(map(str, inexact))} node(s): the epoch length and learning-rate schedule would "
            "change with the size. Raise minNodes, or set spec.training.gradientAccumulationSteps so that every size "
            "from minNodes to spec.nodes divides spec.nodes x gradientAccumulationSteps (sizes that divide "
            f"{asked} now: {', '.join(map(str, fits))})"
        )
        found.append(("spec.elastic.minNodes", message))
    if el.unschedulable_seconds >= spec.rendezvous_timeout_seconds:
        message = (
            f"is {el.unschedulable_seconds}s, not less than spec.rendezvousTimeoutSeconds "
            f"({spec.rendezvous_timeout_seconds}s): the placed ranks would time out waiting for the unplaced ones "
            "before the job shrinks to them. Lower unschedulableSeconds or raise spec.rendezvousTimeoutSeconds"
        )
        found.append(("spec.elastic.unschedulableSeconds", message))
    return found


_JSON_TYPE = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
    type(None): "null",
}
_TYPE_WORDS = {
    "boolean": "true or false",
    "integer": "a whole number",
    "number": "a number",
    "string": "a string",
    "array": "a list",
    "object": "an object",
}


def _sft(spec: JobSpec) -> bool:
    """causal-lm data that trains with TRL's SFTTrainer (the trainer's data.uses_sft)."""
    d = spec.dataset
    return bool(d.messages_field or d.prompt_field or d.completion_field or spec.training.packing)


def check_extra_args(spec: JobSpec, errors: _Errors) -> None:
    """``spec.training.extraArgs`` against the TrainingArguments of the image the job will run (the default image, or
    the ONNX Runtime one for ``acceleration: ort``): each name must be a field, each value of the field's type (and
    one of its values for an enum), integrations the image lacks are refused. A job with its own ``spec.image`` runs
    a stack the operator cannot know, so its trainer checks the names at start-up instead."""
    if spec.image:
        return
    stack = TRAINING_ARGS["ort" if spec.acceleration == "ort" else "default"]
    image = (
        f"the {'ONNX Runtime' if spec.acceleration == 'ort' else 'default'} trainer image (transformers "
        f"{stack['transformers']})"
    )
    # TRL's DPOConfig (task dpo), GRPOConfig (task grpo) and SFTConfig (chat, prompt/completion or packed data) add
    # fields of their own
    trl = spec.task if spec.task in ("dpo", "grpo") else "sft" if spec.task == "causal-lm" and _sft(spec) else None
    names = {**stack["fields"], **(stack.get("trlFields", {}).get(trl, {}) if trl else {})}
    for key, value in spec.training.extra_args.items():
        field_path = f"spec.training.extraArgs.{key}"
        if key in MANAGED_TRAINING_ARGS:
            continue  # refused above, naming the typed field
        known = names.get(key)
        if known is None:
            close = difflib.get_close_matches(key, names, n=3, cutoff=0.7)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            errors.add(field_path, f"is not a {stack['class']} field of {image}{hint}; fix or remove it")
            continue
        kind = _JSON_TYPE.get(type(value), "any")
        allowed = known["type"]
        if "any" not in allowed and kind not in allowed and not (kind == "integer" and "number" in allowed):
            errors.add(
                field_path,
                f"must be {' or '.join(_TYPE_WORDS.get(t, t) for t in allowed if t != 'null')}"
                f"{' (or null)' if 'null' in allowed else ''}, got {value!r}",
            )
            continue
        if known.get("enum") and isinstance(value, str) and value not in known["enum"]:
            close = difflib.get_close_matches(value, known["enum"], n=2, cutoff=0.6)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            errors.add(
                field_path, f"{value!r} is not a value {image} accepts{hint}; one of: {', '.join(known['enum'])}"
            )
        if key == "deepspeed" and value is not None and not stack["deepspeed"]:
            errors.add(
                field_path,
                f"DeepSpeed is not installed in {image}; shard with spec.training.sharding: fsdp "
                "instead, or build an image that adds DeepSpeed (spec.image)",
            )
        if key == "report_to":
            asked = [value] if isinstance(value, str) else list(value or [])
            missing = [r for r in asked if r not in ("none", "all") and r not in stack["reportTo"]]
            if missing:
                have = ", ".join(stack["reportTo"]) or "none"
                errors.add(
                    field_path,
                    f"{', '.join(missing)}: {image} has no such integration installed (it has: "
                    f"{have}); remove it (the trainer exports Prometheus metrics itself) or build an image "
                    "that adds it (spec.image)",
                )


def check_output_path(namespace: str, name: str, spec: JobSpec) -> None:
    """A job's default output directory is ``<namespace>/<name>`` in its claim: a ``spec.output.path`` stays in its
    namespace's tree (a claim may be an export that other namespaces' claims reach too, a static NFS volume say) and
    may not reach into another job's (``<namespace>/<other>``), where it would overwrite that job's checkpoints and
    model."""
    path = spec.output.path
    if path is None:
        return
    first, _, rest = path.partition("/")
    if first != namespace:
        raise SpecError(
            "spec.output.path",
            f"{path!r} is outside {namespace}/, the job's namespace's directory in the claim (a claim may reach an "
            f"export other namespaces' jobs write too, each under its own namespace); use {namespace}/{name}/… or "
            f"leave spec.output.path out for {namespace}/{name}",
        )
    if rest != name and not rest.startswith(name + "/"):
        raise SpecError(
            "spec.output.path",
            f"{path!r} is inside {namespace}/, where each job of the namespace has its "
            f"output directory; use {namespace}/{name}/… or a path that does not start with {namespace}/",
        )


def check_name(name: str) -> None:
    if not NAME_RE.match(name) or len(name) > MAX_NAME:
        raise SpecError("metadata.name", f"{name!r} must be a DNS-1035 label of at most {MAX_NAME} characters")
