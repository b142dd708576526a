"""The operator's one API module (``finetune_operator.k8s``) against the real kube-apiserver: requests whose answer
the operator does not read must still leave their connection reusable."""

from __future__ import annotations

import logging

import pytest
from finetune_operator.k8s import CREATED, Kube
from kubernetes import config

pytestmark = pytest.mark.integration


def _connections(api: object) -> int:
    """New TCP connections the client's urllib3 pools have opened so far."""
    pools = api.rest_client.pool_manager.pools  # type: ignore[attr-defined]
    return sum(pools[key].num_connections for key in pools.keys())  # noqa: SIM118 - the container is not iterable


def test_unread_answers_do_not_churn_connections(cluster, namespace, caplog) -> None:  # type: ignore[no-untyped-def]
    """30 writes whose bodies the operator ignores (ConfigMap creates), one at a time: every request reuses the
    first connection. A connection returned to the pool with its body unread makes the next
    request on it read that body as a status line, fail (BadStatusLine) and retry on a new connection."""
    kube = Kube(config.new_client_from_config(config_file=cluster.kubeconfig))
    caplog.set_level(logging.WARNING, logger="urllib3")
    for i in range(30):
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"c{i}", "namespace": namespace},
            "data": {"payload": "x" * 200_000},
        }
        assert kube.create(cm) == CREATED
    retries = [r.getMessage() for r in caplog.records if "Retrying" in r.getMessage()]
    assert retries == [], retries
    assert _connections(kube.api) == 1
    assert kube.requests["create"] == 30


def test_jobs_are_listed_in_pages(cluster, namespace) -> None:  # type: ignore[no-untyped-def]
    """A list of FineTuneJobs follows the continue tokens to the end: pages of 2 over 5 jobs give all 5, once each."""
    from tests.integration.harness import Jobs, make_job

    api = config.new_client_from_config(config_file=cluster.kubeconfig)
    kube = Kube(api)
    for i in range(5):
        Jobs(api, namespace).create(make_job(f"p{i}").build())
    before = kube.requests["list"]
    names = sorted(j["metadata"]["name"] for j in kube.list_jobs(namespace, page=2))
    assert names == [f"p{i}" for i in range(5)]
    assert kube.requests["list"] - before == 3


def test_a_status_write_sends_the_status_only_and_keeps_the_spec(cluster, namespace) -> None:  # type: ignore[no-untyped-def]
    """The status PUT carries no spec (the API server keeps the stored one): the spec is untouched, the status is
    written, and a write conditioned on a version read before another change is refused (Conflict)."""
    from finetune_operator.k8s import Conflict, status_body

    from tests.integration.harness import Jobs, make_job

    api = config.new_client_from_config(config_file=cluster.kubeconfig)
    kube = Kube(api)
    Jobs(api, namespace).create(make_job("st").nodes(2).build())
    job = kube.get_job(namespace, "st")
    assert job is not None
    assert "spec" not in status_body(job, {"state": "Created"})
    written = kube.replace_status(job, {"state": "Created", "attempt": 0})
    assert written["status"]["state"] == "Created" and written["spec"] == job["spec"]
    stored = kube.get_job(namespace, "st")
    assert stored is not None and stored["spec"]["nodes"] == 2 and stored["status"]["attempt"] == 0
    with pytest.raises(Conflict):
        kube.replace_status(job, {"state": "Running"})  # job's resourceVersion is older than the write above
