"""Progress flows from rank 0's metrics endpoint into typed status and the `kubectl get ftj` columns.

Real: the API server, the operator (a subprocess that scrapes over HTTP) and the trainer's own metrics
exporter (finetune_trainer.metrics, served on 127.0.0.1:9400). Mocked: the kubelet (FakeKubelet reports
rank 0's podIP as 127.0.0.1), since no kubelet can run here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.harness import FakeKubelet, Jobs, OperatorProcess, make_job
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def rank0_metrics() -> Iterator[object]:
    from finetune_trainer.metrics import TrainerMetrics

    m = TrainerMetrics(namespace="ns", job="prog", node_rank=0)
    assert m.serve(9400, addr="127.0.0.1")
    yield m


def test_progress_in_status_and_printer_columns(cluster, api_client, namespace, rank0_metrics) -> None:  # type: ignore[no-untyped-def]
    m = rank0_metrics
    jobs, kubelet = Jobs(api_client, namespace), FakeKubelet(api_client, namespace)
    op = OperatorProcess(cluster.kubeconfig, namespace, FINETUNE_PROGRESS_INTERVAL_SECONDS="1").start()
    try:
        jobs.create(make_job("prog").nodes(2).build())
        for p in jobs.wait_pods("prog", 2):
            kubelet.run(p.metadata.name, ip="127.0.0.1")
        jobs.wait_state("prog", "Running")
        m.step.set(7)  # type: ignore[attr-defined]
        m.total_steps.set(20)  # type: ignore[attr-defined]
        m.samples_per_second.set(12.5)  # type: ignore[attr-defined]
        m.eta.set(95)  # type: ignore[attr-defined]
        m.checkpoint_last_step.set(5)  # type: ignore[attr-defined]
        m.eval_loss.set(0.4321)  # type: ignore[attr-defined]
        progress = wait_for(lambda: (p := jobs.status("prog").get("progress")) and p.get("step") == 7 and p,
                            timeout=30, what="status.progress from rank 0's metrics")
        assert progress["stepOfTotal"] == "7/20" and progress["samplesPerSecond"] == 25.0  # x 2 nodes
        assert progress["eta"] == "1m35s" and progress["lastCheckpointStep"] == 5 and progress["evalLoss"] == 0.4321
        wide = cluster.run_kubectl("get", "ftj", "prog", "-n", namespace, "-o", "wide")
        header, row = wide.splitlines()[:2]
        assert header.split() == ["NAME", "STATE", "NODES", "RESTARTS", "AGE", "STEP", "SAMPLES/S", "ETA", "EVAL-LOSS"]
        cols = row.split()
        assert cols[1:4] == ["Running", "2/2", "0"] and cols[5:] == ["7/20", "25", "1m35s", "0.4321"]
        # The next step moves the status along.
        m.step.set(9)  # type: ignore[attr-defined]
        wait_for(lambda: jobs.status("prog")["progress"]["step"] == 9, timeout=30, what="step 9 in status")
    finally:
        op.stop()
