"""Kueue preempts a gang that really trains, on real nodes: the ranks save a checkpoint on the SIGTERM the real
kubelet sends when Kueue evicts their Workload, the job waits in the queue for re-admission, and its next attempt
resumes from that checkpoint's step.

Real: Kueue's controller manager (hack/kueue, its pod webhook and plain-pod-group integration, on this host against
the node cluster's API server), the scheduler, the kubelets, the chart-installed operator (upgraded with
``kueue.enabled=true`` so it reads Kueue's Workloads), the trainer image, torch.distributed. Nothing is mocked.

The ClusterQueue's quota (1 CPU, 2 GiB) holds one 2-node job of 500m CPU and 1 GiB per rank.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from hack.kueue import LocalKueue
from tests.kueueobjects import Kueue, namespace_queues, queued_condition, queued_labels, running_kueue
from tests.realnodes.conftest import RealCluster, diagnostics, install_chart, job_status
from tests.realnodes.jobs import complete_checkpoints, long_tiny, pods, sigterm_steps, wait_terminal
from tests.waiting import wait_for

pytestmark = [pytest.mark.realnodes, pytest.mark.kueue]
GRACE = 60  # terminationGracePeriodSeconds: time for the collective checkpoint on SIGTERM
RANK = {"requests": {"cpu": "500m", "memory": "1Gi"}}


class _Conditions:
    """The FineTuneJobs' conditions, as tests.kueueobjects.queued_condition reads them."""

    def __init__(self, rc: RealCluster, namespace: str) -> None:
        self.rc, self.ns = rc, namespace

    def condition(self, job: str, ctype: str) -> dict[str, Any] | None:
        return next((c for c in job_status(self.rc, self.ns, job).get("conditions") or [] if c["type"] == ctype), None)


@pytest.fixture(scope="module")
def kueue(real_cluster: RealCluster, chart_operator: str, api_client: client.ApiClient) -> Iterator[LocalKueue]:
    install_chart(real_cluster, "--set", "kueue.enabled=true")  # the operator may read Kueue's Workloads
    try:
        with running_kueue(real_cluster.cluster, api_client) as kq:
            yield kq
    finally:
        install_chart(real_cluster)


@pytest.fixture
def kq(
    request: pytest.FixtureRequest,
    kueue: LocalKueue,
    real_cluster: RealCluster,
    namespace: str,
    api_client: client.ApiClient,
) -> Iterator[Kueue]:
    with namespace_queues(
        request, kueue, real_cluster.cluster, api_client, ns=namespace, quota={"cpu": "1", "memory": "2Gi"}
    ):
        yield Kueue(api_client, namespace)


def queued(rc: RealCluster, namespace: str, name: str, *, priority: str, steps: int, interval: int, **spec: Any) -> Any:
    return long_tiny(
        rc,
        namespace,
        name,
        steps=steps,
        interval=interval,
        labels=queued_labels(priority),
        queueName="team",
        terminationGracePeriodSeconds=GRACE,
        resources=RANK,
        **spec,
    )


def test_preempted_gang_checkpoints_requeues_and_resumes(real_cluster: RealCluster, namespace: str, kq: Kueue) -> None:
    """A high-priority job takes the quota of a training low-priority gang: Kueue evicts low's Workload, its ranks
    agree on a step, checkpoint and exit; the operator counts a disruption (not a restart) and low's next attempt
    waits in the queue, saying why, while high trains; once high succeeds, low is admitted again and resumes from
    exactly the step it checkpointed on SIGTERM."""
    rc, jobs = real_cluster, _Conditions(real_cluster, namespace)
    low = queued(rc, namespace, "low", priority="low", steps=400, interval=50, maxRestarts=0)
    first = wait_for(lambda: complete_checkpoints(low), timeout=600, what="low's first checkpoint", interval=0.5)[-1]
    assert kq.reserving() == [kq.wl("low", 0)]

    high = queued(rc, namespace, "high", priority="high", steps=40, interval=20)
    st = wait_for(
        lambda: (s := job_status(rc, namespace, "low")).get("attempt") == 1 and s,
        timeout=GRACE + 60,
        what="low's gang preempted and restarted",
    )
    assert not (low / "result.json").exists(), "low finished before it was preempted"
    assert (st.get("restarts", 0), st.get("disruptions", 0)) == (0, 1), st  # maxRestarts 0: a failure would end it
    assert st["failure"]["reason"] == "Preempted" and "Kueue" in st["failure"]["message"], st["failure"]
    cond = queued_condition(jobs, "low", "insufficient")  # attempt 1 waits while high holds the quota
    assert kq.wl("low", 1) in cond["message"], cond
    (stopped,) = wait_for(lambda: sigterm_steps(low, 0), timeout=60, what="the ranks' SIGTERM checkpoint in the logs")
    assert stopped >= first and stopped in complete_checkpoints(low), (stopped, complete_checkpoints(low))

    high_st = wait_terminal(rc, namespace, "high")
    assert high_st["state"] == "Succeeded" and high_st.get("disruptions", 0) == 0, high_st
    assert (high / "result.json").exists()
    low_st = wait_terminal(rc, namespace, "low")
    assert low_st["state"] == "Succeeded", (low_st, diagnostics(rc, namespace))
    assert (low_st["attempt"], low_st.get("restarts", 0), low_st["disruptions"]) == (1, 0, 1), low_st
    result = json.loads((low / "result.json").read_text())
    assert result["resumed_from_step"] == stopped and result["steps"] == 400, (stopped, result)
    queued_cond = jobs.condition("low", "Queued")
    assert queued_cond is not None and (queued_cond["status"], queued_cond["reason"]) == ("False", "Admitted")
    # one Workload per attempt; each took the quota once (the preempted one was never admitted again)
    assert [kq.reservations(kq.wl("low", a)) for a in (0, 1)] == [1, 1]
    assert {
        p["metadata"]["labels"]["finetune.dev/attempt"]
        for p in pods(rc, namespace)
        if p["metadata"]["labels"].get("finetune.dev/job-name") == "low"
    } == {"1"}
