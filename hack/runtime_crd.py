"""Generate the runtime CRDs (ClusterFineTuneRuntime, FineTuneRuntime) from the FineTuneJob CRD.

    python -m hack.runtime_crd          # rewrite crds/finetune.dev_{cluster,}finetuneruntimes.yaml
    python -m hack.runtime_crd --check  # exit 1 when they differ (drift gate)

A runtime's ``spec.template`` holds FineTuneJob spec fields in the job's own shape, so its schema is the job's: each
template field's schema (types, bounds, descriptions, CEL rules) is copied from crds/finetune.dev_finetunejobs.yaml,
the single source of truth; the fields are finetune_operator.runtimes.TEMPLATE_FIELDS, the merge rule's own table.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml
from finetune_operator.runtimes import CLUSTER_KIND, DEFAULT_ANNOTATION, GUARDRAILS, NAMESPACED_KIND, TEMPLATE_FIELDS

from hack.helmtools import write_or_check

ROOT = Path(__file__).resolve().parents[1]
JOB_CRD = ROOT / "crds" / "finetune.dev_finetunejobs.yaml"
OUT = {
    CLUSTER_KIND: ROOT / "crds" / "finetune.dev_clusterfinetuneruntimes.yaml",
    NAMESPACED_KIND: ROOT / "crds" / "finetune.dev_finetuneruntimes.yaml",
}
NAMES = {
    CLUSTER_KIND: ("clusterfinetuneruntimes", "clusterfinetuneruntime", ["cftr"], "Cluster"),
    NAMESPACED_KIND: ("finetuneruntimes", "finetuneruntime", ["ftr"], "Namespaced"),
}
LIST = {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 253}, "maxItems": 256}
GUARDRAIL_SCHEMAS: dict[str, dict[str, Any]] = {
    "allowedImagePrefixes": {
        **LIST,
        "description": "Trainer images a job may run (its own spec.image or this runtime's): each must start with one "
        "of these at a boundary ('registry.corp/ml' allows 'registry.corp/ml/x:1', not 'registry.corp/ml-evil/x'); "
        "a job may then set no env that loads code and mount nothing over the image's code.",
    },
    "allowedPriorityClasses": {
        **LIST,
        "description": "PriorityClasses (and Kueue WorkloadPriorityClasses) a job may name in spec.podTemplate.",
    },
    "allowTrustRemoteCode": {
        "type": "boolean",
        "description": "false: a job may not set spec.model.trustRemoteCode.",
    },
    "requireQueueName": {
        "type": "boolean",
        "description": "true: every job must have a Kueue LocalQueue (its own spec.queueName or this runtime's).",
    },
    "allowedServiceAccounts": {**LIST, "description": "ServiceAccounts a job may name in spec.podTemplate."},
    "allowedTolerationKeys": {
        **LIST,
        "description": "Toleration keys a job may name in spec.podTemplate.tolerations (this runtime's own "
        "tolerations are the platform's and always apply); a toleration without a key is refused.",
    },
    "allowedSchedulers": {**LIST, "description": "Schedulers a job may name in spec.podTemplate.schedulerName."},
    "maxNodesPerJob": {
        "type": "integer",
        "minimum": 0,
        "description": "At most this many nodes per job (0: no limit).",
    },
    "maxGpusPerJob": {
        "type": "integer",
        "minimum": 0,
        "description": "At most this many GPUs per job, nodes x GPUs per node (0: no limit).",
    },
}


def _job_schema(path: str, spec: dict[str, Any]) -> dict[str, Any]:
    node = spec
    for part in path.split("."):
        node = node["properties"][part]
    return copy.deepcopy(node)


def _template(job_spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "object",
        "description": "FineTuneJob spec fields, in the job's own shape, that a job runs with when it leaves them "
        "out. Maps (labels, annotations, nodeSelector, resources) merge key by key and the job's key wins; env, "
        "volumes and imagePullSecrets merge by name and the job's entry wins; tolerations add up; any other field is "
        "the job's when it sets it. The output claim template applies to a job that names no output claim.",
        "properties": {},
    }
    for path in TEMPLATE_FIELDS:
        node, parts = out, path.split(".")
        for part in parts[:-1]:
            parent = _job_schema(".".join(parts[: parts.index(part) + 1]), job_spec)
            shell = {k: v for k, v in parent.items() if k in ("type", "description")}
            node = node["properties"].setdefault(part, {**shell, "properties": {}})
        node["properties"][parts[-1]] = _job_schema(path, job_spec)
    return out


def render(kind: str) -> str:
    job = yaml.safe_load(JOB_CRD.read_text())
    version = job["spec"]["versions"][0]
    job_spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    plural, singular, short, scope = NAMES[kind]
    where = (
        "cluster-wide: a job names it with spec.runtimeRef {name} (kind ClusterFineTuneRuntime is the default)"
        if kind == CLUSTER_KIND
        else "in one namespace: its jobs name it with spec.runtimeRef {name, kind: FineTuneRuntime}"
    )
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{job['spec']['group']}",
            "labels": dict(job["metadata"]["labels"]),
        },
        "spec": {
            "group": job["spec"]["group"],
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": short,
            },
            "versions": [
                {
                    "name": version["name"],
                    "served": True,
                    "storage": True,
                    "additionalPrinterColumns": [
                        {
                            "name": "Default",
                            "type": "string",
                            "jsonPath": ".metadata.annotations." + DEFAULT_ANNOTATION.replace(".", "\\."),
                            "description": "The default runtime of jobs that name none",
                        },
                        {
                            "name": "Image",
                            "type": "string",
                            "jsonPath": ".spec.images.default",
                            "description": "The trainer image of every acceleration but ort",
                        },
                        {
                            "name": "Queue",
                            "type": "string",
                            "jsonPath": ".spec.template.queueName",
                            "description": "The default Kueue LocalQueue",
                        },
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                        {
                            "name": "Description",
                            "type": "string",
                            "jsonPath": ".spec.description",
                            "priority": 1,
                            "description": "What the runtime is for",
                        },
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": (
                                f"{kind} is what a platform team sets once for many FineTuneJobs, {where}: the trainer "
                                "images, defaults for the job's spec (pod placement, resources, env, network, the "
                                "output claim, the Kueue queue, training defaults) and guardrails. A field the job "
                                "sets wins over the template; the guardrails always apply, on top of the operator's "
                                f'own. The annotation {DEFAULT_ANNOTATION}: "true" makes it the default of jobs that '
                                "name no runtime (the namespace's default before the cluster's; the newest of "
                                "several). An attempt records the generation it was admitted with: an edit applies "
                                "to the next attempt. Guide: docs/runtimes.md."
                            ),
                            "properties": {
                                "apiVersion": {"type": "string", "description": "APIVersion of this object."},
                                "kind": {"type": "string", "description": "Kind of this object."},
                                "metadata": {"type": "object"},
                                "spec": {
                                    "type": "object",
                                    "description": "The runtime: images, a template of job defaults, guardrails.",
                                    "properties": {
                                        "description": {
                                            "type": "string",
                                            "maxLength": 1024,
                                            "description": "What the runtime is for (`finetune runtimes` shows it).",
                                        },
                                        "images": {
                                            "type": "object",
                                            "description": "The trainer images of jobs that set no spec.image "
                                            "(else the operator's, Helm values trainer.image and trainer.ortImage).",
                                            "properties": {
                                                "default": {
                                                    "type": "string",
                                                    "minLength": 1,
                                                    "maxLength": 512,
                                                    "description": "The current stack: every acceleration but ort.",
                                                },
                                                "ort": {
                                                    "type": "string",
                                                    "minLength": 1,
                                                    "maxLength": 512,
                                                    "description": "The ONNX Runtime stack: acceleration ort.",
                                                },
                                            },
                                        },
                                        **(
                                            {
                                                "allowedNamespaces": {
                                                    **LIST,
                                                    "description": "The namespaces whose jobs may use this runtime "
                                                    "(name it, or have it as their default); empty: every namespace. "
                                                    "A runtime for one team's nodes, tolerations or priority class "
                                                    "lists that team's namespaces.",
                                                }
                                            }
                                            if kind == CLUSTER_KIND
                                            else {}
                                        ),
                                        "template": _template(job_spec),
                                        "guardrails": {
                                            "type": "object",
                                            "description": "Limits on what a job may ask for; unset: no limit from "
                                            "this runtime (the operator's own, Helm values guardrails.*, apply too).",
                                            "properties": {name: GUARDRAIL_SCHEMAS[name] for name in GUARDRAILS},
                                        },
                                    },
                                },
                            },
                        }
                    },
                }
            ],
        },
    }
    head = (
        f"# {kind}: generated by `python -m hack.runtime_crd` (make generate) from\n"
        "# crds/finetune.dev_finetunejobs.yaml, whose schemas its spec.template copies. Do not edit by hand.\n"
    )
    return head + yaml.safe_dump(crd, sort_keys=False, width=120, allow_unicode=True)


def main(argv: list[str]) -> int:
    rc = 0
    for kind, path in OUT.items():
        rc |= write_or_check(path, render(kind), module="hack.runtime_crd", argv=argv, root=ROOT)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
