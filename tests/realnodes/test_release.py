"""The release as users get it, on the real nodes: ``python -m hack.release local`` (the release workflow's
``publish`` step, with the images built here pushed instead of by docker) against a real OCI registry on this machine
(the CNCF distribution registry, ``hack/registry``), then the README's quickstart as written with only the registry
host differing: ``helm install ... oci://<registry>/finetune-operator/charts/finetune-operator --version X.Y.Z``
(``--plain-http``: a registry on loopback), ``kubectl apply -f examples/quickstart.yaml``, and ``helm test``. No path
of the checkout reaches the cluster: every image is pulled by digest by the nodes' containerd from the registry, which
the registry's access log and each node's containerd show, not only the pod specs.

Then an upgrade while a job trains: the next patch release (its images labelled with its own version, so new
digests, as a new build has) by ``helm upgrade``, the operator replaced mid-run: the job's pod is neither restarted
nor duplicated, its status keeps moving under the new operator; the CRDs and the runtimes are the new release's;
``helm rollback`` brings the first release's operator back, the same job still training under it.

Runs before the tier's chart-installed operator (the same release name and namespace: the CRDs ``helm uninstall``
keeps are adopted by the next install)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.localcluster.nodes import RUN_DIR
from hack.registry import CACHED_STORAGE, Registry
from tests.realnodes.conftest import OPERATOR_NAMESPACE, RELEASE, RealCluster, job_status, run_helm, uninstall_chart
from tests.realnodes.jobs import wait_terminal
from tests.waiting import wait_for

pytestmark = pytest.mark.realnodes
ROOT = Path(__file__).resolve().parents[2]
CHART_VERSION = yaml.safe_load((ROOT / "charts" / "finetune-operator" / "Chart.yaml").read_text())["version"]
major, minor, patch = (int(x) for x in CHART_VERSION.split("."))
NEXT_VERSION = f"{major}.{minor}.{patch + 1}"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = Registry(tmp_path_factory.mktemp("registry"), storage=CACHED_STORAGE)
    reg.start()
    try:
        yield reg
    finally:
        reg.stop()


def release(reg: Registry, version: str) -> dict[str, Any]:
    """``python -m hack.release local``, as a maintainer runs it; what it pushed."""
    proc = subprocess.run(
        [sys.executable, "-m", "hack.release", "local", "--registry", reg.host, "--version", version],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=1200,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    return dict(json.loads(proc.stdout))


def operator_pod(rc: RealCluster) -> dict[str, Any]:
    """The operator's one running, ready pod (none while a rollout has two)."""

    def probe() -> dict[str, Any] | None:
        pods = json.loads(rc.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "json"))["items"]
        live = [p for p in pods if "deletionTimestamp" not in p["metadata"]]
        if len(live) != 1 or not all(c.get("ready") for c in live[0]["status"].get("containerStatuses", [])):
            return None
        return dict(live[0])

    return dict(wait_for(probe, timeout=180, what="one ready operator pod", interval=1))


