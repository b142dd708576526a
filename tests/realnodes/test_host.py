"""``python -m hack.localcluster up --nodes N`` / ``down`` (what ``make cluster-up NODES=N`` and ``make run`` use):
a real node joins and is Ready, and after ``down`` the host is exactly as before ``up`` — sysctls the kubelet sets,
the iptables chains of the kubelet and kube-proxy, the bridges, mounts, cgroups and /var paths.

Runs first in the tier (see conftest): one set of real nodes per machine, and the tier's own starts after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hack.localcluster.cluster import BIN_DIR
from hack.localcluster.nodes import HostSnapshot

pytestmark = pytest.mark.realnodes
ROOT = Path(__file__).resolve().parents[2]


def localcluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hack.localcluster", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_up_with_a_real_node_then_down_leaves_the_host_as_found(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    before = HostSnapshot.take()
    up = localcluster("up", "--nodes", "1", "--dir", str(state))
    try:
        assert up.returncode == 0, (up.stdout, up.stderr)
        kubeconfig = up.stdout.strip().removeprefix("export KUBECONFIG=")
        nodes = json.loads(
            subprocess.run(
                [str(BIN_DIR / "kubectl"), f"--kubeconfig={kubeconfig}", "get", "nodes", "-o", "json"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        [node] = nodes["items"]
        assert node["metadata"]["name"] == "ftn-node-0"
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True", node["status"]["conditions"]
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
        changed = before.differences(HostSnapshot.take())
        # The snapshot sees what a kubelet and kube-proxy change (so an equal one after `down` means something).
        assert any(line.startswith("links +ftn-cp") for line in changed), changed
        assert any("KUBE-" in line for line in changed if line.startswith("iptables")), changed
        status = localcluster("status", "--dir", str(state))
        assert status.returncode == 0 and "running" in status.stdout, status.stderr
    finally:
        down = localcluster("down", "--dir", str(state))
    assert down.returncode == 0, (down.stdout, down.stderr)
    left = before.differences(HostSnapshot.take())
    assert not left, "the host is not as it was before `up`:\n" + "\n".join(left)
    assert not state.exists()
