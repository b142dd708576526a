"""The only module that imports kopf's decorators. Every handler hands off to the Controller.

Handlers are ``on.event`` handlers (no kopf progress annotations, no finalizer: owner references clean
up, and a stuck finalizer after ``helm uninstall`` would leave undeletable jobs). The backstop timer is
the Controller's own loop, because kopf timers would add a finalizer.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from typing import Any

import kopf

from finetune_operator.controller import Controller
from finetune_operator.settings import GROUP, LABEL_JOB, PLURAL, VERSION

log = logging.getLogger(__name__)


class EventsOnlyDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf builds a diff base (a deep copy of the object without its status) on every watch event, for change handlers
    (on.create/on.update/on.field). The operator has only event handlers, so kopf never compares or stores it: building
    it was an eighth of the operator's CPU on a ramp of 100 jobs. Nothing to diff means no copy."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return None

    def fetch(self, *, body: kopf.Body) -> Any:
        return None


def configure_kopf(settings: kopf.OperatorSettings, *, peering_priority: int, peering_lifetime: int = 60) -> None:
    """kopf's own bookkeeping lives under finetune.dev, and a stalled watch is re-established."""
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = EventsOnlyDiffBase(prefix=GROUP, key="last-handled-configuration")
    # No cluster-wide CRD/namespace scanning: the chart's namespaced RBAC does not grant it, and the
    # resources and namespaces are given explicitly.
    settings.scanning.disabled = True
    # The pod watch carries only trainer pods: filtered by the API server, not after the fact in this process.
    settings.watching.label_selectors["", "v1", "pods"] = LABEL_JOB
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.peering.priority = peering_priority
    # How long a crashed active replica's entry blocks the standby (crash fail-over time; docs/benchmarks.md).
    settings.peering.lifetime = peering_lifetime
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 8


def _plain(body: kopf.Body) -> dict[str, Any]:
    """kopf's read-only body as the plain dict (camelCase, as on the wire) the rest of the operator works on."""
    return copy.deepcopy(dict(body))


def build_registry(
    controller: Controller,
    *,
    peering_priority: int = 0,
    peering_lifetime: int = 60,
    on_cleanup: Callable[[], None] | None = None,
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # In-cluster service account, else $KUBECONFIG, via the kubernetes client's own loaders.
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, peering_priority=peering_priority, peering_lifetime=peering_lifetime)

    @kopf.on.cleanup(registry=registry)
    def cleanup(**_: Any) -> None:
        # Stop the backstop as soon as kopf starts to exit (before it leaves the peering), so a replica that is
        # shutting down never reconciles after its successor took over.
        if on_cleanup is not None:
            on_cleanup()

    @kopf.on.probe(id="backstop", registry=registry)
    def backstop(**_: Any) -> str:
        # The liveness endpoint answers 500 when the backstop loop stops ticking: kopf's watches may look fine while
        # every deadline, TTL and retry has stopped, and a restart is what fixes a stuck thread.
        why = controller.healthy(max_age=controller.settings.backstop_stale_seconds)
        if why is not None:
            raise kopf.PermanentError(why)
        return "ticking"

    store = controller.store
    # The handlers are coroutines: the store takes an event in the event loop (no I/O, a lock held for microseconds),
    # and only a reconcile pass goes to kopf's thread pool. Most pod events of a ramp only deliver a change a pass is
    # waiting for and need no thread at all.
    executor: list[Any] = []

    @kopf.on.startup(registry=registry)
    def remember_executor(settings: kopf.OperatorSettings, **_: Any) -> None:
        executor.append(settings.execution.executor)

    async def run_pass(namespace: str, name: str) -> None:
        await asyncio.get_running_loop().run_in_executor(
            executor[0] if executor else None, controller.on_event, namespace, name
        )

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def job_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        ns, name = str(body.metadata.namespace), str(body.metadata.name)
        if type == "DELETED":
            controller.forget((ns, name))
            return
        if store is not None:
            fresh = store.put_job(_plain(body))
            if type is None:
                # kopf's listing (at start, or after a 410): deletions in the gap are never delivered, and a pod
                # watch whose relist finds no trainer pod at all delivers nothing, so each job the listing delivers
                # has its pods listed again by the pass that follows (one LIST per job per relist, no time window).
                store.untrust((ns, name))
            elif not fresh:
                return  # the echo of this operator's own status write (or an older version): nothing new
        await run_pass(ns, name)

    @kopf.on.event("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT}, registry=registry)
    async def pod_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        job = body.metadata.labels.get(LABEL_JOB)
        owners = [o for o in body.metadata.get("ownerReferences", []) if o.get("kind") == "FineTuneJob"]
        if not (job and owners):
            return
        key = (str(body.metadata.namespace), str(job))
        if store is not None:
            if type is None and store.relisted():
                # kopf's listing (at start, or after a 410): deletions in the watch's gap are never delivered.
                log.info("the pod watch listed its pods (at start, or after a gap): each job's are listed again")
            if type == "DELETED":
                store.delete_pod(key, dict(body))
            else:
                store.put_pod(key, dict(body))  # read, never kept: the store keeps a PodState
            if (wait := store.waiting(key)) is not None:
                # More of the pods the last pass created or deleted are on their way: the event that brings the last
                # of them runs the pass (the requeue covers one that never comes).
                controller.requeue(key, wait)
                return
        await run_pass(*key)

    return registry
