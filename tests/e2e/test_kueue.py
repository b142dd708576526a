"""Kueue preempts a gang that really trains: the ranks save a checkpoint on the SIGTERM of Kueue's eviction, the job
waits in the queue for re-admission, and its next attempt resumes from that checkpoint's step.

Real: Kueue's controller manager (hack/kueue, its pod webhook and plain-pod-group integration), etcd,
kube-apiserver, kube-controller-manager (with the pod garbage collector), the operator process, the trainer,
torch.distributed. Mocked, because it cannot exist here: the kubelet and container runtime (``hack/nodeagent``, as in
the rest of this tier; like a scheduler, it places a pod only once Kueue lifted its admission gate). Kueue runs on a
control plane of this module's own, so its webhooks and CRDs never touch the session's.

The ClusterQueue's quota (1 CPU, 2 GiB) holds one 2-node job of 500m CPU and 1 GiB per rank.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import config

from hack.kueue import LocalKueue
from tests.conftest import Cluster, local_cluster
from tests.e2e.conftest import E2E, tiny_job
from tests.kueueobjects import (
    Kueue,
    namespace_queues,
    queued_condition,
    queued_labels,
    running_kueue,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.kueue]
TRAIN_TIMEOUT = 420  # generous: 2 CPU cores shared with other work
GRACE = 60  # terminationGracePeriodSeconds: time for the collective checkpoint on SIGTERM
RANK = {"requests": {"cpu": "500m", "memory": "1Gi"}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """This module's own control plane, with the pod GC: a queued gang's pods, deleted while gated and so never
    scheduled, are marked Failed and removed by it, as in every cluster."""
    with local_cluster(extra_controllers=("pod-garbage-collector-controller",)) as c:
        yield c


@pytest.fixture(scope="module")
def kueue(cluster: Cluster) -> Iterator[LocalKueue]:
    with running_kueue(cluster, config.new_client_from_config(config_file=cluster.kubeconfig)) as kq:
        yield kq


@pytest.fixture
def kq(request: pytest.FixtureRequest, kueue: LocalKueue, cluster: Cluster, e2e: E2E) -> Iterator[Kueue]:
    api = config.new_client_from_config(config_file=cluster.kubeconfig)
    with namespace_queues(request, kueue, cluster, api, ns=e2e.namespace, quota={"cpu": "1", "memory": "2Gi"}):
        yield Kueue(api, e2e.namespace)


def queued_tiny_job(name: str, priority: str, **spec: Any) -> dict[str, Any]:
    job = tiny_job(name, queueName="team", terminationGracePeriodSeconds=GRACE, resources=RANK, **spec)
    job["spec"]["podTemplate"]["labels"] = queued_labels(priority)
    return job


def sigterm_steps(e2e: E2E) -> set[int]:
    """The steps at which ranks said they stopped on SIGTERM after a checkpoint (the node agent's pod logs)."""
    logs = "".join(f.read_text(errors="replace") for f in (e2e.agent.state_dir / "logs").glob(f"{e2e.namespace}_*"))
    return {int(m) for m in re.findall(r"stopped on SIGTERM at step (\d+) after saving a checkpoint", logs)}


def test_preempted_gang_checkpoints_requeues_and_resumes(e2e: E2E, kq: Kueue) -> None:
    """A high-priority job takes the quota of a training low-priority gang: Kueue evicts low's Workload, its ranks
    agree on a step, checkpoint and exit; the operator counts a disruption (not a restart) and low's next attempt
    waits in the queue, saying why, while high trains; once high succeeds, low is admitted again and resumes from
    exactly the step it checkpointed on SIGTERM."""
    e2e.jobs.create(queued_tiny_job("low", "low", maxRestarts=0,
                                    **{"training.maxSteps": 400, "training.checkpointEverySteps": 50}))
    first = wait_for(lambda: e2e.complete_checkpoints("low"), timeout=TRAIN_TIMEOUT, what="low's first checkpoint",
                     interval=0.5)[-1]
    assert kq.reserving() == [kq.wl("low", 0)]

    e2e.jobs.create(queued_tiny_job("high", "high", **{"training.maxSteps": 40, "training.checkpointEverySteps": 20}))
    st = wait_for(lambda: (s := e2e.jobs.status("low")).get("attempt") == 1 and s, timeout=GRACE + 60,
                  what="low's gang preempted and restarted")
    assert not (e2e.output_dir("low") / "result.json").exists(), "low finished before it was preempted"
    assert (st.get("restarts", 0), st.get("disruptions", 0)) == (0, 1), st  # maxRestarts 0: a failure would end it
    assert st["failure"]["reason"] == "Preempted" and "Kueue" in st["failure"]["message"], st["failure"]
    cond = queued_condition(e2e.jobs, "low", "insufficient")  # attempt 1 waits while high holds the quota
    assert kq.wl("low", 1) in cond["message"], cond
    (stopped,) = wait_for(lambda: sigterm_steps(e2e), timeout=30, what="the ranks' SIGTERM checkpoint in the logs")
    assert stopped >= first and stopped in e2e.complete_checkpoints("low"), (stopped, e2e.complete_checkpoints("low"))

    high = wait_for(lambda: (s := e2e.jobs.status("high")).get("state") in ("Succeeded", "Failed") and s,
                    timeout=TRAIN_TIMEOUT, what="high to finish", interval=1.0)
    assert high["state"] == "Succeeded" and high.get("disruptions", 0) == 0, high
    low = wait_for(lambda: (s := e2e.jobs.status("low")).get("state") in ("Succeeded", "Failed") and s,
                   timeout=TRAIN_TIMEOUT, what="low to finish", interval=1.0)
    assert low["state"] == "Succeeded", low
    assert (low["attempt"], low.get("restarts", 0), low["disruptions"]) == (1, 0, 1), low
    result = e2e.result("low")
    assert result["resumed_from_step"] == stopped and result["steps"] == 400, (stopped, result)
    queued = e2e.jobs.condition("low", "Queued")
    assert queued is not None and (queued["status"], queued["reason"]) == ("False", "Admitted"), queued
    # one Workload per attempt; each took the quota once (the preempted one was never admitted again)
    assert [kq.reservations(kq.wl("low", a)) for a in (0, 1)] == [1, 1]
    assert {p.metadata.labels["finetune.dev/attempt"] for p in e2e.jobs.pods("low")} == {"1"}
