"""Fault injection: a watch gap. The operator's watches are cut and held while a rank's pod is deleted and another job
is deleted and created again under its name, then come back with 410 Gone (an expired resourceVersion, as after an
etcd compaction), so kopf lists again: it never delivers the deletions that happened in the gap.

Real: the API server, etcd and the operator (a subprocess whose every request goes through
tests/faults/apiproxy.FaultProxy). Mocked: the kubelet (FakeKubelet writes pod status).

The invariants: the operator notices the missing rank from the relist (the gang restarts within seconds), instead of
serving the deleted pod from its cache until its periodic list (ten backstop ticks: 300 s at the default 30 s); no
attempt's pods are created while another attempt's still exist, each rank once per attempt; the job re-created in
the gap gets pods owned by its new uid only, none for the dead one. When the gap leaves no trainer pod at all, the
pod watch's relist delivers nothing: the job watch's relist is what makes the job's pods listed again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.faults.apiproxy import FaultProxy, upstream_of
from tests.faults.harness import Observed, PodWatch
from tests.integration.harness import FakeKubelet, Jobs, OperatorProcess, make_job
from tests.waiting import wait_for

pytestmark = pytest.mark.faults
RESYNC_SECONDS = 30  # the default: the periodic list, the safety net, is 300 s away
NOTICED_WITHIN = 90  # seconds after the relist: well inside the periodic list's 300 s, room for a loaded machine


class Rig:
    """The fault proxy in front of the API server, the operator behind it (resync at the default), a simulated
    kubelet and a pod watch that checks every attempt's pods."""

    def __init__(self, cluster: Any, api_client: Any, namespace: str, tmp_path: Path, *, seed: int) -> None:
        server, tls = upstream_of(cluster.kubeconfig, tmp_path)
        self.proxy = FaultProxy(server, tls, rate=0.0, seed=seed, watch_cut_s=None).start()
        self.jobs, self.kubelet = Jobs(api_client, namespace), FakeKubelet(api_client, namespace)
        kubeconfig = self.proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")
        self.op = OperatorProcess(kubeconfig, namespace, FINETUNE_RESYNC_SECONDS=str(RESYNC_SECONDS)).start()
        self.seen = Observed()
        self.pod_watch = PodWatch(api_client, namespace, self.seen)
        self.pod_watch.start()

    def end_gap(self, job: str) -> float:
        """Answer the held watches with 410 Gone; seconds until ``job``'s gang restart is recorded."""
        relisted = time.monotonic()
        self.proxy.expire_watches()
        wait_for(
            lambda: (self.jobs.status(job).get("attempt") or 0) >= 1,
            timeout=NOTICED_WITHIN,
            what=f"the gang restart of {job} for the pod deleted in the gap",
        )
        return time.monotonic() - relisted

    def stop(self) -> None:
        self.pod_watch.stop.set()
        self.op.stop()
        self.proxy.stop()


