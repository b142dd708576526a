"""The operator against the real control plane: objects, env contract, lifecycle, failure handling.

Real: kube-apiserver (schema, CEL, restricted Pod Security on every pod), etcd, the garbage collector,
and the operator as a subprocess. Mocked: the kubelet (FakeKubelet writes pod status), because no
kubelet or container runtime can run on these machines.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.integration.harness import FakeKubelet, Jobs, OperatorProcess, make_job
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def jobs(api_client, namespace) -> Jobs:  # type: ignore[no-untyped-def]
    return Jobs(api_client, namespace)


@pytest.fixture
def kubelet(api_client, namespace) -> FakeKubelet:  # type: ignore[no-untyped-def]
    return FakeKubelet(api_client, namespace)


@pytest.fixture
def operator(request, cluster, namespace) -> Iterator[OperatorProcess]:  # type: ignore[no-untyped-def]
    op = OperatorProcess(cluster.kubeconfig, namespace).start()
    yield op
    op.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print("==== operator log (tail) ====\n" + "\n".join(op.output().splitlines()[-80:]))


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env if e.value is not None}


def trainer_schema() -> dict[str, Any]:
    found = list((ROOT / "trainer-image").rglob("config.schema.json"))
    assert found, "trainer-image must ship config.schema.json (the operator/trainer contract)"
    return dict(json.loads(found[0].read_text()))


@pytest.mark.parametrize("nodes", [1, 2, 4], ids=["1-node", "2-nodes", "4-nodes"])
def test_objects_and_env_contract(jobs, operator, namespace, nodes) -> None:  # type: ignore[no-untyped-def]
    job = jobs.create(make_job("ft").nodes(nodes).build())
    pods = jobs.wait_pods("ft", nodes)
    assert [p.metadata.name for p in pods] == [f"ft-node-{r}" for r in range(nodes)]
    # the digest of the config the operator admitted, which the trainer checks its file against (a tenant may rewrite
    # the ConfigMap, never a pod's env)
    admitted = hashlib.sha256(jobs.core.read_namespaced_config_map("ft-config", namespace).data["config.json"].encode())
    for rank, pod in enumerate(pods):
        assert env_of(pod) == {
            "PET_NNODES": str(nodes),
            "NNODES": str(nodes),
            "PET_NPROC_PER_NODE": "1",
            "NPROC_PER_NODE": "1",
            "PET_NODE_RANK": str(rank),
            "NODE_RANK": str(rank),
            "PET_MASTER_ADDR": "ft-node-0.ft",
            "MASTER_ADDR": "ft-node-0.ft",
            "PET_MASTER_PORT": "29500",
            "MASTER_PORT": "29500",
            "WORLD_SIZE": str(nodes),
            "FINETUNE_JOB_NAME": "ft",
            "FINETUNE_NAMESPACE": namespace,
            "FINETUNE_ATTEMPT": "0",
            "FINETUNE_RESTARTS_IN_PLACE": "3",  # spec.maxRestarts' default, none used yet
            "FINETUNE_CONFIG": "/etc/finetune/config.json",
            "FINETUNE_CONFIG_SHA256": admitted.hexdigest(),
            "HF_HOME": "/tmp/huggingface",
            "AWS_EC2_METADATA_DISABLED": "true",  # no node IAM role through instance metadata
        }
        assert pod.metadata.labels["finetune.dev/node-rank"] == str(rank)
        assert pod.metadata.labels["finetune.dev/attempt"] == "0"
        assert pod.spec.hostname == f"ft-node-{rank}" and pod.spec.subdomain == "ft"
        assert pod.spec.restart_policy == "Never"
        assert pod.spec.automount_service_account_token is False
        owner = pod.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.uid, owner.controller) == (
            "FineTuneJob",
            "ft",
            job["metadata"]["uid"],
            True,
        )
        shm = next(v for v in pod.spec.volumes if v.name == "shm")
        assert shm.empty_dir.medium == "Memory"
    svc = jobs.core.read_namespaced_service("ft", namespace)
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses is True
    assert svc.spec.selector == {"finetune.dev/job-name": "ft"}
    cm = jobs.core.read_namespaced_config_map("ft-config", namespace)
    config = json.loads(cm.data["config.json"])
    jsonschema.validate(config, trainer_schema())
    assert config["job"] == {"name": "ft", "namespace": namespace}
    assert config["output"]["path"] == f"/output/{namespace}/ft"
    status = jobs.wait_state("ft", "Created")
    assert status["nodes"] == f"0/{nodes}" and status["attempt"] == 0


def test_acceleration_picks_the_trainer_image(jobs, operator) -> None:  # type: ignore[no-untyped-def]
    """ort runs on the ONNX Runtime image, every other acceleration on the default image (Helm values
    trainer.ortImage / trainer.image), and spec.image overrides both."""
    cases = {
        "ort": ("ort", None),
        "none": ("none", None),
        "auto": ("auto", None),
        "compile": ("compile", None),
        "own": ("ort", "registry.example.com/mine:1"),
    }
    for name, (acceleration, image) in cases.items():
        job = make_job(name).set("acceleration", acceleration)
        if image:
            job.set("image", image)
        jobs.create(job.build())
    images = {name: jobs.wait_pods(name, 1)[0].spec.containers[0].image for name in cases}
    assert images == {
        "ort": "trainer-ort:test",
        "none": "trainer:test",
        "auto": "trainer:test",
        "compile": "trainer:test",
        "own": "registry.example.com/mine:1",
    }


def test_running_then_succeeded(jobs, operator, kubelet) -> None:  # type: ignore[no-untyped-def]
    jobs.create(make_job("ok").nodes(2).build())
    pods = jobs.wait_pods("ok", 2)
    for p in pods:
        kubelet.run(p.metadata.name)
    status = jobs.wait_state("ok", "Running")
    assert status["nodes"] == "2/2" and status["readyNodes"] == 2
    for p in pods:
        kubelet.exit(p.metadata.name, 0)
    status = jobs.wait_state("ok", "Succeeded")
    assert status["completionTime"] and status["restarts"] == 0
    assert jobs.condition("ok", "Succeeded")["status"] == "True"
    assert jobs.condition("ok", "Running")["status"] == "False"
    reasons = {
        e.reason
        for e in wait_for(lambda: jobs.events("ok") if len(jobs.events("ok")) >= 3 else None, timeout=30, what="events")
    }
    assert {"PodsCreated", "AllRanksRunning", "AllRanksSucceeded"} <= reasons


def test_rank_failure_restarts_the_gang(jobs, operator, kubelet) -> None:  # type: ignore[no-untyped-def]
    jobs.create(make_job("gang").nodes(2).max_restarts(2).build())
    pods = jobs.wait_pods("gang", 2, attempt=0)
    for p in pods:
        kubelet.run(p.metadata.name)
    jobs.wait_state("gang", "Running")
    kubelet.exit("gang-node-1", 1, message='{"reason": "TrainingError", "message": "NCCL watchdog timeout"}')
    # Every pod of attempt 0 goes (rank 0 was still running), then attempt 1 under the same names.
    pods = jobs.wait_pods("gang", 2, attempt=1)
    assert [p.metadata.name for p in pods] == ["gang-node-0", "gang-node-1"]
    assert {env_of(p)["FINETUNE_ATTEMPT"] for p in pods} == {"1"}
    assert {env_of(p)["FINETUNE_RESTARTS_IN_PLACE"] for p in pods} == {"1"}  # 2 allowed, 1 used
    status = jobs.status("gang")
    assert status["restarts"] == 1 and status["attempt"] == 1
    assert status["failure"]["reason"] == "TrainingError" and status["failure"]["rank"] == 1
    assert "NCCL watchdog timeout" in status["failure"]["message"]
    assert "lastRestartGapSeconds" in status
    assert jobs.condition("gang", "Restarting")["reason"] == "TrainingError"
    for p in pods:
        kubelet.run(p.metadata.name)
    jobs.wait_state("gang", "Running")
    assert jobs.condition("gang", "Restarting")["status"] == "False"


def test_the_next_attempt_runs_with_the_config_of_the_edited_spec(
    jobs, operator, kubelet, api_client, namespace
) -> None:  # type: ignore[no-untyped-def]
    """A mutable field edited while attempt 0 runs (spec.activeDeadlineSeconds, from which the collective timeout
    ddp_timeout is derived) reaches the resolved-config ConfigMap that attempt 1's pods start with."""
    from kubernetes import client

    def ddp_timeout() -> int:
        cm = client.CoreV1Api(api_client).read_namespaced_config_map("edited-config", namespace)
        return int(json.loads(cm.data["config.json"])["training"]["extraArgs"]["ddp_timeout"])

    jobs.create(make_job("edited").nodes(2).max_restarts(2).set("activeDeadlineSeconds", 4000).build())
    for p in jobs.wait_pods("edited", 2, attempt=0):
        kubelet.run(p.metadata.name)
    jobs.wait_state("edited", "Running")
    assert ddp_timeout() == 1000  # a quarter of the deadline
    jobs.patch("edited", {"activeDeadlineSeconds": 2000})
    kubelet.exit("edited-node-1", 1, message="RuntimeError: injected")
    jobs.wait_pods("edited", 2, attempt=1)
    assert ddp_timeout() == 500


