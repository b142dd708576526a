"""What the benchmarks share: a minimal HTTPS client for the local control plane (stdlib only, so the
benchmark's own client costs the machine as little as possible), a polling helper and the probe job."""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hack.localcluster.cluster import LocalCluster

T = TypeVar("T")
NAMESPACE = "bench"
GROUP, VERSION, PLURAL = "finetune.dev", "v1alpha1", "finetunejobs"


def job_manifest(name: str, nodes: int) -> dict[str, Any]:
    """A FineTuneJob the operator can create pods for (no kubelet runs them here)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"path": "/models/tiny", "initFromConfig": True},
            "dataset": {"path": "/data/train.jsonl"},
            "output": {"claimName": "out"},
            "nodes": nodes,
            "training": {"maxSteps": 10},
        },
    }


def wait_for(
    probe: Callable[[], T | None], *, timeout: float, what: str, check: Callable[[], None], interval: float = 0.2
) -> T:
    """Poll ``probe`` until truthy; ``check`` raises when a process we depend on died."""
    deadline = time.monotonic() + timeout
    while True:
        check()
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class Api:
    """A minimal HTTPS client on the admin certificate; one kept-alive connection per thread."""

    def __init__(self, cluster: LocalCluster) -> None:
        assert cluster.state
        pki = Path(cluster.state.dir) / "pki"
        self.port = cluster.state.api_port
        self.ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self._local = threading.local()

    def connection(self, timeout: float = 30) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=timeout)

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        """One request on this thread's kept-alive connection; a GET whose connection the server dropped (a
        loaded apiserver closes idle keep-alive connections) is sent once more on a new one."""
        try:
            return self._request(method, path, body, content_type)
        except (OSError, http.client.HTTPException):
            if method != "GET":
                raise
            return self._request(method, path, body, content_type)

    def _request(self, method: str, path: str, body: Any, content_type: str) -> tuple[int, bytes]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.connection()
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except (OSError, http.client.HTTPException):
            self._local.conn = None
            conn.close()
            raise

    def items(self, path: str) -> list[dict[str, Any]]:
        """Every object of a list, read in pages of 500."""
        out: list[dict[str, Any]] = []
        token = ""
        while True:
            sep = "&" if "?" in path else "?"
            body = self.get_json(f"{path}{sep}limit=500" + (f"&continue={token}" if token else "")) or {}
            out += body.get("items", [])
            token = (body.get("metadata") or {}).get("continue") or ""
            if not token:
                return out

    def get_json(self, path: str) -> dict[str, Any] | None:
        status, data = self.request("GET", path)
        return dict(json.loads(data)) if status == 200 else None

    def create(self, path: str, obj: dict[str, Any]) -> None:
        status, data = self.request("POST", path, obj)
        if status != 201:
            raise RuntimeError(f"POST {path}: HTTP {status} {data[:300]!r}")


class Watcher(threading.Thread):
    """One watch stream; calls ``on_event(type, object, monotonic_time)`` for every event."""

    def __init__(self, api: Api, path: str, on_event: Callable[[str, dict[str, Any], float], None]) -> None:
        super().__init__(daemon=True, name=f"watch {path}")
        self.api, self.path, self.on_event = api, path, on_event
        self.conn = api.connection(timeout=600)
        self.error: BaseException | None = None
        self.ready = threading.Event()

    def run(self) -> None:
        try:
            self.conn.request("GET", self.path)
            resp = self.conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"watch {self.path}: HTTP {resp.status} {resp.read()[:300]!r}")
            self.ready.set()
            while line := resp.readline():
                ev = json.loads(line)
                if ev["type"] == "ERROR":
                    raise RuntimeError(f"watch {self.path}: {ev['object']}")
                self.on_event(ev["type"], ev["object"], time.monotonic())
        except BaseException as e:  # reported by the main thread
            if not getattr(self, "closing", False):
                self.error = e
        finally:
            self.ready.set()

    def close(self) -> None:
        self.closing = True
        with contextlib.suppress(OSError):
            if self.conn.sock:
                self.conn.sock.shutdown(2)
        self.conn.close()
