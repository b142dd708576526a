"""``finetune ui``: a web view of FineTuneJobs, served on localhost with the user's own kubeconfig.

The server holds no credentials of its own: every request is answered through the Python client
(finetune_operator.client) with the user's kubeconfig and RBAC, as ``finetune status`` would. It serves a page that
lists the jobs of every namespace the user can read (state, progress, ETA, MFU) and a page per job with its loss,
evaluation-loss, throughput and learning-rate curves across attempts (from ``status.history``; each new attempt, a
gang restart, is marked), its conditions, events and the tail of rank 0's log. The page and its charting script
ship in the package (``ui_static/``): nothing is fetched from the internet, and the standard library's HTTP server
is the only server-side dependency. Read only: the page changes nothing.

The views are pure functions of the API objects (:func:`job_row`, :func:`job_detail`), tested without a server; the
handler only routes. On a loopback address it answers only requests whose Host header is this machine's (no DNS
rebinding of the user's credentials to another site); on an address other machines reach (``--address 0.0.0.0``),
where any client may send any Host, only requests carrying the random token of the URL it printed. The jobs page
reads at most ``JOBS_SHOWN`` jobs per list and rank 0's log tail at most ``LOG_TAIL_BYTES``, and the page asks again
only after an answer: a tenant's huge log line or thousands of jobs never pin the viewer's machine.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import threading
from datetime import UTC, datetime
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote

from finetune_operator import render
from finetune_operator.client import FineTuneClient, Job, UserError
from finetune_operator.history import series
from finetune_operator.k8s import ApiError

log = logging.getLogger(__name__)

STATIC = {"app.js": "text/javascript", "chart.js": "text/javascript", "style.css": "text/css"}
LOG_TAIL_LINES = 60
JOBS_SHOWN = 500  # rows of the jobs page per list: one request each, refreshed every 5 s
# Scripts, styles and data only from this server: a log line or an event message can never run as script.
CSP = "default-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
# A namespace is a DNS-1123 label, a job name a DNS-1123 subdomain: never "." or "..", which the HTTP client would
# resolve as path segments (a job's read becoming a cluster-wide list).
_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = rf"{_LABEL}(?:\.{_LABEL})*"
_JOB_PATH = re.compile(rf"^/api/jobs/({_LABEL})/({_SUBDOMAIN})$")
_PAGE_PATH = re.compile(rf"^/(jobs/{_LABEL}/{_SUBDOMAIN})?$")
LOG_TAIL_BYTES = 64 * 1024  # the kubelet cuts rank 0's tail here: one huge line costs no more


def job_row(job: Job, now: datetime) -> dict[str, Any]:
    """One row of the jobs page."""
    prog, st = job.progress, job.status
    step, total = prog.get("step"), prog.get("totalSteps")
    why, message = job.reason()
    return {
        "namespace": job.namespace,
        "name": job.name,
        "state": job.state,
        "reason": why,
        "message": message,
        "attempt": job.attempt,
        "restarts": int(st.get("restarts", 0)),
        "nodes": st.get("nodes") or f"0/{(job.raw.get('spec') or {}).get('nodes', 1)}",
        "step": step,
        "totalSteps": total,
        "percent": round(100 * step / total, 1) if step is not None and total else None,
        "eta": prog.get("eta"),
        "mfu": prog.get("mfu"),
        "loss": prog.get("loss"),
        "samplesPerSecond": prog.get("samplesPerSecond"),
        "age": render.age(job.raw["metadata"].get("creationTimestamp"), now),
    }


def attempt_marks(curves: dict[str, list[tuple[int, int, float]]]) -> list[dict[str, int]]:
    """Where each attempt after the first starts (its first step in any series): the restarts on the curves."""
    first: dict[int, int] = {}
    for points in curves.values():
        for attempt, step, _ in points:
            first[attempt] = min(step, first.get(attempt, step))
    return [{"attempt": a, "step": s} for a, s in sorted(first.items())[1:]]


def job_detail(
    job: Job, events: list[dict[str, Any]], log_tail: list[str], log_note: str, now: datetime
) -> dict[str, Any]:
    """Everything the job page shows."""
    found = series(job.status.get("history"))
    return {
        **job_row(job, now),
        "progressLine": render.progress_line(job.progress),
        "failure": job.status.get("failure"),
        "curves": {k: [[a, s, v] for a, s, v in points] for k, points in found.items()},
        "attempts": attempt_marks(found),
        "conditions": [
            {
                "type": c.get("type"),
                "status": c.get("status"),
                "reason": c.get("reason"),
                "message": c.get("message"),
                "age": render.age(c.get("lastTransitionTime"), now),
            }
            for c in job.conditions
        ],
        "events": [
            {
                "type": e.get("type"),
                "reason": e.get("reason"),
                "message": e.get("message"),
                "age": render.age(e.get("lastTimestamp") or e.get("eventTime"), now),
                "count": e.get("count", 1),
            }
            for e in events[-20:]
        ],
        "log": {"lines": log_tail, "note": log_note},
    }


class Views:
    """What the pages ask for, through the client (the user's kubeconfig and RBAC). ``namespaces``: those to list
    when the user may not list FineTuneJobs cluster-wide (default: the client's)."""

    def __init__(self, client: FineTuneClient, namespaces: tuple[str, ...] = ()) -> None:
        self.client = client
        self.namespaces = namespaces or (client.namespace,)

    def jobs(self) -> dict[str, Any]:
        """The jobs page: at most JOBS_SHOWN jobs per list, in one request each (a refresh never reads thousands of
        jobs, each with its history), and a note saying how many more there are."""
        now = datetime.now(UTC)
        notes: list[str] = []
        more: list[int | None] = []
        try:
            jobs, left = self.client.first_jobs(JOBS_SHOWN, all_namespaces=True)
            more.append(left)
            scope = "all namespaces"
        except ApiError as e:
            if e.code != 403:
                raise
            jobs, readable = [], []
            for ns in self.namespaces:
                try:
                    found, left = FineTuneClient(ns, kube=self.client.kube).first_jobs(JOBS_SHOWN)
                    jobs += found
                    more.append(left)
                    readable.append(ns)
                except ApiError as ns_error:
                    if ns_error.code != 403:
                        raise
                    notes.append(f"namespace {ns}: not allowed to list FineTuneJobs")
            scope = "namespace " + ", ".join(readable) if readable else "no namespace"
            notes.insert(0, "listing FineTuneJobs in every namespace is not allowed: showing " + scope)
        if any(m != 0 for m in more):
            count = "more" if None in more else f"{sum(m or 0 for m in more)} more"
            notes.append(
                f"showing the first {JOBS_SHOWN} FineTuneJobs by namespace and name ({count} not shown): open one at "
                "/jobs/<namespace>/<name>, or use finetune list"
            )
        return {"scope": scope, "notes": notes, "jobs": [job_row(j, now) for j in jobs]}

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        ns_client = FineTuneClient(namespace, kube=self.client.kube)
        job = ns_client.get(name)
        lines: list[str] = []
        note = ""
        try:
            pods = ns_client.rank_pods(name, ranks=[0], job=job)
            lines = list(ns_client.log_lines(pods[0], tail=LOG_TAIL_LINES, limit_bytes=LOG_TAIL_BYTES))
            note = f"the last {LOG_TAIL_LINES} lines of {pods[0]} (attempt {job.attempt}, rank 0)"
        except UserError as e:
            note = str(e)
        except ApiError as e:  # not started yet, no pods/log permission, ...
            note = f"rank 0's log: {e.message}"
        return job_detail(job, ns_client.events(name), lines, note, datetime.now(UTC))


def _static(name: str) -> bytes:
    return resources.files("finetune_operator").joinpath("ui_static", name).read_bytes()


TOKEN_COOKIE = "finetune_ui_token"


def _loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address == "localhost"
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def make_handler(views: Views, allowed_hosts: set[str], token: str | None = None) -> type[BaseHTTPRequestHandler]:
    """``token`` None (a loopback address): only requests whose Host is this machine's (no DNS rebinding). Otherwise
    (``--address`` reachable from other machines, where any client may send any Host) every request must carry the
    token: in the URL the command printed (``?token=``, kept as an HttpOnly, SameSite=Strict cookie for the page's own
    requests) or in that cookie."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "finetune-ui"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _send(self, status: int, body: bytes, content_type: str, cookie: str | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Security-Policy", CSP)
            if cookie:
                self.send_header("Set-Cookie", cookie)
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj: Any) -> None:
            self._send(status, json.dumps(obj).encode(), "application/json")

        def _allowed(self, query: str) -> tuple[bool, str | None]:
            """Whether to answer, and the cookie to set (the token arrived in the URL)."""
            if token is None:
                host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]")
                return host in allowed_hosts, None
            given = (parse_qs(query).get("token") or [""])[0]
            if given and hmac.compare_digest(given.encode(), token.encode()):
                return True, f"{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
            jar = SimpleCookie()
            with contextlib.suppress(CookieError):
                jar.load(self.headers.get("Cookie") or "")
            held = jar[TOKEN_COOKIE].value if TOKEN_COOKIE in jar else ""
            return bool(held) and hmac.compare_digest(held.encode(), token.encode()), None

        def do_GET(self) -> None:
            raw_path, _, query = self.path.partition("?")
            allowed, cookie = self._allowed(query)
            if not allowed:
                why = (
                    b"finetune ui answers only on this machine's address\n"
                    if token is None
                    else b"finetune ui: open the URL it printed, with its token\n"
                )
                self._send(HTTPStatus.FORBIDDEN, why, "text/plain")
                return
            path = unquote(raw_path)
            try:
                if path == "/api/jobs":
                    self._json(HTTPStatus.OK, views.jobs())
                elif m := _JOB_PATH.match(path):
                    self._json(HTTPStatus.OK, views.job(m.group(1), m.group(2)))
                elif path.startswith("/static/") and path.removeprefix("/static/") in STATIC:
                    name = path.removeprefix("/static/")
                    self._send(HTTPStatus.OK, _static(name), STATIC[name] + "; charset=utf-8")
                elif _PAGE_PATH.match(path):
                    self._send(HTTPStatus.OK, _static("index.html"), "text/html; charset=utf-8", cookie)
                else:
                    self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {path}"})
            except UserError as e:
                self._json(HTTPStatus.NOT_FOUND, {"error": str(e)})
            except ApiError as e:
                self._json(HTTPStatus.BAD_GATEWAY, {"error": f"the API server answered {e}"})

    return Handler


class UiServer:
    """The HTTP server on ``address:port`` (port 0: any free one), in a thread or in the foreground."""

    def __init__(self, views: Views, *, address: str = "127.0.0.1", port: int = 8080) -> None:
        allowed = {"localhost", "127.0.0.1", "::1", address}
        # Reachable from other machines: the Host check protects nothing there, a token in the printed URL does.
        self.token = None if _loopback(address) else secrets.token_urlsafe(24)
        self.httpd = ThreadingHTTPServer((address, port), make_handler(views, allowed, self.token))
        self.httpd.daemon_threads = True
        host = f"[{address}]" if ":" in address else address
        self.url = f"http://{host}:{self.httpd.server_address[1]}/" + (f"?token={self.token}" if self.token else "")
        self._thread: threading.Thread | None = None

    def start(self) -> UiServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="finetune-ui")
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