def test_restarts_exhausted_fails_and_frees_ranks(jobs, operator, kubelet) -> None:  # type: ignore[no-untyped-def]
    jobs.create(make_job("tired").nodes(2).max_restarts(1).build())
    for attempt in (0, 1):
        pods = jobs.wait_pods("tired", 2, attempt=attempt)
        for p in pods:
            kubelet.run(p.metadata.name)
        jobs.wait_state("tired", "Running")
        kubelet.exit("tired-node-0", 3)
    status = jobs.wait_state("tired", "Failed")
    assert status["restarts"] == 1
    assert status["failure"]["reason"] == "TrainingError" and "restarts exhausted (1/1)" in status["failure"]["message"]
    # The rank still running is deleted; the failed rank's pod stays for `kubectl logs`.
    wait_for(
        lambda: [p.metadata.name for p in jobs.live_pods("tired")] == ["tired-node-0"],
        timeout=30,
        what="only the failed pod to remain",
    )


def test_oom_is_classified(jobs, operator, kubelet) -> None:  # type: ignore[no-untyped-def]
    jobs.create(make_job("oom").max_restarts(0).build())
    (pod,) = jobs.wait_pods("oom", 1)
    kubelet.run(pod.metadata.name)
    kubelet.exit(pod.metadata.name, 137, reason="OOMKilled")
    status = jobs.wait_state("oom", "Failed")
    assert status["failure"]["reason"] == "OOMKilled" and status["failure"]["exitCode"] == 137
    assert jobs.condition("oom", "Failed")["reason"] == "OOMKilled"
    assert "OOMKilled" in {e.reason for e in jobs.events("oom")}


