"""Pure: the platform team's limits on what a tenant's FineTuneJob may ask for (operator settings, set
through Helm values). A violation fails the job at once with a message naming the limit: no retry storm."""

from __future__ import annotations

from dataclasses import dataclass

from finetune_operator.settings import Settings
from finetune_operator.spec import JobSpec


@dataclass(frozen=True)
class Violation:
    reason: str  # InvalidSpec (not allowed at all) or QuotaExceeded (over a limit)
    message: str


def check(spec: JobSpec, settings: Settings) -> Violation | None:
    image = settings.trainer_image(acceleration=spec.acceleration, image=spec.image)
    if settings.allowed_image_prefixes and not image.startswith(settings.allowed_image_prefixes):
        allowed = f"allowed prefixes: {', '.join(settings.allowed_image_prefixes)} (Helm value " \
                  "guardrails.allowedImagePrefixes)"
        if spec.image:
            return Violation("InvalidSpec", f"spec.image: {image} is not allowed by the operator; {allowed}")
        value = "trainer.ortImage" if spec.acceleration == "ort" else "trainer.image"
        return Violation("InvalidSpec", f"the operator's trainer image {image} for acceleration {spec.acceleration} "
                         f"(Helm value {value}) is outside its own allowlist; {allowed}: ask the platform team to "
                         "fix the chart's values, or set spec.image to an allowed image")
    pc = spec.pod_template.priority_class_name
    if settings.allowed_priority_classes and pc is not None and pc not in settings.allowed_priority_classes:
        allowed = ", ".join(settings.allowed_priority_classes)
        return Violation("InvalidSpec", f"spec.podTemplate.priorityClassName: {pc} is not allowed; allowed: "
                         f"{allowed} (Helm value guardrails.allowedPriorityClasses)")
    if settings.max_nodes_per_job and spec.nodes > settings.max_nodes_per_job:
        return Violation("QuotaExceeded", f"spec.nodes={spec.nodes} exceeds the limit of {settings.max_nodes_per_job} "
                         "nodes per job (Helm value guardrails.maxNodesPerJob)")
    gpus = spec.gpus_per_node * spec.nodes
    if settings.max_gpus_per_job and gpus > settings.max_gpus_per_job:
        return Violation("QuotaExceeded", f"the job asks for {gpus} GPUs ({spec.nodes} nodes x {spec.gpus_per_node}), "
                         f"over the limit of {settings.max_gpus_per_job} per job (Helm value guardrails.maxGpusPerJob)")
    return None
