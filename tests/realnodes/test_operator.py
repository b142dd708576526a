"""The operator as users run it: ``helm install`` of the chart with the operator image built from
``operator/Dockerfile``, on real nodes. Its pod passes the restricted Pod Security Standard, runs as the image's
numeric user with a read-only root filesystem, turns Ready through the chart's probes, and ``helm test`` (the
chart's own test pod, as the operator's ServiceAccount) lists FineTuneJobs through ``kubernetes.default`` and reads
the operator's metrics through its Service name: kube-proxy and CoreDNS on the real path."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.realnodes.conftest import OPERATOR_NAMESPACE, RELEASE, RealCluster, helm_binary

pytestmark = pytest.mark.realnodes


def operator_pod(rc: RealCluster) -> dict[str, object]:
    pods = json.loads(
        rc.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/component=operator", "-o", "json")
    )["items"]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return dict(pods[0])


def test_the_chart_runs_the_operator_image_ready_as_non_root_on_a_real_node(
    real_cluster: RealCluster, chart_operator: str
) -> None:
    pod = operator_pod(real_cluster)
    spec, status = pod["spec"], pod["status"]
    assert isinstance(spec, dict) and isinstance(status, dict)
    assert spec["containers"][0]["image"] == real_cluster.images["operator"]
    assert spec["nodeName"].startswith("ftn-node-")
    assert status["phase"] == "Running"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    ctx = spec["containers"][0]["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
    # The process really runs as the image's numeric user (the kubelet enforced runAsNonRoot on it).
    name = pod["metadata"]["name"]  # type: ignore[index]
    uid = real_cluster.kubectl("exec", "-n", OPERATOR_NAMESPACE, name, "--", "id", "-u").strip()
    assert uid == "65532"
    logs = real_cluster.kubectl("logs", "-n", OPERATOR_NAMESPACE, name)
    assert logs.strip(), "the operator logged nothing (kubectl logs is served by the real kubelet)"


def test_helm_test_reaches_the_api_and_the_operators_metrics_through_services(
    real_cluster: RealCluster, chart_operator: str
) -> None:
    proc = subprocess.run(
        [
            helm_binary(),
            f"--kubeconfig={real_cluster.kubeconfig}",
            "test",
            RELEASE,
            "-n",
            OPERATOR_NAMESPACE,
            "--logs",
            "--timeout",
            "180s",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, (
        proc.stdout,
        proc.stderr,
        real_cluster.kubectl("get", "pods,events", "-n", OPERATOR_NAMESPACE, check=False),
    )
    assert "operator metrics: ok" in proc.stdout and "Succeeded" in proc.stdout, proc.stdout
