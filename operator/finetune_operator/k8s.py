"""The one module that talks to the Kubernetes API. Plain dicts in and out (camelCase, as on the wire).

Requests go straight through the kubernetes client's configured connection pool (TLS, client certificates, the
bearer token and its refresh) as JSON, without the client's generated API classes: those validate every body into
pydantic models and back, which cost more CPU than the operator's own work, and importing them more memory.

Writes are idempotent: creating an object that exists is fine (409 ignored), deleting one that is gone is
fine (404 ignored), and status writes carry the resourceVersion they were computed from, so a concurrent
writer makes this pass fail with :class:`Conflict` and the next pass recompute.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections import Counter
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from finetune_operator import runtimes
from finetune_operator.gang import KIND, resource_key
from finetune_operator.kueue import WORKLOAD_GROUP, WORKLOAD_PLURAL, WORKLOAD_VERSION
from finetune_operator.settings import GROUP, LABEL_JOB, PLURAL, VERSION
from finetune_operator.spec import RuntimeRef

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

    def __init__(self, code: int, message: str, causes: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(f"({code}) {message}")
        self.code = code
        self.message = message
        self.causes = causes  # (field, message) of each invalid field, from the Status object's details


class Conflict(ApiError):
    """The object changed since it was read (or is gone); recompute from a fresh read."""


class Rejected(ApiError):
    """The API server refused an object the operator built: invalid (400, 422) or forbidden (403: quota, Pod
    Security admission, RBAC)."""


def _message(body: bytes, reason: str) -> str:
    """The Status object's message of an error answer, else the HTTP reason."""
    try:
        return str(json.loads(body or b"{}").get("message") or reason)
    except (TypeError, ValueError, AttributeError):
        return reason


def _causes(body: bytes) -> tuple[tuple[str, str], ...]:
    """``details.causes`` of an error answer: one (field, message) per invalid field of a 422."""
    try:
        causes = (json.loads(body or b"{}").get("details") or {}).get("causes") or []
        return tuple((str(c.get("field") or ""), str(c.get("message") or "")) for c in causes if isinstance(c, dict))
    except (TypeError, ValueError, AttributeError):
        return ()


def _error(code: int, message: str, *, conflict: tuple[int, ...] = (), body: bytes = b"") -> ApiError:
    if code in conflict:
        return Conflict(code, message)
    if code in (400, 403, 422):
        return Rejected(code, message, _causes(body))
    return ApiError(code, message)


LIST_PAGE = 500  # FineTuneJobs per page of a list


def _q(name: str) -> str:
    """One path segment. ``.`` and ``..`` are refused: the HTTP client resolves dot segments before sending, so they
    would leave the object's path (a namespaced read becoming a cluster-wide list)."""
    if name in (".", ".."):
        raise ValueError(f"{name!r} is not a Kubernetes name")
    return quote(name, safe="")


def _core(namespace: str, plural: str, name: str | None = None) -> str:
    path = f"/api/v1/namespaces/{_q(namespace)}/{plural}"
    return f"{path}/{_q(name)}" if name else path


def _group(group: str, version: str, plural: str, namespace: str | None = None, name: str | None = None) -> str:
    path = f"/apis/{group}/{version}" + (f"/namespaces/{_q(namespace)}" if namespace else "") + f"/{plural}"
    return f"{path}/{_q(name)}" if name else path


def _jobs(namespace: str | None = None, name: str | None = None) -> str:
    return _group(GROUP, VERSION, PLURAL, namespace, name)


# Where each kind of child is created (POST) and deleted.
_CHILDREN = {
    "Pod": lambda ns: _core(ns, "pods"),
    "Service": lambda ns: _core(ns, "services"),
    "ConfigMap": lambda ns: _core(ns, "configmaps"),
    "PersistentVolumeClaim": lambda ns: _core(ns, "persistentvolumeclaims"),
    "PodDisruptionBudget": lambda ns: _group("policy", "v1", "poddisruptionbudgets", ns),
    "NetworkPolicy": lambda ns: _group("networking.k8s.io", "v1", "networkpolicies", ns),
    # An attempt's PodGroup, of its gang scheduler (gang.py): keyed by kind and API group
    "PodGroup.scheduling.x-k8s.io": lambda ns: _group("scheduling.x-k8s.io", "v1alpha1", "podgroups", ns),
    "PodGroup.scheduling.volcano.sh": lambda ns: _group("scheduling.volcano.sh", "v1beta1", "podgroups", ns),
    # A job dispatched by MultiKueue: its Workload on the manager cluster (multikueue.py)
    "Workload": lambda ns: _group(WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD_PLURAL, ns),
}


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


