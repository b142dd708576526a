"""The real-node tier: the product as users get it, on real kubelets.

A control plane of real binaries and two real nodes (``hack/localcluster/nodes.py``: kubelet + containerd each, a CNI
bridge per node, kube-proxy, CoreDNS), running the operator and trainer images built from this repository's
Dockerfiles (``hack/images``), with the operator installed by ``helm install`` of ``charts/finetune-operator`` as a
platform team would. Nothing is mocked. Needs root (kubelets, containerd, bridges); fails, never skips, without it.

The host is checked at the end of the session: everything the nodes changed on it (sysctls, iptables, links,
mounts, cgroups, /var paths) must be back as found, or the session ends in an error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hack.localcluster.nodes import chart_image_values
from tests.conftest import Cluster
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "finetune-operator"
# Chart values for a test cluster: progress every 2 s instead of 15 (the tiny jobs train for seconds); a pod stuck on
# a lost node force-deleted 10 s past its grace period and the node's NotReady instead of 30; elastic jobs that resize
# within seconds.
FAST = [
    "--set",
    "operator.progressIntervalSeconds=2",
    "--set",
    "operator.forceDelete.afterSeconds=10",
    "--set",
    "elastic.minResizeCooldownSeconds=0",
    "--set",
    "elastic.minUnschedulableSeconds=1",
]
OPERATOR_NAMESPACE = "finetune-system"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The CLI's up/down test runs before the tier's own nodes start (one set of real nodes per machine); the release
    installed from its OCI chart next, before the tier's chart-installed operator (the same release); Kueue (its
    webhooks and CRDs stay on the cluster) and a lost node (which boots again) come last."""
    mine = [i for i, item in enumerate(items) if "/realnodes/" in str(item.fspath)]
    if mine:
        block = [items[i] for i in mine]
        order = {"test_host.py": 0, "test_release.py": 1, "test_kueue.py": 3, "test_node_loss.py": 4}
        block.sort(key=lambda item: order.get(item.fspath.basename, 2))  # stable otherwise
        for i, item in zip(mine, block, strict=True):
            items[i] = item


def _why_not_supported() -> str | None:
    if os.geteuid() != 0:
        return "real nodes need root (kubelet, containerd, network bridges)"
    for tool in ("containerd", "runc", "ctr", "buildah", "podman", "iptables", "ip", "conntrack"):
        if not shutil.which(tool):
            return f"{tool} is missing: bash hack/localcluster/host-packages.sh installs the host packages"
    if not Path("/usr/lib/cni/bridge").exists():
        return "the CNI plugins are missing (Debian: containernetworking-plugins)"
    return None


@dataclass(frozen=True)
class RealCluster:
    """The running node cluster: its kubeconfig, the images on its nodes, the host directory of shared volumes."""

    cluster: Cluster
    images: dict[str, str]  # operator / trainer -> image reference on every node
    shared: Path  # host directory behind the shared (ReadWriteMany) volumes the tests create
    nodes: Any  # hack.localcluster.nodes.NodeCluster

    @property
    def nodes_dir(self) -> Path:
        return Path(self.nodes.dir)

    @property
    def kubeconfig(self) -> str:
        return self.cluster.kubeconfig

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.cluster.run_kubectl(*args, input=input, check=check)

    def shared_claim(self, namespace: str, name: str, *, content: Path | None = None, read_only: bool = False) -> Path:
        """A claim both nodes mount at once (``NodeCluster.shared_claim``), holding a copy of ``content``; returns
        the host directory behind it."""
        host = self.shared / namespace / name
        host.mkdir(parents=True, exist_ok=True)
        if content is not None:
            shutil.copytree(content, host / content.name, dirs_exist_ok=True)
        self.nodes.shared_claim(namespace, name, host, read_only=read_only)
        return host


@pytest.fixture(scope="package")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    why = _why_not_supported()
    if why:
        pytest.fail(f"cannot run the real-node tier here: {why}")  # never a silent skip in CI
    from hack.localcluster.cluster import BIN_DIR
    from hack.localcluster.nodes import HostSnapshot, NodeCluster, ensure_node_binaries, image_names, node_store

    ensure_node_binaries()
    store = node_store()
    state = tmp_path_factory.mktemp("realnodes")
    before = HostSnapshot.take()
    nc = NodeCluster(state, count=2, image_store=store)
    nc.start()
    try:
        cluster = Cluster(kubeconfig=nc.kubeconfig, kubectl=str(BIN_DIR / "kubectl"), owned=True)
        print(f"\n[real nodes] {cluster.run_kubectl('get', 'nodes', '-o', 'wide').strip()}")
        yield RealCluster(cluster, image_names(), state / "shared", nc)
        nc.check()  # a kubelet, containerd, kube-proxy or CoreDNS that died during the session fails it
    finally:
        nc.stop()
    left = before.differences(HostSnapshot.take())
    assert not left, "the real nodes left the host changed:\n" + "\n".join(left)


