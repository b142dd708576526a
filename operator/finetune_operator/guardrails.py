"""Pure: the platform team's limits on what a tenant's FineTuneJob may ask for: the operator's own (Helm values
``guardrails.*``) and those of the job's runtime (``spec.guardrails``, finetune_operator.runtimes), each a layer a job
must pass. A violation fails the job at once with a message naming the limit and where it is set: no retry storm."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from finetune_operator.builders import JobRef
from finetune_operator.settings import Settings
from finetune_operator.spec import (
    CODE_LOADING_ENV,
    GPU_VISIBILITY_ENV,
    KUEUE_PREFIX,
    KUEUE_PRIORITY_LABEL,
    JobSpec,
    SpecError,
    check_output_path,
    paths_overlap,
)

# Where the operator's own guardrails are set; a runtime's: "<runtime>: spec.guardrails.{}".
HELM = "Helm value guardrails.{}"


@dataclass(frozen=True)
class Violation:
    reason: str  # InvalidSpec (not allowed at all) or QuotaExceeded (over a limit)
    message: str


def image_allowed(image: str, prefixes: tuple[str, ...]) -> bool:
    """``image`` starts with one of ``prefixes`` at a boundary: ``registry.corp/ml`` allows ``registry.corp/ml/x:1`` and
    ``registry.corp/ml:2``, never ``registry.corp/ml-evil/x``. A prefix that ends in anything but a letter or digit
    (``registry.corp/ml/``, ``ghcr.io/org/trainer-``) is matched as written."""
    for prefix in prefixes:
        if image == prefix or (image.startswith(prefix) and (not prefix[-1].isalnum() or image[len(prefix)] in "/:@")):
            return True
    return False


# Where the trainer images keep their code (uv-managed Python and the venv under /opt, the system): a volume mounted
# over them would replace the image's code, which an image allowlist is there to pin. Under /etc only the dynamic
# linker's files matter (/etc/ssl/certs and the like stay mountable).
IMAGE_CODE_PATHS = ("/opt", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc/ld.so.preload", "/etc/ld.so.conf.d")


def _pins_images(spec: JobSpec, origin: str) -> Violation | None:
    """With an image allowlist, the code that runs must be the image's: no env that loads code from elsewhere, no
    volume over the image's code."""
    allowed = f"the platform allows only its own trainer images ({origin.format('allowedImagePrefixes')})"
    for i, e in enumerate(spec.env):
        if e.get("name") in CODE_LOADING_ENV:
            return Violation(
                "InvalidSpec",
                f"spec.env[{i}].name: {e['name']} would load code from outside the "
                f"image; {allowed}: put the code in an allowed image",
            )
    for i, v in enumerate(spec.pod_template.volumes):
        # The parser refuses paths not in normal form; compared in the form the container runtime mounts anyway.
        mp = "/" + posixpath.normpath(v.mount_path).lstrip("/")
        if mp in ("/", "/etc") or any(paths_overlap(mp, c) for c in IMAGE_CODE_PATHS):
            return Violation(
                "InvalidSpec",
                f"spec.podTemplate.volumes[{i}].mountPath: {v.mount_path} would mount "
                f"over the image's own files; {allowed}: mount data elsewhere (e.g. /data)",
            )
    return None


def _outside(field: str, value: str | None, allowed: tuple[str, ...], where: str, hint: str = "") -> Violation | None:
    """``value`` left out by the platform's allowlist (set at ``where``; empty: any is allowed)."""
    if not allowed or value is None or value in allowed:
        return None
    return Violation("InvalidSpec", f"{field}: {value} is not allowed; allowed: {', '.join(allowed)} ({where}){hint}")


def _no_service_account(name: str | None, origin: str) -> Violation | None:
    """The operator's own layer refuses a ServiceAccount it does not list, an empty list included: the account's token
    and cloud role would reach code the tenant chose, so a user who may only create FineTuneJobs would gain its
    rights. (A runtime's empty list sets no limit of its own.)"""
    if name is None:
        return None
    return Violation(
        "InvalidSpec",
        f"spec.podTemplate.serviceAccountName: {name} is not allowed: {origin.format('allowedServiceAccounts')} is "
        "empty, so no job may name a ServiceAccount (its token and cloud role would reach the job's code); leave it "
        "out (the pods get no token), or ask the platform team to list it",
    )


def _toleration_refused(spec: JobSpec, settings: Settings, where: str) -> Violation | None:
    """A toleration whose key is not allowed lets the job onto nodes tainted for someone else; one without a key
    (operator Exists) tolerates every taint. The platform's own ``trainer.tolerations`` are not the job's."""
    allowed = ", ".join(settings.allowed_toleration_keys)
    for i, toleration in enumerate(spec.pod_template.tolerations):
        key = toleration.get("key")
        if not key:
            return Violation(
                "InvalidSpec",
                f"spec.podTemplate.tolerations[{i}]: a toleration without a key tolerates every taint; name one of "
                f"the allowed keys: {allowed} ({where})",
            )
        if key not in settings.allowed_toleration_keys:
            return Violation(
                "InvalidSpec",
                f"spec.podTemplate.tolerations[{i}].key: {key} is not allowed; allowed: {allowed} ({where})",
            )
    return None


