"""A corpus of hostile and mistaken FineTuneJobs, each applied to the real API server with the operator running, and
checked with ``finetune validate`` (the Python client's ``check``, which the CLI prints): every one is caught before
any pod exists, by the API server (schema and CEL: the object is never stored) or by the operator (``Failed``,
condition ``InvalidSpec``), and both answers name the field.

Real: kube-apiserver, etcd, the CRD with its CEL rules, the operator (a subprocess). Nothing runs pods here: a pod
created at all is the failure. The table of answers is printed (``-s``) and kept in docs/security.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from finetune_operator.client import FineTuneClient
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.integration.harness import Jobs, OperatorProcess, make_job

pytestmark = pytest.mark.integration

_GPU = {"limits": {"nvidia.com/gpu": 1}}
# name, where the mistake goes (dotted path under spec), its value, the field both answers must name
CORPUS: list[tuple[str, str, Any, str]] = [
    ("unknown-arg", "training.extraArgs", {"warmup_ratios": 0.1}, "spec.training.extraArgs.warmup_ratios"),
    ("wrong-type-arg", "training.extraArgs", {"max_grad_norm": "big"}, "spec.training.extraArgs.max_grad_norm"),
    ("removed-arg", "training.extraArgs", {"warmup_ratio": 0.1}, "spec.training.extraArgs.warmup_ratio"),
    ("missing-integration", "training.extraArgs", {"deepspeed": "/etc/passwd"}, "spec.training.extraArgs.deepspeed"),
    ("reserved-arg", "training.extraArgs", {"output_dir": "/tmp/x"}, "spec.training.extraArgs.output_dir"),
    (
        "unknown-scheduler",
        "training.extraArgs",
        {"lr_scheduler_type": "cosine_annealing"},
        "spec.training.extraArgs.lr_scheduler_type",
    ),
    ("unknown-optimizer", "training.extraArgs", {"optim": "adamw_fast"}, "spec.training.extraArgs.optim"),
    (
        "compile-mode",
        "training.extraArgs",
        {"torch_compile_mode": "fastest"},
        "spec.training.extraArgs.torch_compile_mode",
    ),
    ("report-to", "training.extraArgs", {"report_to": ["wandb"]}, "spec.training.extraArgs.report_to"),
    ("learning-rate-word", "training.learningRate", "fast", "spec.training.learningRate"),
    ("negative-steps", "training.maxSteps", -5, "spec.training.maxSteps"),
    ("zero-nodes", "nodes", 0, "spec.nodes"),
    ("acceleration", "acceleration", "turbo", "spec.acceleration"),
    ("task", "task", "world-domination", "spec.task"),
    ("output-escape", "output.path", "../other-team/ckpt", "spec.output.path"),
    ("mount-double-slash", "podTemplate.volumes", [{"name": "v", "mountPath": "//usr", "emptyDir": {}}], "mountPath"),
    (
        "mount-dot-dot",
        "podTemplate.volumes",
        [{"name": "v", "mountPath": "/data/../usr", "emptyDir": {}}],
        "mountPath",
    ),
    ("mount-dot", "podTemplate.volumes", [{"name": "v", "mountPath": "/./opt/venv", "emptyDir": {}}], "mountPath"),
    ("gpu-visibility", "env", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}], "spec.env"),
    ("fractional-gpu", "resources", {"limits": {"nvidia.com/gpu": "0.5"}}, "spec.resources"),
    ("negative-deadline", "activeDeadlineSeconds", -1, "spec.activeDeadlineSeconds"),
    ("lora-rank-zero", "training.lora", {"r": 0}, "spec.training.lora.r"),
    ("procs-zero", "procsPerNode", 0, "spec.procsPerNode"),
    ("token-inline", "hfTokenSecretRef", "hf_abcdef", "spec.hfTokenSecretRef"),
    ("unknown-sharding", "training.sharding", "zero3", "spec.training.sharding"),
    ("quantize-on-cpu", "training.lora", {"r": 8, "quantization": "4bit"}, "spec.training.lora.quantization"),
    ("output-other-namespace", "output.path", "team-b/llama-sft", "spec.output.path"),
    ("elastic-inexact-batch", "spec", {"nodes": 3, "elastic": {"minNodes": 2}}, "spec.elastic.minNodes"),
    (
        "elastic-timeout-before-shrink",
        "spec",
        {
            "nodes": 4,
            "rendezvousTimeoutSeconds": 60,
            "training": {"maxSteps": 10, "gradientAccumulationSteps": 6},
            "elastic": {"minNodes": 2, "unschedulableSeconds": 600},
        },
        "spec.elastic.unschedulableSeconds",
    ),
]

# The platform's guardrails (Helm values the client cannot read, so `finetune validate` does not judge them): refused
# by the operator at admission with its defaults, naming the field
GUARDRAILS: list[tuple[str, str, Any, str]] = [
    ("any-service-account", "podTemplate.serviceAccountName", "ci-deployer", "spec.podTemplate.serviceAccountName"),
    (
        "elastic-resize-storm",
        "spec",
        {"nodes": 2, "elastic": {"minNodes": 1, "resizeCooldownSeconds": 0, "unschedulableSeconds": 1}},
        "spec.elastic.resizeCooldownSeconds",
    ),
]


def _manifest(name: str, path: str, value: Any, namespace: str) -> dict[str, Any]:
    """The corpus entry's manifest: one field set (``path``), or several (``spec``: merged into the spec)."""
    manifest = make_job(name).build() if path == "spec" else make_job(name).set(path, value).build()
    if path == "spec":
        manifest["spec"].update(value)
    manifest["metadata"]["namespace"] = namespace
    return manifest


