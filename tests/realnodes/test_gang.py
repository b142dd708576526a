"""Gang scheduling without Kueue, on real nodes: the scheduler-plugins Coscheduling plugin binds all of an attempt's
ranks or none, and a gang restart is a new attempt with a PodGroup of its own.

Real: the scheduler-plugins kube-scheduler (hack/gangschedulers: built from the Go module proxy, run on this host as a
second scheduler, ``scheduler-plugins-scheduler``, against the node cluster's API server) with its PodGroup CRD, the
kubelets, the chart-installed operator (upgraded with ``gangScheduling.scheduler=coscheduling``), the trainer image,
torch.distributed. Nothing is mocked. The job's ranks must not share a node (a required pod anti-affinity), so with
one node cordoned only one rank fits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hack.gangschedulers import SCHEDULER_NAME, LocalCoscheduling, crd
from tests.realnodes.conftest import RealCluster, diagnostics, install_chart, job_status
from tests.realnodes.jobs import long_tiny, pods, wait_terminal
from tests.waiting import wait_for

pytestmark = [pytest.mark.realnodes, pytest.mark.gangschedulers]
APART = {  # the job's ranks on different nodes
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchExpressions": [{"key": "finetune.dev/node-rank", "operator": "Exists"}]},
            }
        ]
    }
}
GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


@pytest.fixture(scope="module")
def coscheduling(real_cluster: RealCluster, chart_operator: str) -> Iterator[LocalCoscheduling]:
    real_cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(crd("scheduling.x-k8s.io_podgroups")))
    real_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/podgroups.scheduling.x-k8s.io")
    install_chart(real_cluster, "--set", "gangScheduling.scheduler=coscheduling")
    scheduler = LocalCoscheduling(real_cluster.kubeconfig).start()
    try:
        yield scheduler
        scheduler.check()
    finally:
        scheduler.stop()
        install_chart(real_cluster)


def ranks(rc: RealCluster, namespace: str, job: str) -> list[dict[str, Any]]:
    return sorted(
        (
            p
            for p in pods(rc, namespace)
            if p["metadata"]["labels"].get("finetune.dev/job-name") == job
            and "finetune.dev/node-rank" in p["metadata"]["labels"]
            and not p["metadata"].get("deletionTimestamp")
        ),
        key=lambda p: int(p["metadata"]["labels"]["finetune.dev/node-rank"]),
    )


def bound(gang: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Both ranks, when both are bound to a node."""
    return gang if len(gang) == 2 and all(p["spec"].get("nodeName") for p in gang) else None


def pod_groups(rc: RealCluster, namespace: str) -> dict[str, dict[str, Any]]:
    items = json.loads(rc.kubectl("get", "podgroups.scheduling.x-k8s.io", "-n", namespace, "-o", "json"))["items"]
    return {g["metadata"]["name"]: g for g in items}


def refused_by_the_gang_scheduler(rc: RealCluster, namespace: str, pod: str) -> bool:
    """The Coscheduling scheduler said it could not place ``pod`` (a FailedScheduling event of its own)."""
    events = json.loads(
        rc.kubectl("get", "events", "-n", namespace, "-o", "json", f"--field-selector=involvedObject.name={pod}")
    )["items"]
    return any(
        e["reason"] == "FailedScheduling"
        and SCHEDULER_NAME in (e.get("reportingComponent"), (e.get("source") or {}).get("component"))
        for e in events
    )


def test_a_gang_is_placed_whole_or_not_at_all_and_a_restart_makes_the_next_group(
    real_cluster: RealCluster, namespace: str, coscheduling: LocalCoscheduling
) -> None:
    """With one of the two nodes cordoned, neither rank of a 2-node job is bound (the rank that fits waits at Permit
    for its peer, then is let go); uncordoned, both are bound together and train. A rank deleted while it trains is a
    disruption: the next attempt is a new PodGroup (the first one deleted), and the job succeeds."""
    rc = real_cluster
    nodes = sorted(json.loads(rc.kubectl("get", "nodes", "-o", "json"))["items"], key=lambda n: n["metadata"]["name"])
    cordoned = nodes[1]["metadata"]["name"]
    rc.kubectl("cordon", cordoned)
    try:
        submitted = time.monotonic()
        out = long_tiny(rc, namespace, "gang", steps=200, interval=50, pod={"affinity": APART})
        gang = wait_for(lambda: len(r := ranks(rc, namespace, "gang")) == 2 and r, timeout=60, what="both ranks")
        for p in gang:
            assert p["spec"]["schedulerName"] == SCHEDULER_NAME, p["spec"]
        groups = pod_groups(rc, namespace)
        (group,) = groups
        assert groups[group]["spec"]["minMember"] == 2 and {p["metadata"]["labels"][GROUP_LABEL] for p in gang} == {
            group
        }
        wait_for(
            lambda: all(refused_by_the_gang_scheduler(rc, namespace, p["metadata"]["name"]) for p in gang),
            timeout=120,
            what="the gang scheduler refusing both ranks",
        )
        assert not any(p["spec"].get("nodeName") for p in ranks(rc, namespace, "gang")), "half a gang was bound"
    finally:
        rc.kubectl("uncordon", cordoned)
    uncordoned = time.monotonic()
    placed = wait_for(lambda: bound(ranks(rc, namespace, "gang")), timeout=120, what="both ranks bound")
    figures = {"submit_to_both_refused_s": round(uncordoned - submitted, 1), "uncordon_to_placed_s": 0.0}
    figures["uncordon_to_placed_s"] = round(time.monotonic() - uncordoned, 1)
    assert len({p["spec"]["nodeName"] for p in placed}) == 2
    wait_for(lambda: job_status(rc, namespace, "gang").get("state") == "Running", timeout=180, what="gang running")

    deleted = time.monotonic()
    rc.kubectl("delete", "pod", "-n", namespace, placed[1]["metadata"]["name"], "--wait=false")
    st = wait_for(
        lambda: (s := job_status(rc, namespace, "gang")).get("attempt") == 1 and s, timeout=180, what="attempt 1"
    )
    regrouped = wait_for(
        lambda: group not in (g := pod_groups(rc, namespace)) and len(g) == 1 and g,
        timeout=120,
        what="attempt 1's PodGroup, attempt 0's gone",
    )
    (next_group,) = regrouped
    assert next_group != group and regrouped[next_group]["spec"]["minMember"] == 2, regrouped
    assert st.get("disruptions", 0) == 1, st
    wait_for(
        lambda: (
            (r := bound(ranks(rc, namespace, "gang")))
            and all(p["metadata"]["labels"][GROUP_LABEL] == next_group for p in r)
        ),
        timeout=180,
        what="attempt 1's ranks bound",
    )
    figures["rank_deleted_to_next_attempt_placed_s"] = round(time.monotonic() - deleted, 1)
    final = wait_terminal(rc, namespace, "gang")
    assert final["state"] == "Succeeded", (final, diagnostics(rc, namespace))
    assert {p["metadata"]["labels"][GROUP_LABEL] for p in ranks(rc, namespace, "gang")} <= {next_group}
    assert (out / "result.json").exists()
    print(json.dumps({"coscheduling": figures}))
