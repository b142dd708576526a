"""The local control plane's own contract: up twice in a row, down leaves no process or port, a crashed
component is reported with its log."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from hack.localcluster.cluster import ClusterError, LocalCluster, _alive, port_in_use
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def test_up_down_twice_leaves_nothing_behind(tmp_path: Path) -> None:
    for _ in range(2):
        c = LocalCluster(tmp_path / "cp")
        state = c.start()
        assert c.api_get("/version")["gitVersion"] == f"v{state.version}"
        pids, ports = dict(state.pids), [state.api_port, state.etcd_port, state.etcd_peer_port, state.kcm_port]
        c.stop()
        assert not any(_alive(p) for p in pids.values())
        assert not any(port_in_use(p) for p in ports)
        assert not (tmp_path / "cp").exists()


def test_a_crashed_component_is_reported_with_its_log(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path / "cp")
    state = c.start()
    try:
        os.kill(state.pids["kube-controller-manager"], signal.SIGKILL)
        wait_for(lambda: not _alive(state.pids["kube-controller-manager"]), timeout=10, what="the kill")
        with pytest.raises(ClusterError) as e:
            c.check()
        assert "kube-controller-manager" in str(e.value) and "last lines of" in str(e.value)
        assert "controller" in str(e.value).split("last lines of", 1)[1]  # the log tail itself
    finally:
        c.stop()


def test_a_port_taken_between_its_pick_and_the_bind_is_picked_again(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Ports are picked free and bound by the components a moment later, so another process may take one in between
    (CI saw etcd exit with "bind: address already in use"). The first port handed out here is one a listener holds:
    etcd fails on it, and the start tries again on newly picked ports instead of failing."""
    import socket

    from hack.localcluster import cluster

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picks, real = [], cluster.free_port

    def first_one_taken() -> int:
        port = taken.getsockname()[1] if not picks else real()
        picks.append(port)
        return int(port)

    monkeypatch.setattr(cluster, "free_port", first_one_taken)
    c = LocalCluster(tmp_path / "cp")
    try:
        state = c.start()
        assert c.api_get("/version")["gitVersion"] == f"v{state.version}"
        assert picks[0] not in (state.api_port, state.etcd_port, state.etcd_peer_port, state.kcm_port)  # given up
        assert picks[0] == taken.getsockname()[1] and len(picks) > 5  # a second set of ports was picked
    finally:
        c.stop()
        taken.close()
