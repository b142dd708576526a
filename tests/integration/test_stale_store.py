"""Passes that decide from a stale store (after a leader change, or a watch gap whose deletions kopf never reports)
write nothing destructive: a delete is preconditioned on the job version the pass read, a gang is created only after a
fresh read, and a delete that finds its pod gone makes the store list again.

Real: kube-apiserver, etcd and the operator's Controller in-process, its store fed only by its own passes (the way a
replica's store looks after its watches missed changes). Mocked: the kubelet (FakeKubelet writes pod status)."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
from finetune_operator.controller import Controller
from finetune_operator.k8s import Kube
from finetune_operator.settings import Settings
from finetune_operator.store import Store
from kubernetes import config

from tests.integration.harness import FakeKubelet, Jobs, make_job
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def controller(cluster, namespace) -> Iterator[Controller]:  # type: ignore[no-untyped-def]
    c = Controller(
        Kube(config.new_client_from_config(config_file=cluster.kubeconfig)),
        Settings(namespaces=(namespace,), default_image="trainer:test"),
        store=Store(),
    )
    yield c
    c._pool.shutdown(wait=False)


def _pass(c: Controller, namespace: str, name: str) -> None:
    c.on_event(namespace, name)


def _delivered(c: Controller, jobs: Jobs, api_client, name: str) -> None:  # type: ignore[no-untyped-def]
    """What a live watch would have delivered by now: the job and its pods as the API server holds them; then a
    pass."""
    assert c.store is not None
    key = (jobs.ns, name)
    c.store.put_job(jobs.get(name))
    for pod in jobs.pods(name):
        c.store.put_pod(key, api_client.sanitize_for_serialization(pod))
    _pass(c, *key)


def test_a_stale_suspended_job_deletes_no_running_gang(controller, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    """The store still holds the job as Suspended (suspend: true) while on the server it was resumed and runs: the
    pass would stop the gang with no change of status. The read before its deletes finds a newer version: a conflict,
    and no pod is deleted; the next pass reads the job and leaves the gang running."""
    jobs, key = Jobs(api_client, namespace), (namespace, "nap")
    jobs.create(make_job("nap").set("suspend", True).build())
    _pass(controller, *key)
    wait_for(lambda: jobs.state("nap") == "Suspended", timeout=10, what="Suspended")
    stale = copy.deepcopy(jobs.get("nap"))
    jobs.patch("nap", {"suspend": False})
    _delivered(controller, jobs, api_client, "nap")
    (pod,) = jobs.wait_pods("nap", 1)
    FakeKubelet(api_client, namespace).run(pod.metadata.name)
    wait_for(
        lambda: (_delivered(controller, jobs, api_client, "nap"), jobs.state("nap"))[1] == "Running",
        timeout=20,
        what="Running",
    )
    controller.store.forget_job(key)  # type: ignore[union-attr]
    controller.store.put_job(stale)  # type: ignore[union-attr]
    _pass(controller, *key)
    (after,) = jobs.pods("nap")
    assert after.metadata.uid == pod.metadata.uid and after.metadata.deletion_timestamp is None
    _pass(controller, *key)  # reads the job afresh
    assert jobs.state("nap") == "Running"
    assert jobs.pods("nap")[0].metadata.deletion_timestamp is None


def test_no_gang_for_a_job_deleted_in_a_watch_gap(controller, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    """The job was deleted while the store was not looking: a pass from the store would create a gang owned by a dead
    uid. The fresh read before the creates finds it gone; no pod is created and the job is forgotten."""
    jobs, key = Jobs(api_client, namespace), (namespace, "ghost")
    jobs.create(make_job("ghost").set("suspend", True).build())
    _pass(controller, *key)
    wait_for(lambda: jobs.state("ghost") == "Suspended", timeout=10, what="Suspended")
    stale = copy.deepcopy(jobs.get("ghost"))
    stale["spec"]["suspend"] = False  # as it was just before it was deleted: resumed
    jobs.delete("ghost")
    wait_for(lambda: not jobs.exists("ghost"), timeout=20, what="the job to be gone")
    controller.store.forget_job(key)  # type: ignore[union-attr]
    controller.store.put_job(stale)  # type: ignore[union-attr]
    _pass(controller, *key)
    assert jobs.pods("ghost") == []
    _pass(controller, *key)  # reads afresh: gone, so forgotten
    assert controller.store.job(key) is None  # type: ignore[union-attr]
    assert jobs.pods("ghost") == []


def test_a_delete_that_finds_its_pod_gone_lists_again(controller, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    """The store trusts a pod that was deleted in a watch gap: the uid-preconditioned delete answers 404, and the
    store stops trusting the job's pods, so the next pass lists them instead of waiting on a pod that is gone."""
    jobs, key = Jobs(api_client, namespace), (namespace, "gap")
    jobs.create(make_job("gap").build())
    _pass(controller, *key)
    (pod,) = jobs.wait_pods("gap", 1)
    store = controller.store
    assert store is not None
    wait_for(
        lambda: (_delivered(controller, jobs, api_client, "gap"), store.pods(key))[1] is not None,
        timeout=20,
        what="the store to trust the job's pods",
    )
    from kubernetes import client

    client.CoreV1Api(api_client).delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    wait_for(lambda: jobs.pods("gap") == [], timeout=20, what="the pod to be gone")
    assert store.pods(key) is not None  # the store never heard of the deletion
    jobs.patch("gap", {"suspend": True})  # a reason to delete the pod the store still holds
    store.forget_job(key)
    _pass(controller, *key)
    assert store.pods(key) is None  # the 404 made the store list again


