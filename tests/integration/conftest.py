"""Fixtures of the scheduling tiers (test_gpu_cluster, test_kueue): a control plane of the module's own WITH
kube-scheduler (the session's has none: its pods stay unbound), a restricted namespace holding a bound claim, fake GPU
nodes (tests.integration.gpunodes) and the operator as a subprocess. Module-scoped: each module its own control plane.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client, config

from tests.conftest import Cluster, dump_namespace, local_cluster
from tests.integration.gpucluster import Operator, bound_claim, make_ns
from tests.integration.gpunodes import GpuNodes
from tests.integration.harness import Jobs


@pytest.fixture(scope="module")
def sched(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A control plane of its own, with kube-scheduler (the session's has none: its pods stay unbound), and the
    kube-controller-manager controllers a module names in ``EXTRA_CONTROLLERS``."""
    with local_cluster(scheduler=True, extra_controllers=getattr(request.module, "EXTRA_CONTROLLERS", ())) as c:
        yield c


@pytest.fixture(scope="module")
def api(sched: Cluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=sched.kubeconfig)


@pytest.fixture
def ns(request: pytest.FixtureRequest, sched: Cluster, api: client.ApiClient) -> Iterator[str]:
    """A restricted namespace holding the bound ReadWriteMany claim ``out`` that ``make_job`` names."""
    name = make_ns(sched)
    bound_claim(api, name)
    yield name
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(dump_namespace(sched, name))
    sched.run_kubectl("delete", "namespace", name, "--wait=false", check=False)
    sched.run_kubectl("delete", "pv", "-l", f"finetune.dev/test-ns={name}", "--wait=false", check=False)


@pytest.fixture
def nodes(request: pytest.FixtureRequest, api: client.ApiClient) -> Iterator[GpuNodes]:
    """Two tainted 8-GPU nodes (a test's ``gpu_nodes`` marker can ask for another count)."""
    marker = request.node.get_closest_marker("gpu_nodes")
    gpu_nodes = GpuNodes(api, f"gpu-{uuid.uuid4().hex[:4]}", count=marker.args[0] if marker else 2).start()
    yield gpu_nodes
    gpu_nodes.stop()


@pytest.fixture
def operator_env() -> dict[str, str]:
    return {}


@pytest.fixture
def operator(request: pytest.FixtureRequest, sched: Cluster, ns: str, operator_env: dict[str, str]) -> Iterator[None]:
    op = Operator(sched, ns, **operator_env)
    yield None
    rep = getattr(request.node, "rep_call", None)
    op.stop(rep is not None and rep.failed)


@pytest.fixture
def jobs(api: client.ApiClient, ns: str) -> Jobs:
    return Jobs(api, ns)


@pytest.fixture
def rank0_metrics() -> Iterator[object]:
    """The trainer's own metrics exporter (finetune_trainer.metrics) serving on 127.0.0.1:9400, where the operator
    scrapes a job whose FakeKubelet-run rank 0 reports podIP 127.0.0.1; closed after the test."""
    from finetune_trainer.metrics import TrainerMetrics

    m = TrainerMetrics(namespace="ns", job="rank0", node_rank=0)
    assert m.serve(9400, addr="127.0.0.1")
    yield m
    m.close()
