"""A local Kubernetes control plane of real binaries: etcd, kube-apiserver, kube-controller-manager.

The binaries are built from the Go module proxy by ``build.sh`` and cached outside the repository
(``~/.cache/finetune-operator/k8s-<version>/bin``). Everything a running cluster needs — certificates,
the service-account signing key, kubeconfigs, etcd's data and each component's log — lives in one
state directory (a temp dir by default), never in the repository.

What is real and what is not:
- kube-apiserver with RBAC authorization, the default admission chain (PodSecurity, ServiceAccount, …) plus
  OwnerReferencesPermissionEnforcement (as on OpenShift),
  TokenRequest (service-account tokens signed by a generated key), CRDs, CEL validation;
- kube-controller-manager with an explicit controller list: the garbage collector (owner-reference
  cleanup, foreground deletion), namespace deletion, service accounts (every namespace gets ``default``)
  and resource quotas. Node-lifecycle controllers are deliberately off: there is no kubelet heartbeat;
- kube-scheduler only when asked (``scheduler=True``);
- etcd with ``--unsafe-no-fsync``: for tests and benchmarks only, never for data you care about;
- no kubelet, no container runtime, no kube-proxy, no DNS: ``hack/localcluster/nodes.py`` adds real ones
  (``LocalCluster(nodes=True)`` binds the API server where pods reach it and turns on the Node authorizer).

Everything listens on 127.0.0.1, on ports picked free at start, so several clusters can coexist; a cluster with real
nodes serves the API on the host address of their network (``HOST_ADDRESS``), one such cluster per machine.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
K8S_VERSION = (HERE / "k8s-version").read_text().strip()
CACHE = Path(os.environ.get("FINETUNE_CACHE", Path.home() / ".cache" / "finetune-operator"))
BIN_DIR = CACHE / f"k8s-{K8S_VERSION}" / "bin"

# Controllers run by kube-controller-manager. Named explicitly: the node-lifecycle controllers would
# evict pods from a node without a kubelet heartbeat, and pod-garbage-collector deletes pods bound to
# nodes that do not exist.
CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "resourcequota-controller",
    "clusterrole-aggregation-controller",
    "disruption-controller",  # PodDisruptionBudget status, which the Eviction API checks
    "persistentvolumeclaim-protection-controller",  # removes kubernetes.io/pvc-protection once no pod uses a claim
    "persistentvolume-protection-controller",
)
# With real kubelets: the controllers that Services, Deployments, node loss and claims need.
NODE_CONTROLLERS = (
    "endpoints-controller",
    "endpointslice-controller",
    "pod-garbage-collector-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "persistentvolume-binder-controller",
    "root-ca-certificate-publisher-controller",  # kube-root-ca.crt, which every service-account token volume mounts
    "deployment-controller",  # the chart's operator Deployment
    "replicaset-controller",
)
SERVICE_CIDR = "10.96.0.0/16"
# Where the control plane answers pods on real nodes (an address on a host bridge of its own; see nodes.py).
HOST_ADDRESS = "10.243.0.1"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


class ClusterError(RuntimeError):
    """The control plane could not start, or one of its components died."""


PORT_TRIES = 3  # starts on newly picked ports when a component found its port taken


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def ensure_binaries() -> Path:
    """Build (or reuse) the control-plane binaries; returns their directory."""
    if not (BIN_DIR.parent / ".complete").exists():
        subprocess.run(["bash", str(HERE / "build.sh")], check=True)
    return BIN_DIR


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args)} failed:\n{proc.stderr}")


def _issue_cert(pki: Path, name: str, subject: str, *, sans: str | None = None, client: bool) -> None:
    """An EC key and a certificate signed by the local CA."""
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=pki)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=pki)
    usage = "clientAuth" if client else "serverAuth"
    ext = [f"extendedKeyUsage={usage}", "keyUsage=critical,digitalSignature,keyEncipherment"]
    if sans:
        ext.append(f"subjectAltName={sans}")
    (pki / f"{name}.ext").write_text("\n".join(ext) + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "30",
        "-sha256",
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.crt",
        cwd=pki,
    )


def generate_pki(pki: Path) -> None:
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=pki)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "ca.key",
        "-subj",
        "/CN=finetune-local-ca",
        "-days",
        "30",
        "-out",
        "ca.crt",
        cwd=pki,
    )
    _issue_cert(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        client=False,
        sans=f"IP:127.0.0.1,IP:10.96.0.1,IP:{HOST_ADDRESS},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local",
    )
    _issue_cert(pki, "admin", "/O=system:masters/CN=finetune-admin", client=True)
    _issue_cert(pki, "controller-manager", "/CN=system:kube-controller-manager", client=True)
    _issue_cert(pki, "scheduler", "/CN=system:kube-scheduler", client=True)
    # The API server's client certificate towards kubelets (logs, exec, port-forward), as kubeadm's.
    _issue_cert(pki, "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", client=True)
    # Service-account token signing key (TokenRequest); RSA, as every consumer supports it.
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=pki)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for p in pki.glob("*.key"):
        p.chmod(0o600)


def write_kubeconfig(path: Path, *, server: str, pki: Path, user: str) -> None:
    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "finetune-local", "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(f"{user}.crt"), "client-key-data": b64(f"{user}.key")},
            }
        ],
        "contexts": [{"name": "finetune-local", "context": {"cluster": "finetune-local", "user": user}}],
        "current-context": "finetune-local",
    }
    path.write_text(json.dumps(cfg, indent=2))
    path.chmod(0o600)


@dataclass
class State:
    """What ``up`` records so that ``down``/``status`` in another process can find the cluster."""

    dir: str
    version: str
    api_port: int
    etcd_port: int
    etcd_peer_port: int
    kcm_port: int
    scheduler_port: int = 0
    address: str = "127.0.0.1"  # where kube-apiserver listens
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> str:
        return str(Path(self.dir) / "admin.kubeconfig")

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.api_port}"

    def save(self) -> None:
        (Path(self.dir) / "state.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, state_dir: Path) -> State | None:
        f = state_dir / "state.json"
        if not f.exists():
            return None
        return cls(**json.loads(f.read_text()))


def stop_group(proc: subprocess.Popen[bytes] | None, timeout: float = 15.0) -> None:
    """Stop a process started in a session of its own (``start_new_session``) and everything it started: SIGTERM to
    its group, SIGKILL after ``timeout`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def cmdline(pid: int | str) -> str | None:
    """The command line of process ``pid``, its arguments joined by spaces; None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def runs_with(pid: int, *marks: str) -> bool:
    """Whether ``pid`` is a live process whose command line holds one of ``marks`` (its state directory, say): the pid
    recorded for a component of a run killed long ago may belong to another process by now, never to be signalled."""
    cmd = cmdline(pid)
    return cmd is not None and _alive(pid) and any(mark in cmd for mark in marks)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0): look at /proc.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def log_tail(state_dir: Path, component: str, lines: int = 40) -> str:
    f = state_dir / "logs" / f"{component}.log"
    if not f.exists():
        return "(no log)"
    return "\n".join(f.read_text(errors="replace").splitlines()[-lines:])


class LocalCluster:
    """Start, check and stop one local control plane whose state lives in ``state_dir``."""

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        scheduler: bool = False,
        extra_controllers: tuple[str, ...] = (),
        nodes: bool = False,
    ) -> None:
        self.state_dir = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="finetune-cluster-"))
        self.nodes = nodes  # real kubelets will join: serve them (and their pods) on HOST_ADDRESS
        self.scheduler = scheduler or nodes
        node_controllers = NODE_CONTROLLERS if nodes else ()
        # extra: e.g. the pod GC, where every pod's node exists
        self.controllers = tuple(dict.fromkeys((*CONTROLLERS, *node_controllers, *extra_controllers)))
        self.state: State | None = State.load(self.state_dir)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._argv: dict[str, list[str]] = {}  # each component's command line, for restart()

    # -- queries ------------------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> str:
        assert self.state, "cluster not started"
        return self.state.kubeconfig

    def running(self) -> bool:
        return bool(self.state and self.state.pids and all(_alive(p) for p in self.state.pids.values()))

    def check(self) -> None:
        """Raise ClusterError, with the component's log, when any component has died."""
        if not self.state:
            raise ClusterError(f"no cluster recorded in {self.state_dir}")
        for name, pid in self.state.pids.items():
            if not _alive(pid):
                proc = self._procs.get(name)
                code = proc.poll() if proc else None
                raise ClusterError(
                    f"{name} (pid {pid}) is not running"
                    + (f", exit code {code}" if code is not None else "")
                    + f"; last lines of {self.state_dir}/logs/{name}.log:\n{log_tail(self.state_dir, name)}"
                )

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> State:
        if self.running():
            assert self.state
            return self.state
        for tries_left in reversed(range(PORT_TRIES)):
            try:
                return self._start(timeout)
            except ClusterError as e:
                # A port picked free (free_port) can be taken by another process before the component binds it: the
                # component exits at once saying so, and a start on newly picked ports succeeds.
                if not tries_left or "address already in use" not in str(e):
                    raise
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> State:
        bins = ensure_binaries()
        t0 = time.monotonic()
        d = self.state_dir
        for sub in ("pki", "logs", "etcd"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        pki = d / "pki"
        if not (pki / "sa.pub").exists():
            generate_pki(pki)
        st = State(
            dir=str(d),
            version=K8S_VERSION,
            api_port=free_port(),
            etcd_port=free_port(),
            etcd_peer_port=free_port(),
            kcm_port=free_port(),
            scheduler_port=free_port() if self.scheduler else 0,
            address=HOST_ADDRESS if self.nodes else "127.0.0.1",
        )
        self.state = st
        write_kubeconfig(d / "admin.kubeconfig", server=st.server, pki=pki, user="admin")
        write_kubeconfig(d / "controller-manager.kubeconfig", server=st.server, pki=pki, user="controller-manager")
        write_kubeconfig(d / "scheduler.kubeconfig", server=st.server, pki=pki, user="scheduler")
        try:
            self._spawn(
                "etcd",
                [
                    str(bins / "etcd"),
                    "--name=local",
                    f"--data-dir={d / 'etcd'}",
                    f"--listen-client-urls=http://127.0.0.1:{st.etcd_port}",
                    f"--advertise-client-urls=http://127.0.0.1:{st.etcd_port}",
                    f"--listen-peer-urls=http://127.0.0.1:{st.etcd_peer_port}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{st.etcd_peer_port}",
                    f"--initial-cluster=local=http://127.0.0.1:{st.etcd_peer_port}",
                    "--unsafe-no-fsync",  # tests and benchmarks only
                    "--log-level=warn",
                ],
            )
            self._wait(lambda: self._http_ok(f"http://127.0.0.1:{st.etcd_port}/health"), "etcd", t0, timeout)
            self._spawn(
                "kube-apiserver",
                [
                    str(bins / "kube-apiserver"),
                    f"--etcd-servers=http://127.0.0.1:{st.etcd_port}",
                    f"--bind-address={st.address}",
                    f"--advertise-address={st.address}",
                    f"--secure-port={st.api_port}",
                    f"--tls-cert-file={pki / 'apiserver.crt'}",
                    f"--tls-private-key-file={pki / 'apiserver.key'}",
                    f"--client-ca-file={pki / 'ca.crt'}",
                    # Real kubelets: each may read and write only what its own pods need, as on any cluster.
                    "--authorization-mode=Node,RBAC" if self.nodes else "--authorization-mode=RBAC",
                    # as OpenShift: blockOwnerDeletion needs update on the owner's finalizers (the chart grants it)
                    "--enable-admission-plugins=OwnerReferencesPermissionEnforcement"
                    + (",NodeRestriction" if self.nodes else ""),
                    f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                    f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                    *([f"--kubelet-certificate-authority={pki / 'ca.crt'}"] if self.nodes else []),
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    f"--service-account-key-file={pki / 'sa.pub'}",
                    f"--service-account-signing-key-file={pki / 'sa.key'}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    # as kubeadm: reach a node's kubelet (the node agent's, for `kubectl logs`) at its InternalIP
                    "--kubelet-preferred-address-types=InternalIP,Hostname",
                    "--allow-privileged=false",
                    "--profiling=false",
                    "--v=1",
                ],
            )
            self._wait(self._api_ready, "kube-apiserver", t0, timeout)
            self._spawn(
                "kube-controller-manager",
                [
                    str(bins / "kube-controller-manager"),
                    f"--kubeconfig={d / 'controller-manager.kubeconfig'}",
                    f"--authentication-kubeconfig={d / 'controller-manager.kubeconfig'}",
                    f"--authorization-kubeconfig={d / 'controller-manager.kubeconfig'}",
                    f"--controllers={','.join(self.controllers)}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={st.kcm_port}",
                    f"--root-ca-file={pki / 'ca.crt'}",
                    f"--service-account-private-key-file={pki / 'sa.key'}",
                    "--use-service-account-credentials=true",  # each controller as its own SA, as kubeadm does
                    "--leader-elect=false",
                    # Garbage collection and namespace deletion react within a second or two.
                    "--concurrent-gc-syncs=5",
                    "--namespace-sync-period=10s",
                    "--v=1",
                ],
            )
            if self.scheduler:
                self._spawn(
                    "kube-scheduler",
                    [
                        str(bins / "kube-scheduler"),
                        f"--kubeconfig={d / 'scheduler.kubeconfig'}",
                        f"--authentication-kubeconfig={d / 'scheduler.kubeconfig'}",
                        f"--authorization-kubeconfig={d / 'scheduler.kubeconfig'}",
                        "--bind-address=127.0.0.1",
                        f"--secure-port={st.scheduler_port}",
                        "--leader-elect=false",
                        "--v=1",
                    ],
                )
            self._wait(self._default_serviceaccount_exists, "kube-controller-manager", t0, timeout)
        except BaseException:
            self.stop(keep_logs=True)
            raise
        st.save()
        return st

    def restart(self, name: str, *, timeout: float = 90.0) -> float:
        """Crash one component (SIGKILL) and start it again with the same arguments, ports and data, as a supervisor
        would; returns the seconds from the kill until it answers again. For fault-injection tests."""
        assert self.state
        st, proc = self.state, self._procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        port = {"etcd": st.etcd_port, "kube-apiserver": st.api_port, "kube-controller-manager": st.kcm_port}[name]
        while port_in_use(port) and time.monotonic() - t0 < timeout:
            time.sleep(0.05)
        self._spawn(name, self._argv[name])
        ready = {
            "etcd": lambda: self._http_ok(f"http://127.0.0.1:{st.etcd_port}/health"),
            "kube-apiserver": self._api_ready,
            "kube-controller-manager": lambda: True,
        }[name]
        self._wait(ready, name, t0, timeout)
        return time.monotonic() - t0

    def _spawn(self, name: str, argv: list[str]) -> None:
        assert self.state
        self._argv[name] = argv
        log = open(self.state_dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()
        self._procs[name] = proc
        self.state.pids[name] = proc.pid
        self.state.save()

    def _wait(self, ready: object, component: str, t0: float, timeout: float) -> None:
        assert callable(ready)
        while True:
            self.check()  # a component that died is reported with its log, not waited on
            if ready():
                return
            if time.monotonic() - t0 > timeout:
                raise ClusterError(
                    f"{component} not ready after {timeout:.0f}s; last lines of its log:\n"
                    f"{log_tail(self.state_dir, component)}"
                )
            time.sleep(0.2)

    def _ssl_context(self) -> ssl.SSLContext:
        pki = self.state_dir / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return ctx

    def _http_ok(self, url: str, ctx: ssl.SSLContext | None = None) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def api_get(self, path: str) -> dict[str, object]:
        assert self.state
        with urllib.request.urlopen(self.state.server + path, timeout=5, context=self._ssl_context()) as r:
            return dict(json.loads(r.read()))

    def _api_ready(self) -> bool:
        assert self.state
        return self._http_ok(self.state.server + "/readyz", self._ssl_context())

    def _default_serviceaccount_exists(self) -> bool:
        try:
            self.api_get("/api/v1/namespaces/default/serviceaccounts/default")
            return True
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, *, keep_logs: bool = False) -> None:
        """Stop every component (SIGTERM, then SIGKILL) and wait until its ports are free."""
        state = self.state or State.load(self.state_dir)
        if state:
            pids = {name: pid for name, pid in state.pids.items() if runs_with(pid, str(self.state_dir))}
            for name in reversed(COMPONENTS):
                pid = pids.get(name)
                if pid is None:
                    continue
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            for name, pid in pids.items():
                while _alive(pid) and time.monotonic() < deadline:
                    self._reap(name)
                    time.sleep(0.1)
                if _alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    while _alive(pid):
                        self._reap(name)
                        time.sleep(0.05)
                self._reap(name)
            ports = [state.api_port, state.etcd_port, state.etcd_peer_port, state.kcm_port, state.scheduler_port]
            deadline = time.monotonic() + 10
            while any(p and port_in_use(p) for p in ports) and time.monotonic() < deadline:
                time.sleep(0.1)
        self.state = None
        if keep_logs:
            with contextlib.suppress(FileNotFoundError):
                (self.state_dir / "state.json").unlink()
        else:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def _reap(self, name: str) -> None:
        proc = self._procs.get(name)
        if proc is not None:
            proc.poll()


def default_state_dir() -> Path:
    return Path(os.environ.get("FINETUNE_CLUSTER_DIR", f"/tmp/finetune-cluster-{os.getuid()}"))


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m hack.localcluster", description="A local control plane of real Kubernetes binaries."
    )
    ap.add_argument("command", choices=["build", "up", "down", "status"])
    ap.add_argument(
        "--dir",
        type=Path,
        default=default_state_dir(),
        help="state directory (default: $FINETUNE_CLUSTER_DIR or /tmp/finetune-cluster-$UID)",
    )
    ap.add_argument("--scheduler", action="store_true", help="also run kube-scheduler")
    ap.add_argument(
        "--nodes",
        type=int,
        default=0,
        metavar="N",
        help="also start N real nodes (kubelet + containerd; images built from the Dockerfiles)",
    )
    args = ap.parse_args(argv)

    if args.command == "build":
        print(ensure_binaries())
        return 0
    if args.nodes or (args.dir / "nodes").exists():
        from hack.localcluster.nodes import nodes_main

        return nodes_main(args.command, args.dir, args.nodes or 2)
    cluster = LocalCluster(args.dir, scheduler=args.scheduler)
    if args.command == "up":
        if cluster.running():
            print(f"# already running (Kubernetes v{K8S_VERSION}) in {args.dir}", file=sys.stderr)
        else:
            if cluster.state:  # recorded but dead: clean up first
                cluster.stop()
                cluster = LocalCluster(args.dir, scheduler=args.scheduler)
            t0 = time.monotonic()
            try:
                cluster.start()
            except ClusterError as e:
                print(f"cluster-up failed: {e}", file=sys.stderr)
                return 1
            version = cluster.api_get("/version")["gitVersion"]
            print(
                f"# control plane {version} up in {time.monotonic() - t0:.1f}s; logs in {args.dir}/logs",
                file=sys.stderr,
            )
        print(f"export KUBECONFIG={cluster.kubeconfig}")
        return 0
    if args.command == "down":
        cluster.stop()
        print(f"# control plane in {args.dir} stopped", file=sys.stderr)
        return 0
    try:  # status
        cluster.check()
    except ClusterError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"running: export KUBECONFIG={cluster.kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
