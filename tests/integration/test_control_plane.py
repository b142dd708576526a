"""Smoke test: the control plane the integration tiers run against is a real Kubernetes.

Nothing here is mocked: a real kube-apiserver (RBAC, admission, CRD structural schemas, TokenRequest),
etcd, and kube-controller-manager's garbage collector and namespace controller.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from hack.localcluster.cluster import K8S_VERSION
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "smoke.finetune.dev", "v1", "widgets"
WIDGET_CRD = f"""
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {PLURAL}.{GROUP}
spec:
  group: {GROUP}
  scope: Namespaced
  names: {{plural: {PLURAL}, singular: widget, kind: Widget}}
  versions:
  - name: {VERSION}
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {{type: integer, minimum: 1, maximum: 10}}
"""


@pytest.fixture(scope="module")
def widget_crd(cluster):  # type: ignore[no-untyped-def]
    cluster.run_kubectl("apply", "-f", "-", input=WIDGET_CRD)
    cluster.run_kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{PLURAL}.{GROUP}")
    yield
    cluster.run_kubectl("delete", f"crd/{PLURAL}.{GROUP}", "--wait=false", check=False)


def widget(name: str, size: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Widget", "metadata": {"name": name}, "spec": {"size": size}}


def test_server_is_the_pinned_kubernetes(api_client) -> None:  # type: ignore[no-untyped-def]
    info = client.VersionApi(api_client).get_code()
    print(f"kube-apiserver {info.git_version} ({info.platform}, {info.go_version})")
    assert info.git_version == f"v{K8S_VERSION}"
    assert int(info.major) == 1 and int(info.minor) >= 34


def test_create_and_watch_a_custom_object(api_client, widget_crd, namespace) -> None:  # type: ignore[no-untyped-def]
    co = client.CustomObjectsApi(api_client)
    seen: list[tuple[str, str]] = []
    w = watch.Watch()

    def watcher() -> None:
        for ev in w.stream(co.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, timeout_seconds=30):
            seen.append((ev["type"], ev["object"]["metadata"]["name"]))
            if len(seen) >= 2:
                w.stop()

    t = threading.Thread(target=watcher, daemon=True)
    t.start()
    wait_for(lambda: t.is_alive(), timeout=5, what="watch thread")
    co.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, widget("w1", 3))
    co.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "w1", {"spec": {"size": 4}})
    wait_for(lambda: len(seen) >= 2, timeout=30, what="ADDED and MODIFIED watch events")
    assert seen[:2] == [("ADDED", "w1"), ("MODIFIED", "w1")]


@pytest.mark.parametrize("size", [0, 11, "three"], ids=["below-minimum", "above-maximum", "wrong-type"])
def test_schema_violations_are_rejected(api_client, widget_crd, namespace, size) -> None:  # type: ignore[no-untyped-def]
    co = client.CustomObjectsApi(api_client)
    with pytest.raises(ApiException) as e:
        co.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, widget("bad", size))
    assert e.value.status == 422
    assert "spec.size" in e.value.body


def test_foreground_delete_collects_owned_configmap(api_client, widget_crd, namespace) -> None:  # type: ignore[no-untyped-def]
    co = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    owner = co.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, widget("owner", 1))
    ref = client.V1OwnerReference(
        api_version=f"{GROUP}/{VERSION}",
        kind="Widget",
        name="owner",
        uid=owner["metadata"]["uid"],
        block_owner_deletion=True,
    )
    core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owned", owner_references=[ref]), data={"k": "v"}),
    )
    co.delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "owner", body=client.V1DeleteOptions(propagation_policy="Foreground")
    )

    def gone(read: Any, *args: Any) -> bool:
        try:
            read(*args)
        except ApiException as e:
            return e.status == 404
        return False

    wait_for(
        lambda: gone(core.read_namespaced_config_map, "owned", namespace),
        timeout=60,
        what="the garbage collector to delete the owned ConfigMap",
    )
    wait_for(
        lambda: gone(co.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, "owner"),
        timeout=60,
        what="the foreground-deleted owner to disappear",
    )


def test_rbac_and_token_request(cluster, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    """A TokenRequest token authenticates as the ServiceAccount, which RBAC grants nothing."""
    core = client.CoreV1Api(api_client)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="robot"))
    )
    token = core.create_namespaced_service_account_token(
        "robot",
        namespace,
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)),
    ).status.token
    cfg = client.Configuration()
    base = api_client.configuration
    cfg.host, cfg.ssl_ca_cert = base.host, base.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token}"}
    robot = client.ApiClient(cfg)
    review = client.AuthenticationV1Api(robot).create_self_subject_review(client.V1SelfSubjectReview())
    assert review.status.user_info.username == f"system:serviceaccount:{namespace}:robot"
    with pytest.raises(ApiException) as e:
        client.CoreV1Api(robot).list_namespaced_secret(namespace)
    assert e.value.status == 403


def test_namespace_deletion_is_real(cluster, api_client) -> None:  # type: ignore[no-untyped-def]
    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="smoke-ns-delete")))
    core.create_namespaced_config_map("smoke-ns-delete", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c")))
    core.delete_namespace("smoke-ns-delete")

    def gone() -> bool:
        try:
            core.read_namespace("smoke-ns-delete")
        except ApiException as e:
            return e.status == 404
        return False

    wait_for(gone, timeout=90, what="the namespace controller to finish deleting the namespace")


def test_pods_must_pass_restricted_pod_security(api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    """Test namespaces enforce the restricted profile: a pod without its security context is refused."""
    core = client.CoreV1Api(api_client)
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="bad"),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(name="c", image="busybox", security_context=client.V1SecurityContext(run_as_user=0))
            ]
        ),
    )
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod(namespace, pod)
    assert e.value.status == 403 and "restricted" in e.value.body, e.value.body