# What Kube.create found: created now; ours already (or an ownerless object such as a retained claim, when the object
# built has no owner either); controlled by another owner (a deleted namesake's, to wait out); or held by an object
# nothing controls (someone else's, under the name the job needs).
CREATED, EXISTS, FOREIGN, TAKEN = "created", "exists", "foreign", "taken"


def status_body(job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """What a status PUT sends: apiVersion, kind, the identity and version the write is conditioned on, the status."""
    meta = job["metadata"]
    return {
        "apiVersion": job["apiVersion"],
        "kind": job["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "resourceVersion": meta["resourceVersion"]},
        "status": status,
    }


def _controller_uid(obj: dict[str, Any]) -> str | None:
    refs = obj["metadata"].get("ownerReferences") or []
    return next((r.get("uid") for r in refs if r.get("controller")), None)


class Kube:
    """The operator's requests to the Kubernetes API, each counted by verb."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._runtimes_forbidden: set[str] = set()

    def _count(self, verb: str) -> None:
        with self._lock:
            self.requests[verb] += 1

    def _request(
        self,
        verb: str,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: dict[str, str] | None = None,
        ok: tuple[int, ...] = (),
        conflict: tuple[int, ...] = (),
        content_type: str = "application/json",
        timeout: Any = TIMEOUT,
    ) -> Any | None:
        """One request, counted and with the timeout. Returns the urllib3 response, its body not yet read (None for
        an answer in ``ok``: 404 for "already gone", 409 for "already exists"); raises :class:`ApiError` (or
        :class:`Conflict` for a status in ``conflict``, :class:`Rejected`) for any other error answer or failure."""
        self._count(verb)
        cfg = self.api.configuration
        headers = {**self.api.default_headers, "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        self.api.update_params_for_auth(headers, [], ["BearerToken"], path, method, body)
        url = cfg.host + path + (f"?{urlencode(query)}" if query else "")
        rest: Any = self.api.rest_client
        try:
            resp = rest.request(method, url, headers=headers, body=body, _request_timeout=timeout)
        except (urllib3.exceptions.HTTPError, ApiException) as e:  # no answer: connection, TLS, timeout
            raise ApiError(0, f"{method} {path}: {e}") from e
        if 200 <= resp.status < 300:
            return resp
        data = resp.read()  # the whole error answer: the connection goes back to the pool clean
        if resp.status in ok:
            return None
        raise _error(resp.status, _message(data, str(resp.reason)), conflict=conflict, body=data)

    def _read(
        self, path: str, *, verb: str = "get", query: dict[str, str] | None = None, absent_ok: bool = True
    ) -> dict[str, Any] | None:
        resp = self._request(verb, "GET", path, query=query, ok=(404,) if absent_ok else ())
        if resp is None:
            return None
        try:
            return dict(json.loads(resp.read()))
        except (urllib3.exceptions.HTTPError, ValueError) as e:  # the answer broke off, or is not JSON
            raise ApiError(0, f"GET {path}: {e}") from e

    def _write(self, verb: str, method: str, path: str, *, body: Any = None, ok: tuple[int, ...] = ()) -> bool:
        """A write whose answer the operator does not need; False when the answer was one of ``ok``."""
        resp = self._request(verb, method, path, body=body, ok=ok)
        if resp is None:
            return False
        _release(resp.response)
        return True

    # -- reads ---------------------------------------------------------------------------------------

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(_jobs(namespace, name))

    def list_jobs(self, namespace: str | None = None, *, page: int = LIST_PAGE) -> list[dict[str, Any]]:
        """Every FineTuneJob (of ``namespace``), read in pages of ``page``: one answer never holds thousands of large
        jobs at once, on the API server or here. A continue token that expired (410) starts the list again."""
        return self.list_jobs_at(namespace, page=page)[0]

    def list_jobs_at(self, namespace: str | None = None, *, page: int = LIST_PAGE) -> tuple[list[dict[str, Any]], int]:
        """:meth:`list_jobs` and the resourceVersion of the snapshot it reflects (every page of one list shares it)."""
        items: list[dict[str, Any]] = []
        token, version = "", 0
        while True:
            query = {"limit": str(page), **({"continue": token} if token else {})}
            try:
                body = self._read(_jobs(namespace), verb="list", query=query, absent_ok=False) or {}
            except ApiError as e:
                if e.code != 410 or not token:
                    raise
                items, token = [], ""  # the snapshot the token pointed at was compacted: list from the start
                continue
            meta = body.get("metadata") or {}
            if not token:
                with contextlib.suppress(TypeError, ValueError):
                    version = int(meta.get("resourceVersion") or 0)
            items.extend(body.get("items", []))
            token = str(meta.get("continue") or "")
            if not token:
                return items, version

    def list_jobs_first(self, namespace: str | None, limit: int) -> tuple[list[dict[str, Any]], int | None]:
        """The first ``limit`` FineTuneJobs (of ``namespace``) by namespace and name, in one answer, and how many more
        there are (None when the API server does not say)."""
        body = self._read(_jobs(namespace), verb="list", query={"limit": str(limit)}, absent_ok=False) or {}
        meta = body.get("metadata") or {}
        more: int | None = 0
        if meta.get("continue"):
            try:
                more = int(meta["remainingItemCount"])
            except (KeyError, TypeError, ValueError):
                more = None
        return list(body.get("items", [])), more

    def get_peering(self, name: str, namespace: str | None) -> dict[str, Any] | None:
        """kopf's peering object: KopfPeering in a namespace, or the ClusterKopfPeering."""
        if namespace:
            return self._read(_group("kopf.dev", "v1", "kopfpeerings", namespace, name))
        return self._read(_group("kopf.dev", "v1", "clusterkopfpeerings", None, name))

    def list_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return self.list_pods_at(namespace, job)[0]

    def list_pods_at(self, namespace: str, job: str) -> tuple[list[dict[str, Any]], int]:
        """A job's pods and the list's resourceVersion (the point in the watch stream the list reflects)."""
        body = (
            self._read(
                _core(namespace, "pods"), verb="list", query={"labelSelector": f"{LABEL_JOB}={job}"}, absent_ok=False
            )
            or {}
        )
        try:
            version = int((body.get("metadata") or {}).get("resourceVersion") or 0)
        except ValueError:
            version = 0
        return list(body.get("items", [])), version

    def get_node(self, name: str) -> dict[str, Any] | None:
        """A Node, or None when it no longer exists (its pods can then never be confirmed stopped)."""
        return self._read(f"/api/v1/nodes/{_q(name)}")

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(_core(namespace, "persistentvolumeclaims", name))

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Kueue Workload, or None when it does not exist (or Kueue's CRDs are not installed)."""
        return self._read(_group(WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD_PLURAL, namespace, name))

    def get_kueue(self, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """One of Kueue's objects (a LocalQueue in ``namespace``; a ClusterQueue, ResourceFlavor or Topology), None
        when absent. A 404 that is not the object's own: LookupError where the API server serves no Kueue at all,
        PermissionError where it serves Kueue but not its v1beta2 (before v0.15); PermissionError also when the
        operator may not read it (the chart's kueue.enabled)."""
        try:
            return self._read(_group(WORKLOAD_GROUP, WORKLOAD_VERSION, plural, namespace, name), absent_ok=False)
        except ApiError as e:
            if e.code == 404 and f'"{name}" not found' in e.message:
                return None
            if e.code == 404 and self._read(f"/apis/{WORKLOAD_GROUP}") is None:
                raise LookupError(f"Kueue is not installed (the API server serves no {WORKLOAD_GROUP})") from e
            if e.code in (403, 404):
                raise PermissionError(f"{plural}.{WORKLOAD_GROUP}/{WORKLOAD_VERSION}: {e.message}") from e
            raise

    def finish_workload(self, namespace: str, body: dict[str, Any]) -> None:
        """Server-side apply of a Workload's status (multikueue.finished: its Finished condition); gone is fine."""
        path = _group(WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD_PLURAL, namespace, body["metadata"]["name"])
        resp = self._request(
            "patch",
            "PATCH",
            f"{path}/status",
            body=body,
            query={"fieldManager": "finetune-operator", "force": "true"},
            ok=(404,),
            content_type="application/apply-patch+yaml",
        )
        if resp is not None:
            _release(resp.response)

    def get_runtime(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """A runtime (``finetuneruntimes`` in ``namespace``, or ``clusterfinetuneruntimes``), None when absent."""
        return self._read(_group(GROUP, VERSION, plural, namespace, name))

    def list_runtimes(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """The runtimes of one kind; none when their CRD is not installed (404)."""
        body = self._read(_group(GROUP, VERSION, plural, namespace), verb="list") or {}
        return list(body.get("items", []))

    def runtime_choice(self, namespace: str, ref: RuntimeRef | None) -> runtimes.Choice:
        """The runtime a job of ``namespace`` runs with: the one ``ref`` names, else the namespace's or the cluster's
        default (runtimes.choose), with the cluster's default beneath a namespace's runtime (its guardrails still bind).
        The operator reads it when an attempt starts; ``finetune validate`` before."""
        if ref is not None:
            plural = runtimes.PLURALS[ref.kind]
            ns = namespace if ref.kind == runtimes.NAMESPACED_KIND else None
            try:
                named = self.get_runtime(plural, ns, ref.name)
            except ApiError as e:
                if e.code != 403:
                    raise
                return runtimes.Choice(
                    None,
                    "spec.runtimeRef",
                    f"spec.runtimeRef: {ref.kind} {ref.name!r} cannot be read ({e.message[:200]}): grant get and list "
                    f"on {plural} (the chart does)",
                )
            floor = self._listed(runtimes.CLUSTER_KIND, None) if named and ref.kind == runtimes.NAMESPACED_KIND else []
            return runtimes.choose(ref, namespace, named=named, cluster=floor)
        return runtimes.choose(
            None,
            namespace,
            namespaced=self._listed(runtimes.NAMESPACED_KIND, namespace),
            cluster=self._listed(runtimes.CLUSTER_KIND, None),
        )

    def _listed(self, kind: str, namespace: str | None) -> list[dict[str, Any]]:
        """The runtimes of ``kind``; none when they may not be listed (a custom RBAC set-up), said once in the log."""
        try:
            return self.list_runtimes(runtimes.PLURALS[kind], namespace)
        except ApiError as e:
            if e.code != 403:
                raise
            if kind not in self._runtimes_forbidden:
                self._runtimes_forbidden.add(kind)
                log.warning("may not list %s (%s): jobs that name none run without a default", kind, e.message)
            return []

    # -- writes --------------------------------------------------------------------------------------

    def create(self, obj: dict[str, Any]) -> str:
        """Create a job's child (Pod, Service, ConfigMap, claim, PDB, NetworkPolicy): :data:`CREATED`, :data:`EXISTS`
        (ours already, a ConfigMap then rewritten when its data differs; or an ownerless object such as a retained
        claim), :data:`FOREIGN` (an object of the same name controlled by another owner: a deleted job of the same name
        whose children the garbage collector has not removed yet; never adopted) or :data:`TAKEN` (an object of the
        same name that nothing controls). An object the API server refuses raises :class:`Rejected`."""
        meta = obj["metadata"]
        path = _CHILDREN[resource_key(obj["kind"], obj["apiVersion"])](meta["namespace"])
        try:
            if self._write("create", "POST", path, body=obj, ok=(409,)):
                return CREATED
        except ApiError as e:
            if e.code == 404 and obj["kind"] == KIND:  # the gang scheduler's CRD is not installed: never will be by us
                raise Rejected(404, f"{obj['apiVersion']} PodGroup is not served: {e.message}") from e
            raise
        owner = _controller_uid(obj)
        if owner is None:
            return EXISTS
        try:
            held = self._read(f"{path}/{_q(meta['name'])}")
        except ApiError as e:  # whatever the answer (a 403 of an older Role, say), the pass retries: never a refusal
            raise ApiError(e.code, f"reading {obj['kind']} {meta['name']}, which already exists: {e.message}") from e
        if held is None:  # gone since: the next pass creates it
            return FOREIGN
        held_owner = _controller_uid(held)
        if held_owner is None:
            return TAKEN
        if held_owner != owner:
            return FOREIGN
        if obj["kind"] == "ConfigMap" and held.get("data") != obj.get("data"):
            # The resolved config follows the spec's mutable fields (the deadline behind ddp_timeout, the cache, the
            # rendezvous timeout): rewritten before the attempt's pods are created, so they start with the new one.
            meta = dict(held["metadata"])
            body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": meta.get("resourceVersion")}}
            try:
                resp = self._request("update", "PUT", f"{path}/{_q(meta['name'])}", body=body, conflict=(404, 409))
            except Rejected as e:  # a Role without update (an older chart): the pass retries, never an InvalidSpec
                raise ApiError(e.code, f"updating ConfigMap {meta['name']}: {e.message}") from e
            if resp is not None:
                _release(resp.response)
        return EXISTS

    def delete_pod(self, namespace: str, name: str, *, uid: str, grace_seconds: int | None) -> bool:
        """Delete exactly this pod (uid precondition: never a newer pod of the same name)."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        return self._write("delete", "DELETE", _core(namespace, "pods", name), body=options, ok=(404, 409))

    def delete_object(self, kind: str, namespace: str, name: str) -> None:
        """Delete a job's non-pod child (its PodDisruptionBudget, an attempt's PodGroup by gang.resource_key); gone
        already is fine."""
        self._write("delete", "DELETE", f"{_CHILDREN[kind](namespace)}/{_q(name)}", ok=(404,))

    def delete_job(self, namespace: str, name: str, *, uid: str) -> None:
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid},
            "propagationPolicy": "Background",
        }
        self._write("delete", "DELETE", _jobs(namespace, name), body=options, ok=(404, 409))

    def replace_status(self, job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """PUT the status subresource with the job's resourceVersion (optimistic concurrency): a job changed or
        deleted since it was read raises :class:`Conflict`. The body is the status and the identity only: the API
        server keeps everything but the status from the stored object, so sending the spec (up to a whole
        manifest, on every write) would only cost bandwidth and etcd-size parsing."""
        meta = job["metadata"]
        body = status_body(job, status)
        resp = self._request(
            "update", "PUT", _jobs(meta["namespace"], meta["name"]) + "/status", body=body, conflict=(404, 409)
        )
        assert resp is not None  # nothing is "ok" here: every error raised
        return dict(json.loads(resp.read()))

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
            self._write("create", "POST", _core(meta["namespace"], "events"), body=event)
        except ApiError as e:
            log.warning("could not post event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], e)

    # -- what the finetune user commands need (with the user's own kubeconfig and RBAC) -----------------------

    def apply_job(self, obj: dict[str, Any], *, dry_run: bool, force: bool = False) -> dict[str, Any]:
        """Server-side apply of a FineTuneJob (``kubectl apply --server-side``): creates or updates it, field by field
        under the ``finetune`` field manager. ``dry_run``: admission, the schema and its CEL rules are checked and
        nothing is stored. Raises :class:`Rejected` (invalid: the message names the field) or :class:`ApiError`."""
        meta = obj["metadata"]
        query = {"fieldManager": "finetune", "fieldValidation": "Strict"}  # a misspelt field is an error, as in kubectl
        if dry_run:
            query["dryRun"] = "All"
        if force:
            query["force"] = "true"
        resp = self._request(
            "apply",
            "PATCH",
            _jobs(meta["namespace"], meta["name"]),
            body=obj,
            query=query,
            content_type="application/apply-patch+yaml",
        )
        assert resp is not None  # nothing is "ok" here: every error raised
        return dict(json.loads(resp.read()))

    def patch_job_spec(self, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any] | None:
        """A JSON merge patch of the job's spec (``suspend``, say); None when the job does not exist."""
        resp = self._request(
            "patch",
            "PATCH",
            _jobs(namespace, name),
            body={"spec": spec},
            ok=(404,),
            content_type="application/merge-patch+json",
        )
        return None if resp is None else dict(json.loads(resp.read()))

    def delete_job_named(self, namespace: str, name: str) -> bool:
        """Delete a job by name (its pods, Service and ConfigMap go with it); False when it does not exist."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        return self._write("delete", "DELETE", _jobs(namespace, name), body=options, ok=(404,))

    def list_job_events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The core/v1 Events of a FineTuneJob (what ``kubectl describe`` shows), oldest first."""
        query = {"fieldSelector": f"involvedObject.name={name},involvedObject.kind=FineTuneJob"}
        body = self._read(_core(namespace, "events"), verb="list", query=query, absent_ok=False) or {}
        items = list(body.get("items", []))
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def pod_log(
        self,
        namespace: str,
        pod: str,
        *,
        follow: bool = False,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> Any:
        """The trainer container's log as a stream of byte chunks (``kubectl logs [-f]``), at most ``limit_bytes``
        (the kubelet cuts it). With ``follow`` it ends when the container ends; the caller closes it
        (``.release_conn()``) when it stops reading early."""
        query = {"container": "trainer"}
        if follow:
            query["follow"] = "true"
        if tail_lines is not None:
            query["tailLines"] = str(tail_lines)
        if limit_bytes is not None:
            query["limitBytes"] = str(limit_bytes)
        # no read timeout when following: a quiet trainer (a long evaluation) is not a dead connection
        resp = self._request(
            "get", "GET", _core(namespace, "pods", pod) + "/log", query=query, timeout=(5, None) if follow else TIMEOUT
        )
        assert resp is not None
        return resp.response