def always(ref: JobRef, spec: JobSpec) -> Violation | None:
    """What no platform setting allows (``finetune validate`` checks it too)."""
    for i, e in enumerate(spec.env):
        if e.get("name") in GPU_VISIBILITY_ENV:
            return Violation(
                "InvalidSpec",
                f"spec.env[{i}].name: {e['name']} decides which GPUs the container sees; "
                "the device plugin sets it from resources.limits['nvidia.com/gpu'], ask for GPUs there",
            )
    for k in spec.pod_template.labels:
        if k.startswith(KUEUE_PREFIX) and k != KUEUE_PRIORITY_LABEL:
            return Violation(
                "InvalidSpec",
                f"spec.podTemplate.labels['{k}']: Kueue's labels are set by the operator "
                "(its pod groups); use spec.queueName to queue the job",
            )
    for k in spec.pod_template.annotations:
        if k.startswith(KUEUE_PREFIX):
            return Violation(
                "InvalidSpec",
                f"spec.podTemplate.annotations['{k}']: Kueue's annotations are set by the "
                "operator; use spec.queueName to queue the job",
            )
    try:
        check_output_path(ref.namespace, ref.name, spec)
    except SpecError as e:
        return Violation("InvalidSpec", str(e))
    return None


def check(
    ref: JobRef,
    spec: JobSpec,
    settings: Settings,
    *,
    own: JobSpec | None = None,
    origin: str = HELM,
    image_source: str | None = None,
) -> Violation | None:
    """Checked when an attempt is admitted (reconcile._start_attempt), so a change of these rules or of the platform's
    values applies to the next attempt and never kills one that runs. ``spec`` is the effective spec (with the
    runtime's template merged in); the allowlists of pod settings judge ``own``, the job's own spec (default:
    ``spec``): what the platform's runtime sets is the platform's. ``origin`` names where this layer is set (a format
    string taking the guardrail's name); ``image_source`` where the default image comes from."""
    if (found := always(ref, spec)) is not None:
        return found
    own = own or spec
    image = settings.trainer_image(acceleration=spec.acceleration, image=spec.image)
    if settings.allowed_image_prefixes and not image_allowed(image, settings.allowed_image_prefixes):
        allowed = (
            f"allowed prefixes: {', '.join(settings.allowed_image_prefixes)} ({origin.format('allowedImagePrefixes')})"
        )
        if spec.image:
            return Violation("InvalidSpec", f"spec.image: {image} is not allowed by the operator; {allowed}")
        source = image_source or "Helm value " + ("trainer.ortImage" if spec.acceleration == "ort" else "trainer.image")
        return Violation(
            "InvalidSpec",
            f"the platform's trainer image {image} for acceleration {spec.acceleration} "
            f"({source}) is outside the allowlist; {allowed}: ask the platform team to "
            "fix its images, or set spec.image to an allowed image",
        )
    # Code-loading env and mounts over the image's code are judged on the whole effective spec, a runtime's values too:
    # env from a ConfigMap and volumes are looked up in the job's namespace, where the tenant writes them.
    if settings.allowed_image_prefixes and (pinned := _pins_images(spec, origin)) is not None:
        return pinned
    pt, classes, where = own.pod_template, settings.allowed_priority_classes, origin.format("allowedPriorityClasses")
    for refused in (
        _outside("spec.podTemplate.priorityClassName", pt.priority_class_name, classes, where),
        _outside(
            f"spec.podTemplate.labels['{KUEUE_PRIORITY_LABEL}']", pt.labels.get(KUEUE_PRIORITY_LABEL), classes, where
        ),
    ):
        if refused is not None:
            return refused
    if settings.require_queue_name and not spec.queue_name:
        return Violation(
            "InvalidSpec",
            f"spec.queueName: the platform admits jobs only through Kueue ({origin.format('requireQueueName')}); "
            "name a LocalQueue of the namespace (kubectl get localqueues)",
        )
    for refused in (
        _no_service_account(pt.service_account_name, origin)
        if origin == HELM and not settings.allowed_service_accounts
        else None,
        _outside(
            "spec.podTemplate.serviceAccountName",
            pt.service_account_name,
            settings.allowed_service_accounts,
            origin.format("allowedServiceAccounts"),
            "; a ServiceAccount's token and cloud role would reach the job's code",
        ),
        _toleration_refused(own, settings, origin.format("allowedTolerationKeys"))
        if settings.allowed_toleration_keys
        else None,
        _outside(
            "spec.podTemplate.schedulerName",
            pt.scheduler_name,
            settings.allowed_schedulers,
            origin.format("allowedSchedulers"),
            "; leave it out for the cluster's default scheduler",
        ),
        _outside(
            "spec.gangScheduling.schedulerName",
            own.gang_scheduling.scheduler_name if own.gang_scheduling is not None else None,
            settings.allowed_schedulers,
            origin.format("allowedSchedulers"),
            "; leave it out for the gang scheduler's own name",
        ),
    ):
        if refused is not None:
            return refused
    if spec.model.trust_remote_code and not settings.allow_trust_remote_code:
        return Violation(
            "InvalidSpec",
            "spec.model.trustRemoteCode: the platform does not run code from model "
            f"repositories ({origin.format('allowTrustRemoteCode')} is false); use a model whose "
            "architecture transformers ships",
        )
    if settings.max_nodes_per_job and spec.nodes > settings.max_nodes_per_job:
        return Violation(
            "QuotaExceeded",
            f"spec.nodes={spec.nodes} exceeds the limit of {settings.max_nodes_per_job} "
            f"nodes per job ({origin.format('maxNodesPerJob')})",
        )
    gpus = spec.gpus_per_node * spec.nodes
    if settings.max_gpus_per_job and gpus > settings.max_gpus_per_job:
        return Violation(
            "QuotaExceeded",
            f"the job asks for {gpus} GPUs ({spec.nodes} nodes x {spec.gpus_per_node}), "
            f"over the limit of {settings.max_gpus_per_job} per job ({origin.format('maxGpusPerJob')})",
        )
    return None
