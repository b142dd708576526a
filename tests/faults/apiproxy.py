"""A fault-injecting proxy in front of the real kube-apiserver: some requests get 429 (with Retry-After), 500 or a
dropped connection instead of an answer, and watch streams are cut short, at a rate and with a seed.

The operator talks to it over plain HTTP on 127.0.0.1 (kubeconfig from :meth:`FaultProxy.write_kubeconfig`); the
proxy forwards every other request to the API server over TLS as the cluster's admin, streaming the answer (watches
included). Counts what it did, per fault and per verb, for the scenario's figures.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import ssl
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

FAULTS = ("429", "500", "drop")
_HOP = {
    "host",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "content-length",
}


def _status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FaultProxy:
    def __init__(
        self,
        upstream: str,
        ssl_ctx: ssl.SSLContext,
        *,
        rate: float,
        seed: int,
        watch_cut_s: tuple[float, float] | None = (1.0, 6.0),
        after_write: Callable[[str], None] | None = None,
    ) -> None:
        self.upstream, self.ssl_ctx, self.rate = upstream.rstrip("/"), ssl_ctx, rate
        self.rng = random.Random(seed)
        self.watch_cut_s = watch_cut_s
        # Called with "<verb> <path>" once a write (create, update, patch, delete) has been applied by the API server
        # (a 2xx answer) and before that answer goes back: the point where a client dying leaves the most to redo.
        self.after_write = after_write
        self.injected: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()  # by verb (get, list, watch, create, update, delete, patch)
        self.enabled = threading.Event()
        self.enabled.set()
        # A watch gap (hold_watches, then expire_watches): the watches are cut and held, and come back with 410 Gone,
        # so the client must list again, and what was deleted meanwhile is never delivered as an event.
        self._held = False
        self._released: asyncio.Event | None = None
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def stop(self) -> None:
        """Close every connection (watches included, within a second) and the upstream session, then the loop."""
        done = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        with contextlib.suppress(Exception):
            done.result(15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _shutdown(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    def write_kubeconfig(self, path: Path) -> str:
        server = f"http://127.0.0.1:{self.port}"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "proxy",
                    "clusters": [{"name": "proxy", "cluster": {"server": server}}],
                    "users": [{"name": "proxy", "user": {}}],
                    "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
                }
            )
        )
        return str(path)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._session = self._loop.run_until_complete(self._client())
        self._ready.set()
        self._loop.run_forever()

    async def _client(self) -> aiohttp.ClientSession:
        # aiohttp creates a session (and its connector) only inside a running event loop
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.ssl_ctx, limit=0),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
        )

    # -- requests ----------------------------------------------------------------------------------------

    @staticmethod
    def _verb(request: web.Request) -> str:
        if request.query.get("watch") in ("1", "true"):
            return "watch"
        named = len([p for p in request.path.split("/") if p]) % 2 == 0  # .../<plural>/<name>: one object
        return {
            "GET": "get" if named else "list",
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete",
        }.get(request.method, request.method.lower())

    def _draw(self) -> str | None:
        with self._lock:
            if not self.enabled.is_set() or self.rng.random() >= self.rate:
                return None
            return self.rng.choice(FAULTS)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        verb = self._verb(request)
        with self._lock:
            self.requests[verb] += 1
            held = self._held
        if verb == "watch" and (held or (self._released is not None and not self._released.is_set())):
            return await self._expired(request)
        fault = self._draw()
        if fault is not None:
            with self._lock:
                self.injected[fault] += 1
        if fault == "429":
            return web.json_response(
                _status_body(429, "TooManyRequests", "injected: too many requests"),
                status=429,
                headers={"Retry-After": "1"},
            )
        if fault == "500":
            return web.json_response(_status_body(500, "InternalError", "injected: internal error"), status=500)
        if fault == "drop":  # no answer: the client sees its connection end (as after a timeout or a crash)
            await asyncio.sleep(0.5)
            return self._drop(request)
        return await self._forward(request, verb)

    @staticmethod
    def _drop(request: web.Request) -> web.Response:
        """Close the connection without an answer (the response returned is never sent)."""
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=502)

    async def _forward(self, request: web.Request, verb: str) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        body = await request.read()
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body or None
        ) as up:
            if self.after_write is not None and verb in ("create", "update", "patch", "delete") and up.status < 300:
                await up.read()  # applied: the API server has answered (a refused write, a 409, changed nothing)
                self.after_write(f"{verb} {request.path}")
                return self._drop(request)
            resp = web.StreamResponse(
                status=up.status, headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP}
            )
            await resp.prepare(request)
            cut_at = None
            if verb == "watch" and self.watch_cut_s is not None:
                with self._lock:
                    cut_at = self._loop.time() + self.rng.uniform(*self.watch_cut_s) if self.enabled.is_set() else None
            while True:
                timeout = None if cut_at is None else max(0.0, cut_at - self._loop.time())
                if verb == "watch":  # a hold cuts the stream within a fraction of a second
                    timeout = 0.2 if timeout is None else min(timeout, 0.2)
                try:
                    chunk = await asyncio.wait_for(up.content.readany(), timeout)
                except TimeoutError:  # the watch is cut short, as an API server restart or a load balancer would
                    if verb == "watch" and not self._held and (cut_at is None or self._loop.time() < cut_at):
                        continue  # only the hold's poll
                    with self._lock:
                        self.injected["watch-cut"] += 1
                    break
                if not chunk:
                    break
                if verb == "watch" and self._held:
                    with self._lock:
                        self.injected["watch-cut"] += 1
                    break  # what arrived in the gap is never delivered
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    def hold_watches(self) -> None:
        """Cut every watch stream and hold the client's next watch requests unanswered (a partitioned API server)."""
        with self._lock:
            self._held = True
            self._released = asyncio.Event()

    def expire_watches(self) -> None:
        """End the gap: every held watch request gets ``410 Gone`` (its resourceVersion is too old), as after an etcd
        compaction, so the client lists again; the events of the gap are never delivered."""
        with self._lock:
            self._held = False
            released = self._released
        if released is not None:
            self._loop.call_soon_threadsafe(released.set)

    async def _expired(self, request: web.Request) -> web.StreamResponse:
        released = self._released
        if released is not None:
            await released.wait()
        with self._lock:
            self.injected["watch-410"] += 1
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        event = {"type": "ERROR", "object": _status_body(410, "Expired", "injected: too old resource version")}
        await resp.write((json.dumps(event) + "\n").encode())
        await resp.write_eof()
        return resp

    def figures(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": dict(self.requests), "injected": dict(self.injected)}


def upstream_of(kubeconfig: str, scratch: Path) -> tuple[str, ssl.SSLContext]:
    """The API server a kubeconfig names, and a TLS context with its CA and client certificate (inline data)."""
    cfg = yaml.safe_load(Path(kubeconfig).read_text())
    ctx_name = cfg["current-context"]
    context = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in cfg["users"] if u["name"] == context["user"])
    files = {}
    for key in ("certificate-authority-data", "client-certificate-data", "client-key-data"):
        files[key] = scratch / key
        files[key].write_bytes(base64.b64decode(cluster.get(key) or user.get(key)))
    tls = ssl.create_default_context(cafile=str(files["certificate-authority-data"]))
    tls.load_cert_chain(str(files["client-certificate-data"]), str(files["client-key-data"]))
    return str(cluster["server"]), tls