def test_a_rank_deleted_in_a_watch_gap_is_noticed_from_the_relist(
    cluster,
    api_client,
    namespace,  # type: ignore[no-untyped-def]
    tmp_path,
) -> None:
    rig = Rig(cluster, api_client, namespace, tmp_path, seed=1)
    proxy, jobs, kubelet, op, seen = rig.proxy, rig.jobs, rig.kubelet, rig.op, rig.seen
    core = client.CoreV1Api(api_client)
    try:
        jobs.create(make_job("gap").nodes(2).max_restarts(2).build())
        jobs.create(make_job("ghost").build())
        pods = jobs.wait_pods("gap", 2, attempt=0) + jobs.wait_pods("ghost", 1)
        for p in pods:
            kubelet.run(p.metadata.name)
        jobs.wait_state("gap", "Running", timeout=60)
        jobs.wait_state("ghost", "Running", timeout=60)
        dead_uid = jobs.get("ghost")["metadata"]["uid"]
        time.sleep(2)  # the Running pods reach the operator's cache
        proxy.hold_watches()
        time.sleep(1)
        core.delete_namespaced_pod("gap-node-1", namespace, grace_period_seconds=0)
        # The other job goes (its pod with it, as its node's kubelet would confirm) and comes back under its name.
        jobs.delete("ghost")
        core.delete_namespaced_pod("ghost-node-0", namespace, grace_period_seconds=0)
        wait_for(
            lambda: (
                [p.metadata.name for p in jobs.pods("gap")] == ["gap-node-0"]
                and not jobs.pods("ghost")
                and not jobs.exists("ghost")
            ),
            timeout=20,
            what="the rank's pod and the other job to be gone",
        )
        jobs.create(make_job("ghost").build())
        new_uid = jobs.get("ghost")["metadata"]["uid"]
        time.sleep(1)
        relisted = time.monotonic()
        noticed = rig.end_gap("gap")
        (ghost_pod,) = jobs.wait_pods("ghost", 1, timeout=NOTICED_WITHIN)
        ghost_s = time.monotonic() - relisted
        for p in jobs.wait_pods("gap", 2, attempt=1):
            kubelet.run(p.metadata.name)
        jobs.wait_state("gap", "Running", timeout=60)
        time.sleep(2)  # what the pod watch has left to see
        figures = proxy.figures()
        ghost_events = [e.reason for e in jobs.events("ghost") if e.involved_object.uid == new_uid]
    finally:
        rig.stop()
    print(
        json.dumps(
            {
                "scenario": "a rank deleted in a watch gap, then 410 Gone",
                "noticed_s": round(noticed, 1),
                "recreated_job_pods_s": round(ghost_s, 1),
                "recreated_job_events": ghost_events,
                "overlaps": len(seen.overlaps),
                "resync_s": RESYNC_SECONDS,
                **figures,
            }
        )
    )
    assert figures["injected"].get("watch-410", 0) >= 1, figures
    assert "each job's are listed again" in op.output()
    assert seen.overlaps == [], seen.overlaps
    assert seen.attempts["gap"] == {0, 1} and seen.pods_created["gap"] == 4  # each rank once per attempt
    owners = {o.uid for o in ghost_pod.metadata.owner_references or []}
    assert owners == {new_uid} and dead_uid not in owners
    assert seen.pods_created["ghost"] == 2  # the dead job's one pod and the new job's one: none for the dead uid


def test_a_gap_that_leaves_no_trainer_pod_is_noticed_from_the_jobs_relist(
    cluster,
    api_client,
    namespace,  # type: ignore[no-untyped-def]
    tmp_path,
) -> None:
    """The only trainer pod in the operator's sight is deleted in the gap: the pod watch's relist then delivers no
    event at all, and the job's is what makes its pods listed again (the gang restarts within seconds, not at the
    periodic list)."""
    rig = Rig(cluster, api_client, namespace, tmp_path, seed=2)
    proxy, jobs, kubelet, seen = rig.proxy, rig.jobs, rig.kubelet, rig.seen
    try:
        jobs.create(make_job("alone").max_restarts(2).build())
        (pod,) = jobs.wait_pods("alone", 1, attempt=0)
        kubelet.run(pod.metadata.name)
        jobs.wait_state("alone", "Running", timeout=60)
        time.sleep(2)  # the Running pod reaches the operator's cache
        proxy.hold_watches()
        time.sleep(1)
        client.CoreV1Api(api_client).delete_namespaced_pod("alone-node-0", namespace, grace_period_seconds=0)
        wait_for(lambda: not jobs.pods("alone"), timeout=20, what="the job's only pod to be gone")
        time.sleep(1)
        noticed = rig.end_gap("alone")
        jobs.wait_pods("alone", 1, attempt=1)
        time.sleep(2)  # what the pod watch has left to see
    finally:
        rig.stop()
    print(json.dumps({"scenario": "the only trainer pod deleted in a watch gap", "noticed_s": round(noticed, 1)}))
    assert seen.overlaps == [], seen.overlaps
    assert seen.attempts["alone"] == {0, 1} and seen.pods_created["alone"] == 2
