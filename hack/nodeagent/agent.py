"""The local node agent: a test double for kubelet + container runtime (see ``hack/nodeagent/__init__.py``)."""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from hack.nodeagent.kubeletapi import KubeletApi, LogSource
from hack.nodeagent.network import Bridge, PodNetwork

log = logging.getLogger("nodeagent")

JOB_LABEL = "finetune.dev/job-name"
TERMINATION_LOG = "/dev/termination-log"
IMAGE_SAMPLES = "/opt/finetune/samples"  # where the trainer images link finetune_trainer/samples
STAGE = "/run/finetune-nodeagent-stage"  # an empty host directory; a private tmpfs inside each pod
MAX_MESSAGE = 4096  # kubelet: termination message cap per container
FALLBACK_LINES, FALLBACK_BYTES = 80, 2048  # kubelet: FallbackToLogsOnError takes this much of the log tail


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def default_image_venv() -> Path:
    """The "image": a virtualenv holding ``finetune-trainer``. ``$FINETUNE_AGENT_IMAGE_VENV``, else the running
    interpreter's venv when it has the trainer, else the development venv that ``.ci/venv.sh`` builds."""
    env = os.environ.get("FINETUNE_AGENT_IMAGE_VENV")
    if env:
        return Path(env)
    here = Path(sys.executable).parent
    if (here / "finetune-trainer").exists():
        return here.parent
    root = Path(__file__).resolve().parents[2]
    return Path(
        subprocess.run(
            ["bash", str(root / ".ci" / "venv.sh"), "--path"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )


@dataclass
class PodRun:
    """One pod this agent runs."""

    namespace: str
    name: str
    uid: str
    hostname: str
    subdomain: str | None
    container: str
    image: str
    grace: int
    fallback_to_logs: bool
    dir: Path
    log_path: Path
    net: PodNetwork | None = None
    proc: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    exit_code: int | None = None
    terminating: bool = False
    finished: bool = False  # terminal status reported
    waiting_reason: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def ip(self) -> str | None:
        return self.net.address if self.net else None

    @property
    def hosts_file(self) -> Path:
        return self.dir / "etc-hosts"


class NodeAgent:
    """Register a Node, bind FineTuneJob pods to it, run their containers as local processes, report status.

    Usage: ``NodeAgent(kubeconfig, claims_dir=...).start()`` … ``.stop()``; :meth:`logs` for failure dumps.
    """

    def __init__(
        self,
        kubeconfig: str,
        *,
        node_name: str = "local-agent",
        claims_dir: str | Path,
        namespace: str | None = None,
        state_dir: str | Path | None = None,
        image_venv: str | Path | None = None,
        image_venvs: dict[str, str | Path] | None = None,
        image_env: dict[str, str] | None = None,
        poll_interval: float = 0.3,
        heartbeat_seconds: float = 10.0,
        cpu: str | None = None,
        memory: str = "16Gi",
    ) -> None:
        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.coord = client.CoordinationV1Api(self.api)
        self.node_name = node_name
        self.namespace = namespace
        self.claims_dir = Path(claims_dir).resolve()
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="nodeagent-")).resolve()
        self.image_venv = Path(image_venv or default_image_venv()).resolve()
        # Images that stand for another venv (the ONNX Runtime trainer image -> the ORT stack's venv); every other
        # image runs in image_venv.
        self.image_venvs = {image: Path(v).resolve() for image, v in (image_venvs or {}).items()}
        # What a container image would set (Dockerfile.cpu ENV/WORKDIR), plus a thread cap so two ranks on a
        # small machine do not oversubscribe it.
        self.image_env = {
            "PATH": f"{self.image_venv / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "VIRTUAL_ENV": str(self.image_venv),
            "HF_HOME": "/tmp/hf-home",
            "PYTHONUNBUFFERED": "1",
            "FINETUNE_CONFIG": "/etc/finetune/config.json",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "LANG": "C.UTF-8",
            **(image_env or {}),
        }
        self.poll_interval = poll_interval
        self.heartbeat_seconds = heartbeat_seconds
        self.cpu = cpu or str(os.cpu_count() or 1)
        self.memory = memory
        self.bridge = Bridge()
        self.pods: dict[str, PodRun] = {}  # by uid
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._services: dict[str, tuple[float, set[str]]] = {}
        self.errors: list[str] = []
        self.kubelet_api: KubeletApi | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> NodeAgent:
        for tool in ("ip", "nsenter", "unshare", "mount", "hostname"):
            if not shutil.which(tool):
                raise RuntimeError(f"the node agent needs {tool!r} (iproute2/util-linux) and root")
        if os.geteuid() != 0:
            raise RuntimeError("the node agent needs root (network and mount namespaces)")
        for venv in (self.image_venv, *self.image_venvs.values()):
            if not (venv / "bin" / "finetune-trainer").exists():
                raise RuntimeError(f"no finetune-trainer in the image venv {venv}")
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.claims_dir.mkdir(parents=True, exist_ok=True)
        Path(STAGE).mkdir(parents=True, exist_ok=True)
        self.bridge.create()
        self.kubelet_api = KubeletApi(self.bridge.gateway, self.state_dir, self._log_source).start()
        self._register_node()
        for target in (self._loop, self._heartbeat):
            t = threading.Thread(target=target, name=f"nodeagent-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)
        log.info(
            "node %s ready, pods on %s.0/24, state in %s", self.node_name, self.bridge.gateway[:-2], self.state_dir
        )
        return self

    def stop(self, *, delete_pods: bool = True) -> None:
        """Kill every pod's processes, remove network namespaces, veths and the bridge, and the Node. With
        ``delete_pods`` the pods it ran are force-deleted (a real node going away would leave them bound; a test
        namespace could then never be deleted)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        with self._lock:
            runs = list(self.pods.values())
        for run in runs:
            self._kill(run, grace=2)
            if delete_pods:
                self._force_delete(run)
            self._cleanup(run)
        if self.kubelet_api is not None:
            self.kubelet_api.stop()
        self.bridge.delete()
        with contextlib.suppress(ApiException):
            self.core.delete_node(self.node_name)
        with contextlib.suppress(ApiException):
            self.coord.delete_namespaced_lease(self.node_name, "kube-node-lease")

    def __enter__(self) -> NodeAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ node

    def _node_status(self) -> dict[str, Any]:
        ts = now()
        cond = [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "local node agent is ready",
                "lastHeartbeatTime": ts,
                "lastTransitionTime": ts,
            },
            *(
                {
                    "type": t,
                    "status": "False",
                    "reason": f"KubeletHas{r}",
                    "message": "",
                    "lastHeartbeatTime": ts,
                    "lastTransitionTime": ts,
                }
                for t, r in (
                    ("MemoryPressure", "SufficientMemory"),
                    ("DiskPressure", "NoDiskPressure"),
                    ("PIDPressure", "SufficientPID"),
                )
            ),
        ]
        cap = {"cpu": self.cpu, "memory": self.memory, "pods": "110", "ephemeral-storage": "50Gi"}
        return {
            "conditions": cond,
            "capacity": cap,
            "allocatable": cap,
            "addresses": [
                {"type": "InternalIP", "address": self.bridge.gateway},
                {"type": "Hostname", "address": self.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_api.port if self.kubelet_api else 0}},
            "nodeInfo": {
                "kubeletVersion": "local-node-agent",
                "containerRuntimeVersion": "local-processes://0",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "kernelVersion": os.uname().release,
                "osImage": "local",
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }

    def _register_node(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {
                    "kubernetes.io/hostname": self.node_name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "finetune.dev/local-node-agent": "true",
                },
            },
        }
        try:
            self.core.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
        self.core.patch_node_status(self.node_name, {"status": self._node_status()})
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.node_name, "namespace": "kube-node-lease"},
            "spec": {
                "holderIdentity": self.node_name,
                "leaseDurationSeconds": 40,
                "renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        }
        try:
            self.coord.create_namespaced_lease("kube-node-lease", lease)
        except ApiException as e:
            if e.status != 409:
                log.warning("lease: %s", e.reason)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                self.coord.patch_namespaced_lease(
                    self.node_name,
                    "kube-node-lease",
                    {"spec": {"renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}},
                )
                self.core.patch_node_status(self.node_name, {"status": self._node_status()})
            except Exception as e:
                log.warning("heartbeat failed: %s", e)

    # ------------------------------------------------------------------ main loop

    def _list_pods(self) -> list[Any]:
        if self.namespace:
            return list(self.core.list_namespaced_pod(self.namespace, label_selector=JOB_LABEL).items)
        return list(self.core.list_pod_for_all_namespaces(label_selector=JOB_LABEL).items)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception as e:
                log.exception("sync failed")
                self.errors.append(repr(e))
            self._stop.wait(self.poll_interval)

    def _sync(self) -> None:
        pods = self._list_pods()
        seen: set[str] = set()
        for pod in pods:
            uid = pod.metadata.uid
            seen.add(uid)
            node = pod.spec.node_name
            if not node:
                # As a scheduler: a pod with scheduling gates (Kueue's admission gate) waits until they are lifted.
                if pod.metadata.deletion_timestamp is None and not pod.spec.scheduling_gates:
                    self._bind(pod)
                continue
            if node != self.node_name:
                continue
            with self._lock:
                run = self.pods.get(uid)
            if pod.metadata.deletion_timestamp is not None:
                if run is None:
                    self._force_delete_pod(pod.metadata.namespace, pod.metadata.name, uid)
                elif not run.terminating:
                    run.terminating = True
                    grace = pod.metadata.deletion_grace_period_seconds
                    threading.Thread(
                        target=self._delete_flow, args=(run, grace if grace is not None else run.grace), daemon=True
                    ).start()
                continue
            if run is None:
                if pod.status.phase in ("Succeeded", "Failed"):
                    continue  # finished before this agent started
                run = self._admit(pod)
            if run.proc is None and not run.finished:
                self._try_start(run, pod)
            elif run.proc is not None and run.exit_code is None and not run.terminating and run.proc.poll() is not None:
                self._on_exit(run)
        # pods that vanished (force-deleted by someone else): clean up
        with self._lock:
            gone = [r for uid, r in self.pods.items() if uid not in seen]
        for run in gone:
            self._kill(run, grace=0)
            self._cleanup(run)
        self._refresh_hosts()

    def _bind(self, pod: Any) -> None:
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=pod.metadata.name, uid=pod.metadata.uid),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=self.node_name),
        )
        try:
            self.core.create_namespaced_pod_binding(
                pod.metadata.name, pod.metadata.namespace, body, _preload_content=False
            )
            log.info("bound %s/%s", pod.metadata.namespace, pod.metadata.name)
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    # ------------------------------------------------------------------ pod start

    def _admit(self, pod: Any) -> PodRun:
        c = pod.spec.containers[0]
        ns, name, uid = pod.metadata.namespace, pod.metadata.name, pod.metadata.uid
        pdir = self.state_dir / "pods" / f"{ns}_{name}_{uid[:8]}"
        pdir.mkdir(parents=True, exist_ok=True)
        run = PodRun(
            namespace=ns,
            name=name,
            uid=uid,
            hostname=pod.spec.hostname or name,
            subdomain=pod.spec.subdomain,
            container=c.name,
            image=c.image or "",
            grace=int(pod.spec.termination_grace_period_seconds or 30),
            fallback_to_logs=(c.termination_message_policy == "FallbackToLogsOnError"),
            dir=pdir,
            log_path=self.state_dir / "logs" / f"{ns}_{name}_{uid[:8]}.log",
        )
        with self._lock:
            self.pods[uid] = run
        return run

    def _log_source(self, ns: str, name: str, container: str) -> LogSource | tuple[int, str]:
        """For the kubelet API: the log of pod ``ns/name``'s container, as a kubelet answers ``kubectl logs``."""
        with self._lock:
            runs = [r for r in self.pods.values() if r.namespace == ns and r.name == name]
        if not runs:
            return 404, f"pod {ns}/{name} not found on node {self.node_name}"
        run = runs[-1]
        if container != run.container:
            return 400, f"container {container} is not valid for pod {name}"
        if run.proc is None:
            return 400, f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
        proc = run.proc
        return LogSource(run.log_path, started=True, running=lambda: run.exit_code is None and proc.poll() is None)

    def _lookup(self, kind: str, ns: str, name: str, key: str | None) -> dict[str, str] | str | None:
        try:
            if kind == "configMap":
                obj = self.core.read_namespaced_config_map(name, ns)
                data = dict(obj.data or {})
            else:
                obj = self.core.read_namespaced_secret(name, ns)
                data = {k: base64.b64decode(v).decode() for k, v in (obj.data or {}).items()}
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        if key is None:
            return data
        return data.get(key)

    def venv_for(self, image: str) -> Path:
        return self.image_venvs.get(image, self.image_venv)

    def _env(self, run: PodRun, c: Any) -> dict[str, str]:
        env = dict(self.image_env)
        venv = self.venv_for(run.image)
        env["PATH"] = env["PATH"].replace(str(self.image_venv / "bin"), str(venv / "bin"), 1)
        env["VIRTUAL_ENV"] = str(venv)
        env["HOSTNAME"] = run.hostname
        for e in c.env or []:
            if e.value_from is None:
                env[e.name] = e.value or ""
                continue
            vf = e.value_from
            if vf.config_map_key_ref or vf.secret_key_ref:
                ref = vf.config_map_key_ref or vf.secret_key_ref
                kind = "configMap" if vf.config_map_key_ref else "secret"
                val = self._lookup(kind, run.namespace, ref.name, ref.key)
                if val is None:
                    if ref.optional:
                        continue
                    what = "ConfigMap" if kind == "configMap" else "Secret"
                    raise _ConfigError(f"couldn't find key {ref.key} in {what} {run.namespace}/{ref.name}")
                env[e.name] = str(val)
            elif vf.field_ref:
                path = vf.field_ref.field_path
                env[e.name] = {
                    "metadata.name": run.name,
                    "metadata.namespace": run.namespace,
                    "metadata.uid": run.uid,
                    "status.podIP": run.ip or "",
                    "spec.nodeName": self.node_name,
                }.get(path, "")
        return env

    def _volumes(self, run: PodRun, pod: Any) -> dict[str, tuple[str, str | None]]:
        """Materialise volumes: name -> (host path, tmpfs marker or None)."""
        out: dict[str, tuple[str, str | None]] = {}
        vroot = run.dir / "volumes"
        for v in pod.spec.volumes or []:
            target = vroot / v.name
            if v.config_map or v.secret:
                src = v.config_map or v.secret
                kind = "configMap" if v.config_map else "secret"
                data = self._lookup(kind, run.namespace, src.name if v.config_map else src.secret_name, None)
                if data is None:
                    if src.optional:
                        data = {}
                    else:
                        raise _MountError(
                            f"{'configmap' if v.config_map else 'secret'} "
                            f"{src.name if v.config_map else src.secret_name!r} not found"
                        )
                assert isinstance(data, dict)
                target.mkdir(parents=True, exist_ok=True)
                items = src.items or [client.V1KeyToPath(key=k, path=k) for k in data]
                for it in items:
                    if it.key in data:
                        f = target / it.path
                        f.parent.mkdir(parents=True, exist_ok=True)
                        f.write_text(data[it.key])
                out[v.name] = (str(target), None)
            elif v.persistent_volume_claim:
                claim = self.claims_dir / run.namespace / v.persistent_volume_claim.claim_name
                claim.mkdir(parents=True, exist_ok=True)
                out[v.name] = (str(claim), None)
            elif v.empty_dir is not None:
                if v.empty_dir.medium == "Memory":
                    out[v.name] = ("tmpfs", v.empty_dir.size_limit or None)
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    out[v.name] = (str(target), None)
            elif v.projected is not None:
                target.mkdir(parents=True, exist_ok=True)
                self._projected(run, pod, v.projected, target)
                out[v.name] = (str(target), None)
            else:
                raise _MountError(f"volume {v.name}: type not supported by the local node agent")
        return out

    def _projected(self, run: PodRun, pod: Any, proj: Any, target: Path) -> None:
        """The service account token volume (kube-api-access-*): token, ca.crt, namespace."""
        for src in proj.sources or []:
            if src.service_account_token is not None:
                req = {
                    "spec": {"audiences": [], "expirationSeconds": src.service_account_token.expiration_seconds or 3600}
                }
                tok = self.core.create_namespaced_service_account_token(
                    pod.spec.service_account_name or "default", run.namespace, req
                )
                (target / src.service_account_token.path).write_text(tok.status.token)
            elif src.config_map is not None:
                data = self._lookup("configMap", run.namespace, src.config_map.name, None) or {}
                assert isinstance(data, dict)
                for it in src.config_map.items or [client.V1KeyToPath(key=k, path=k) for k in data]:
                    if it.key in data:
                        (target / it.path).write_text(data[it.key])
            elif src.downward_api is not None:
                for it in src.downward_api.items or []:
                    if it.field_ref and it.field_ref.field_path == "metadata.namespace":
                        (target / it.path).write_text(run.namespace)

    def _setup_script(self, run: PodRun, pod: Any, c: Any, volumes: dict[str, tuple[str, str | None]]) -> str:
        """The shell run as the pod's PID 1 before ``exec``-ing the command, inside fresh mount/UTS/PID namespaces.

        Every source is first bound onto a private staging tmpfs (``STAGE``), then onto its target: a target such
        as ``/tmp`` would otherwise hide sources that live under it (the agent's state or claims directories).
        """
        q = shlex.quote
        term = run.dir / "termination-log"
        term.write_text("")
        etc_hostname = run.dir / "etc-hostname"
        etc_hostname.write_text(run.hostname + "\n")
        resolv = run.dir / "etc-resolv.conf"
        resolv.write_text(
            f"search {run.namespace}.svc.cluster.local svc.cluster.local cluster.local\n"
            "nameserver 127.0.0.1\noptions ndots:5 timeout:1 attempts:1\n"
        )
        plan: list[tuple[str, str, bool, bool, str | None]] = []  # (source, target, is_dir, ro, tmpfs size)
        # Files the image ships at a fixed path: the trainer package's samples, as the images link them
        # (trainer-image/Dockerfile*); first, so a volume may still mount over them.
        samples = sorted(self.venv_for(run.image).glob("lib/python*/site-packages/finetune_trainer/samples"))
        if samples:
            plan.append((str(samples[0]), IMAGE_SAMPLES, True, True, None))
        for m in sorted(c.volume_mounts or [], key=lambda m: m.mount_path.rstrip("/").count("/")):
            src, size = volumes[m.name]
            if src != "tmpfs" and m.sub_path:
                src = os.path.join(src, m.sub_path)
            plan.append((src, m.mount_path, src == "tmpfs" or os.path.isdir(src), bool(m.read_only), size))
        for src_path, dst in (
            (term, c.termination_message_path or TERMINATION_LOG),
            (run.hosts_file, "/etc/hosts"),
            (etc_hostname, "/etc/hostname"),
            (resolv, "/etc/resolv.conf"),
        ):
            plan.append((str(src_path), dst, False, False, None))
        lines = ["set -e", f"hostname {q(run.hostname)}", f"mount -t tmpfs -o size=1m tmpfs {STAGE}"]
        for i, (src, _, is_dir, _, _) in enumerate(plan):
            if src == "tmpfs":
                continue
            lines.append(f"mkdir {STAGE}/{i}" if is_dir else f"touch {STAGE}/{i}")
            lines.append(f"mount --bind {q(src)} {STAGE}/{i}")
        for i, (src, dst, is_dir, ro, size) in enumerate(plan):
            lines.append(f"mkdir -p {q(dst)}" if is_dir else f"[ -e {q(dst)} ] || touch {q(dst)}")
            if src == "tmpfs":
                lines.append(f"mount -t tmpfs {'-o size=' + str(_bytes(size)) if size else ''} tmpfs {q(dst)}")
                continue
            lines.append(f"mount --bind {STAGE}/{i} {q(dst)}")
            if ro:
                lines.append(f"mount -o remount,bind,ro {q(dst)}")
        lines.append(f"cd {q(c.working_dir or '/tmp')}")
        lines.append('exec "$@"')
        return "\n".join(lines)

    def _try_start(self, run: PodRun, pod: Any) -> None:
        c = pod.spec.containers[0]
        try:
            env = self._env(run, c)
            volumes = self._volumes(run, pod)
        except _ConfigError as e:
            self._report_waiting(run, "CreateContainerConfigError", str(e))
            return
        except _MountError as e:
            self._report_waiting(run, "ContainerCreating", f"MountVolume.SetUp failed: {e}")
            return
        argv = list(c.command or []) + list(c.args or [])
        if not argv:
            self._report_waiting(
                run, "CreateContainerError", "no command: the local node agent has no image ENTRYPOINT"
            )
            return
        run.net = PodNetwork(self.bridge).create()
        self._write_hosts(run)
        script = self._setup_script(run, pod, c, volumes)
        cmd = [
            "nsenter",
            f"--net={run.net.netns_path}",
            "--",
            "unshare",
            "--mount",
            "--uts",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            script,
            "pod-init",
            *argv,
        ]
        with open(run.log_path, "ab") as out:
            run.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                cwd="/",
            )
        run.started_at = now()
        log.info("started %s (%s) pid %d", run.key, run.ip, run.proc.pid)
        self._patch_status(
            run,
            {
                "phase": "Running",
                "hostIP": self.bridge.gateway,
                "podIP": run.ip,
                "podIPs": [{"ip": run.ip}],
                "startTime": run.started_at,
                "conditions": self._conditions(ready=True),
                "containerStatuses": [self._cstatus(run, {"running": {"startedAt": run.started_at}}, ready=True)],
            },
        )

    # ------------------------------------------------------------------ status

    def _conditions(self, *, ready: bool) -> list[dict[str, Any]]:
        ts = now()
        r = "True" if ready else "False"
        return [
            {"type": "Initialized", "status": "True", "lastTransitionTime": ts},
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": ts},
            {"type": "ContainersReady", "status": r, "lastTransitionTime": ts},
            {"type": "Ready", "status": r, "lastTransitionTime": ts},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts},
        ]

    def _cstatus(self, run: PodRun, state: dict[str, Any], *, ready: bool) -> dict[str, Any]:
        return {
            "name": run.container,
            "image": run.image,
            "imageID": f"local://{self.venv_for(run.image)}",
            "containerID": f"local://{run.uid}",
            "ready": ready,
            "started": "running" in state,
            "restartCount": 0,
            "state": state,
        }

    def _patch_status(self, run: PodRun, status: dict[str, Any]) -> None:
        try:
            self.core.patch_namespaced_pod_status(
                run.name, run.namespace, {"metadata": {"uid": run.uid}, "status": status}
            )
        except ApiException as e:
            if e.status not in (404, 409, 422):
                raise

    def _report_waiting(self, run: PodRun, reason: str, message: str) -> None:
        if run.waiting_reason == reason + message:
            return
        run.waiting_reason = reason + message
        self._patch_status(
            run,
            {
                "phase": "Pending",
                "conditions": self._conditions(ready=False),
                "containerStatuses": [
                    self._cstatus(run, {"waiting": {"reason": reason, "message": message}}, ready=False)
                ],
            },
        )

    def _termination_message(self, run: PodRun, code: int) -> str:
        msg = ""
        with contextlib.suppress(OSError):
            msg = (run.dir / "termination-log").read_text(errors="replace")[:MAX_MESSAGE]
        if not msg.strip() and code != 0 and run.fallback_to_logs:
            with contextlib.suppress(OSError):
                tail = run.log_path.read_bytes()[-64 * 1024 :].decode(errors="replace").splitlines()[-FALLBACK_LINES:]
                msg = "\n".join(tail)[-FALLBACK_BYTES:]
        return msg

    def _on_exit(self, run: PodRun) -> None:
        assert run.proc is not None
        with self._lock:
            if run.exit_code is not None:
                return
            rc = run.proc.wait()
            run.exit_code = rc if rc >= 0 else 128 - rc
        code = run.exit_code  # killed by signal N: 128+N, as container runtimes report
        term: dict[str, Any] = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": run.started_at,
            "finishedAt": now(),
            "containerID": f"local://{run.uid}",
        }
        msg = self._termination_message(run, code)
        if msg:
            term["message"] = msg
        log.info("%s exited %d", run.key, code)
        run.finished = True
        self._patch_status(
            run,
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": self._conditions(ready=False),
                "containerStatuses": [self._cstatus(run, {"terminated": term}, ready=False)],
            },
        )
        if run.net:  # a finished pod keeps no IP in DNS (publishNotReadyAddresses covers only live pods)
            run.net.delete()
            run.net = None

    # ------------------------------------------------------------------ deletion

    def _init_pid(self, run: PodRun) -> int | None:
        """Host PID of the container's PID 1 (the child of ``unshare --fork``)."""
        if run.proc is None or run.proc.poll() is not None:
            return None
        try:
            kids = psutil.Process(run.proc.pid).children()
        except psutil.NoSuchProcess:
            return None
        return kids[0].pid if kids else None

    def _kill(self, run: PodRun, *, grace: float) -> None:
        """SIGTERM to the container's PID 1, SIGKILL to the whole PID namespace after ``grace`` seconds."""
        if run.proc is None or run.proc.poll() is not None:
            return
        pid = self._init_pid(run)
        if pid and grace > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.proc.wait(timeout=grace)
        if run.proc.poll() is None:
            pid = self._init_pid(run)
            if pid:  # PID 1 of a PID namespace dies: the kernel kills every process in it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait(timeout=30)

    def _delete_flow(self, run: PodRun, grace: int) -> None:
        try:
            if run.proc is not None and run.exit_code is None:
                self._kill(run, grace=grace)
                self._on_exit(run)
            self._force_delete(run)
        except Exception as e:
            log.exception("deleting %s", run.key)
            self.errors.append(repr(e))
        finally:
            self._cleanup(run)

    def _force_delete(self, run: PodRun) -> None:
        self._force_delete_pod(run.namespace, run.name, run.uid)

    def _force_delete_pod(self, ns: str, name: str, uid: str) -> None:
        body = client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid))
        try:
            self.core.delete_namespaced_pod(name, ns, body=body)
            log.info("deleted %s/%s", ns, name)
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def _cleanup(self, run: PodRun) -> None:
        with self._lock:
            self.pods.pop(run.uid, None)
        if run.net:
            run.net.delete()
            run.net = None
        shutil.rmtree(run.dir / "volumes", ignore_errors=True)

    # ------------------------------------------------------------------ names (the cluster DNS stand-in)

    def _service_names(self, ns: str) -> set[str]:
        ts, names = self._services.get(ns, (0.0, set()))
        if time.monotonic() - ts > 2:
            with contextlib.suppress(ApiException):
                names = {s.metadata.name for s in self.core.list_namespaced_service(ns).items}
            self._services[ns] = (time.monotonic(), names)
        return names

    def _hosts_content(self, run: PodRun, runs: list[PodRun]) -> str:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        own_fqdn = []
        if run.subdomain:
            own_fqdn = [
                f"{run.hostname}.{run.subdomain}.{run.namespace}.svc.cluster.local",
                f"{run.hostname}.{run.subdomain}.{run.namespace}.svc",
                f"{run.hostname}.{run.subdomain}.{run.namespace}",
                f"{run.hostname}.{run.subdomain}",
            ]
        lines.append(f"{run.ip}\t{' '.join([*own_fqdn, run.hostname])}")
        services = self._service_names(run.namespace)
        for other in runs:
            if other is run or other.ip is None or other.namespace != run.namespace or not other.subdomain:
                continue
            if other.subdomain not in services:
                continue
            h, s, ns = other.hostname, other.subdomain, other.namespace
            lines.append(f"{other.ip}\t{h}.{s}.{ns}.svc.cluster.local {h}.{s}.{ns}.svc {h}.{s}.{ns} {h}.{s}")
        return "\n".join(lines) + "\n"

    def _write_hosts(self, run: PodRun) -> None:
        with self._lock:
            runs = list(self.pods.values())
        content = self._hosts_content(run, runs)
        f = run.hosts_file
        if f.exists() and f.read_text() == content:
            return
        # in place (same inode): the file is bind-mounted into the pod's mount namespace
        with open(f, "a+") as fh:
            fh.seek(0)
            fh.truncate()
            fh.write(content)

    def _refresh_hosts(self) -> None:
        with self._lock:
            runs = [r for r in self.pods.values() if r.net is not None]
        for run in runs:
            self._write_hosts(run)

    def logs(self, namespace: str | None = None, tail: int = 60) -> str:
        """The tail of every pod log this agent kept (all attempts), for failure dumps."""
        parts = []
        for f in sorted((self.state_dir / "logs").glob("*.log")):
            if namespace and not f.name.startswith(f"{namespace}_"):
                continue
            text = f.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"==== pod log {f.name} (last {tail} lines) ====\n" + "\n".join(text))
        if self.errors:
            parts.append("==== node agent errors ====\n" + "\n".join(self.errors[-20:]))
        return "\n".join(parts)


def _bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (``1Gi``, ``512M``, ``1e9``) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    for suffix in sorted(units, key=len, reverse=True):
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * units[suffix])
    return int(float(quantity))


class _ConfigError(Exception):
    pass


class _MountError(Exception):
    pass
