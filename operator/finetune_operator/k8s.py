"""The one module that talks to the Kubernetes API. Plain dicts in and out (camelCase, as on the wire).

Writes are idempotent: creating an object that exists is fine (409 ignored), deleting one that is gone is
fine (404 ignored), and status writes carry the resourceVersion they were computed from, so a concurrent
writer makes this pass fail with :class:`Conflict` and the next pass recompute.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from finetune_operator.settings import GROUP, LABEL_JOB, PLURAL, VERSION

log = logging.getLogger(__name__)


TIMEOUT = (5, 30)  # connect, read: a half-open connection must not hold a job's lock forever


def _release(resp: Any) -> None:
    """Return the connection of a response we do not read to the pool, its body read and discarded first: a
    connection put back with the body unread hands that body to the next request on it as its status line
    (BadStatusLine, a retry on a new connection, answers of 504 and 409 under load)."""
    resp.drain_conn()
    resp.release_conn()


class ApiError(Exception):
    """A request the API server answered with an error (or that failed on the way); the controller sees only this
    module's exceptions, never the client library's."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"({code}) {message}")
        self.code = code
        self.message = message


class Conflict(ApiError):
    """The object changed since it was read (or is gone); recompute from a fresh read."""


class Rejected(ApiError):
    """The API server refused an object the operator built: invalid (400, 422) or forbidden (403: quota, Pod
    Security admission, RBAC)."""


def _message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except (TypeError, ValueError):
        return str(e.reason)


def _mapped(e: ApiException, *, conflict: tuple[int, ...] = ()) -> ApiError:
    code = int(e.status or 0)
    if code in conflict:
        return Conflict(code, _message(e))
    if code in (400, 403, 422):
        return Rejected(code, _message(e))
    return ApiError(code, _message(e))


def load_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """In-cluster config when running in a pod, else the kubeconfig ($KUBECONFIG or the given path)."""
    if kubeconfig is None:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            return client.ApiClient()
        except config.ConfigException:
            pass
    api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    return api


class Kube:
    """Typed-enough wrapper over the Kubernetes API for the operator's needs; counts its requests."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.policy = client.PolicyV1Api(api)
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _count(self, verb: str) -> None:
        with self._lock:
            self.requests[verb] += 1

    @staticmethod
    def _json(resp: Any) -> dict[str, Any]:
        return dict(json.loads(resp.data))

    def _request(self, verb: str, call: Any, *args: Any, ok: tuple[int, ...] = (), conflict: tuple[int, ...] = (),
                 **kwargs: Any) -> Any | None:
        """One request, counted and with the timeout, its raw response returned (None for an answer in ``ok``:
        404 for "already gone", 409 for "already exists"); any other error raised as this module's own."""
        self._count(verb)
        try:
            return call(*args, _preload_content=False, _request_timeout=TIMEOUT, **kwargs)
        except ApiException as e:
            if e.status in ok:
                return None
            raise _mapped(e, conflict=conflict) from e

    def _read(self, call: Any, *args: Any, verb: str = "get", absent_ok: bool = True) -> dict[str, Any] | None:
        resp = self._request(verb, call, *args, ok=(404,) if absent_ok else ())
        return None if resp is None else self._json(resp)

    # -- reads ---------------------------------------------------------------------------------------

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)

    def list_jobs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        if namespace:
            body = self._read(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                              verb="list", absent_ok=False)
        else:
            body = self._read(self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL, verb="list",
                              absent_ok=False)
        return list((body or {}).get("items", []))

    def get_peering(self, name: str, namespace: str | None) -> dict[str, Any] | None:
        """kopf's peering object: KopfPeering in a namespace, or the ClusterKopfPeering."""
        if namespace:
            return self._read(self.custom.get_namespaced_custom_object, "kopf.dev", "v1", namespace, "kopfpeerings",
                              name)
        return self._read(self.custom.get_cluster_custom_object, "kopf.dev", "v1", "clusterkopfpeerings", name)

    def list_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return self.list_pods_at(namespace, job)[0]

    def list_pods_at(self, namespace: str, job: str) -> tuple[list[dict[str, Any]], int]:
        """A job's pods and the list's resourceVersion (the point in the watch stream the list reflects)."""
        resp = self._request("list", self.core.list_namespaced_pod, namespace, label_selector=f"{LABEL_JOB}={job}")
        body = self._json(resp)
        try:
            version = int((body.get("metadata") or {}).get("resourceVersion") or 0)
        except ValueError:
            version = 0
        return list(body.get("items", [])), version

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(self.core.read_namespaced_persistent_volume_claim, name, namespace)

    # -- writes --------------------------------------------------------------------------------------

    def create(self, obj: dict[str, Any]) -> bool:
        """Create a job's child (Pod, Service, ConfigMap, claim, PDB); False when it already exists. An object the
        API server refuses raises :class:`Rejected`."""
        create: Any = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "ConfigMap": self.core.create_namespaced_config_map,
            "PersistentVolumeClaim": self.core.create_namespaced_persistent_volume_claim,
            "PodDisruptionBudget": self.policy.create_namespaced_pod_disruption_budget,
        }[obj["kind"]]
        resp = self._request("create", create, obj["metadata"]["namespace"], obj, ok=(409,))
        if resp is None:
            return False
        _release(resp)
        return True

    def delete_pod(self, namespace: str, name: str, *, uid: str, grace_seconds: int | None) -> bool:
        """Delete exactly this pod (uid precondition: never a newer pod of the same name)."""
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid), grace_period_seconds=grace_seconds)
        resp = self._request("delete", self.core.delete_namespaced_pod, name, namespace, body=body, ok=(404, 409))
        if resp is None:
            return False
        _release(resp)
        return True

    def delete_object(self, kind: str, namespace: str, name: str) -> None:
        """Delete a job's non-pod child (its PodDisruptionBudget); gone already is fine."""
        delete: Any = {"PodDisruptionBudget": self.policy.delete_namespaced_pod_disruption_budget}[kind]
        resp = self._request("delete", delete, name, namespace, ok=(404,))
        if resp is not None:
            _release(resp)

    def delete_job(self, namespace: str, name: str, *, uid: str) -> None:
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid), propagation_policy="Background")
        resp = self._request("delete", self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                             name, body=body, ok=(404, 409))
        if resp is not None:
            _release(resp)

    def replace_status(self, job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """PUT the status subresource with the job's resourceVersion (optimistic concurrency): a job changed or
        deleted since it was read raises :class:`Conflict`."""
        meta = job["metadata"]
        body = {
            "apiVersion": job["apiVersion"],
            "kind": job["kind"],
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "resourceVersion": meta["resourceVersion"],
            },
            "spec": job.get("spec"),
            "status": status,
        }
        resp = self._request("update", self.custom.replace_namespaced_custom_object_status, GROUP, VERSION,
                             meta["namespace"], PLURAL, meta["name"], body, conflict=(404, 409))
        return self._json(resp)

    def post_event(self, job: dict[str, Any], *, type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on the job (what `kubectl describe ftj` shows); failures are only logged."""
        meta = job["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        event: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": job["apiVersion"],
                "kind": job["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": type_,
            "reason": reason,
            "message": message[:1023],
            "source": {"component": "finetune-operator"},
            "reportingComponent": "finetune.dev/operator",
            "reportingInstance": "finetune-operator",
            "firstTimestamp": now[:19] + "Z",
            "lastTimestamp": now[:19] + "Z",
            "count": 1,
        }
        try:
            _release(self._request("create", self.core.create_namespaced_event, meta["namespace"], event))
        except ApiError as e:
            log.warning("could not post event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], e)