def test_eviction_restarts_without_counting(jobs, operator, kubelet) -> None:  # type: ignore[no-untyped-def]
    jobs.create(make_job("evict").nodes(2).max_restarts(0).build())
    pods = jobs.wait_pods("evict", 2, attempt=0)
    for p in pods:
        kubelet.run(p.metadata.name)
    kubelet.evict("evict-node-0")
    jobs.wait_pods("evict", 2, attempt=1)
    status = jobs.status("evict")
    assert status["restarts"] == 0 and status["disruptions"] == 1
    assert status["failure"]["reason"] == "Evicted"


def test_config_error_fails_at_once(jobs, operator, kubelet) -> None:  # type: ignore[no-untyped-def]
    jobs.create(make_job("cfg").nodes(2).max_restarts(5).build())
    pods = jobs.wait_pods("cfg", 2)
    kubelet.exit(
        pods[0].metadata.name,
        78,
        message='{"reason": "ConfigError", "message": "dataset.path: /data/x.jsonl does not exist"}',
    )
    status = jobs.wait_state("cfg", "Failed")
    assert status["restarts"] == 0 and status["failure"]["reason"] == "ConfigError"
    assert "dataset.path" in status["failure"]["message"]


def test_image_pull_backoff_fails_after_bounded_wait(jobs, operator, kubelet) -> None:  # type: ignore[no-untyped-def]
    jobs.create(make_job("pull").build())
    (pod,) = jobs.wait_pods("pull", 1)
    kubelet.wait_image_pull(pod.metadata.name)
    wait_for(
        lambda: (jobs.condition("pull", "Created") or {}).get("reason") == "ImagePullBackOff",
        timeout=30,
        what="the ImagePullBackOff reason on the Created condition",
    )
    status = jobs.wait_state("pull", "Failed", timeout=60)  # FINETUNE_WAITING_TIMEOUT_SECONDS=5 in tests
    assert status["failure"]["reason"] == "ImagePullBackOff"


