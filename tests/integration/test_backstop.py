"""The backstop (deadlines, TTLs, retries, progress) against the real API server: it runs where kopf's handlers run,
whatever happens to one namespace's peering object, and one job's stuck pass never holds up another job's.

Real: kube-apiserver, etcd, the operator (a subprocess, peering on; and the Controller in-process for the lock test).
Mocked: the kubelet (FakeKubelet writes pod status)."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from finetune_operator.controller import Controller
from finetune_operator.k8s import Kube
from finetune_operator.settings import Settings
from finetune_operator.store import Store
from kubernetes import client, config

from hack.operator_process import OperatorProcess
from tests.integration.harness import FakeKubelet, Jobs, make_job
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
PEERING_CRDS = ROOT / "charts" / "finetune-operator" / "crds" / "kopf-peering-crds.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metric(port: int, name: str) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


@pytest.fixture
def second_namespace(cluster, api_client) -> Iterator[str]:  # type: ignore[no-untyped-def]
    name = f"second-{int(time.time() * 1000) % 10**8}"
    core = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


@pytest.mark.parametrize("gone", ["peering object", "namespace"])
def test_one_namespaces_peering_object_gone_stops_nothing(
    cluster,
    api_client,
    namespace,  # type: ignore[no-untyped-def]
    second_namespace,
    gone,
) -> None:
    """Namespaced mode over two namespaces, peering on: the first namespace's KopfPeering, or the whole namespace, is
    deleted (an offboarded team), and a job in the second one still meets its deadline (a backstop requeue). The
    operator exports that it runs the backstop and that one peering object is missing, and keeps running."""
    cluster.run_kubectl("apply", "--server-side", "-f", str(PEERING_CRDS))
    for ns in (namespace, second_namespace):
        cluster.run_kubectl(
            "apply",
            "-f",
            "-",
            input=f"apiVersion: kopf.dev/v1\nkind: KopfPeering\nmetadata:\n"
            f"  name: finetune-operator\n  namespace: {ns}\n",
        )
    port = _free_port()
    op = OperatorProcess(
        cluster.kubeconfig,
        namespace,
        also_watch=(second_namespace,),
        standalone=False,
        FINETUNE_METRICS_PORT=str(port),
        FINETUNE_PEERING_PRIORITY="100",
    ).start()
    try:
        wait_for(
            lambda: _metric(port, "finetune_operator_backstop_active") == 1,
            timeout=60,
            what="the only replica to run the backstop",
        )
        if gone == "namespace":  # its peering object goes with it, and the operator's watches there end
            cluster.run_kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=60s")
        else:
            cluster.run_kubectl("delete", "kopfpeering", "finetune-operator", "-n", namespace)
        wait_for(
            lambda: _metric(port, "finetune_operator_peering_objects_missing") == 1,
            timeout=30,
            what="the missing peering object to be exported",
        )
        assert _metric(port, "finetune_operator_backstop_active") == 1
        jobs = Jobs(api_client, second_namespace)
        jobs.create(make_job("late").set("activeDeadlineSeconds", 3).build())
        (pod,) = jobs.wait_pods("late", 1)
        FakeKubelet(api_client, second_namespace).run(pod.metadata.name)
        status = jobs.wait_state("late", "Failed", timeout=30)
        assert status["failure"]["reason"] == "DeadlineExceeded"
        assert "is missing" in op.output() and f"in namespace {namespace}" in op.output()
        assert (
            op.proc is not None and op.proc.poll() is None
        )  # the operator lives on, whatever its watches in the deleted namespace do
    finally:
        op.stop()


def test_a_pass_holding_its_job_holds_up_no_other_job(cluster, api_client, namespace) -> None:  # type: ignore[no-untyped-def]
    """One job's lock is held (a pass stuck on a slow request) while both jobs are due: the other job's pass runs, the
    backstop loop keeps ticking (its liveness stays good), and the held job is left marked for the holder."""
    controller = Controller(
        Kube(config.new_client_from_config(config_file=cluster.kubeconfig)),
        Settings(namespaces=(namespace,), resync_seconds=3600, default_image="trainer:test"),
        store=Store(),
    )
    jobs = Jobs(api_client, namespace)
    jobs.create(make_job("stuck").build())
    jobs.create(make_job("free").build())
    held = controller._lock((namespace, "stuck"))
    held.acquire()
    stop = threading.Event()
    loop = threading.Thread(target=controller.loop, args=(stop,), daemon=True)
    loop.start()
    try:
        controller.requeue((namespace, "stuck"), 0)
        controller.requeue((namespace, "free"), 0)
        wait_for(lambda: len(jobs.pods("free")) == 1, timeout=30, what="the free job's pass to create its pod")
        assert jobs.pods("stuck") == []
        assert controller.healthy(max_age=2.0) is None
        assert (namespace, "stuck") in controller._dirty
        held.release()
        controller.on_event(namespace, "stuck")  # what the holder's drain does when its pass ends
        wait_for(lambda: len(jobs.pods("stuck")) == 1, timeout=30, what="the held job's pass once the lock is free")
    finally:
        stop.set()
        loop.join(timeout=5)
    assert controller.healthy(max_age=0.0) is not None  # a loop that has stopped fails the liveness check


def _healthz(port: int) -> int:
    try:
        return int(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_liveness_fails_while_the_backstop_loop_is_stuck(cluster, api_client, namespace, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The operator (a subprocess) with its backstop loop held at a failpoint (finetune_operator.failpoints): kopf's
    /healthz, what the chart's liveness probe reads, answers 500 once the loop has not ticked for
    FINETUNE_BACKSTOP_STALE_SECONDS, and 200 again when the loop runs; a deadline that came due meanwhile then fires."""
    port = _free_port()
    op = OperatorProcess(
        cluster.kubeconfig,
        namespace,
        FINETUNE_HEALTH_PORT=str(port),
        FINETUNE_BACKSTOP_STALE_SECONDS="3",
        FINETUNE_FAILPOINTS_DIR=str(tmp_path),
    ).start()
    try:
        wait_for(lambda: _healthz(port) == 200, timeout=60, what="the operator's /healthz to answer 200")
        (tmp_path / "backstop-loop").touch()
        # kopf caches a probe's answer for 10 s: 500 within the stale limit plus that
        wait_for(lambda: _healthz(port) == 500, timeout=30, what="/healthz to fail while the loop is stuck")
        assert "the backstop loop last ticked" in op.output()
        jobs = Jobs(api_client, namespace)
        jobs.create(make_job("late").set("activeDeadlineSeconds", 3).build())
        (pod,) = jobs.wait_pods("late", 1)  # kopf's watches and handlers run: only the timer loop is stuck
        FakeKubelet(api_client, namespace).run(pod.metadata.name)
        time.sleep(5)
        assert _healthz(port) == 500
        (tmp_path / "backstop-loop").unlink()
        wait_for(lambda: _healthz(port) == 200, timeout=30, what="/healthz to pass once the loop ticks again")
        status = jobs.wait_state("late", "Failed", timeout=30)
        assert status["failure"]["reason"] == "DeadlineExceeded"
    finally:
        op.stop()
