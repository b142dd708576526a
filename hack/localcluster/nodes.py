"""Real nodes for the local control plane: kubelets on containerd, a CNI bridge per node, kube-proxy and CoreDNS.

Each node is what a kind node would hold, on the host itself rather than in a container:
- its own containerd (root, state and socket of its own), whose image store is a hard-linked clone of one prepared
  store holding the images built from the repository's Dockerfiles (``images.py``): seconds and almost no disk per
  node, however large the trainer image;
- its own CNI bridge ``ftn<i>`` and pod subnet ``10.244.<i>.0/24`` (bridge + host-local + portmap plugins from
  Debian's ``containernetworking-plugins``); the host routes between the bridges;
- a real kubelet (built from the Go module proxy like the control plane) with its own root dir, ports, cgroup root
  and node certificate (``system:node:<name>``: the Node authorizer and NodeRestriction apply);
- local PersistentVolumes on its disk, in a StorageClass ``standard`` (the default class) with
  ``WaitForFirstConsumer``: claims bind where their pod is scheduled, as with kind's local-path provisioner.
Shared by the nodes: kube-proxy (iptables mode: ClusterIP Services, ``kubernetes.default`` for in-cluster clients)
and CoreDNS (headless-Service names, ``cluster.local``), both on the host, and the bridge ``ftn-cp`` holding the
host addresses: the control plane's ``10.243.0.1`` (API server, DNS) and each kubelet's ``10.243.0.1<i>``.

Everything the nodes change on the host is recorded before they start and put back when they stop: sysctls the
kubelet and kube-proxy set, iptables rules and chains (IPv4 and IPv6), links, mounts, cgroups, and the paths under
/var/lib and /var/log a kubelet writes whatever its root dir (``HostSnapshot``). One set of real nodes per machine
at a time (fixed addresses and bridge names): ``start`` refuses while the bridge ``ftn-cp`` exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hack.localcluster.cluster import (
    BIN_DIR,
    HOST_ADDRESS,
    SERVICE_CIDR,
    ClusterError,
    LocalCluster,
    _alive,
    _issue_cert,
    cmdline,
    free_port,
    runs_with,
    write_kubeconfig,
)

HERE = Path(__file__).resolve().parent
CNI_BIN = Path("/usr/lib/cni")
CP_BRIDGE = "ftn-cp"
POD_CIDR = "10.244.0.0/16"
DNS_IP = HOST_ADDRESS
CLUSTER_DOMAIN = "cluster.local"
RUN_DIR = Path("/run/finetune-nodes")  # containerd state and sockets (short paths: unix sockets have a length limit)
KUBELET_DIR = Path("/var/lib/finetune-nodes")  # kubelet root dirs: on disk (emptyDirs), short (its sockets)
# The state directory of the real nodes this machine runs, written before start changes the host and removed by stop.
# On tmpfs: a reboot forgets it together with the links, mounts and firewall it stands for.
OWNER = Path("/run/finetune-nodes.owner")
# The sysctls a kubelet or kube-proxy sets on the host, and the one the nodes need (forwarding between bridges).
SYSCTLS = (
    "net/ipv4/ip_forward",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/conf/all/route_localnet",
)
# Paths a kubelet writes outside its --root-dir.
HOST_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/etc/cni",
    "/opt/cni",
    "/run/netns",
    "/run/containerd",
    str(KUBELET_DIR),
)  # /run/netns: pod network namespaces (CRI)
CGROUP_ROOT = Path("/sys/fs/cgroup")


def node_name(i: int) -> str:
    return f"ftn-node-{i}"


def node_ip(i: int) -> str:
    return f"10.243.0.{10 + i}"


def bridge(i: int) -> str:
    return f"ftn{i}"


def pod_subnet(i: int) -> str:
    return f"10.244.{i}.0/24"


def _run(*argv: str, check: bool = True, input: str | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, input=input)
    if check and proc.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


# -- the host, before and after ---------------------------------------------------------------------------------


BUILTIN_CHAINS = {"INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"}


def _iptables_rules(tool: str) -> list[str]:
    """Every table's chains and rules as ``-save`` prints them, counters zeroed (valid ``-restore`` input, and equal
    for equal firewalls). A table holding nothing but empty built-in chains that accept is left out: it filters
    nothing, and listing a table can create it."""
    if not shutil.which(tool):
        return []
    out = subprocess.run([tool], capture_output=True, text=True).stdout
    tables: list[list[str]] = []
    for line in out.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("*"):
            tables.append([line])
        elif tables:
            tables[-1].append(line.rsplit(" [", 1)[0] + " [0:0]" if line.startswith(":") else line)
    kept: list[str] = []
    for table in tables:
        chains = [line[1:].split() for line in table if line.startswith(":")]
        trivial = not any(line.startswith("-") for line in table) and all(
            c[0] in BUILTIN_CHAINS and c[1] == "ACCEPT" for c in chains
        )
        if not trivial:
            kept += table
    return kept


def _restore_iptables(tool: str, rules: list[str]) -> None:
    """Put every table back as ``rules`` had it; a table ``rules`` does not hold is emptied."""
    if not shutil.which(tool):
        return
    before = {line for line in rules if line.startswith("*")}
    for line in _iptables_rules(f"{tool}-save"):
        if line.startswith("*") and line not in before:
            table = line[1:]
            _run(tool, "-t", table, "-F", check=False)
            _run(tool, "-t", table, "-X", check=False)
            for chain in BUILTIN_CHAINS:
                _run(tool, "-t", table, "-P", chain, "ACCEPT", check=False)
    if rules:
        _run(f"{tool}-restore", input="\n".join(rules) + "\n", check=False)


def _mounts() -> list[str]:
    return sorted(line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())


def _cgroups() -> list[str]:
    found = []
    for hierarchy in sorted(CGROUP_ROOT.iterdir()):
        if hierarchy.is_dir():
            found += [str(d) for d in sorted(hierarchy.glob("ftn-*"))]
            found += [str(d) for d in sorted(hierarchy.glob("kubepods*"))]
    return found


@dataclass
class HostSnapshot:
    """What real nodes may change on the host: taken before they start; ``stop`` puts it back, a test compares."""

    sysctls: dict[str, str]
    iptables: list[str]
    ip6tables: list[str]
    links: list[str]
    mounts: list[str]
    cgroups: list[str]
    paths: dict[str, bool]
    processes: list[str]  # kubelets, containerds, shims, kube-proxy, CoreDNS of real nodes still running

    @classmethod
    def take(cls) -> HostSnapshot:
        sysctls = {}
        for key in SYSCTLS:
            with contextlib.suppress(OSError):
                sysctls[key] = (Path("/proc/sys") / key).read_text().strip()
        links = sorted(json_link["ifname"] for json_link in json.loads(_run("ip", "-j", "link", "show")))
        return cls(
            sysctls=sysctls,
            iptables=_iptables_rules("iptables-save"),
            ip6tables=_iptables_rules("ip6tables-save"),
            links=links,
            mounts=_mounts(),
            cgroups=_cgroups(),
            paths={p: os.path.lexists(p) for p in HOST_PATHS},
            processes=_node_processes(),
        )

    def differences(self, other: HostSnapshot) -> list[str]:
        """What differs between this snapshot and ``other``, one line each (empty: the same host)."""
        diffs = []
        mine, theirs = asdict(self), asdict(other)
        for key in mine:
            a, b = mine[key], theirs[key]
            if a == b:
                continue
            if isinstance(a, dict):
                diffs += [
                    f"{key} {k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
                ]
            else:
                diffs += [f"{key} +{x}" for x in b if x not in a] + [f"{key} -{x}" for x in a if x not in b]
        return diffs

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> HostSnapshot:
        return cls(**json.loads(path.read_text()))

    def restore(self) -> None:
        """Put back the sysctls and the firewall as they were, and remove paths that did not exist."""
        for key, value in self.sysctls.items():
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / key).write_text(value + "\n")
        _restore_iptables("iptables", self.iptables)
        _restore_iptables("ip6tables", self.ip6tables)
        for path, existed in self.paths.items():
            if not existed and os.path.lexists(path):
                shutil.rmtree(path, ignore_errors=True)


# -- processes ----------------------------------------------------------------------------------------------------


@dataclass
class NodesState:
    dir: str
    count: int
    pids: dict[str, int] = field(default_factory=dict)
    kubelet_ports: dict[str, int] = field(default_factory=dict)

    def save(self) -> None:
        (Path(self.dir) / "nodes.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, d: Path) -> NodesState | None:
        f = d / "nodes.json"
        return cls(**json.loads(f.read_text())) if f.exists() else None


def _kill_tree(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _stop_pid(pid: int, timeout: float) -> None:
    _kill_tree(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    if _alive(pid):
        _kill_tree(pid, signal.SIGKILL)
        while _alive(pid):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.05)


class NodeCluster:
    """A control plane (``LocalCluster(nodes=True)``) and ``count`` real nodes starting from ``image_store`` (the
    node store of ``hack/images/node-store.sh``), all under ``state_dir``."""

    def __init__(
        self,
        state_dir: Path,
        *,
        count: int = 2,
        image_store: Path | None = None,
        extra_controllers: tuple[str, ...] = (),
    ) -> None:
        self.count = count
        self.image_store = image_store
        self.cluster = LocalCluster(Path(state_dir) / "control-plane", nodes=True, extra_controllers=extra_controllers)
        self.dir = Path(state_dir) / "nodes"
        self.state: NodesState | None = NodesState.load(self.dir) if self.dir.exists() else None

    # -- paths --------------------------------------------------------------------------------------------------

    def node_dir(self, i: int) -> Path:
        return self.dir / node_name(i)

    def socket(self, i: int) -> Path:
        return RUN_DIR / node_name(i) / "containerd.sock"

    def log(self, component: str) -> Path:
        return self.dir / "logs" / f"{component}.log"

    @property
    def kubeconfig(self) -> str:
        return self.cluster.kubeconfig

    # -- host preparation -------------------------------------------------------------------------------------

    @staticmethod
    def bridges_up(count: int) -> None:
        """The host bridge of the control-plane and kubelet addresses, and one (empty) bridge per node for CNI.
        Needed before the API server starts, as it listens on ``HOST_ADDRESS``."""
        existing = {link["ifname"] for link in json.loads(_run("ip", "-j", "link", "show"))}
        if CP_BRIDGE not in existing:
            _run("ip", "link", "add", CP_BRIDGE, "type", "bridge")
            for addr in (HOST_ADDRESS, *(node_ip(i) for i in range(count))):
                _run("ip", "addr", "add", f"{addr}/32", "dev", CP_BRIDGE)
            _run("ip", "link", "set", CP_BRIDGE, "up")
        for i in range(count):
            if bridge(i) not in existing:
                _run("ip", "link", "add", bridge(i), "type", "bridge")
                _run("ip", "addr", "add", f"{pod_subnet(i).replace('.0/24', '.1/24')}", "dev", bridge(i))
                _run("ip", "link", "set", bridge(i), "up")

    @staticmethod
    def bridges_down() -> None:
        for link in json.loads(_run("ip", "-j", "link", "show")):
            name = link["ifname"]
            if name == CP_BRIDGE or (name.startswith("ftn") and name[3:].isdigit()):
                _run("ip", "link", "del", name, check=False)

    def _cgroup_roots(self) -> None:
        for i in range(self.count):
            for hierarchy in CGROUP_ROOT.iterdir():
                if not (hierarchy / "cgroup.procs").exists():
                    continue
                d = hierarchy / node_name(i)
                d.mkdir(exist_ok=True)
                for f in ("cpuset.cpus", "cpuset.mems"):  # cgroup v1 cpuset children start empty
                    if (d / f).exists() and not (d / f).read_text().strip():
                        (d / f).write_text((hierarchy / f).read_text())

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> NodesState:
        _clear_a_killed_run()
        t0 = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        OWNER.write_text(str(self.dir) + "\n")
        (self.dir / "logs").mkdir(exist_ok=True)
        snapshot = self.dir / "host-before.json"
        if not snapshot.exists():
            HostSnapshot.take().save(snapshot)
        st = NodesState(dir=str(self.dir), count=self.count)
        self.state = st
        st.save()
        try:
            (Path("/proc/sys/net/ipv4/ip_forward")).write_text("1\n")
            self.bridges_up(self.count)  # before the API server, which listens on HOST_ADDRESS
            self.cluster.start()
            self._cgroup_roots()
            pki = self.cluster.state_dir / "pki"
            for i in range(self.count):
                self._start_containerd(i)
            for i in range(self.count):
                self._start_kubelet(i, pki)
            self._start_kube_proxy(pki)
            self._start_coredns()
            self._wait_ready(t0, timeout)
            self._storage()
        except BaseException:
            self.stop()
            raise
        return st

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        assert self.state
        log = open(self.log(name), "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        log.close()
        self.state.pids[name] = proc.pid
        self.state.save()

    def _start_containerd(self, i: int) -> None:
        name, d = node_name(i), self.node_dir(i)
        root = d / "containerd"
        d.mkdir(parents=True, exist_ok=True)
        if not root.exists():
            if self.image_store and (self.image_store / "root").exists():
                clone_store(self.image_store / "root", root)
            else:
                root.mkdir(parents=True)
        run = RUN_DIR / name
        run.mkdir(parents=True, exist_ok=True)
        cni = d / "cni"
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        (cni / "net.d" / "10-finetune.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": f"finetune-{name}",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": bridge(i),
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": pod_subnet(i)}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(cni / "ipam"),
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                },
                indent=1,
            )
        )
        pause = (self.image_store / "pause-image").read_text().strip() if self.image_store else "registry.k8s.io/pause"
        (d / "containerd.toml").write_text(f'''version = 2
root = "{root}"
state = "{run}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{self.socket(i)}"
[ttrpc]
  address = "{run}/containerd.sock.ttrpc"
[debug]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = false
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{run}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni / "net.d"}"
''')
        with contextlib.suppress(FileNotFoundError):  # a socket left by a killed containerd (a lost node)
            self.socket(i).unlink()
        self._spawn(f"containerd-{name}", ["containerd", "--config", str(d / "containerd.toml")])
        deadline = time.monotonic() + 30
        while not self.socket(i).exists():
            self._check(f"containerd-{name}")
            if time.monotonic() > deadline:
                log = self.log(f"containerd-{name}")
                raise ClusterError(f"containerd of {name} did not open its socket; see {log}")
            time.sleep(0.1)

    def _start_kubelet(self, i: int, pki: Path) -> None:
        assert self.state
        name, d = node_name(i), self.node_dir(i)
        kd = KUBELET_DIR / name
        kd.mkdir(parents=True, exist_ok=True)
        if not (pki / f"{name}.crt").exists():
            _issue_cert(pki, name, f"/O=system:nodes/CN=system:node:{name}", client=True)
            _issue_cert(pki, f"{name}-serving", f"/CN={name}", sans=f"IP:{node_ip(i)},DNS:{name}", client=False)
        write_kubeconfig(
            d / "kubelet.kubeconfig", server=self.cluster.state.server if self.cluster.state else "", pki=pki, user=name
        )
        port, healthz = free_port(), free_port()
        self.state.kubelet_ports[name] = port
        (d / "resolv.conf").write_text("")  # pods get the cluster DNS only: this network has no upstream resolver
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{name}",
            "cgroupsPerQOS": True,
            "address": node_ip(i),
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz,
            "tlsCertFile": str(pki / f"{name}-serving.crt"),
            "tlsPrivateKeyFile": str(pki / f"{name}-serving.key"),
            "authentication": {
                "x509": {"clientCAFile": str(pki / "ca.crt")},
                "webhook": {"enabled": False},
                "anonymous": {"enabled": False},
            },
            "authorization": {"mode": "AlwaysAllow"},  # only clients with a certificate of the cluster's CA get in
            "clusterDomain": CLUSTER_DOMAIN,
            "clusterDNS": [DNS_IP],
            "resolvConf": str(d / "resolv.conf"),
            "containerRuntimeEndpoint": f"unix://{self.socket(i)}",
            "podLogsDir": str(d / "pod-logs"),
            "failSwapOn": False,
            "maxOpenFiles": 20000,
            "protectKernelDefaults": False,
            # The images come from the store, never a registry: never collect them; no disk-pressure eviction on a
            # shared development disk (memory pressure still evicts).
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "serializeImagePulls": False,
            "shutdownGracePeriod": "0s",
            "staticPodPath": "",
        }
        (d / "kubelet.yaml").write_text(json.dumps(config, indent=1))
        self._spawn(
            f"kubelet-{name}",
            [
                str(BIN_DIR / "kubelet"),
                f"--config={d / 'kubelet.yaml'}",
                f"--kubeconfig={d / 'kubelet.kubeconfig'}",
                f"--hostname-override={name}",
                f"--node-ip={node_ip(i)}",
                f"--root-dir={kd}",
                f"--cert-dir={kd / 'pki'}",
                f"--node-labels=finetune.dev/local-node={i}",
                "--v=1",
            ],
        )

    def _start_kube_proxy(self, pki: Path) -> None:
        d = self.dir
        if not (pki / "kube-proxy.crt").exists():
            _issue_cert(pki, "kube-proxy", "/CN=system:kube-proxy", client=True)  # bound to system:node-proxier
        server = self.cluster.state.server if self.cluster.state else ""
        write_kubeconfig(d / "kube-proxy.kubeconfig", server=server, pki=pki, user="kube-proxy")
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(d / "kube-proxy.kubeconfig")},
            "hostnameOverride": node_name(0),
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            # Every node's pods share this host: masquerade, so a Service's reply always comes back through it.
            "iptables": {"masqueradeAll": True},
            # Leave the host's conntrack settings alone (this sandbox may not allow changing them).
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "nodePortAddresses": [f"{node_ip(0)}/32"],
            "bindAddress": "127.0.0.1",
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
        }
        (d / "kube-proxy.yaml").write_text(json.dumps(config, indent=1))
        self._spawn("kube-proxy", [str(BIN_DIR / "kube-proxy"), f"--config={d / 'kube-proxy.yaml'}", "--v=1"])

    def _start_coredns(self) -> None:
        corefile = self.dir / "Corefile"
        corefile.write_text(f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {DNS_IP}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {self.cluster.kubeconfig} finetune-local
        pods insecure
        ttl 5
    }}
    cache 5
}}
.:53 {{
    bind {DNS_IP}
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
""")
        self._spawn("coredns", [str(BIN_DIR / "coredns"), "-conf", str(corefile)])

    def _check(self, component: str | None = None) -> None:
        assert self.state
        for name, pid in self.state.pids.items():
            if (component is None or name == component) and not _alive(pid):
                tail = "\n".join(self.log(name).read_text(errors="replace").splitlines()[-30:])
                raise ClusterError(f"{name} (pid {pid}) is not running; last lines of {self.log(name)}:\n{tail}")

    def check(self) -> None:
        """Raise ClusterError, with the component's log, when a node component has died."""
        self._check()

    def _kubectl(self, *args: str, input: str | None = None) -> str:
        return _run(str(BIN_DIR / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args, input=input)

    def _wait_ready(self, t0: float, timeout: float, *, untainted: bool = False) -> None:
        """Every node Ready (and, with ``untainted``, without the node lifecycle controller's taints)."""
        want = {node_name(i) for i in range(self.count)}
        while True:
            self._check()
            nodes = json.loads(self._kubectl("get", "nodes", "-o", "json"))["items"]
            ready = {
                n["metadata"]["name"]
                for n in nodes
                if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
                and not (
                    untainted and any(t["key"].startswith("node.kubernetes.io/") for t in n["spec"].get("taints") or [])
                )
            }
            if want <= ready:
                return
            if time.monotonic() - t0 > timeout:
                raise ClusterError(
                    f"nodes not Ready{' and untainted' if untainted else ''} after {timeout:.0f}s: "
                    f"{sorted(want - ready)}; see {self.dir}/logs"
                )
            time.sleep(0.5)

    def _storage(self) -> None:
        """The default StorageClass ``standard`` and local volumes on each node's disk."""
        docs = [
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {
                    "name": "standard",
                    "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
                },
                "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Delete",
            }
        ]
        for i in range(self.count):
            for k in range(VOLUMES_PER_NODE):
                path = self.node_dir(i) / "volumes" / f"pv-{k}"
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(0o777)  # any pod's non-root user may write (local volumes get no fsGroup chown)
                docs.append(
                    {
                        "apiVersion": "v1",
                        "kind": "PersistentVolume",
                        "metadata": {"name": f"{node_name(i)}-pv-{k}", "labels": {"finetune.dev/local-node": str(i)}},
                        "spec": {
                            "capacity": {"storage": "20Gi"},
                            "accessModes": ["ReadWriteOnce"],
                            "persistentVolumeReclaimPolicy": "Retain",
                            "storageClassName": "standard",
                            "local": {"path": str(path)},
                            "nodeAffinity": {
                                "required": {
                                    "nodeSelectorTerms": [
                                        {
                                            "matchExpressions": [
                                                {
                                                    "key": "kubernetes.io/hostname",
                                                    "operator": "In",
                                                    "values": [node_name(i)],
                                                }
                                            ]
                                        }
                                    ]
                                }
                            },
                        },
                    }
                )
        self._kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))

    def shared_claim(self, namespace: str, name: str, host_dir: Path, *, read_only: bool = False) -> None:
        """A claim every node can mount at once (ReadWriteMany, or ReadOnlyMany): a ``hostPath`` volume bound to it
        in advance, standing in for the NFS or CSI file share of a cluster (all nodes here are this machine).
        ``host_dir`` is made writable for the pods' non-root users (hostPath volumes get no fsGroup)."""
        host_dir.mkdir(parents=True, exist_ok=True)
        for d in (host_dir, *(p for p in host_dir.rglob("*") if p.is_dir())):
            d.chmod(0o777)
        mode = "ReadOnlyMany" if read_only else "ReadWriteMany"
        pv = f"{namespace}-{name}"[:63]
        self._kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "List",
                    "items": [
                        {
                            "apiVersion": "v1",
                            "kind": "PersistentVolume",
                            "metadata": {"name": pv},
                            "spec": {
                                "capacity": {"storage": "10Gi"},
                                "accessModes": [mode],
                                "storageClassName": "",
                                "persistentVolumeReclaimPolicy": "Retain",
                                "hostPath": {"path": str(host_dir), "type": "Directory"},
                                "claimRef": {"namespace": namespace, "name": name},
                            },
                        },
                        {
                            "apiVersion": "v1",
                            "kind": "PersistentVolumeClaim",
                            "metadata": {"name": name, "namespace": namespace},
                            "spec": {
                                "accessModes": [mode],
                                "storageClassName": "",
                                "volumeName": pv,
                                "resources": {"requests": {"storage": "10Gi"}},
                            },
                        },
                    ],
                }
            ),
        )

    @contextlib.contextmanager
    def partition(self, a: int, b: int) -> Iterator[None]:
        """Cut the network between the pods of node ``a`` and node ``b`` (both directions; a firewall rule on the
        host, which routes between the node bridges), as a broken switch would; healed on exit."""
        rules = [
            [
                "FORWARD",
                "-s",
                pod_subnet(x),
                "-d",
                pod_subnet(y),
                "-j",
                "DROP",
                "-m",
                "comment",
                "--comment",
                "finetune partition",
            ]
            for x, y in ((a, b), (b, a))
        ]
        for rule in rules:
            _run("iptables", "-I", *rule)
        try:
            yield
        finally:
            for rule in rules:
                _run("iptables", "-D", *rule, check=False)

    def lose(self, i: int) -> None:
        """Node ``i`` fails as a machine does when its power goes: its pod network is cut off first (so its dying
        processes send no FIN or RST to the pods they talked to), then its kubelet, its containerd, the containerd
        shims and every process of its pods are SIGKILLed at once. The Node object stays, its pods stay bound to it
        and say Running: nothing will report on them again until ``rejoin``. The node lifecycle controller turns the
        node Unknown after ``--node-monitor-grace-period`` (50 s) and taints it unreachable."""
        assert self.state
        name = node_name(i)
        for rule in self._lost_rules(i):
            _run("iptables", "-I", *rule)
        for component in (f"kubelet-{name}", f"containerd-{name}"):
            pid = self.state.pids.pop(component)
            _kill_tree(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.state.save()
        _kill_shims(RUN_DIR / name)
        for hierarchy in CGROUP_ROOT.iterdir():  # every process of the node's pods (they outlive their shims)
            node_cgroup = hierarchy / name
            if not (node_cgroup / "cgroup.procs").exists():
                continue
            for procs in node_cgroup.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    for pid in procs.read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)

    def rejoin(self, i: int, timeout: float = 120.0) -> None:
        """Node ``i``, lost, boots again: its network comes back, its containerd restarts on the same root (the
        images are still there) and its kubelet re-registers, cleans up the containers of pods that no longer exist
        and reports Ready."""
        for rule in self._lost_rules(i):
            _run("iptables", "-D", *rule, check=False)
        self._start_containerd(i)
        self._start_kubelet(i, self.cluster.state_dir / "pki")
        self._wait_ready(time.monotonic(), timeout, untainted=True)

    @staticmethod
    def _lost_rules(i: int) -> list[list[str]]:
        return [
            ["FORWARD", flag, pod_subnet(i), "-j", "DROP", "-m", "comment", "--comment", "finetune node lost"]
            for flag in ("-s", "-d")
        ]

    def stop(self) -> None:
        """Stop every node component, remove what they left (containers, mounts, network namespaces, cgroups, links,
        state), stop the control plane and put the host back as the snapshot taken before start found it."""
        st = self.state or NodesState.load(self.dir)
        if st is None:  # nothing of this directory's runs (a start that refused, or a second stop): touch nothing
            self.cluster.stop()
            return
        count = st.count
        pids = {name: pid for name, pid in st.pids.items() if runs_with(pid, *NODE_MARKS)}
        for name in ["coredns", "kube-proxy", *[f"kubelet-{node_name(i)}" for i in range(count)]]:
            if name in pids:
                _stop_pid(pids[name], 15)
        for i in range(count):
            self._remove_containers(i)
            if f"containerd-{node_name(i)}" in pids:
                _stop_pid(pids[f"containerd-{node_name(i)}"], 15)
        self.cluster.stop()
        _clear_host(self.dir)
        self.state = None

    def _remove_containers(self, i: int) -> None:
        """Stop the node's pods' containers (their shims outlive containerd otherwise)."""
        sock = self.socket(i)
        if not sock.exists():
            return
        ctr = ["ctr", "--address", str(sock), "-n", "k8s.io"]
        tasks = subprocess.run([*ctr, "tasks", "ls", "-q"], capture_output=True, text=True).stdout.split()
        for task in tasks:
            subprocess.run([*ctr, "tasks", "kill", "-s", "SIGKILL", task], capture_output=True)
        for task in tasks:
            subprocess.run([*ctr, "tasks", "delete", "-f", task], capture_output=True)
        containers = subprocess.run([*ctr, "containers", "ls", "-q"], capture_output=True, text=True).stdout.split()
        for c in containers:
            subprocess.run([*ctr, "containers", "delete", c], capture_output=True)


