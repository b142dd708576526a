"""The Python client (finetune_operator.client), as a notebook uses it, against the real API server and the real
operator: a manifest built in Python validated and submitted, every error named, get, list, wait, suspend, resume,
follow to the end and delete.

Real: the API server (its CRD schema and CEL rules), the operator (a subprocess) and the client (in this process, with
the test cluster's kubeconfig, as a user's). Mocked: the kubelet (FakeKubelet), as everywhere in the integration tier;
pod logs need a real one (tests/realnodes/test_examples.py reads them through the client).
"""

from __future__ import annotations

import io

import pytest
from finetune_operator.client import FineTuneClient, InvalidManifest, Unreachable, UserError, WaitTimeout
from rich.console import Console

from tests.integration.harness import FakeKubelet, Jobs, OperatorProcess, make_job

pytestmark = pytest.mark.integration


def test_a_notebook_submits_follows_and_manages_a_job(cluster, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    jobs, kubelet = Jobs(api_client, namespace), FakeKubelet(api_client, namespace)
    ft = FineTuneClient(namespace, kubeconfig=cluster.kubeconfig, poll_seconds=0.2)
    spec = make_job("nb").nodes(2).max_restarts(1).build()["spec"]

    # Every error of a dict manifest at once, with its field: the typed spec's and the API server's (a typo).
    bad = ft.manifest("nb", {**spec, "training": {"learningRate": "fast", "maxStep": 3}})
    with pytest.raises(InvalidManifest) as refused:
        ft.submit(bad)
    fields = sorted(e.split(":", 1)[0].lstrip(".") for e in refused.value.errors)
    assert fields == ["spec.training.learningRate", "spec.training.maxStep"], refused.value.errors
    assert not jobs.exists("nb")
    with pytest.raises(UserError, match=r"metadata\.namespace is 'elsewhere'"):
        ft.submit(ft.manifest("nb", spec, namespace="elsewhere"))

    typed = ft.validate(ft.manifest("nb", spec))  # what the operator will run, defaults filled in
    assert typed.nodes == 2 and typed.max_restarts == 1 and typed.training.per_device_batch_size == 8
    op = OperatorProcess(cluster.kubeconfig, namespace).start()
    try:
        done = ft.submit(ft.manifest("nb", spec))
        assert done.verb == "created" and done.job.namespace == namespace and done.finished_before is None
        assert ft.submit(ft.manifest("nb", spec)).verb == "unchanged"
        pods = jobs.wait_pods("nb", 2)
        with pytest.raises(WaitTimeout) as late:
            ft.wait("nb", for_="Running", timeout=1)
        assert late.value.job.state in ("Pending", "Created")
        for p in pods:
            kubelet.run(p.metadata.name)
        running = ft.wait("nb", for_="Running", timeout=30)
        assert running.state == "Running" and running.reason()[0] == "AllRanksRunning"
        assert [(j.namespace, j.name, j.state) for j in ft.list_jobs()] == [(namespace, "nb", "Running")]
        assert (namespace, "nb") in [(j.namespace, j.name) for j in ft.list_jobs(all_namespaces=True)]
        assert {p["metadata"]["name"] for p in ft.status_pods(running)} == {"nb-node-0", "nb-node-1"}
        assert "PodsCreated" in [e["reason"] for e in ft.events("nb")]

        ft.suspend("nb")
        assert ft.wait("nb", for_="Suspended", timeout=30).state == "Suspended"
        ft.resume("nb")
        pods = jobs.wait_pods("nb", 2, attempt=1)
        for p in pods:
            kubelet.run(p.metadata.name)
        for p in pods:
            kubelet.exit(p.metadata.name, 0)
        bar = io.StringIO()
        ended = ft.follow("nb", logs=False, uid=done.job.uid, console=Console(file=bar, width=120))
        assert ended.state == "Succeeded" and ended.attempt == 1, ended.final_line()
        assert "Succeeded (attempt 1)" in bar.getvalue()
        with pytest.raises(Unreachable, match="waited for Running"):
            ft.wait("nb", for_="Running")
        with pytest.raises(UserError, match=r"has finished \(Succeeded\): nothing to suspend"):
            ft.suspend("nb")
        again = ft.submit(ft.manifest("nb", {**spec, "maxRestarts": 2}))  # applied, and said: it never runs again
        assert again.verb == "configured" and again.finished_before == "Succeeded"

        ft.delete("nb", wait=True, timeout=60)
        assert not jobs.exists("nb") and not jobs.pods("nb")
        with pytest.raises(UserError, match=f"FineTuneJob {namespace}/nb not found"):
            ft.get("nb")
    finally:
        op.stop()