@pytest.fixture
def operator(cluster, namespace) -> Iterator[OperatorProcess]:  # type: ignore[no-untyped-def]
    # the chart's elastic floors (the harness lowers them for the elastic tests' short timings)
    floors = {"FINETUNE_ELASTIC_MIN_RESIZE_COOLDOWN_SECONDS": "60", "FINETUNE_ELASTIC_MIN_UNSCHEDULABLE_SECONDS": "30"}
    op = OperatorProcess(cluster.kubeconfig, namespace, **floors).start()
    yield op
    op.stop()


def test_every_hostile_spec_is_caught_before_any_pod_naming_its_field(
    cluster,
    api_client,
    namespace,
    operator,  # type: ignore[no-untyped-def]
) -> None:
    jobs = Jobs(api_client, namespace)
    ft = FineTuneClient(namespace, kubeconfig=cluster.kubeconfig)
    answers: dict[str, dict[str, str]] = {}
    for name, path, value, field in CORPUS:
        manifest = _manifest(name, path, value, namespace)
        _, errors = ft.check(manifest)
        validate = [e for e in errors if field in e]
        assert validate, f"{name}: finetune validate did not name {field}: {errors}"
        try:
            jobs.create(manifest)
            answers[name] = {"validate": validate[0], "server": "stored"}
        except ApiException as e:
            assert e.status == 422 and field.split(".")[-1] in e.body, f"{name}: {e.status} {e.body}"
            message = json.loads(e.body)["message"]
            answers[name] = {"validate": validate[0], "server": "refused", "answer": message}
    for name, path, value, _ in GUARDRAILS:
        jobs.create(_manifest(name, path, value, namespace))
        answers[name] = {"validate": "(the platform's guardrails: the operator's)", "server": "stored"}
    for name, _, _, field in CORPUS + GUARDRAILS:
        if answers[name]["server"] != "stored":
            continue
        status = jobs.wait_state(name, "Failed", timeout=60)
        cond = jobs.condition(name, "InvalidSpec")
        assert cond is not None and cond["status"] == "True", (name, status)
        assert field in cond["message"], f"{name}: the operator's condition does not name {field}: {cond['message']}"
        answers[name]["answer"] = cond["message"]
    for name, *_ in CORPUS + GUARDRAILS:
        assert jobs.pods(name) == [], f"{name}: pods were created"
    for name, a in answers.items():
        print(f"| {name} | {a['server']} | {a['answer'][:160]} | {a['validate'][:160]} |")


def test_validate_reports_every_mistake_of_a_manifest_at_once(cluster, namespace) -> None:  # type: ignore[no-untyped-def]
    """Three mistakes, one run: the typed spec's errors and the server dry run's, each with its field."""
    manifest = _manifest("three", "training.learningRate", "fast", namespace)
    manifest["spec"]["nodes"] = 0
    manifest["spec"]["training"]["extraArgs"] = {"warmup_ratios": 0.1}
    _, errors = FineTuneClient(namespace, kubeconfig=cluster.kubeconfig).check(manifest)
    for field in ("spec.training.learningRate", "spec.nodes", "spec.training.extraArgs.warmup_ratios"):
        assert [e for e in errors if e.startswith(field)], (field, errors)


def test_validate_says_in_one_run_what_the_operator_would(cluster, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    """What the operator judges when an attempt starts comes in the same report as the schema's errors: a multi-node
    job with no output claim (no runtime of the namespace gives one) beside a typo, and a claim only one node can
    mount beside an output path outside the job's namespace. Before, the runtime's and the claims' share came only
    once every other error was fixed, and the claims not at all."""
    client.CoreV1Api(api_client).create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": "single"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    ft = FineTuneClient(namespace, kubeconfig=cluster.kubeconfig)
    nowhere = _manifest("nowhere", "training.learningRate", "fast", namespace)
    nowhere["spec"]["nodes"] = 2
    del nowhere["spec"]["output"]
    _, errors = ft.check(nowhere)
    for field in ("spec.training.learningRate", "spec.output"):
        assert [e for e in errors if e.startswith(field)], (field, errors)
    shared = _manifest("shared", "output", {"claimName": "single", "path": "team-b/llama"}, namespace)
    shared["spec"]["nodes"] = 2
    _, errors = ft.check(shared)
    assert any(e.startswith("spec.output.path") and f"outside {namespace}/" in e for e in errors), errors
    assert any(e.startswith("spec.output.claimName") and "ReadWriteOnce" in e for e in errors), errors