def test_a_job_deleted_while_its_pass_runs_leaves_no_state_behind(controller, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    """The job's DELETED event arrives (kopf calls forget) while a pass of that job is writing its status: the pass
    must not put the job's state back afterwards, or the jobs gauge counts a job that no longer exists."""
    jobs, key = Jobs(api_client, namespace), (namespace, "gone")
    jobs.create(make_job("gone").build())
    real_write = controller.kube.replace_status

    def write_then_deleted(job, status):  # type: ignore[no-untyped-def]
        written = real_write(job, status)
        controller.forget(key)  # the watch's DELETED event, handled on kopf's loop while this pass still runs
        return written

    controller.kube.replace_status = write_then_deleted  # type: ignore[method-assign]
    _pass(controller, *key)
    assert key not in controller._states
    samples = {
        s.labels["state"]: s.value
        for m in controller.metrics.registry.collect()
        if m.name == "finetune_operator_jobs"
        for s in m.samples
        if s.labels.get("finetune_namespace") == namespace
    }
    assert not any(samples.values()), samples
    assert not controller._forgotten  # only in-flight passes are remembered


def test_a_resync_list_taken_before_a_job_was_created_forgets_nothing(controller, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    """The backstop's list of jobs is a snapshot; a job the watch delivered after it was taken is not in it, and is
    not a ghost: the resync keeps it (and its pass) instead of forgetting it until its next event."""
    jobs = Jobs(api_client, namespace)
    jobs.create(make_job("early").build())
    snapshot = controller.kube.list_jobs_at(namespace)
    jobs.create(make_job("late").build())
    assert controller.store is not None
    controller.store.put_job(jobs.get("late"))  # what the watch delivered after the list
    controller.kube.list_jobs_at = lambda ns, **_: snapshot  # type: ignore[method-assign,assignment,misc]
    controller.resync()
    assert controller.store.job((namespace, "late")) is not None
    assert controller.store.job((namespace, "early")) is not None
    wait_for(lambda: jobs.state("late") == "Created", timeout=20, what="the late job's pass (its pods created)")


def test_admission_under_namespace_limits_reads_the_store_once_jobs_are_listed(api_client, namespace, cluster) -> None:  # type: ignore[no-untyped-def]
    """With a per-namespace limit, each job's admission needs the namespace's usage. Before the backstop's first list
    it comes from the API server (the store may not hold every job yet); after it, from the store: passes of waiting
    jobs cost no LIST of the namespace's jobs (a thousand pending jobs would be a thousand LISTs per resync). The
    limit still holds from the store."""
    c = Controller(
        Kube(config.new_client_from_config(config_file=cluster.kubeconfig)),
        Settings(namespaces=(namespace,), default_image="trainer:test", max_nodes_per_namespace=3),
        store=Store(),
    )
    listed: list[str | None] = []
    real_list = c.kube.list_jobs

    def counted(ns: str | None = None, **kw):  # type: ignore[no-untyped-def]  # a spy: the real LIST, counted
        listed.append(ns)
        return real_list(ns, **kw)

    c.kube.list_jobs = counted  # type: ignore[method-assign]
    try:
        jobs = Jobs(api_client, namespace)
        jobs.create(make_job("first").nodes(2).build())
        _delivered(c, jobs, api_client, "first")
        assert listed == [namespace]  # not listed by the backstop yet: usage from the API server
        jobs.wait_pods("first", 2)
        c.resync()  # the backstop's first tick lists every job into the store
        wait_for(lambda: not c._queued, timeout=20, what="the resync's passes")
        listed.clear()
        for name in ("second", "third"):
            jobs.create(make_job(name).nodes(2).build())
            _delivered(c, jobs, api_client, name)
        assert listed == []  # usage from the store: no LIST of the namespace's jobs per pass
        assert jobs.pods("second") == [] and jobs.pods("third") == []  # 2 + 2 > 3: both wait, decided from the store
        assert jobs.condition("second", "Created")["reason"] == "QuotaExceeded"  # type: ignore[index]
    finally:
        c._pool.shutdown(wait=False)
