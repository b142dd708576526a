"""Pod networking for the local node agent: one bridge per agent, one network namespace per pod.

Each agent owns a bridge ``fta<k>`` with address ``10.200.<k>.1/24`` in the host namespace (so the operator,
running on the host, reaches pod IPs as it would in a cluster) and gives every pod a network namespace
``fta<k>-<seq>`` with a veth pair (``ftv<k>x<seq>`` on the bridge, ``eth0`` inside) and an address
``10.200.<k>.<n>/24``. These addresses exist only in this machine's own network namespaces and are never routed
anywhere; there is no default route inside a pod (no egress), like an air-gapped cluster.
"""

from __future__ import annotations

import subprocess
import threading

SUBNET_PREFIX = "10.200"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


class Bridge:
    """The agent's bridge and address pool. ``create()`` picks the first free index k (0..199)."""

    def __init__(self) -> None:
        self.index = -1
        self.name = ""
        self._lock = threading.Lock()
        self._used: set[int] = set()
        self._seq = 0

    @property
    def gateway(self) -> str:
        return f"{SUBNET_PREFIX}.{self.index}.1"

    def create(self) -> Bridge:
        for k in range(200):
            name = f"fta{k}"
            if ip("link", "add", name, "type", "bridge", check=False).returncode == 0:
                self.index, self.name = k, name
                ip("addr", "add", f"{SUBNET_PREFIX}.{k}.1/24", "dev", name)
                ip("link", "set", name, "up")
                return self
        raise RuntimeError("no free bridge index fta0..fta199")

    def delete(self) -> None:
        if self.name:
            ip("link", "del", self.name, check=False)
            self.name = ""

    def allocate(self) -> tuple[str, str, str]:
        """(netns name, host-side veth name, IP address) for a new pod."""
        with self._lock:
            host = next(n for n in range(2, 255) if n not in self._used)
            self._used.add(host)
            self._seq += 1
            seq = self._seq
        return f"fta{self.index}-{seq}", f"ftv{self.index}x{seq}", f"{SUBNET_PREFIX}.{self.index}.{host}"

    def release(self, address: str) -> None:
        with self._lock:
            self._used.discard(int(address.rsplit(".", 1)[1]))


class PodNetwork:
    """One pod's network namespace, wired to the agent's bridge."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.netns, self.veth, self.address = bridge.allocate()

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"

    def create(self) -> PodNetwork:
        ip("netns", "add", self.netns)
        ip("link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        ip("link", "set", self.veth, "master", self.bridge.name, "up")
        ip("-n", self.netns, "addr", "add", f"{self.address}/24", "dev", "eth0")
        ip("-n", self.netns, "link", "set", "eth0", "up")
        ip("-n", self.netns, "link", "set", "lo", "up")
        return self

    def delete(self) -> None:
        ip("link", "del", self.veth, check=False)  # removes the peer too
        ip("netns", "del", self.netns, check=False)
        self.bridge.release(self.address)
