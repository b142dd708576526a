"""``finetune ui``: a web view of FineTuneJobs, served on localhost with the user's own kubeconfig.

The server holds no credentials of its own: every request is answered through the Python client
(finetune_operator.client) with the user's kubeconfig and RBAC, as ``finetune status`` would. It serves a page that
lists the jobs of every namespace the user can read (state, progress, ETA, MFU) and a page per job with its loss,
evaluation-loss, throughput and learning-rate curves across attempts (from ``status.history``; each new attempt, a
gang restart, is marked), its conditions, events and the tail of rank 0's log. The page and its charting script
ship in the package (``ui_static/``): nothing is fetched from the internet, and the standard library's HTTP server
is the only server-side dependency. Read only: the page changes nothing.

The views are pure functions of the API objects (:func:`job_row`, :func:`job_detail`), tested without a server; the
handler only routes. It answers only requests whose Host header is this machine's (no DNS rebinding of the
user's credentials to another site).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import unquote

from finetune_operator import render
from finetune_operator.client import FineTuneClient, Job, UserError
from finetune_operator.history import series
from finetune_operator.k8s import ApiError

log = logging.getLogger(__name__)

STATIC = {"app.js": "text/javascript", "chart.js": "text/javascript", "style.css": "text/css"}
LOG_TAIL_LINES = 60
# Scripts, styles and data only from this server: a log line or an event message can never run as script.
CSP = "default-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
_JOB_PATH = re.compile(r"^/api/jobs/([a-z0-9.-]+)/([a-z0-9.-]+)$")
_PAGE_PATH = re.compile(r"^/(jobs/[a-z0-9.-]+/[a-z0-9.-]+)?$")


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
        now = datetime.now(UTC)
        notes: list[str] = []
        try:
            jobs = self.client.list_jobs(all_namespaces=True)
            scope = "all namespaces"
        except ApiError as e:
            if e.code != 403:
                raise
            jobs, readable = [], []
            for ns in self.namespaces:
                try:
                    jobs += FineTuneClient(ns, kube=self.client.kube).list_jobs()
                    readable.append(ns)
                except ApiError as ns_error:
                    if ns_error.code != 403:
                        raise
                    notes.append(f"namespace {ns}: not allowed to list FineTuneJobs")
            scope = "namespace " + ", ".join(readable) if readable else "no namespace"
            notes.insert(0, "listing FineTuneJobs in every namespace is not allowed: showing " + scope)
        return {"scope": scope, "notes": notes, "jobs": [job_row(j, now) for j in jobs]}

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        ns_client = FineTuneClient(namespace, kube=self.client.kube)
        job = ns_client.get(name)
        lines: list[str] = []
        note = ""
        try:
            pods = ns_client.rank_pods(name, ranks=[0], job=job)
            lines = list(ns_client.log_lines(pods[0], tail=LOG_TAIL_LINES))
            note = f"the last {LOG_TAIL_LINES} lines of {pods[0]} (attempt {job.attempt}, rank 0)"
        except UserError as e:
            note = str(e)
        except ApiError as e:  # not started yet, no pods/log permission, ...
            note = f"rank 0's log: {e.message}"
        return job_detail(job, ns_client.events(name), lines, note, datetime.now(UTC))


def _static(name: str) -> bytes:
    return resources.files("finetune_operator").joinpath("ui_static", name).read_bytes()


def make_handler(views: Views, allowed_hosts: set[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "finetune-ui"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Security-Policy", CSP)
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj: Any) -> None:
            self._send(status, json.dumps(obj).encode(), "application/json")

        def do_GET(self) -> None:
            host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]")
            if host not in allowed_hosts:
                self._send(HTTPStatus.FORBIDDEN, b"finetune ui answers only on this machine's address\n", "text/plain")
                return
            path = unquote(self.path.split("?", 1)[0])
            try:
                if path == "/api/jobs":
                    self._json(HTTPStatus.OK, views.jobs())
                elif m := _JOB_PATH.match(path):
                    self._json(HTTPStatus.OK, views.job(m.group(1), m.group(2)))
                elif path.startswith("/static/") and path.removeprefix("/static/") in STATIC:
                    name = path.removeprefix("/static/")
                    self._send(HTTPStatus.OK, _static(name), STATIC[name] + "; charset=utf-8")
                elif _PAGE_PATH.match(path):
                    self._send(HTTPStatus.OK, _static("index.html"), "text/html; charset=utf-8")
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
        self.httpd = ThreadingHTTPServer((address, port), make_handler(views, allowed))
        self.httpd.daemon_threads = True
        host = f"[{address}]" if ":" in address else address
        self.url = f"http://{host}:{self.httpd.server_address[1]}/"
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
