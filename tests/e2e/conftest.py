"""End-to-end plumbing: the real control plane (``cluster``), the real operator as a subprocess, and the local
node agent (``hack/nodeagent``) — the one test double: it stands in for kubelet + container runtime and runs
each trainer pod's ``finetune-trainer`` as local processes in network/mount/UTS/PID namespaces of their own.

Needs root and iproute2/util-linux (network namespaces); fails (never skips) without them. The trainer "image" is a
virtualenv holding ``finetune-trainer`` (``$FINETUNE_AGENT_IMAGE_VENV``, else the running venv); the operator's ONNX
Runtime image (``acceleration: ort``) runs from the ORT stack's venv (``.ci/venv.sh --ort-path``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hack.nodeagent.agent import NodeAgent, default_image_venv
from tests.integration.harness import Jobs, OperatorProcess
from tests.trainer.helpers import ort_venv, ort_venv_problem

ROOT = Path(__file__).resolve().parents[2]
ORT_IMAGE = "trainer-ort:test"  # the operator's ONNX Runtime image here; the node agent runs it from the ORT venv


def _why_not_supported() -> str | None:
    if os.geteuid() != 0:
        return "the local node agent needs root (network namespaces)"
    for tool in ("ip", "nsenter", "unshare", "mount", "hostname"):
        if not shutil.which(tool):
            return f"the local node agent needs {tool}"
    if not (default_image_venv() / "bin" / "finetune-trainer").exists():
        return f"no finetune-trainer in {default_image_venv()} (set FINETUNE_AGENT_IMAGE_VENV)"
    return None


@dataclass
class E2E:
    namespace: str
    agent: NodeAgent
    operator: OperatorProcess
    jobs: Jobs
    claims: Path
    kubectl: Any  # Cluster.run_kubectl

    def output_dir(self, job: str) -> Path:
        """Host directory of ``/output/<ns>/<job>`` (claim finetune-output)."""
        return self.claims / self.namespace / "finetune-output" / self.namespace / job

    def result(self, job: str) -> dict[str, Any]:
        return dict(json.loads((self.output_dir(job) / "result.json").read_text()))

    def complete_checkpoints(self, job: str) -> list[int]:
        d = self.output_dir(job) / "checkpoints"
        return sorted(int(c.name.split("-")[1]) for c in d.glob("checkpoint-*") if (c / "COMPLETE").exists())

    def diagnostics(self) -> str:
        return "\n".join(
            [
                "==== operator log (tail) ====",
                "\n".join(self.operator.output().splitlines()[-80:]),
                self.agent.logs(self.namespace),
            ]
        )


def _cpu_runtime(api: Any) -> None:
    """The runtime the examples name (the chart ships it; this tier runs the operator without the chart): the
    operator's own images, nothing else."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    body = {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "ClusterFineTuneRuntime",
        "metadata": {"name": "cpu"},
        "spec": {"description": "the operator's images"},
    }
    co = client.CustomObjectsApi(api)
    try:  # the session's cluster: an earlier test (the chart's, say) may have left one with other images
        co.delete_cluster_custom_object("finetune.dev", "v1alpha1", "clusterfinetuneruntimes", "cpu")
    except ApiException as e:
        if e.status != 404:
            raise
    co.create_cluster_custom_object("finetune.dev", "v1alpha1", "clusterfinetuneruntimes", body)


@pytest.fixture
def e2e(request: pytest.FixtureRequest, cluster: Any, namespace: str, tmp_path: Path) -> Iterator[E2E]:
    why = _why_not_supported()
    if why:
        pytest.fail(f"cannot run the end-to-end tier here: {why}")  # never a silent skip in CI
    claims = tmp_path / "claims"
    # The workspace claim holds this repository's examples/ (what the example's README asks a cluster to provide).
    ws = claims / namespace / "finetune-workspace"
    ws.mkdir(parents=True)
    shutil.copytree(ROOT / "examples", ws / "examples")  # a copy: pods get their own /tmp
    images = {} if ort_venv_problem() else {ORT_IMAGE: ort_venv()}  # the ORT test fails on its absence itself
    agent = NodeAgent(
        cluster.kubeconfig,
        node_name=f"agent-{namespace}"[:63],
        claims_dir=claims,
        namespace=namespace,
        state_dir=tmp_path / "agent",
        image_venvs=images,
    ).start()
    operator = OperatorProcess(
        cluster.kubeconfig, namespace, FINETUNE_PROGRESS_INTERVAL_SECONDS="1", FINETUNE_ORT_IMAGE=ORT_IMAGE
    ).start()
    from kubernetes import config

    api = config.new_client_from_config(config_file=cluster.kubeconfig)
    _cpu_runtime(api)
    env = E2E(namespace, agent, operator, Jobs(api, namespace), claims, cluster.run_kubectl)
    try:
        yield env
    finally:
        operator.stop()
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(env.diagnostics())
        agent.stop()