def test_suspend_and_resume(jobs, operator, kubelet) -> None:  # type: ignore[no-untyped-def]
    jobs.create(make_job("nap").nodes(2).build())
    for p in jobs.wait_pods("nap", 2, attempt=0):
        kubelet.run(p.metadata.name)
    jobs.wait_state("nap", "Running")
    jobs.patch("nap", {"suspend": True})
    jobs.wait_state("nap", "Suspended")
    wait_for(lambda: jobs.live_pods("nap") == [], timeout=30, what="pods deleted on suspend")
    assert jobs.condition("nap", "Suspended")["status"] == "True"
    jobs.patch("nap", {"suspend": False})
    pods = jobs.wait_pods("nap", 2, attempt=1)
    assert {env_of(p)["FINETUNE_ATTEMPT"] for p in pods} == {"1"}
    assert jobs.status("nap")["restarts"] == 0
    assert jobs.condition("nap", "Suspended")["status"] == "False"


def test_active_deadline(jobs, operator, kubelet) -> None:  # type: ignore[no-untyped-def]
    jobs.create(make_job("late").set("activeDeadlineSeconds", 3).build())
    (pod,) = jobs.wait_pods("late", 1)
    kubelet.run(pod.metadata.name)
    status = jobs.wait_state("late", "Failed", timeout=30)
    assert status["failure"]["reason"] == "DeadlineExceeded"
    wait_for(lambda: jobs.live_pods("late") == [], timeout=30, what="pods deleted at the deadline")


def test_ttl_after_finished_deletes_the_job(jobs, operator, kubelet) -> None:  # type: ignore[no-untyped-def]
    jobs.create(make_job("ttl").set("ttlSecondsAfterFinished", 2).build())
    (pod,) = jobs.wait_pods("ttl", 1)
    kubelet.exit(pod.metadata.name, 0)
    jobs.wait_state("ttl", "Succeeded")
    wait_for(lambda: not jobs.exists("ttl"), timeout=30, what="the job to be deleted after its TTL")


@pytest.mark.parametrize(
    ("spec_patch", "field"),
    [
        ({"training": {"maxSteps": 10, "extraArgs": {"output_dir": "/x"}}}, "spec.training.extraArgs.output_dir"),
        ({"training": {"maxSteps": 10, "evaluation": {"strategy": "epoch"}}}, "spec.dataset.evalSplit"),
        (
            {"podTemplate": {"volumes": [{"name": "data", "mountPath": "/output/data", "emptyDir": {}}]}},
            "spec.podTemplate.volumes[0].mountPath",
        ),
        ({"podTemplate": {"labels": {"finetune.dev/job-name": "other"}}}, "spec.podTemplate.labels"),
    ],
    ids=["managed-extra-arg", "eval-without-split", "mount-over-output", "reserved-label"],
)
def test_semantic_errors_become_invalid_spec(jobs, operator, spec_patch, field) -> None:  # type: ignore[no-untyped-def]
    manifest = make_job("bad").build()
    manifest["spec"].update(spec_patch)
    jobs.create(manifest)
    status = jobs.wait_state("bad", "Failed")
    cond = jobs.condition("bad", "InvalidSpec")
    assert cond["status"] == "True" and field in cond["message"]
    assert jobs.pods("bad") == []
    warning = wait_for(
        lambda: [e for e in jobs.events("bad") if e.reason == "InvalidSpec"], timeout=20, what="an InvalidSpec event"
    )
    assert warning[0].type == "Warning"
    # No retry storm: across several backstop passes (2 s each in tests) nothing is rewritten. Proving an
    # absence needs an observation window; this is the one place a test waits on purpose.
    rv = jobs.get("bad")["metadata"]["resourceVersion"]
    time.sleep(3 * int(operator.env["FINETUNE_RESYNC_SECONDS"]))
    assert jobs.get("bad")["metadata"]["resourceVersion"] == rv
    assert status["observedGeneration"] == 1


