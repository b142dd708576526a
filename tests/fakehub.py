"""A fake Hugging Face Hub for the push side (create a repo, commit files), on 127.0.0.1.

It stands in for the Hugging Face Hub, which cannot be reached from the test machines (and a test must never write to
it): the REAL ``huggingface_hub`` client talks to it through ``HfApi(endpoint=hub.url, token=hub.token)`` or
``HF_ENDPOINT``. Routes (``{repo}`` is ``<org>/<name>``, models only; the revision is ignored, all lands on ``main``):

- ``POST /api/repos/create``: JSON ``{"name", "organization", "visibility" | "private", "type"}``; 409 if it exists;
- ``GET  /api/whoami-v2``: a fixed user ``fake-user``;
- ``POST /api/validate-yaml``: sent when a README.md is uploaded; accepts any metadata (no errors, no warnings);
- ``GET  /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}``: repo info (id, sha, private, siblings);
- ``POST /api/models/{repo}/preupload/{rev}``: answers ``uploadMode: "regular"`` for every file, with the git blob
  oid of the stored copy (so unchanged files are skipped, as on the Hub): content then comes base64 in the commit,
  so neither the LFS batch API nor Xet is needed, whatever the size, and ``HF_HUB_DISABLE_XET`` need not be set;
- ``POST /api/models/{repo}/commit/{rev}``: the ndjson commit (``header``, ``file``, ``deletedFile``,
  ``deletedFolder``; ``lfsFile`` is refused with 400 since it is never asked for); answers ``commitOid``/``commitUrl``.

Every request must carry ``Authorization: Bearer <token>``, else 401 (so a wrong token fails as on the Hub); the
token each request used ("" if none) is recorded in ``tokens_seen``. Files land in ``<root>/<org>/<name>/<path>``;
``repos`` maps repo id -> ``{"private": bool, "commits": [message, ...]}``. Both are also written, after every
request, to ``<root>/.fakehub.json`` for a hub run as a subprocess:
``python -m tests.fakehub --root DIR [--port N] [--token T]`` prints its URL on stdout once listening.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

Response = tuple[int, dict[str, str], bytes]
USER = "fake-user"
REPO_ROUTE = re.compile(r"/api/models/(?P<repo>[\w.-]+/[\w.-]+)(?:/(?P<action>revision|preupload|commit)/.+)?")


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def error(status: int, message: str, code: str | None = None) -> Response:
    headers = {"Content-Type": "application/json", "X-Error-Message": message}
    if code:
        headers["X-Error-Code"] = code
    return status, headers, json.dumps({"error": message}).encode()


def ok(payload: Any) -> Response:
    return 200, {"Content-Type": "application/json"}, json.dumps(payload).encode()


@dataclass
class FakeHub:
    root: Path
    token: str = "hf_fake"
    repos: dict[str, dict[str, Any]] = field(default_factory=dict)
    tokens_seen: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None, "FakeHub not started"
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self, port: int = 0) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                hub.handle(self)

            def do_POST(self) -> None:
                hub.handle(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.root.mkdir(parents=True, exist_ok=True)
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="fakehub", daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    # -- HTTP

    def handle(self, req: BaseHTTPRequestHandler) -> None:
        body = read_body(req)  # always drained, so a refused request leaves the keep-alive connection usable
        auth = req.headers.get("Authorization") or ""
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else auth
        with self.lock:
            self.tokens_seen.append(token)
            if token != self.token:
                status, headers, payload = error(401, "Invalid credentials in Authorization header")
            else:
                try:
                    status, headers, payload = self.route(req.command, unquote(urlsplit(req.path).path), body)
                except (ValueError, KeyError, TypeError, AttributeError) as e:  # a malformed request
                    status, headers, payload = error(400, f"fake hub: bad request: {e!r}")
            (self.root / ".fakehub.json").write_text(json.dumps({"repos": self.repos, "tokens_seen": self.tokens_seen}))
        req.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(payload))}.items():
            req.send_header(key, value)
        req.end_headers()
        req.wfile.write(payload)

    def route(self, method: str, path: str, body: bytes) -> Response:
        if (method, path) == ("POST", "/api/repos/create"):
            return self.create(json.loads(body or b"{}"))
        if (method, path) == ("GET", "/api/whoami-v2"):
            return ok({"type": "user", "name": USER, "orgs": [], "auth": {"accessToken": {"role": "write"}}})
        if (method, path) == ("POST", "/api/validate-yaml"):  # a README.md's metadata: accepted unchecked
            return ok({"errors": [], "warnings": []})
        match = REPO_ROUTE.fullmatch(path)
        if match is None:
            return error(404, f"fake hub: no route for {method} {path}")
        repo_id, action = match["repo"], match["action"]
        if repo_id not in self.repos:
            return error(404, "Repository not found", "RepoNotFound")
        if method == "GET" and action in (None, "revision"):
            return self.info(repo_id)
        if method == "POST" and action == "preupload":
            return self.preupload(repo_id, json.loads(body))
        if method == "POST" and action == "commit":
            return self.commit(repo_id, body)
        return error(404, f"fake hub: no route for {method} {path}")

    # -- routes

    def create(self, spec: dict[str, Any]) -> Response:
        if spec.get("type", "model") != "model":
            return error(400, "fake hub: model repos only")
        repo_id = f"{spec.get('organization') or USER}/{spec['name']}"
        url = f"{self.url}/{repo_id}"
        if repo_id in self.repos:  # the Hub's 409 carries the url too: create_repo(exist_ok=True) returns it
            status, headers, _ = error(409, "You already created this model repo")
            return status, headers, json.dumps({"error": headers["X-Error-Message"], "url": url}).encode()
        private = spec.get("visibility", "private" if spec.get("private") else "public") == "private"
        self.repos[repo_id] = {"private": private, "commits": []}
        (self.root / repo_id).mkdir(parents=True, exist_ok=True)
        return ok({"url": url, "name": repo_id, "id": repo_id})

    def info(self, repo_id: str) -> Response:
        repo = self.repos[repo_id]
        files = sorted(p.relative_to(self.root / repo_id).as_posix() for p in self.files(repo_id))
        siblings = [{"rfilename": f} for f in files]
        return ok({"id": repo_id, "sha": self.sha(repo_id), "private": repo["private"], "siblings": siblings})

    def preupload(self, repo_id: str, spec: dict[str, Any]) -> Response:
        answers = []
        for f in spec["files"]:
            stored = self.root / repo_id / f["path"]
            oid = git_oid(stored.read_bytes()) if stored.is_file() else None
            answers.append({"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": oid})
        return ok({"files": answers, "commitOid": self.sha(repo_id)})

    def commit(self, repo_id: str, body: bytes) -> Response:
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        message = next((ln["value"].get("summary", "") for ln in lines if ln["key"] == "header"), "")
        base = (self.root / repo_id).resolve()
        ops = [
            (ln["key"], ln["value"], (base / ln["value"]["path"]).resolve()) for ln in lines if ln["key"] != "header"
        ]
        for key, value, target in ops:
            if key not in ("file", "deletedFile", "deletedFolder"):
                return error(400, f"fake hub: unsupported commit operation {key!r} (only regular uploads)")
            if PurePosixPath(value["path"]).is_absolute() or not target.is_relative_to(base) or target == base:
                return error(400, f"fake hub: bad path {value['path']!r}")
        for key, value, target in ops:
            if key == "file":
                target.parent.mkdir(parents=True, exist_ok=True)
                content = value["content"]
                target.write_bytes(base64.b64decode(content) if value.get("encoding") == "base64" else content.encode())
            elif key == "deletedFile":
                target.unlink(missing_ok=True)
            else:
                shutil.rmtree(target, ignore_errors=True)
        self.repos[repo_id]["commits"].append(message)
        oid = self.sha(repo_id)
        return ok({"commitOid": oid, "commitUrl": f"{self.url}/{repo_id}/commit/{oid}", "pullRequestUrl": None})

    # -- helpers

    def files(self, repo_id: str) -> list[Path]:
        return [p for p in (self.root / repo_id).rglob("*") if p.is_file()]

    def sha(self, repo_id: str) -> str:
        """A 40-hex commit id, new after every commit."""
        return hashlib.sha1(f"{repo_id}:{len(self.repos[repo_id]['commits'])}".encode()).hexdigest()


def read_body(req: BaseHTTPRequestHandler) -> bytes:
    if req.headers.get("Transfer-Encoding", "").lower() != "chunked":
        return req.rfile.read(int(req.headers.get("Content-Length") or 0))
    chunks = []
    while size := int(req.rfile.readline().split(b";")[0], 16):
        chunks.append(req.rfile.read(size))
        req.rfile.readline()
    while req.rfile.readline().strip():  # trailers
        pass
    return b"".join(chunks)


@contextmanager
def serve(root: Path | str, token: str = "hf_fake") -> Iterator[FakeHub]:
    """A FakeHub on 127.0.0.1:<free port>, in a thread, stopped on exit."""
    hub = FakeHub(Path(root), token).start()
    try:
        yield hub
    finally:
        hub.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--token", default="hf_fake")
    args = parser.parse_args()
    hub = FakeHub(args.root, args.token).start(args.port)
    print(hub.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        hub.stop()


if __name__ == "__main__":
    main()
