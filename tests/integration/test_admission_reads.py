"""What a job costs the API server while it waits: the reads before an attempt (its runtime, both runtime kinds listed
when it names none; its claims; the namespace's use) are made only by a pass that may start one, never by the passes
of a job waiting out a quota retry, however many such jobs there are; and a placeholder the API server refuses is
tried again later and later, not on every pass.

Real: kube-apiserver, etcd and the operator's Controller in-process, counting its own requests by verb (``Kube``); the
store is fed as the watches would feed it. Nothing runs pods here."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from finetune_operator.controller import Controller
from finetune_operator.k8s import Kube
from finetune_operator.settings import Settings
from finetune_operator.store import Store
from kubernetes import client, config

from tests.integration.harness import FakeKubelet, Jobs, make_job
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

WAITING = 10


@pytest.fixture
def controller(cluster, namespace) -> Iterator[Controller]:  # type: ignore[no-untyped-def]
    c = Controller(
        Kube(config.new_client_from_config(config_file=cluster.kubeconfig)),
        Settings(namespaces=(namespace,), default_image="trainer:test", max_nodes_per_namespace=1),
        store=Store(),
    )
    yield c
    c._pool.shutdown(wait=False)


def _pass(c: Controller, jobs: Jobs, name: str) -> None:
    """A pass with the job as a watch would have delivered it by now (its newest status)."""
    assert c.store is not None
    c.store.put_job(jobs.get(name))
    c.on_event(jobs.ns, name)


def test_jobs_waiting_for_quota_read_nothing_for_admission_until_their_retry(controller, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    """One job holds the namespace's only node; ten more wait (QuotaExceeded, a retry 30 s on). Three more passes of
    each (watch events: a label edit, a resync) read no runtime, claim or job list: before, each such pass listed both
    runtime kinds and the namespace's jobs and read the claim, for every waiting job."""
    jobs = Jobs(api_client, namespace)
    jobs.create(make_job("holder").build())
    _pass(controller, jobs, "holder")
    wait_for(lambda: len(jobs.pods("holder")) == 1, timeout=10, what="the holder's pod")
    waiting = [f"wait-{i}" for i in range(WAITING)]
    for name in waiting:
        jobs.create(make_job(name).build())
        _pass(controller, jobs, name)
    for name in waiting:
        wait_for(
            lambda n=name: (c := jobs.condition(n, "Created")) and c.get("reason") == "QuotaExceeded",  # type: ignore[misc]
            timeout=10,
            what=f"{name} waiting for the namespace's nodes",
        )
    before = dict(controller.kube.requests)
    for _ in range(3):
        for name in waiting:
            _pass(controller, jobs, name)
    after = controller.kube.requests
    assert after["list"] == before.get("list", 0), (before, dict(after))
    assert after["get"] == before.get("get", 0), (before, dict(after))
    assert all(jobs.pods(n) == [] for n in waiting)
    assert all(jobs.state(n) == "Pending" for n in waiting)


def test_a_refused_placeholder_is_tried_again_later_and_later_not_every_pass(api_client, cluster, namespace) -> None:  # type: ignore[no-untyped-def]
    """An elastic job trains below its size and keeps a placeholder to find capacity; the API server refuses it (here:
    the operator's placeholder PriorityClass does not exist). The job trains on, the refusal is said once, and the
    tries come 2 s, 4 s, 8 s, ... up to 5 minutes apart: over ten minutes of passes every 2 s, a few tries, not 300
    (each a GET and a POST). The clock is the controller's own, moved by the test; the test binds and runs the pods
    as the scheduler and a kubelet would."""
    clock = [datetime(2026, 12, 7, tzinfo=UTC)]
    c = Controller(
        Kube(config.new_client_from_config(config_file=cluster.kubeconfig)),
        Settings(namespaces=(namespace,), default_image="trainer:test", placeholder_priority_class="no-such-class"),
        clock=lambda: clock[0],
    )
    jobs, kubelet = Jobs(api_client, namespace), FakeKubelet(api_client, namespace)
    jobs.create(make_job("el").nodes(2).set("elastic", {"minNodes": 1, "unschedulableSeconds": 30}).build())
    try:
        c.on_event(namespace, "el")
        wait_for(lambda: len(jobs.pods("el")) == 2, timeout=10, what="the first attempt's two ranks")
        core = client.CoreV1Api(api_client)

        def place_and_run(name: str) -> None:  # the scheduler and the kubelet of a node that fits one rank
            target = client.V1ObjectReference(api_version="v1", kind="Node", name="node-a")
            binding = client.V1Binding(metadata=client.V1ObjectMeta(name=name), target=target)
            core.create_namespaced_pod_binding(name, namespace, binding, _preload_content=False)
            kubelet.run(name)

        place_and_run("el-node-0")
        unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}
        core.patch_namespaced_pod_status("el-node-1", namespace, {"status": {"conditions": [unschedulable]}})
        for _ in range(10):  # past unschedulableSeconds: the gang shrinks to its placed rank, and runs there
            clock[0] += timedelta(seconds=20)
            c.on_event(namespace, "el")
            for pod in jobs.pods("el"):  # the kubelet confirms the deletions the operator asked for
                if pod.metadata.deletion_timestamp is not None:
                    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
            live = jobs.live_pods("el")
            attempt = live[0].metadata.labels["finetune.dev/attempt"] if len(live) == 1 else None
            if (
                [p.metadata.name for p in live] == ["el-node-0"]
                and attempt == "1"
                and live[0].status.phase != "Running"
            ):
                place_and_run("el-node-0")
        c.on_event(namespace, "el")
        st = jobs.status("el")
        assert (st["state"], st["nodes"], st["attempt"]) == ("Running", "1/2", 1), st
        before = c.kube.requests["create"]
        for _ in range(300):  # ten minutes of passes, one every 2 s
            clock[0] += timedelta(seconds=2)
            c.on_event(namespace, "el")
        tries = c.kube.requests["create"] - before
        assert 2 <= tries <= 5, tries  # still tried, up to 5 minutes apart: not 300 times
        assert c._placeholders_refused[(namespace, "el")][0] == 300
        assert jobs.state("el") == "Running" and [e.reason for e in jobs.events("el")].count("PlaceholderRefused") == 1
    finally:
        c._pool.shutdown(wait=False)
        # Its pods are bound to a node no kubelet serves: removed here, as that kubelet would, so that nothing of the
        # job outlives the test (an operator of a later test watching every namespace would find it terminating).
        jobs.delete("el")
        for pod in jobs.pods("el"):
            client.CoreV1Api(api_client).delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        wait_for(lambda: not jobs.pods("el") and not jobs.exists("el"), timeout=30, what="the job and its pods gone")
