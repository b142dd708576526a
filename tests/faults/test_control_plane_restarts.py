"""Fault injection: kube-apiserver and etcd crash (SIGKILL) and come back while jobs run, fail and restart.

Real: a control plane of this test's own (hack/localcluster: etcd, kube-apiserver, kube-controller-manager; its
components are killed and restarted with the same data and ports, as a supervisor would) and the operator (a
subprocess that must ride it out: its watches reconnect, its cache is relisted, nothing is done twice). Mocked: the
kubelet (tests/faults/harness.ScriptedKubelet), since no kubelet can run here.

Invariants as in test_operator_kills, plus: the operator process never exits.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from hack.localcluster.cluster import LocalCluster
from tests.faults.harness import SCRIPTS, Observed, PodWatch, ScriptedKubelet, check_round, writes_after_settling
from tests.integration.harness import Jobs, OperatorProcess, make_job

pytestmark = pytest.mark.faults
ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("FAULTS_SEED", "7"))
RESTARTS = (("kube-apiserver", 3), ("etcd", 2))


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, client.ApiClient]]:
    """A control plane for this test alone: its components are crashed on purpose."""
    local = LocalCluster(tmp_path / "cluster")
    local.start()
    try:
        api = config.new_client_from_config(config_file=local.kubeconfig)
        from kubernetes import utils

        utils.create_from_yaml(api, str(ROOT / "crds" / "finetune.dev_finetunejobs.yaml"))
        ext = client.ApiextensionsV1Api(api)
        deadline = time.monotonic() + 60
        while not any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition("finetunejobs.finetune.dev").status.conditions or []
        ):
            assert time.monotonic() < deadline, "the FineTuneJob CRD was not established"
            time.sleep(0.2)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "faults"}})
        yield local, api
    finally:
        local.stop()


def _what_the_cluster_holds(api: Any, op: OperatorProcess) -> str:
    """On a failure: every trainer pod (attempt, deletion, finalizers, node, phase), every job's status and the
    operator's log tail."""
    lines = ["==== trainer pods ===="]
    for pod in client.CoreV1Api(api).list_namespaced_pod("faults", label_selector="finetune.dev/job-name").items:
        m = pod.metadata
        lines.append(
            f"{m.name} uid={m.uid} attempt={m.labels.get('finetune.dev/attempt')} phase={pod.status.phase} "
            f"deletion={m.deletion_timestamp} finalizers={m.finalizers} node={pod.spec.node_name}"
        )
    lines.append("==== jobs ====")
    jobs = Jobs(api, "faults")
    for s in SCRIPTS:
        lines.append(json.dumps({"name": f"{s.name}-0", "status": jobs.status(f"{s.name}-0")}, default=str))
    lines.append("==== operator log (tail) ====")
    lines.append(op.output()[-6000:])
    return "\n".join(lines)


def test_control_plane_restarts(own_cluster: tuple[LocalCluster, Any]) -> None:
    local, api = own_cluster
    rng = random.Random(SEED)
    jobs, seen = Jobs(api, "faults"), Observed()
    podwatch, kubelet = PodWatch(api, "faults", seen), ScriptedKubelet(api, "faults")
    podwatch.start()
    kubelet.start()
    op = OperatorProcess(local.kubeconfig, "faults").start()
    outages: dict[str, list[float]] = {}
    try:
        for s in SCRIPTS:
            jobs.create(make_job(f"{s.name}-0").nodes(s.nodes).max_restarts(s.max_restarts).build())
        for component, times in RESTARTS:
            for _ in range(times):
                time.sleep(rng.uniform(1.0, 4.0))
                outages.setdefault(component, []).append(round(local.restart(component), 2))
                assert op.proc is not None and op.proc.poll() is None, "the operator exited:\n" + op.output()[-3000:]
        try:
            finals = {f"{s.name}-0": jobs.wait_state(f"{s.name}-0", s.state, timeout=240) for s in SCRIPTS}
        except AssertionError:
            print(_what_the_cluster_holds(api, op))
            raise
        quiet_writes = writes_after_settling(jobs, finals)
        wrong = check_round(jobs, seen, finals, 0)
        alive = op.proc is not None and op.proc.poll() is None
    finally:
        op.stop()
        podwatch.stop.set()
        kubelet.stop.set()
    report = {
        "scenario": "kube-apiserver and etcd SIGKILL and restart",
        "seed": SEED,
        "outage_s": outages,
        "violations": len(seen.overlaps) + len(wrong) + quiet_writes + (not alive),
        "attempt_overlaps": len(seen.overlaps),
        "wrong_outcomes": len(wrong),
        "quiet_writes": quiet_writes,
        "operator_alive": alive,
        "pods_created": sum(seen.pods_created.values()),
    }
    print(json.dumps(report))
    if out := os.environ.get("FAULTS_REPORT"):
        Path(out).with_suffix(".control-plane.json").write_text(json.dumps(report, indent=2))
    assert seen.overlaps == [], seen.overlaps
    assert wrong == {}, wrong
    assert quiet_writes == 0 and alive
