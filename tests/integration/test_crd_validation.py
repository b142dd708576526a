"""The API server itself rejects bad FineTuneJobs, with a message that names the field (schema + CEL)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.integration.harness import GROUP, PLURAL, VERSION, make_job

pytestmark = pytest.mark.integration


def _without(path: str) -> dict[str, Any]:
    job = make_job("x").build()
    node = job["spec"]
    *parents, last = path.split(".")
    for p in parents:
        node = node[p]
    del node[last]
    return job


CASES: list[tuple[str, dict[str, Any], str]] = [
    ("name-too-long", {**make_job("a" * 55).build()}, "metadata.name"),
    ("name-uppercase", {**make_job("Bad").build()}, "metadata.name"),
    ("name-starts-with-digit", {**make_job("1job").build()}, "metadata.name"),
    ("no-model", _without("model"), "spec.model"),
    ("model-both", make_job("x").set("model", {"name": "bert", "path": "/m"}).build(), "spec.model"),
    ("dataset-neither", make_job("x").set("dataset", {"textField": "t"}).build(), "spec.dataset"),
    ("epochs-and-steps", make_job("x").set("training", {"epochs": 1, "maxSteps": 5}).build(), "spec.training"),
    ("task-unknown", make_job("x").set("task", "image-generation").build(), "spec.task"),
    ("acceleration-unknown", make_job("x").set("acceleration", "tensorrt").build(), "spec.acceleration"),
    ("precision-unknown", make_job("x").set("training.precision", "int4").build(), "spec.training.precision"),
    ("nodes-zero", make_job("x").nodes(0).build(), "spec.nodes"),
    ("nodes-too-many", make_job("x").nodes(513).build(), "spec.nodes"),
    ("negative-lr", make_job("x").set("training.learningRate", -1).build(), "spec.training.learningRate"),
    ("batch-zero", make_job("x").set("training.perDeviceBatchSize", 0).build(), "spec.training.perDeviceBatchSize"),
    ("reserved-env", make_job("x").set("env", [{"name": "MASTER_ADDR", "value": "evil"}]).build(), "spec.env[0]"),
    ("reserved-env-prefix", make_job("x").set("env", [{"name": "PET_NNODES", "value": "9"}]).build(), "spec.env[0]"),
    (
        "gpu-visibility-env",
        make_job("x").set("env", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]).build(),
        "spec.env[0]",
    ),
    ("output-path-dot-dot", make_job("x").set("output.path", "runs/../other").build(), "spec.output.path"),
    (
        "procs-vs-gpus",
        make_job("x").set("procsPerNode", 2).set("resources", {"limits": {"nvidia.com/gpu": 4}}).build(),
        "spec.procsPerNode",
    ),
    ("relative-model-path", make_job("x").set("model", {"path": "models/tiny"}).build(), "spec.model.path"),
    (
        "dpo-with-chat-column",
        make_job("x").set("task", "dpo").set("dataset.messagesField", "m").build(),
        "spec.dataset",
    ),
    (
        "chosen-on-causal-lm",
        make_job("x").set("task", "causal-lm").set("dataset.chosenField", "c").build(),
        "spec.dataset",
    ),
    (
        "dpo-settings-on-causal-lm",
        make_job("x").set("task", "causal-lm").set("training.dpo", {"beta": 0.1}).build(),
        "spec.training.dpo",
    ),
    (
        "dpo-beta-zero",
        make_job("x").set("task", "dpo").set("training.dpo", {"beta": 0}).build(),
        "spec.training.dpo.beta",
    ),
    ("dpo-with-ort", make_job("x").set("task", "dpo").set("acceleration", "ort").build(), "spec.acceleration"),
    (
        "grpo-with-completion-column",
        make_job("x").set("task", "grpo").set("dataset.promptField", "p").set("dataset.completionField", "c").build(),
        "spec.dataset",
    ),
    (
        "grpo-settings-on-causal-lm",
        make_job("x").set("task", "causal-lm").set("training.grpo", {"numGenerations": 4}).build(),
        "spec.training.grpo",
    ),
    ("grpo-with-ort", make_job("x").set("task", "grpo").set("acceleration", "ort").build(), "spec.acceleration"),
    (
        "grpo-one-generation",
        make_job("x").set("task", "grpo").set("training.grpo", {"numGenerations": 1}).build(),
        "spec.training.grpo.numGenerations",
    ),
    (
        "grpo-unknown-reward",
        make_job("x").set("task", "grpo").set("training.grpo", {"rewards": [{"type": "bleu"}]}).build(),
        "spec.training.grpo.rewards[0].type",
    ),
    (
        "evaluation-on-classification",
        make_job("x").set("evaluation", {"split": "test", "metrics": [{"type": "regex", "pattern": "x"}]}).build(),
        "spec.evaluation",
    ),
    (
        "evaluation-length-metric",
        make_job("x")
        .set("task", "causal-lm")
        .set("evaluation", {"split": "test", "metrics": [{"type": "length"}]})
        .build(),
        "spec.evaluation.metrics[0].type",
    ),
    (
        "reward-model-relative-path",
        make_job("x")
        .set("task", "grpo")
        .set("training.grpo", {"rewards": [{"type": "rewardModel", "model": "rm"}]})
        .build(),
        "spec.training.grpo.rewards[0].model",
    ),
    (
        "topology-two-modes",
        make_job("x").set("topology", {"required": "rack", "preferred": "rack"}).build(),
        "spec.topology",
    ),
    (
        "topology-elastic-required",
        make_job("x").nodes(2).set("elastic", {"minNodes": 1}).set("topology", {"required": "rack"}).build(),
        "spec.topology",
    ),
    (
        "managed-by-without-queue",
        make_job("x").set("managedBy", "kueue.x-k8s.io/multikueue").build(),
        "spec.managedBy",
    ),
    (
        "managed-by-someone-else",
        make_job("x").set("managedBy", "example.com/other").set("queueName", "q").build(),
        "spec.managedBy",
    ),
    (
        "liger-without-gpu",
        make_job("x").set("task", "causal-lm").set("training.kernels", "liger").build(),
        "spec.training.kernels",
    ),
    (
        "prompt-without-completion",
        make_job("x").set("task", "causal-lm").set("dataset.promptField", "p").build(),
        "spec.dataset.completionField",
    ),
    (
        "claim-and-template",
        make_job("x")
        .set(
            "output",
            {
                "claimName": "o",
                "volumeClaimTemplate": {
                    "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}
                },
            },
        )
        .build(),
        "spec.output",
    ),
    (
        "rwo-template-two-nodes",
        make_job("x")
        .nodes(2)
        .set(
            "output",
            {
                "volumeClaimTemplate": {
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
                }
            },
        )
        .build(),
        "spec.output.volumeClaimTemplate.spec.accessModes",
    ),
    (
        "hostpath-volume",
        make_job("x")
        .set("podTemplate", {"volumes": [{"name": "h", "mountPath": "/h", "hostPath": {"path": "/"}}]})
        .build(),
        "spec.podTemplate.volumes[0]",
    ),
    *[
        (
            f"mount-path-{label}",
            make_job("x").set("podTemplate", {"volumes": [{"name": "v", "mountPath": path, "emptyDir": {}}]}).build(),
            "spec.podTemplate.volumes[0].mountPath",
        )
        for label, path in (
            ("double-slash", "//usr"),
            ("dot-dot", "/data/../usr"),
            ("dot", "/./opt/venv"),
            ("trailing-slash", "/data/"),
            ("root", "/"),
        )
    ],
    (
        "eval-steps-without-every",
        make_job("x").set("training.evaluation", {"strategy": "steps"}).build(),
        "spec.training.evaluation",
    ),
    ("unknown-field", make_job("x").set("gpus", 8).build(), "spec.gpus"),
    (
        "push-without-token",
        make_job("x").set("output", {"claimName": "o", "pushToHub": {"repo": "a/b"}}).build(),
        "spec.output.pushToHub",
    ),
    (
        "hub-repo-without-owner",
        make_job("x")
        .set("output", {"claimName": "o", "pushToHub": {"repo": "model", "secretRef": {"name": "hub"}}})
        .build(),
        "spec.output.pushToHub.repo",
    ),
    (
        "s3-uri-not-s3",
        make_job("x").set("output", {"claimName": "o", "s3": {"uri": "https://bucket/x"}}).build(),
        "spec.output.s3.uri",
    ),
    (
        "qlora-without-gpus",
        make_job("x").set("training.lora", {"r": 8, "quantization": "4bit"}).build(),
        "spec.training.lora.quantization",
    ),
    ("sharding-unknown", make_job("x").set("training.sharding", "zero3").build(), "spec.training.sharding"),
    ("queue-name-not-a-label-value", make_job("x").set("queueName", "Team_A").build(), "spec.queueName"),
    ("queue-name-too-long", make_job("x").set("queueName", "q" * 64).build(), "spec.queueName"),
    (
        "elastic-min-above-nodes",
        make_job("x").nodes(2).set("elastic", {"minNodes": 3}).build(),
        "spec.elastic.minNodes",
    ),
    ("elastic-min-zero", make_job("x").nodes(2).set("elastic", {"minNodes": 0}).build(), "spec.elastic.minNodes"),
    ("elastic-without-min", make_job("x").nodes(2).set("elastic", {"resizeCooldownSeconds": 60}).build(), "minNodes"),
    (
        "elastic-negative-cooldown",
        make_job("x").nodes(2).set("elastic", {"minNodes": 1, "resizeCooldownSeconds": -1}).build(),
        "spec.elastic.resizeCooldownSeconds",
    ),
]


@pytest.mark.parametrize(("manifest", "field"), [(m, f) for _, m, f in CASES], ids=[c[0] for c in CASES])
def test_api_server_rejects_with_the_field_named(api_client, namespace, manifest, field) -> None:  # type: ignore[no-untyped-def]
    co = client.CustomObjectsApi(api_client)
    with pytest.raises(ApiException) as e:
        co.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest, field_validation="Strict")
    assert e.value.status in (400, 422), e.value.body
    assert field in e.value.body, e.value.body


def test_immutable_fields_cannot_change(api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    co = client.CustomObjectsApi(api_client)
    co.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, make_job("imm").nodes(2).build())
    with pytest.raises(ApiException) as e:
        co.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "imm", {"spec": {"nodes": 4}})
    assert "spec.nodes is immutable" in e.value.body
    co.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "imm", {"spec": {"suspend": True}})


def test_elastic_range_is_fixed_once_the_job_exists(api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    """spec.elastic can be neither added, removed nor changed: the attempts' sizes and batches follow it."""
    co = client.CustomObjectsApi(api_client)
    co.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, make_job("el").nodes(2).set("elastic", {"minNodes": 1}).build()
    )
    created = co.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "el")
    assert created["spec"]["elastic"] == {"minNodes": 1, "resizeCooldownSeconds": 300, "unschedulableSeconds": 120}
    for patch in ({"spec": {"elastic": {"minNodes": 2}}}, {"spec": {"elastic": None}}):
        with pytest.raises(ApiException) as e:
            co.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "el", patch)
        assert "spec.elastic is immutable" in e.value.body, e.value.body
    co.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, make_job("fixed").nodes(2).build())
    with pytest.raises(ApiException) as e:
        co.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "fixed", {"spec": {"elastic": {"minNodes": 1}}}
        )
    assert "spec.elastic is immutable" in e.value.body, e.value.body