def test_a_hostile_spec_fails_before_any_pod_with_every_error(jobs, operator) -> None:  # type: ignore[no-untyped-def]
    """What the API server's schema lets through (extraArgs are free-form) but the job's image would refuse only after
    scheduling and an image pull: an unknown name, a wrong type, an integration the image lacks. The operator fails
    the job before any pod, and its condition names every field at once."""
    manifest = make_job("hostile").build()
    manifest["spec"]["training"] = {
        "maxSteps": 10,
        "extraArgs": {"warmup_ratios": 0.1, "max_grad_norm": "big", "deepspeed": "/etc/passwd", "report_to": ["wandb"]},
    }
    jobs.create(manifest)
    jobs.wait_state("hostile", "Failed")
    cond = jobs.condition("hostile", "InvalidSpec")
    assert cond["status"] == "True"
    for key in ("warmup_ratios", "max_grad_norm", "deepspeed", "report_to"):
        assert f"spec.training.extraArgs.{key}:" in cond["message"], cond["message"]
    assert jobs.pods("hostile") == []
    print(cond["message"])


def test_operator_restart_mid_reconcile_creates_no_duplicates(cluster, jobs, namespace, kubelet) -> None:  # type: ignore[no-untyped-def]
    first = OperatorProcess(cluster.kubeconfig, namespace).start()
    try:
        jobs.create(make_job("twice").nodes(4).build())
        wait_for(lambda: len(jobs.pods("twice")) >= 1, timeout=60, what="the first pod")
        first.kill()  # SIGKILL in the middle of creating the gang
    finally:
        first.stop()
    second = OperatorProcess(cluster.kubeconfig, namespace).start()
    try:
        pods = jobs.wait_pods("twice", 4)
        uids = {p.metadata.uid for p in pods}
        for p in pods:
            kubelet.run(p.metadata.name)
        jobs.wait_state("twice", "Running")
        assert {p.metadata.uid for p in jobs.pods("twice")} == uids  # nothing recreated
        assert len(jobs.pods("twice")) == 4
    finally:
        second.stop()


def test_deleting_the_job_collects_every_child(jobs, operator, namespace, api_client) -> None:  # type: ignore[no-untyped-def]
    from kubernetes import client

    net = client.NetworkingV1Api(api_client)
    jobs.create(make_job("gc").nodes(2).build())
    jobs.wait_pods("gc", 2)
    # the job's NetworkPolicy, as the API server accepted it: the gang's pods reach each other, the metrics port is
    # open (no metricsFrom configured), nothing else
    policy = net.read_namespaced_network_policy("gc", namespace)
    assert policy.metadata.owner_references[0].kind == "FineTuneJob"
    assert policy.spec.pod_selector.match_labels == {"finetune.dev/job-name": "gc"}
    peers, metrics = policy.spec.ingress
    assert peers.ports is None and peers._from[0].pod_selector.match_labels == {"finetune.dev/job-name": "gc"}
    assert [p.port for p in metrics.ports] == [9400] and metrics._from is None
    jobs.delete("gc")

    def children() -> int:
        n = len(jobs.pods("gc"))
        n += len(jobs.core.list_namespaced_service(namespace, label_selector="finetune.dev/job-name=gc").items)
        n += len(jobs.core.list_namespaced_config_map(namespace, label_selector="finetune.dev/job-name=gc").items)
        n += len(net.list_namespaced_network_policy(namespace, label_selector="finetune.dev/job-name=gc").items)
        return n

    wait_for(
        lambda: children() == 0,
        timeout=60,
        what="the garbage collector to remove pods, service, config, network policy",
    )


def test_pod_the_api_server_refuses_becomes_invalid_spec(jobs, operator) -> None:  # type: ignore[no-untyped-def]
    """A quantity the CRD's int-or-string accepts but a Pod does not: InvalidSpec naming the field, no retry loop."""
    jobs.create(make_job("qty").set("resources", {"limits": {"memory": "1x"}}).build())
    jobs.wait_state("qty", "Failed")
    cond = jobs.condition("qty", "InvalidSpec")
    assert cond["status"] == "True" and "spec.resources.limits['memory']" in cond["message"]
    assert jobs.pods("qty") == []


