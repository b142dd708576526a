"""``python -m hack.localcluster up --nodes N`` / ``down`` (what ``make cluster-up NODES=N`` and ``make run`` use):
a real node joins and is Ready, and after ``down`` the host is exactly as before ``up`` — sysctls the kubelet sets,
the iptables chains of the kubelet and kube-proxy, the bridges, mounts, cgroups and /var paths — even when a run
before it was killed with its pod running and never brought down.

Runs first in the tier (see conftest): one set of real nodes per machine, and the tier's own starts after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hack.localcluster.cluster import BIN_DIR, cmdline
from hack.localcluster.nodes import KUBELET_DIR, RUN_DIR, HostSnapshot, image_names

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


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        [str(BIN_DIR / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=True,
        input=stdin,
    ).stdout


def kill_like_a_lost_session(state: Path) -> list[str]:
    """SIGKILL the control plane and the node components of the cluster in ``state``, as the end of a session or an
    OOM kill does: no ``down`` runs, so the pod's shim and process, its mounts and network namespace, the bridges,
    the firewall chains and the sysctls stay behind."""
    killed = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        cmd = cmdline(proc.name)
        if cmd is None:
            continue
        ours = str(state) in cmd or str(RUN_DIR) in cmd or str(KUBELET_DIR) in cmd or "ftn-node-" in cmd
        if ours and "containerd-shim" not in cmd:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed.append(cmd[:60])
    return killed


def test_up_with_a_real_node_then_down_leaves_the_host_as_found(tmp_path: Path) -> None:
    killed_run = tmp_path / "killed"
    state = tmp_path / "cluster"
    before = HostSnapshot.take()
    first = localcluster("up", "--nodes", "1", "--dir", str(killed_run))
    assert first.returncode == 0, (first.stdout, first.stderr)
    kubeconfig = first.stdout.strip().removeprefix("export KUBECONFIG=")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "left-behind", "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "c",
                    "image": image_names()["operator"],
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ],
        },
    }
    kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(pod))
    kubectl(kubeconfig, "wait", "pod/left-behind", "--for=jsonpath={.status.phase}=Running", "--timeout=120s")
    assert kill_like_a_lost_session(killed_run)
    dirty = before.differences(HostSnapshot.take())
    assert any(line.startswith("links +ftn-cp") for line in dirty), dirty
    assert any("/run/netns/cni-" in line for line in dirty if line.startswith("mounts +")), dirty

    up = localcluster("up", "--nodes", "1", "--dir", str(state))
    try:
        assert up.returncode == 0, (up.stdout, up.stderr)
        assert f"clearing what real nodes killed before their stop left on this host ({killed_run}" in up.stderr
        kubeconfig = up.stdout.strip().removeprefix("export KUBECONFIG=")
        [node] = json.loads(kubectl(kubeconfig, "get", "nodes", "-o", "json"))["items"]
        assert node["metadata"]["name"] == "ftn-node-0"
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True", node["status"]["conditions"]
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
        changed = before.differences(HostSnapshot.take())
        # The snapshot sees what a kubelet and kube-proxy change (so an equal one after `down` means something).
        assert any(line.startswith("links +ftn-cp") for line in changed), changed
        assert any("KUBE-" in line for line in changed if line.startswith("iptables")), changed
        assert not any("/run/netns/cni-" in line for line in changed), changed  # the killed run's pod is gone
        status = localcluster("status", "--dir", str(state))
        assert status.returncode == 0 and "running" in status.stdout, status.stderr
    finally:
        down = localcluster("down", "--dir", str(state))
    assert down.returncode == 0, (down.stdout, down.stderr)
    left = before.differences(HostSnapshot.take())
    assert not left, "the host is not as it was before `up`:\n" + "\n".join(left)
    assert not state.exists()
