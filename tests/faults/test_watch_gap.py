"""Fault injection: a watch gap. The operator's watches are cut and held while a rank's pod is deleted, then come back
with 410 Gone (an expired resourceVersion, as after an etcd compaction), so kopf lists again: it never delivers the
deletion that happened in the gap.

Real: the API server, etcd and the operator (a subprocess whose every request goes through
tests/faults/apiproxy.FaultProxy). Mocked: the kubelet (FakeKubelet writes pod status).

The invariant: the operator notices the missing rank from the relist (the gang restarts within seconds), instead of
serving the deleted pod from its cache until its periodic list (ten backstop ticks: 300 s at the default 30 s).
"""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client

from tests.faults.apiproxy import FaultProxy, upstream_of
from tests.integration.harness import FakeKubelet, Jobs, OperatorProcess, make_job
from tests.waiting import wait_for

pytestmark = pytest.mark.faults
RESYNC_SECONDS = 30  # the default: the periodic list, the safety net, is 300 s away
NOTICED_WITHIN = 40  # seconds after the relist


def test_a_rank_deleted_in_a_watch_gap_is_noticed_from_the_relist(
    cluster,
    api_client,
    namespace,  # type: ignore[no-untyped-def]
    tmp_path,
) -> None:
    server, tls = upstream_of(cluster.kubeconfig, tmp_path)
    proxy = FaultProxy(server, tls, rate=0.0, seed=1, watch_cut_s=None).start()
    jobs, kubelet = Jobs(api_client, namespace), FakeKubelet(api_client, namespace)
    op = OperatorProcess(
        proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig"), namespace, FINETUNE_RESYNC_SECONDS=str(RESYNC_SECONDS)
    ).start()
    try:
        jobs.create(make_job("gap").nodes(2).max_restarts(2).build())
        pods = jobs.wait_pods("gap", 2, attempt=0)
        for p in pods:
            kubelet.run(p.metadata.name)
        jobs.wait_state("gap", "Running", timeout=60)
        time.sleep(2)  # the Running pods reach the operator's cache
        proxy.hold_watches()
        time.sleep(1)
        client.CoreV1Api(api_client).delete_namespaced_pod("gap-node-1", namespace, grace_period_seconds=0)
        wait_for(
            lambda: [p.metadata.name for p in jobs.pods("gap")] == ["gap-node-0"],
            timeout=20,
            what="the rank's pod to be gone",
        )
        time.sleep(1)
        relisted = time.monotonic()
        proxy.expire_watches()
        wait_for(
            lambda: (jobs.status("gap").get("attempt") or 0) >= 1,
            timeout=NOTICED_WITHIN,
            what="the gang restart for the rank deleted in the gap",
        )
        noticed = time.monotonic() - relisted
        figures = proxy.figures()
    finally:
        op.stop()
        proxy.stop()
    print(
        json.dumps(
            {
                "scenario": "a rank deleted in a watch gap, then 410 Gone",
                "noticed_s": round(noticed, 1),
                "resync_s": RESYNC_SECONDS,
                **figures,
            }
        )
    )
    assert figures["injected"].get("watch-410", 0) >= 1, figures
    assert "each job's are listed again" in op.output()
