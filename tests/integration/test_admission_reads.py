"""What a job costs the API server while it waits to start: the reads before an attempt (its runtime, both runtime
kinds listed when it names none; its claims; the namespace's use) are made only by a pass that may start one, never by
the passes of a job waiting out a quota retry, however many such jobs there are.

Real: kube-apiserver, etcd and the operator's Controller in-process, counting its own requests by verb (``Kube``); the
store is fed as the watches would feed it. Nothing runs pods here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from finetune_operator.controller import Controller
from finetune_operator.k8s import Kube
from finetune_operator.settings import Settings
from finetune_operator.store import Store
from kubernetes import config

from tests.integration.harness import Jobs, make_job
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
