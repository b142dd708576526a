"""A node lost under a training gang, on real nodes, through the chart-installed operator.

The node of one rank (the one without the operator's pod) fails as a machine does when its power goes
(``NodeCluster.lose``): its pod network is cut, then its kubelet, its containerd and every process of its pods are
SIGKILLed. Nothing will report on its pod again. The real node lifecycle controller turns the node Ready=Unknown
after its grace period (50 s) and taints it ``node.kubernetes.io/unreachable:NoExecute``; the job's pods tolerate
that taint for 5 s (``spec.podTemplate.tolerations``, as a platform that wants fast failover sets them; Kubernetes'
default is 300 s), so the taint eviction controller deletes the pod, which no kubelet will ever confirm. The
operator must restart the gang (a disruption: ``maxRestarts: 0`` would end the job on a counted failure),
force-delete the stuck pod once the node has been NotReady for ``operator.forceDelete.afterSeconds`` (10 s here; one
``ForceDeleted`` event), and only then create the next attempt, which the scheduler places on the node left; it
resumes from the newest complete checkpoint. The node then boots again (``NodeCluster.rejoin``) and is Ready and
untainted for the tests after this one.

Real: everything (control plane, node lifecycle and taint eviction controllers, scheduler, kubelets, containerd, the
operator's Deployment, the trainer image). A node that stays Ready while its kubelet never finishes a deletion (a
hung unmount) cannot be made to happen on demand; it stays in the fault tier on simulated kubelets
(tests/faults/test_node_hung.py).
"""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client

from tests.faults.harness import Observed, PodWatch
from tests.realnodes.conftest import RealCluster, diagnostics, job_status
from tests.realnodes.jobs import (
    INTERVAL,
    SPREAD,
    complete_checkpoints,
    event_reasons,
    long_tiny,
    node_of,
    pods,
    report,
    wait_terminal,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.realnodes, pytest.mark.faults]
TOLERATE = 5  # seconds the pods tolerate an unreachable or not-ready node
STEPS = 200  # the next attempt trains both ranks on the node left
FAST_FAILOVER = [
    {"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": TOLERATE}
    for taint in ("unreachable", "not-ready")
]


def test_a_lost_node_restarts_the_gang_on_the_node_left_after_its_stuck_pod_is_force_deleted(
    real_cluster: RealCluster, chart_operator: str, namespace: str, api_client: client.ApiClient
) -> None:
    rc = real_cluster
    out = long_tiny(
        rc,
        namespace,
        "lost",
        steps=STEPS,
        maxRestarts=0,
        terminationGracePeriodSeconds=5,
        pod={"affinity": SPREAD, "tolerations": FAST_FAILOVER},
    )
    seen = Observed()
    podwatch = PodWatch(api_client, namespace, seen)
    podwatch.start()
    lost_node: int | None = None
    try:
        first = wait_for(lambda: complete_checkpoints(out), timeout=600, what="a complete checkpoint", interval=0.5)[-1]
        # The node lost is the one without the operator's pod (losing the operator with it is another scenario:
        # its Deployment's pod waits out Kubernetes' default 300 s toleration before it is evicted and replaced).
        operator_node = rc.kubectl(
            "get",
            "pods",
            "-n",
            chart_operator,
            "-l",
            "app.kubernetes.io/component=operator",
            "-o",
            "jsonpath={.items[0].spec.nodeName}",
        )
        ranks = {r: node_of(rc, namespace, f"lost-node-{r}") for r in (0, 1)}
        assert len(set(ranks.values())) == 2, f"both ranks run on one node: {ranks}"
        victim = next(r for r, n in ranks.items() if n != operator_node)
        gone, kept = ranks[victim], ranks[1 - victim]
        lost_node = int(rc.kubectl("get", "node", gone, "-o", "jsonpath={.metadata.labels.finetune\\.dev/local-node}"))
        t0 = time.monotonic()
        rc.nodes.lose(lost_node)
        wait_for(
            lambda: job_status(rc, namespace, "lost").get("attempt") == 1,
            timeout=240,
            what="the gang restart",
            interval=0.5,
        )
        detect = time.monotonic() - t0

        def force_deleted() -> bool:
            return not any(p["metadata"]["labels"]["finetune.dev/attempt"] == "0" for p in pods(rc, namespace))

        wait_for(force_deleted, timeout=240, what="the stuck pod to be force-deleted", interval=0.5)
        forced = time.monotonic() - t0
        wait_for(
            lambda: (st := job_status(rc, namespace, "lost")).get("state") == "Running" and st.get("attempt") == 1,
            timeout=300,
            what="attempt 1 running",
            interval=0.5,
        )
        recovered = time.monotonic() - t0
        assert {node_of(rc, namespace, f"lost-node-{r}") for r in (0, 1)} == {kept}
        st = wait_terminal(rc, namespace, "lost")
    finally:
        podwatch.stop.set()
        if lost_node is not None:
            rc.nodes.rejoin(lost_node)
    events = event_reasons(rc, namespace, "lost")
    figures = {
        "scenario": "node lost (real nodes)",
        "tolerationSeconds": TOLERATE,
        "time_to_detect_s": round(detect, 1),
        "force_deleted_after_s": round(forced, 1),
        "recovered_after_s": round(recovered, 1),
        "force_deleted_events": events.count("ForceDeleted"),
        "violations": len(seen.overlaps) + abs(events.count("ForceDeleted") - 1),
    }
    report("node-lost-real", figures)
    assert st["state"] == "Succeeded", (st, diagnostics(rc, namespace))
    assert (st.get("restarts", 0), st.get("disruptions", 0)) == (0, 1), st
    assert seen.overlaps == [], seen.overlaps
    assert events.count("ForceDeleted") == 1, events
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == STEPS, result
    assert result["resumed_from_step"] >= first and result["resumed_from_step"] % INTERVAL == 0, result
    ready = rc.kubectl("get", "nodes", "-o", "jsonpath={.items[*].status.conditions[?(@.type=='Ready')].status}")
    assert ready.split() == ["True", "True"], ready
