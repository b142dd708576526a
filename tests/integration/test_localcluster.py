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