def test_namespace_quota_rejection_is_a_condition(cluster, jobs, operator, namespace) -> None:  # type: ignore[no-untyped-def]
    cluster.run_kubectl("create", "quota", "one-pod", "--hard=pods=1", "-n", namespace)
    wait_for(
        lambda: (
            "pods" in cluster.run_kubectl("get", "quota", "one-pod", "-n", namespace, "-o", "jsonpath={.status.hard}")
        ),
        timeout=30,
        what="the quota controller to publish the quota",
    )
    jobs.create(make_job("big").nodes(2).build())
    cond = wait_for(
        lambda: (c := jobs.condition("big", "Created")) and c.get("reason") == "QuotaExceeded" and c,
        timeout=60,
        what="a QuotaExceeded condition",
    )
    assert "exceeded quota" in cond["message"] and cond["status"] == "False"
    assert jobs.state("big") != "Failed"
    # the event is posted after the status write (and the deletion of the rank created before the refusal)
    wait_for(
        lambda: "QuotaExceeded" in {e.reason for e in jobs.events("big")},
        timeout=30,
        what="a QuotaExceeded event on the job",
    )


HOLD = "test.finetune.dev/hold"  # a finalizer standing in for a kubelet still waiting for a trainer's checkpoint


def _hold(jobs: Jobs, kind: str, name: str, on: bool) -> None:
    body = {"metadata": {"finalizers": [HOLD] if on else None}}
    if kind == "pod":
        jobs.core.patch_namespaced_pod(name, jobs.ns, body)
    else:
        jobs.core.patch_namespaced_config_map(name, jobs.ns, body)


def test_a_job_recreated_under_its_name_adopts_nothing_of_the_old_one(jobs, operator) -> None:  # type: ignore[no-untyped-def]
    """`kubectl delete ftj same && kubectl apply -f same.yaml` while the old job's rank 0 is still terminating and
    its ConfigMap not yet collected: the new job (another uid) creates nothing under names they hold, counts no
    disruption, says what it waits for, and starts with its own objects once they are gone. Mocked: the kubelet (a
    finalizer holds the old pod in Terminating, as a kubelet waiting for a checkpoint on SIGTERM would)."""
    old = jobs.create(make_job("same").nodes(2).build())
    jobs.wait_pods("same", 2)
    wait_for(
        lambda: jobs.core.list_namespaced_config_map(jobs.ns, field_selector="metadata.name=same-config").items,
        timeout=30,
        what="the old job's ConfigMap",
    )
    _hold(jobs, "pod", "same-node-0", True)
    _hold(jobs, "configmap", "same-config", True)
    try:
        jobs.delete("same")
        wait_for(lambda: not jobs.exists("same"), timeout=30, what="the old job to be deleted")
        wait_for(
            lambda: [p.metadata.name for p in jobs.pods("same")] == ["same-node-0"],
            timeout=60,
            what="the garbage collector to delete the old pods (rank 0 held in Terminating)",
        )
        new = jobs.create(make_job("same").nodes(2).build())
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
        waiting = wait_for(
            lambda: (c := jobs.condition("same", "Created")) and c["reason"] == "PreviousJobTerminating" and c,
            timeout=30,
            what="the new job to wait for its namesake's pod",
        )
        assert waiting["status"] == "False" and "same-node-0" in waiting["message"]
        _hold(jobs, "pod", "same-node-0", False)
        # the old ConfigMap still stands: its name is not adopted either
        wait_for(
            lambda: (c := jobs.condition("same", "Created")) and "ConfigMap same-config" in c["message"],
            timeout=30,
            what="the new job to wait for its namesake's ConfigMap",
        )
        assert all(p.metadata.owner_references[0].uid == new["metadata"]["uid"] for p in jobs.pods("same"))
    finally:
        for kind, name in (("pod", "same-node-0"), ("configmap", "same-config")):
            with contextlib.suppress(Exception):  # already gone
                _hold(jobs, kind, name, False)
    pods = jobs.wait_pods("same", 2)
    assert {p.metadata.owner_references[0].uid for p in pods} == {new["metadata"]["uid"]}
    cm = jobs.core.read_namespaced_config_map("same-config", jobs.ns)
    assert cm.metadata.owner_references[0].uid == new["metadata"]["uid"]
    status = jobs.wait_state("same", "Created")
    assert status["disruptions"] == 0 and status["restarts"] == 0 and status["attempt"] == 0
