"""The part of the kubelet's HTTPS API the API server proxies ``kubectl logs`` to: ``GET /containerLogs/<namespace>/
<pod>/<container>`` with ``follow``, ``tailLines`` and ``limitBytes``, served from the node agent's log files.

The API server finds it through the Node's ``status.daemonEndpoints.kubeletEndpoint.Port`` and its ``InternalIP``
(the local cluster runs kube-apiserver with ``--kubelet-preferred-address-types=InternalIP,Hostname``, as kubeadm
does). The certificate is self-signed and no client certificate is asked for: the test control plane gives the API
server no kubelet CA, so it does not verify the kubelet (a real cluster must: ``--kubelet-certificate-authority``).
"""

from __future__ import annotations

import logging
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

log = logging.getLogger("nodeagent.kubeletapi")


def self_signed(directory: Path, address: str) -> tuple[Path, Path]:
    """A serving certificate for ``address`` (openssl, as the local cluster's PKI)."""
    crt, key = directory / "kubelet.crt", directory / "kubelet.key"
    if not crt.exists():
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "30",
                "-subj",
                "/CN=local-node-agent",
                "-addext",
                f"subjectAltName=IP:{address}",
                "-keyout",
                str(key),
                "-out",
                str(crt),
            ],
            check=True,
            capture_output=True,
        )
    return crt, key


class LogSource:
    """What the server needs from the agent for one container: its log file and whether it still runs."""

    def __init__(self, path: Path, started: bool, running: Callable[[], bool]) -> None:
        self.path, self.started, self.running = path, started, running


def _tail(data: bytes, lines: int) -> bytes:
    """The last ``lines`` lines, as the kubelet counts them (ended by "\\n" only: a progress bar's "\\r" is not one)."""
    if lines <= 0:
        return b""
    parts = data.split(b"\n")
    ended = data.endswith(b"\n")
    if ended:
        parts = parts[:-1]
    return b"\n".join(parts[-lines:]) + (b"\n" if ended else b"")


class KubeletApi:
    """An HTTPS server on ``address``:<free port> in a thread. ``lookup(namespace, pod, container)`` gives the
    container's :class:`LogSource`, or a string saying why there is none (answered 404/400 as the kubelet does)."""

    def __init__(
        self, address: str, state_dir: Path, lookup: Callable[[str, str, str], LogSource | tuple[int, str]]
    ) -> None:
        self.address, self.lookup = address, lookup
        crt, key = self_signed(state_dir, address)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("%s " + fmt, self.address_string(), *args)

            def _plain(self, code: int, text: str) -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path == "/healthz":
                    self._plain(200, "ok")
                    return
                parts = [unquote(p) for p in url.path.split("/") if p]
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self._plain(404, f"404 page not found: {url.path}")
                    return
                found = server.lookup(parts[1], parts[2], parts[3])
                if isinstance(found, tuple):
                    self._plain(*found)
                    return
                q = {k: v[-1] for k, v in parse_qs(url.query).items()}
                server.stream(
                    self,
                    found,
                    follow=q.get("follow") == "true",
                    tail=int(q["tailLines"]) if q.get("tailLines") else None,
                    limit=int(q["limitBytes"]) if q.get("limitBytes") else None,
                )

        self.httpd = ThreadingHTTPServer((address, 0), Handler)
        self.httpd.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(crt, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="kubelet-api", daemon=True)

    def start(self) -> KubeletApi:
        self._thread.start()
        log.info("kubelet API on https://%s:%d", self.address, self.port)
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @staticmethod
    def stream(
        handler: BaseHTTPRequestHandler, src: LogSource, *, follow: bool, tail: int | None, limit: int | None
    ) -> None:
        """The log as a chunked body; with ``follow``, new bytes as they come until the container ends."""
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        sent = 0

        def send(data: bytes) -> bool:
            nonlocal sent
            if limit is not None:
                data = data[: max(0, limit - sent)]
            if data:
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                handler.wfile.flush()
                sent += len(data)
            return limit is None or sent < limit

        try:
            with open(src.path, "rb") as f:
                data = f.read()
                more = send(_tail(data, tail) if tail is not None else data)
                while more and follow:
                    alive = src.running()
                    chunk = f.read()
                    if chunk:
                        more = send(chunk)
                    elif not alive:
                        break  # ended, and everything it wrote is sent
                    else:
                        time.sleep(0.2)
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except OSError:  # the reader went away (a broken pipe, a reset, TLS): nothing more to send
            handler.close_connection = True