def _as_tenant(api_client: Any, namespace: str) -> client.ApiClient:
    """An API client acting as a user bound, in ``namespace``, to what the chart aggregates into the built-in ``edit``
    role for FineTuneJobs (every verb on the jobs, get on their status)."""
    rbac = client.RbacAuthorizationV1Api(api_client)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "tenant"},
            "rules": [
                {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "create", "update", "patch"]},
                {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get"]},
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "tenant"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "tenant"}],
        },
    )
    tenant = client.ApiClient(api_client.configuration)
    tenant.set_default_header("Impersonate-User", "tenant")
    return tenant


SHAPING = [
    ("resources", {"limits": {"cpu": "1", "nvidia.com/gpu": 0}}),
    ("image", "registry.example/other:1"),
    ("env", [{"name": "HOME", "value": "/data"}]),
    ("podTemplate", {"serviceAccountName": "ci-deployer"}),
    ("runtimeRef", {"name": "other"}),
]


def test_what_shapes_the_pods_cannot_change_while_an_attempt_runs(api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    """A tenant (the namespace's edit role) cannot edit what its running pods were admitted and built with: GPU usage,
    GPU-seconds and the guardrails judged those values. Other fields stay editable, and once the job is suspended (no
    attempt runs) the same edits are taken, for the next attempt. The operator's status writes are replayed by hand
    (only the API server's rules are under test)."""
    admin, tenant = client.CustomObjectsApi(api_client), client.CustomObjectsApi(_as_tenant(api_client, namespace))
    job = make_job("shaped").nodes(2).set("resources", {"limits": {"cpu": "1", "nvidia.com/gpu": 8}}).build()
    tenant.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
    for field, value in (("image", "registry.example/first:1"), ("env", [{"name": "A", "value": "1"}])):  # no attempt
        tenant.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "shaped", {"spec": {field: value}})
    running = {"status": {"state": "Running", "attempt": 0, "attemptStartTime": "2026-12-07T00:00:00Z"}}
    admin.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "shaped", running)
    for field, value in SHAPING:
        with pytest.raises(ApiException) as e:
            tenant.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "shaped", {"spec": {field: value}})
        assert e.value.status == 422 and f"spec.{field} cannot change while an attempt runs" in e.value.body, (
            e.value.body
        )
    with pytest.raises(ApiException) as e:  # removing the field is a change too
        tenant.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "shaped", {"spec": {"resources": None}}
        )
    assert "spec.resources cannot change while an attempt runs" in e.value.body, e.value.body
    tenant.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "shaped", {"spec": {"maxRestarts": 5}})
    tenant.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "shaped", {"spec": {"suspend": True}})
    stored = admin.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "shaped")
    assert stored["spec"]["resources"]["limits"]["nvidia.com/gpu"] == 8, stored["spec"]  # the admitted value kept
    assert stored["spec"]["env"] == [{"name": "A", "value": "1"}] and stored["spec"]["maxRestarts"] == 5, stored["spec"]
    suspended = {"status": {"state": "Suspended", "attempt": 1, "attemptStartTime": None}}
    admin.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "shaped", suspended)
    for field, value in SHAPING:
        tenant.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "shaped", {"spec": {field: value}})
    edited = admin.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "shaped")["spec"]
    assert edited["podTemplate"] == {"serviceAccountName": "ci-deployer"} and edited["runtimeRef"]["name"] == "other"
    # A finished job's spec no longer shapes anything: editable again, although its last attempt's start is kept.
    finished = {"status": {"state": "Succeeded", "attempt": 1, "attemptStartTime": "2026-12-07T00:10:00Z"}}
    admin.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "shaped", finished)
    tenant.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "shaped", {"spec": {"env": None}})
