"""Progress flows from rank 0's metrics endpoint into typed status, its curves (status.history, completed from rank 0's
termination message when the job succeeds) and the `kubectl get ftj` columns.

Real: the API server, the operator (a subprocess that scrapes over HTTP) and the trainer's own metrics
exporter (finetune_trainer.metrics, served on 127.0.0.1:9400). Mocked: the kubelet (FakeKubelet reports
rank 0's podIP as 127.0.0.1), since no kubelet can run here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from finetune_operator.render import curve_rows
from finetune_trainer.errors import REASON_COMPLETED, result_summary

from tests.integration.harness import FakeKubelet, Jobs, OperatorProcess, make_job
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


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
        m.samples_per_second.set(12.5)  # type: ignore[attr-defined]
        m.eta.set(95)  # type: ignore[attr-defined]
        m.checkpoint_last_step.set(5)  # type: ignore[attr-defined]
        m.eval_loss.set(0.4321)  # type: ignore[attr-defined]
        m.loss.set(2.5)  # type: ignore[attr-defined]
        m.learning_rate.set(3e-5)  # type: ignore[attr-defined]
        m.total_steps.set(20)  # type: ignore[attr-defined]  # last: a page without it is no progress yet
        progress = wait_for(
            lambda: (p := jobs.status("prog").get("progress")) and p.get("step") == 7 and p,
            timeout=30,
            what="status.progress from rank 0's metrics",
        )
        assert progress["stepOfTotal"] == "7/20" and progress["samplesPerSecond"] == 25.0  # x 2 nodes
        assert progress["eta"] == "1m35s" and progress["lastCheckpointStep"] == 5 and progress["evalLoss"] == 0.4321
        wide = cluster.run_kubectl("get", "ftj", "prog", "-n", namespace, "-o", "wide")
        header, row = wide.splitlines()[:2]
        assert header.split() == [
            "NAME",
            "STATE",
            "REASON",
            "NODES",
            "RESTARTS",
            "AGE",
            "STEP",
            "SAMPLES/S",
            "ETA",
            "EVAL-LOSS",
            "RUNTIME",
        ]
        cols = row.split()
        assert cols[1:5] == ["Running", "AllRanksRunning", "2/2", "0"]
        assert cols[6:] == ["7/20", "25", "1m35s", "0.4321"]  # and no runtime: the operator's own settings
        assert progress["learningRate"] == 3e-5
        # The next step moves the status along, and each step seen is a point of the curves in status.history.
        m.step.set(9)  # type: ignore[attr-defined]
        m.loss.set(2.0)  # type: ignore[attr-defined]  # a scrape in between fills step 9's point in later
        hist = wait_for(
            lambda: (h := jobs.status("prog").get("history")) and h["train"][-1].get("loss") == 2.0 and h,
            timeout=30,
            what="step 9's loss in status.history",
        )
        assert hist["train"] == [
            {"attempt": 0, "step": 7, "loss": 2.5, "samplesPerSecond": 25.0, "learningRate": 3e-5},
            {"attempt": 0, "step": 9, "loss": 2.0, "samplesPerSecond": 25.0, "learningRate": 3e-5},
        ]
        assert hist["eval"] == [{"attempt": 0, "step": 7, "evalLoss": 0.4321}]
        assert dict(curve_rows(hist))["Loss"] == "█▁  2.5 → 2 (steps 7-9)"
        # Every rank exits 0 before rank 0 is scraped again: the finished job shows its last step, not step 9, and
        # its curves end where training did: rank 0's termination message carries the losses and evaluations of its
        # result.json (written by the trainer's own function), which fill in what the scrapes did not see.
        summary = result_summary(
            {
                "steps": 20,
                "attempt": 0,
                "samples_per_second": 26.0,
                "loss_history": [[5, 2.7], [10, 1.9], [15, 1.6], [20, 1.4]],
                "eval_history": [{"step": 10, "loss": 0.5}, {"step": 20, "loss": 0.41}],
            }
        )
        completed = json.dumps({"reason": REASON_COMPLETED, "message": "trained to step 20", "result": summary})
        kubelet.exit("prog-node-0", 0, message=completed)
        kubelet.exit("prog-node-1", 0)
        jobs.wait_state("prog", "Succeeded")
        row = cluster.run_kubectl("get", "ftj", "prog", "-n", namespace, "-o", "wide").splitlines()[1].split()
        assert row[1:3] == ["Succeeded", "AllRanksSucceeded"] and row[6] == "20/20" and row[8] == "0s", row
        hist = jobs.status("prog")["history"]
        assert [(p["step"], p["loss"]) for p in hist["train"]] == [
            (5, 2.7),
            (7, 2.5),
            (9, 2.0),
            (10, 1.9),
            (15, 1.6),
            (20, 1.4),
        ], hist["train"]
        assert hist["train"][1]["samplesPerSecond"] == 25.0 and hist["train"][-1]["samplesPerSecond"] == 26.0
        assert [(p["step"], p["evalLoss"]) for p in hist["eval"]] == [(7, 0.4321), (10, 0.5), (20, 0.41)]
    finally:
        op.stop()


@pytest.fixture
def trickling_rank0() -> Iterator[list[int]]:
    """Tenant code at its worst: a metrics endpoint on 127.0.0.2:9400 that accepts, answers 200 and then sends one byte
    every 0.2 s without end (each byte resets a per-read timeout). Yields the count of connections it accepted."""
    import socket
    import threading

    accepted = [0]
    stop = threading.Event()
    srv = socket.create_server(("127.0.0.2", 9400))
    srv.settimeout(0.2)

    def trickle(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000000\r\n\r\n")
                while not stop.wait(0.2):
                    conn.sendall(b"#")
            except OSError:
                pass  # the operator gave up on it

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            accepted[0] += 1
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    yield accepted
    stop.set()
    server.join(timeout=5)
    srv.close()


def test_a_tenant_that_trickles_its_metrics_stalls_nothing(cluster, api_client, namespace, trickling_rank0) -> None:  # type: ignore[no-untyped-def]
    """One job's rank 0 trickles its metrics page forever. Its scrapes are abandoned at their deadline and retried, and
    the rest of the operator carries on: another job's activeDeadlineSeconds (a timer the backstop loop runs) still
    fails that job on time. Mocked: the kubelet (FakeKubelet sets the pods' phase and podIP)."""
    jobs, kubelet = Jobs(api_client, namespace), FakeKubelet(api_client, namespace)
    op = OperatorProcess(cluster.kubeconfig, namespace, FINETUNE_PROGRESS_INTERVAL_SECONDS="1").start()
    try:
        jobs.create(make_job("slow").nodes(2).build())
        for p in jobs.wait_pods("slow", 2):
            kubelet.run(p.metadata.name, ip="127.0.0.2")
        jobs.wait_state("slow", "Running")
        wait_for(lambda: trickling_rank0[0] >= 1, timeout=30, what="the operator to start scraping the tenant")
        jobs.create(make_job("deadline").set("activeDeadlineSeconds", 8).build())
        for p in jobs.wait_pods("deadline", 1):
            kubelet.run(p.metadata.name, ip="10.0.0.9")
        jobs.wait_state("deadline", "Running")
        failed = jobs.wait_state("deadline", "Failed", timeout=60)
        assert failed["failure"]["reason"] == "DeadlineExceeded"
        # the tenant's scrapes were given up and tried again, never completed
        wait_for(lambda: trickling_rank0[0] >= 3, timeout=30, what="repeated scrapes of the trickling endpoint")
        assert "progress" not in jobs.status("slow") and jobs.state("slow") == "Running"
    finally:
        op.stop()


def test_the_first_scrape_starts_when_the_job_turns_running(cluster, api_client, namespace, rank0_metrics) -> None:  # type: ignore[no-untyped-def]
    """A one-node job's pod runs (one pod event, then none): the pass that sets Running decided from the state
    before, when no scrape may start; the next pass comes at once, not at the next event or backstop tick (an hour
    away here), so the job's progress shows up."""
    m = rank0_metrics
    jobs, kubelet = Jobs(api_client, namespace), FakeKubelet(api_client, namespace)
    op = OperatorProcess(
        cluster.kubeconfig, namespace, FINETUNE_PROGRESS_INTERVAL_SECONDS="1", FINETUNE_RESYNC_SECONDS="3600"
    ).start()
    try:
        m.step.set(3)  # type: ignore[attr-defined]
        m.total_steps.set(10)  # type: ignore[attr-defined]
        jobs.create(make_job("first").build())
        (pod,) = jobs.wait_pods("first", 1)
        kubelet.run(pod.metadata.name, ip="127.0.0.1")
        jobs.wait_state("first", "Running")
        progress = wait_for(
            lambda: (jobs.status("first").get("progress") or {}).get("stepOfTotal"),
            timeout=30,
            what="the first scrape's progress without any further event",
        )
        assert progress == "3/10"
    finally:
        op.stop()
