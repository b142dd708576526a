"""Shared pytest plumbing: the real local control plane, CRDs, one namespace per test, failure dumps.

The ``cluster`` fixture starts the local control plane of real binaries (see ``hack/localcluster``)
once per session, or reuses the cluster named by ``$KUBECONFIG`` when that is set. Every test that
asks for ``namespace`` gets a fresh namespace that enforces the restricted Pod Security Standard, so
the real API server proves every pod we create passes it. When a test fails, what its namespace held
(objects and events) is printed with the failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import prebuild

ROOT = Path(__file__).resolve().parent.parent
CRDS = ROOT / "crds"
_PREBUILD = pytest.StashKey["subprocess.Popen[bytes] | None"]()


@dataclass(frozen=True)
class Cluster:
    kubeconfig: str
    kubectl: str
    owned: bool  # started by this session (and stopped by it)

    def run_kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        proc = subprocess.run(
            [self.kubectl, f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc.stdout if check else proc.stdout + proc.stderr


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, items: list[pytest.Item]) -> None:
    """Tiers in the order of ``tests.prebuild.tier``; each tier's own order (its conftest's) is kept."""
    prebuild.order(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"finetune-prebuild-{os.getpid()}.log"
    session.config.stash[_PREBUILD] = prebuild.start(session.items, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    prebuild.stop(session.config.stash.get(_PREBUILD, None))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{rep.when}", rep)


def _kubectl_binary() -> str:
    from hack.localcluster.cluster import BIN_DIR

    built = BIN_DIR / "kubectl"
    return str(built) if built.exists() else "kubectl"


def install_crds(c: Cluster) -> None:
    """Apply this repository's CRDs and wait until the API server serves them."""
    crds = sorted(CRDS.glob("*.yaml"))
    for f in crds:
        c.run_kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f))
    # `kubectl wait` fails at once (not waits) while a just-created CRD has no status.conditions yet
    from tests.waiting import wait_for

    wait_for(
        lambda: (
            c.run_kubectl("wait", "--for=condition=Established", "--timeout=60s", *[f"-f={f}" for f in crds]) or True
        ),
        timeout=90,
        what="the CRDs to be Established",
        interval=0.5,
    )


@contextmanager
def local_cluster(*, scheduler: bool = False, extra_controllers: tuple[str, ...] = ()) -> Iterator[Cluster]:
    """A control plane of real binaries started for the caller, with the CRDs; checked (no component crashed) and
    stopped at the end."""
    from hack.localcluster.cluster import LocalCluster, ensure_binaries

    ensure_binaries()
    local = LocalCluster(scheduler=scheduler, extra_controllers=extra_controllers)
    local.start()
    try:
        c = Cluster(kubeconfig=local.kubeconfig, kubectl=_kubectl_binary(), owned=True)
        install_crds(c)
        yield c
    finally:
        try:
            local.check()  # a component that crashed during the session fails loudly
        finally:
            local.stop()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The real control plane: started here, or the one ``$KUBECONFIG`` names."""
    reuse = os.environ.get("KUBECONFIG")
    if reuse:
        from hack.localcluster.cluster import ensure_binaries

        ensure_binaries()
        c = Cluster(kubeconfig=reuse, kubectl=_kubectl_binary(), owned=False)
        install_crds(c)
        print(f"\n[cluster] {c.run_kubectl('version').strip()}")
        yield c
        return
    with local_cluster() as c:
        print(f"\n[cluster] {c.run_kubectl('version').strip()}")
        yield c


@pytest.fixture(scope="session")
def api_client(cluster: Cluster):  # type: ignore[no-untyped-def]
    from kubernetes import config

    return config.new_client_from_config(config_file=cluster.kubeconfig)


def dump_namespace(cluster: Cluster, ns: str) -> str:
    kinds = "pods,services,configmaps,serviceaccounts,roles,rolebindings,persistentvolumeclaims"
    if list(CRDS.glob("*.yaml")):
        kinds += ",finetunejobs.finetune.dev"
    parts = [
        f"==== objects in namespace {ns} ====",
        cluster.run_kubectl("get", kinds, "-n", ns, "-o", "wide", "--show-labels", check=False),
        f"==== finetunejobs in {ns} (yaml) ====",
        cluster.run_kubectl("get", "finetunejobs.finetune.dev", "-n", ns, "-o", "yaml", check=False),
        f"==== events in {ns} ====",
        cluster.run_kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False),
    ]
    return "\n".join(parts)


@pytest.fixture
def namespace(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[str]:
    """A fresh namespace enforcing the restricted Pod Security Standard; dumped if the test fails."""
    slug = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    ns = f"t-{slug}-{uuid.uuid4().hex[:5]}"
    cluster.run_kubectl(
        "apply",
        "-f",
        "-",
        input=f"""
apiVersion: v1
kind: Namespace
metadata:
  name: {ns}
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/enforce-version: latest
    finetune.dev/test: "true"
""",
    )
    yield ns
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(dump_namespace(cluster, ns))
    cluster.run_kubectl("delete", "namespace", ns, "--wait=false", check=False)