VOLUMES_PER_NODE = 6


def _wait_veths_gone(before: set[str], timeout: float = 120.0) -> None:
    """Wait until the pods' veth ends are gone from the host. The kernel frees a deleted pod network namespace, and
    with it the host end of its veth, only once the last socket in it is closed: the orphaned TCP connections of
    processes killed behind a cut network (a lost node) retransmit their FIN for up to a couple of minutes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        links = {link["ifname"] for link in json.loads(_run("ip", "-j", "link", "show"))}
        if not {name for name in links - before if name.startswith("veth")}:
            return
        time.sleep(1)


def _rmdir_cgroup(d: Path) -> None:
    if not d.is_dir():
        return
    for child in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            child.rmdir()
    with contextlib.suppress(OSError):
        d.rmdir()


def _unmount_below(*roots: Path) -> None:
    prefixes = tuple(str(r) + "/" for r in roots)
    for _ in range(3):
        targets = [m for m in _mounts() if m.startswith(prefixes) or m in {str(r) for r in roots}]
        if not targets:
            return
        for m in sorted(targets, key=len, reverse=True):  # the deepest first
            subprocess.run(["umount", "-l", m], capture_output=True)


def _read_or_empty(path: Path) -> str:
    """A cgroup file's text, or "" when its cgroup went away between listing and reading (its last process ended)."""
    try:
        return path.read_text()
    except OSError:  # FileNotFoundError, or ENODEV from a cgroup being removed
        return ""