def pulled_by_digest(rc: RealCluster, pod: dict[str, Any], image: str) -> None:
    """The pod runs ``image`` (``repo@sha256:…``) and the containerd of its node holds it under that name: the
    kubelet had it pulled from the registry, by digest."""
    [status] = pod["status"]["containerStatuses"]
    assert pod["spec"]["containers"][0]["image"] == image
    assert status["imageID"].endswith(image.rsplit("@", 1)[1]), status
    node = pod["spec"]["nodeName"]
    names = subprocess.run(
        ["ctr", "--address", str(RUN_DIR / node / "containerd.sock"), "-n", "k8s.io", "images", "ls", "-q"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert image in names, (node, names)


def step_of(rc: RealCluster, namespace: str) -> int:
    return int((job_status(rc, namespace, "upgrade").get("progress") or {}).get("step") or 0)


def pods_of(rc: RealCluster, namespace: str) -> list[dict[str, Any]]:
    out = rc.kubectl("get", "pods", "-n", namespace, "-l", "finetune.dev/job-name=upgrade", "-o", "json")
    return list(json.loads(out)["items"])


def keeps_training(rc: RealCluster, namespace: str, pod_before: dict[str, Any], operator: str) -> None:
    """After an operator change: the job runs on, in its one pod of before (not restarted, not duplicated, no restart
    counted, the trainer image it was admitted with), and its progress moves, written by ``operator``."""
    st = job_status(rc, namespace, "upgrade")
    assert st["state"] == "Running" and st.get("restarts", 0) == 0 and st["attempt"] == 0, st
    [pod] = pods_of(rc, namespace)
    assert pod["metadata"]["uid"] == pod_before["metadata"]["uid"], pod["metadata"]
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert pod["spec"]["containers"][0]["image"] == pod_before["spec"]["containers"][0]["image"]
    step = step_of(rc, namespace)
    wait_for(lambda: step_of(rc, namespace) > step, timeout=120, what=f"progress written by {operator}", interval=1)


def test_a_release_installs_from_its_oci_chart_pulls_by_digest_and_upgrades_while_a_job_trains(
    real_cluster: RealCluster, registry: Registry, namespace: str
) -> None:
    rc = real_cluster
    first, second = release(registry, CHART_VERSION), release(registry, NEXT_VERSION)
    assert first["not built here"] == ["trainer", "trainer-ort"], first  # the CUDA images: never a made-up digest
    assert set(first["images"]) == {"operator", "trainer-cpu"}
    assert all(first["images"][k] != second["images"][k] for k in first["images"])  # each build its own digests
    chart = first["chart"]
    assert chart == f"oci://{registry.host}/finetune-operator/charts/finetune-operator"

    # The README's quickstart, only the registry host differing (and --plain-http: a registry on loopback).
    run_helm(rc, "install", RELEASE, chart, "--version", CHART_VERSION, "--plain-http",
             "--namespace", OPERATOR_NAMESPACE, "--create-namespace", "--wait", "--timeout", "300s")  # fmt: skip
    try:
        pulled_by_digest(rc, operator_pod(rc), first["images"]["operator"])
        run_helm(rc, "test", RELEASE, "-n", OPERATOR_NAMESPACE, "--timeout", "180s")
        rc.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "quickstart.yaml"))
        st = wait_terminal(rc, namespace, "quickstart")
        assert st["state"] == "Succeeded" and st["progress"]["step"] == 60, st
        trainer = json.loads(rc.kubectl("get", "pod", "quickstart-node-0", "-n", namespace, "-o", "json"))
        pulled_by_digest(rc, trainer, first["images"]["trainer-cpu"])
        pulls = {(repo, ref) for repo, ref, agent in registry.pulls() if agent.startswith("containerd/")}
        for image in first["images"].values():
            repo, digest = image.split("/", 1)[1].rsplit("@", 1)
            assert (repo, digest) in pulls, (image, sorted(pulls))

        # Upgrade to the next release while a job trains, then roll back while it still trains.
        job = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
        job["metadata"]["name"] = "upgrade"
        job["spec"]["training"]["maxSteps"] = 100000  # trains through both operator changes; deleted at the end
        rc.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))
        wait_for(lambda: step_of(rc, namespace) > 0, timeout=300, what="the job to report progress", interval=1)
        [pod_before] = pods_of(rc, namespace)
        run_helm(rc, "upgrade", RELEASE, chart, "--version", NEXT_VERSION, "--plain-http",
                 "-n", OPERATOR_NAMESPACE, "--wait", "--timeout", "300s")  # fmt: skip
        pulled_by_digest(rc, operator_pod(rc), second["images"]["operator"])
        keeps_training(rc, namespace, pod_before, "the next release's operator")
        crd = json.loads(rc.kubectl("get", "crd", "finetunejobs.finetune.dev", "-o", "json"))
        assert crd["metadata"]["labels"]["helm.sh/chart"] == f"finetune-operator-{NEXT_VERSION}"
        runtime = json.loads(rc.kubectl("get", "clusterfinetuneruntime", "cpu", "-o", "json"))
        assert runtime["spec"]["images"]["default"] == second["images"]["trainer-cpu"]  # for the jobs to come

        run_helm(rc, "rollback", RELEASE, "1", "-n", OPERATOR_NAMESPACE, "--wait", "--timeout", "300s")
        pulled_by_digest(rc, operator_pod(rc), first["images"]["operator"])
        keeps_training(rc, namespace, pod_before, "the first release's operator again")
        history = json.loads(run_helm(rc, "history", RELEASE, "-n", OPERATOR_NAMESPACE, "-o", "json"))
        assert [(h["revision"], h["chart"]) for h in history] == [
            (1, f"finetune-operator-{CHART_VERSION}"),
            (2, f"finetune-operator-{NEXT_VERSION}"),
            (3, f"finetune-operator-{CHART_VERSION}"),
        ]
        rc.kubectl("delete", "ftj", "upgrade", "-n", namespace, "--wait=false")
    finally:
        uninstall_chart(rc)