@pytest.fixture(scope="package")
def cluster(real_cluster: RealCluster) -> Cluster:
    """In this tier, the cluster every shared fixture (``namespace``, ``api_client``) uses is the one with nodes."""
    return real_cluster.cluster


@pytest.fixture(scope="package")
def api_client(real_cluster: RealCluster) -> Any:
    """A Kubernetes client of the cluster with nodes (the session's ``api_client`` is the other control plane's)."""
    from kubernetes import config

    return config.new_client_from_config(config_file=real_cluster.kubeconfig)


def helm_binary() -> str:
    from hack.helmtools import ensure_tools

    return str(ensure_tools().helm)


def run_helm(rc: RealCluster, *args: str, timeout: float = 400) -> str:
    """``helm ARGS`` against the cluster; its output. A failure shows the operator namespace's pods and events."""
    proc = subprocess.run(
        [helm_binary(), f"--kubeconfig={rc.kubeconfig}", *args], capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        dump = rc.kubectl("get", "pods,events", "-n", OPERATOR_NAMESPACE, "-o", "wide", check=False)
        raise AssertionError(f"helm {args[0]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n{dump}")
    return proc.stdout


def install_chart(rc: RealCluster, *extra: str) -> str:
    """``helm install`` of the chart with the images built here, as the README's install page does it; returns
    helm's output. Waits until the operator's Deployment is available (its readiness probe passed)."""
    return run_helm(
        rc,
        "upgrade",
        "--install",
        RELEASE,
        str(ROOT / "charts" / "finetune-operator"),
        "-n",
        OPERATOR_NAMESPACE,
        "--create-namespace",
        *chart_image_values(rc.images),
        *FAST,
        "--wait",
        "--timeout",
        "180s",
        *extra,
        timeout=240,
    )


def uninstall_chart(rc: RealCluster) -> None:
    """``helm uninstall`` of the release, whatever came of it (the CRDs stay: crds.keep)."""
    subprocess.run(
        [helm_binary(), f"--kubeconfig={rc.kubeconfig}", "uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--wait",
         "--timeout", "120s"],
        capture_output=True,
        timeout=180,
    )  # fmt: skip


@pytest.fixture(scope="package")
def chart_operator(real_cluster: RealCluster) -> Iterator[str]:
    """The operator installed by the chart (cluster scope), shared by the tier; returns the release's namespace."""
    install_chart(real_cluster)
    yield OPERATOR_NAMESPACE
    uninstall_chart(real_cluster)


def wait_pod_phase(rc: RealCluster, namespace: str, pod: str, phases: tuple[str, ...], timeout: float = 180) -> str:
    def probe() -> str | None:
        out = rc.kubectl("get", "pod", pod, "-n", namespace, "-o", "jsonpath={.status.phase}", check=False)
        return out if out in phases else None

    return str(wait_for(probe, timeout=timeout, what=f"pod {pod} to reach {phases}", interval=0.5))


def operator_logs(rc: RealCluster) -> str:
    return rc.kubectl("logs", "-n", OPERATOR_NAMESPACE, f"deploy/{RELEASE}", "--tail=200", check=False)


def diagnostics(rc: RealCluster, namespace: str) -> str:
    from tests.conftest import dump_namespace

    nodes_logs: list[str] = []
    for f in sorted((rc.nodes_dir / "logs").glob("kubelet-*.log")):
        nodes_logs += [f"==== {f.name} (tail) ====", *f.read_text(errors="replace").splitlines()[-30:]]
    return "\n".join(
        [dump_namespace(rc.cluster, namespace), "==== operator log (tail) ====", operator_logs(rc), *nodes_logs]
    )


def job_status(rc: RealCluster, namespace: str, name: str) -> dict[str, Any]:
    out = rc.kubectl("get", "ftj", name, "-n", namespace, "-o", "json")
    return dict(json.loads(out).get("status") or {})