def _kill_node_cgroups(timeout: float = 10.0) -> None:
    """SIGKILL what is left in the nodes' cgroups: a pod's processes outlive a shim killed before it stopped them.
    Membership of a node's cgroup is what makes them the nodes' (no pid is taken on trust)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = {
            int(pid)
            for hierarchy in CGROUP_ROOT.iterdir()
            if hierarchy.is_dir()
            for procs in hierarchy.glob("ftn-node-*/**/cgroup.procs")
            for pid in _read_or_empty(procs).split()
        }
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _clear_host(nodes_dir: Path | None) -> None:
    """Remove what real nodes leave on the host once their processes are gone: shims, mounts, pod network
    namespaces, the firewall chains of kube-proxy, links, cgroups, the run and kubelet directories; then put the
    sysctls and the firewall back as ``nodes_dir``'s snapshot (taken before start) found them. ``nodes_dir`` None
    (no snapshot to go by): every pod network namespace and node cgroup goes, and the sysctls stay as they are."""
    snapshot = nodes_dir / "host-before.json" if nodes_dir else None
    before = HostSnapshot.load(snapshot) if snapshot and snapshot.exists() else None
    _kill_shims()
    _kill_node_cgroups()
    _unmount_below(*([nodes_dir] if nodes_dir else []), RUN_DIR, KUBELET_DIR)
    netns = Path("/run/netns")
    for ns in netns.glob("cni-*") if netns.exists() else []:  # containerd's; the snapshot's own stay
        if before is None or str(ns) not in before.mounts:
            subprocess.run(["ip", "netns", "del", ns.name], capture_output=True)
    kube_proxy = BIN_DIR / "kube-proxy"
    if kube_proxy.exists():
        subprocess.run([str(kube_proxy), "--cleanup"], capture_output=True)
    NodeCluster.bridges_down()
    for hierarchy in CGROUP_ROOT.iterdir():
        for d in sorted(hierarchy.glob("ftn-node-*")) if hierarchy.is_dir() else []:
            _rmdir_cgroup(d)
    if before is not None and snapshot is not None:
        _wait_veths_gone(set(before.links))
        before.restore()
        snapshot.unlink()
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    shutil.rmtree(KUBELET_DIR, ignore_errors=True)
    if nodes_dir:
        for d in nodes_dir.glob("ftn-node-*"):
            shutil.rmtree(d, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (nodes_dir / "nodes.json").unlink()
    if OWNER.exists() and (nodes_dir is None or OWNER.read_text().strip() == str(nodes_dir)):
        OWNER.unlink()


def _clear_a_killed_run() -> None:
    """Before real nodes start: refuse while another set runs here, and clear what a run killed before its stop
    (SIGKILL, a lost session) left on the host: its bridges, mounts and firewall chains would otherwise stop every
    later start. Nothing of the earlier run is killed by a recorded pid (a pid may belong to another process by
    now): a run with a node process still alive is a running one."""
    links = {link["ifname"] for link in json.loads(_run("ip", "-j", "link", "show"))}
    if CP_BRIDGE not in links and not OWNER.exists() and not RUN_DIR.exists():
        return
    owner = Path(OWNER.read_text().strip()) if OWNER.exists() else None
    alive = [cmd for cmd in _node_processes() if "containerd-shim" not in cmd]
    if alive:
        where = f" --dir {owner.parent}" if owner else " --dir DIR"
        raise ClusterError(
            f"real nodes already run on this machine ({alive[0][:80]}…); stop them with "
            f"`python -m hack.localcluster down{where}` (make cluster-down)"
        )
    print(
        f"# clearing what real nodes killed before their stop left on this host ({owner or 'no state directory'})",
        file=sys.stderr,
    )
    _clear_host(owner if owner and owner.is_dir() else None)


NODE_MARKS = (
    str(RUN_DIR),
    str(KUBELET_DIR),
    "--hostname-override=ftn-node-",
    "/nodes/ftn-node-",
    "/nodes/kube-proxy.yaml",
    "/nodes/Corefile",
)  # what the command line of every node component (and of nothing else) holds


def _node_processes() -> list[str]:
    """Command lines of processes that belong to real nodes (they name the nodes' run or kubelet directories)."""
    found = []
    for proc in Path("/proc").iterdir():
        cmd = cmdline(proc.name) if proc.name.isdigit() else None
        if cmd is not None and any(mark in cmd for mark in NODE_MARKS):
            found.append(cmd[:200])
    return sorted(found)


def _kill_shims(under: Path = RUN_DIR) -> None:
    """containerd-shim-runc-v2 processes of these nodes (found by their -address under ``under``: RUN_DIR, or one
    node's directory in it)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and any(f"{under}/".encode() in a for a in cmd):
            _kill_tree(int(proc.name), signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


def clone_store(template: Path, dest: Path) -> None:
    """A node's containerd root from the prepared store: hard links for the content blobs and the unpacked
    snapshots (read-only once committed; a container writes to an upper dir of its own), real copies of the
    databases containerd writes in place."""
    if subprocess.run(["cp", "-al", str(template), str(dest)], capture_output=True).returncode != 0:
        # hard links cannot cross filesystems (a state directory on a tmpfs /tmp): copy, sharing blocks where the
        # filesystem can
        shutil.rmtree(dest, ignore_errors=True)
        _run("cp", "-a", "--reflink=auto", str(template), str(dest))
    for db in dest.rglob("*.db"):
        tmp = db.with_suffix(".db.copy")
        shutil.copy2(db, tmp)
        tmp.replace(db)


def node_store() -> Path:
    """The node store of the images built from this checkout (``hack/images/build.sh``: built on first use)."""
    proc = subprocess.run(["bash", str(HERE.parent / "images" / "build.sh")], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"hack/images/build.sh failed ({proc.returncode}); its output is above")
    return Path(proc.stdout.strip().splitlines()[-1])


def image_names() -> dict[str, str]:
    """``operator`` and ``trainer``: the references of the images built from this checkout."""
    out = _run("bash", str(HERE.parent / "images" / "build.sh"), "--names")
    return {k: v for k, v in (line.split() for line in out.splitlines()) if k in ("operator", "trainer")}


def chart_image_values(images: dict[str, str]) -> list[str]:
    """helm --set flags that point the chart at the images built here (``image_names``): on the nodes, in no
    registry, so never pulled. The trainer image stands for the CUDA one and is the cpu runtime's too."""
    out = []
    for key, prefix in (("operator", "image"), ("trainer", "trainer.image"), ("trainer", "trainer.cpuImage")):
        repo, tag = images[key].rsplit(":", 1)
        out += ["--set", f"{prefix}.repository={repo}", "--set", f"{prefix}.tag={tag}"]
        if prefix != "trainer.cpuImage":  # trainer.image.pullPolicy is every trainer container's
            out += ["--set", f"{prefix}.pullPolicy=Never"]
    return out


def ensure_node_binaries() -> None:
    if not (BIN_DIR / "kubelet").exists() or not (BIN_DIR / "coredns").exists():
        subprocess.run(["bash", str(HERE / "build-node.sh")], check=True)


def nodes_main(command: str, state_dir: Path, count: int) -> int:
    """``python -m hack.localcluster up|down|status --nodes N``."""
    import sys

    nc = NodeCluster(state_dir, count=count)
    if command == "up":
        if nc.state:
            print(f"# real nodes already recorded in {state_dir}; `down` first", file=sys.stderr)
            return 1
        ensure_node_binaries()
        nc.image_store = node_store()
        t0 = time.monotonic()
        try:
            nc.start()
        except ClusterError as e:
            print(f"cluster-up failed: {e}", file=sys.stderr)
            return 1
        print(
            f"# control plane and {count} real nodes up in {time.monotonic() - t0:.1f}s; logs in "
            f"{nc.cluster.state_dir}/logs and {nc.dir}/logs",
            file=sys.stderr,
        )
        print(f"export KUBECONFIG={nc.kubeconfig}")
        return 0
    if command == "down":
        if nc.state:
            nc.count = nc.state.count
        nc.stop()
        shutil.rmtree(state_dir, ignore_errors=True)
        print(f"# control plane and nodes in {state_dir} stopped; host restored", file=sys.stderr)
        return 0
    try:
        nc.cluster.check()
        nc.check()
    except (ClusterError, AssertionError) as e:
        print(e, file=sys.stderr)
        return 1
    print(f"running: export KUBECONFIG={nc.kubeconfig}")
    return 0


__all__ = [
    "CP_BRIDGE",
    "DNS_IP",
    "SERVICE_CIDR",
    "HostSnapshot",
    "NodeCluster",
    "chart_image_values",
    "clone_store",
    "node_ip",
    "node_name",
]
