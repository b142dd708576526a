"""The shared Hugging Face cache (config ``cache``): node rank 0 fetches Hub inputs once, the other ranks wait for
its ready marker, and every worker runs with the Hub offline.

The Hugging Face Hub is MOCKED here, by ``FakeHub``: a threaded HTTP server in the test process, reached through
``HF_ENDPOINT`` exactly as a Hub mirror in an air-gapped cluster would be. These machines have no route to
huggingface.co (and a test must never depend on it, nor on real weights), and only a server we own can count
requests, which is what these tests are about: one download per job, none per rank, none from the workers.
FakeHub implements just what huggingface_hub 0.36 and datasets 3.6 call for ``snapshot_download`` and
``load_dataset`` (repo info, tree, paths-info, resolve with HEAD and GET), and answers unknown repos, revisions
and files with the Hub's 404 + ``X-Error-Code`` headers. It serves the tiny BERT of ``examples/tiny`` with
random weights built from its config, and the tiny dataset of ``examples/tiny/data``.

Everything else is real: the launcher, torchrun, gloo on 127.0.0.1, transformers and datasets reading the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from finetune_trainer import hfcache, launcher
from finetune_trainer.config import parse_config
from finetune_trainer.env import RunEnv
from finetune_trainer.errors import ConfigError, RendezvousTimeout

from tests.trainer.helpers import REPO, TINY, Node, deep_merge, free_port, poll, read_json, tiny_config

pytestmark = pytest.mark.trainer

RUN_TIMEOUT = 420
MODEL = "tiny-org/tiny-bert"
DATASET = "tiny-org/tiny-sentiment"
MODEL_SHA = hashlib.sha1(b"model").hexdigest()
DATASET_SHA = hashlib.sha1(b"dataset").hexdigest()
DECOYS = ("flax_model.msgpack", "pytorch_model.bin", "onnx/model.onnx")  # never read when safetensors exist
# What the workers need, all of it: the model files and the two split files plus the dataset card.
WANTED = {f"{MODEL}/{f}" for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                   "special_tokens_map.json")} | {
    f"{DATASET}/{f}" for f in ("README.md", "data/train.jsonl", "data/validation.jsonl")
}  # fmt: skip
DATASET_CARD = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train.jsonl
  - split: validation
    path: data/validation.jsonl
---
# tiny-sentiment
"""


# ---------------------------------------------------------------------------------------------------- fake hub


@dataclass
class FakeRepo:
    sha: str
    files: dict[str, bytes]

    def dirs(self) -> set[str]:
        return {"/".join(p.split("/")[:i]) for p in self.files for i in range(1, p.count("/") + 1)}

    def entry(self, path: str) -> dict[str, Any]:
        if path in self.files:
            oid = hashlib.sha1(self.files[path]).hexdigest()
            return {"type": "file", "oid": oid, "size": len(self.files[path]), "path": path}
        return {"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "path": path}


@dataclass(frozen=True)
class Hit:
    time: float
    method: str
    path: str
    status: int


@dataclass
class FakeHub:
    """The Hub's read API for a few repos, counting every request (``hits``)."""

    repos: dict[tuple[str, str], FakeRepo]  # (kind "models" | "datasets", repo id)
    hits: list[Hit] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                hub.handle(self, "GET")

            def do_HEAD(self) -> None:
                hub.handle(self, "HEAD")

            def do_POST(self) -> None:
                hub.handle(self, "POST")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def snapshot(self) -> list[Hit]:
        with self.lock:
            return list(self.hits)

    def downloads(self, hits: list[Hit] | None = None) -> dict[str, int]:
        """GETs of file contents, by ``<repo id>/<file>``."""
        counts: dict[str, int] = {}
        for h in self.snapshot() if hits is None else hits:
            if h.method == "GET" and "/resolve/" in h.path and h.status == 200:
                repo, _, rest = h.path.removeprefix("/datasets/").lstrip("/").partition("/resolve/")
                name = f"{repo}/{rest.split('/', 1)[1]}"
                counts[name] = counts.get(name, 0) + 1
        return counts

    # -- routing

    def handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(req.path)
        path = unquote(url.path)
        query = parse_qs(url.query)
        body = b""
        if method == "POST":
            body = req.rfile.read(int(req.headers.get("Content-Length") or 0))
        status, headers, payload = self.route(method, path, query, body)
        with self.lock:
            self.hits.append(Hit(time.time(), method, path, status))
        req.send_response(status)
        for k, v in headers.items():
            req.send_header(k, v)
        req.send_header("Content-Length", str(len(payload)))
        req.end_headers()
        if method != "HEAD":
            req.wfile.write(payload)

    def route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> tuple[int, dict, bytes]:
        if path.startswith("/api/models/") or path.startswith("/api/datasets/"):
            kind, _, rest = path.removeprefix("/api/").partition("/")
            return self.api(kind, rest, method, query, body)
        kind = "datasets" if path.startswith("/datasets/") else "models"
        repo_id, sep, rest = path.removeprefix("/datasets/").lstrip("/").partition("/resolve/")
        if sep and method in ("GET", "HEAD"):
            revision, _, file = rest.partition("/")
            return self.resolve(kind, repo_id, revision, file)
        return self.error(404, "EntryNotFound", f"fake hub: no route for {method} {path}")

    @staticmethod
    def error(status: int, code: str, message: str) -> tuple[int, dict, bytes]:
        return (
            status,
            {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"},
            (json.dumps({"error": message}).encode()),
        )

    @staticmethod
    def json(payload: Any) -> tuple[int, dict, bytes]:
        return 200, {"Content-Type": "application/json"}, json.dumps(payload).encode()

    def find(self, kind: str, repo_id: str, revision: str) -> FakeRepo | tuple[int, dict, bytes]:
        repo = self.repos.get((kind, repo_id))
        if repo is None:
            return self.error(404, "RepoNotFound", "Repository not found")
        if revision not in ("main", repo.sha):
            return self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return repo

    def api(self, kind: str, rest: str, method: str, query: dict, body: bytes) -> tuple[int, dict, bytes]:
        # /api/{kind}/{org}/{name}[/revision/{rev} | /tree/{rev}[/{path}] | /paths-info/{rev}]
        parts = rest.split("/")
        repo_id, action, tail = "/".join(parts[:2]), (parts[2] if len(parts) > 2 else ""), parts[3:]
        revision = tail[0] if tail else "main"
        repo = self.find(kind, repo_id, revision)
        if not isinstance(repo, FakeRepo):
            return repo
        if action in ("", "revision") and method == "GET":
            siblings = [{"rfilename": p} for p in sorted(repo.files)]
            return self.json({"id": repo_id, "sha": repo.sha, "siblings": siblings, "private": False,
                              "disabled": False, "gated": False, "tags": [], "downloads": 0, "likes": 0})  # fmt: skip
        if action == "tree" and method == "GET":
            prefix = "/".join(tail[1:])
            recursive = query.get("recursive", ["False"])[0].lower() == "true"
            names = sorted(set(repo.files) | repo.dirs())
            inside = [n for n in names if not prefix or n.startswith(prefix + "/")]
            if prefix and prefix not in repo.dirs():
                return self.error(404, "EntryNotFound", f"{prefix} does not exist")
            depth = prefix.count("/") + 1 if prefix else 0
            return self.json([repo.entry(n) for n in inside if recursive or n.count("/") == depth])
        if action == "paths-info" and method == "POST":
            wanted = parse_qs(body.decode()).get("paths", [])
            known = set(repo.files) | repo.dirs()
            return self.json([repo.entry(p) for p in wanted if p in known])
        return self.error(404, "EntryNotFound", f"fake hub: unsupported {method} {action}")

    def resolve(self, kind: str, repo_id: str, revision: str, file: str) -> tuple[int, dict, bytes]:
        repo = self.find(kind, repo_id, revision)
        if not isinstance(repo, FakeRepo):
            return repo
        if file not in repo.files:
            return self.error(404, "EntryNotFound", f"{file} does not exist on {revision}")
        content = repo.files[file]
        etag = hashlib.sha256(content).hexdigest()
        return (
            200,
            {"X-Repo-Commit": repo.sha, "ETag": f'"{etag}"', "Content-Type": "application/octet-stream"},
            (content),
        )


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], FakeRepo]:
    """The tiny BERT (random weights from its config, as safetensors) and the tiny dataset, as Hub repos."""
    import transformers

    bert = TINY / "bert"
    out = tmp_path_factory.mktemp("tiny-bert")
    config = transformers.AutoConfig.from_pretrained(bert, num_labels=2)
    transformers.set_seed(0)
    transformers.AutoModelForSequenceClassification.from_config(config).save_pretrained(out, safe_serialization=True)
    model_files = {p.name: p.read_bytes() for p in bert.iterdir()}
    model_files.update({p.name: p.read_bytes() for p in out.iterdir()})  # config.json with num_labels, weights
    model_files.update({d: b"decoy: never downloaded" for d in DECOYS})
    data = TINY / "data"
    dataset_files = {
        "README.md": DATASET_CARD.encode(),
        "data/train.jsonl": (data / "train.jsonl").read_bytes(),
        "data/validation.jsonl": (data / "eval.jsonl").read_bytes(),
    }
    return {
        ("models", MODEL): FakeRepo(MODEL_SHA, model_files),
        ("datasets", DATASET): FakeRepo(DATASET_SHA, dataset_files),
    }


@pytest.fixture
def hub(repos: dict[tuple[str, str], FakeRepo]) -> Iterator[FakeHub]:
    h = FakeHub(repos).start()
    yield h
    h.stop()


def hub_env(endpoint: str) -> dict[str, str]:
    """The launcher online (helpers.Node defaults to offline), pointed at the fake hub; nothing leaves 127.0.0.1."""
    return {
        "HF_ENDPOINT": endpoint,
        "HF_HUB_OFFLINE": "0",
        "HF_DATASETS_OFFLINE": "0",
        "HF_UPDATE_DOWNLOAD_COUNTS": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }


def hub_config(tmp: Path, cache: Path | None, **over: Any) -> dict[str, Any]:
    cfg = tiny_config(
        tmp / "out",
        acceleration="none",
        model={"name": MODEL, "path": None, "initFromConfig": False},
        dataset={"name": DATASET, "path": None, "evalSplit": "validation"},
        training={"maxSteps": 6, "checkpointEverySteps": 6, "evaluation": {"strategy": "steps", "everySteps": 6},
                  "extraArgs": {"logging_steps": 2}},
        cache={"path": str(cache)} if cache else None,
    )  # fmt: skip
    cfg["model"]["path"] = None
    cfg["dataset"]["path"] = None
    return deep_merge(cfg, over)


@dataclass
class CacheStep:
    """``python -m finetune_trainer.hfcache`` (the launcher's cache step alone) with the env contract."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def finish(self, timeout: float = 180) -> tuple[int, str]:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"hfcache did not finish in {timeout}s:\n{self.log()}") from None
        return self.proc.returncode, self.log()


def run_hfcache(
    tmp: Path, cfg: dict[str, Any], env: dict[str, str], *, node_rank: int = 0, nnodes: int = 1
) -> CacheStep:
    path = tmp / f"config-hfcache-{node_rank}.json"
    path.write_text(json.dumps(cfg))
    full = dict(os.environ)
    full.update(env)
    full.update({"FINETUNE_CONFIG": str(path), "PET_NNODES": str(nnodes), "PET_NODE_RANK": str(node_rank),
                 "FINETUNE_TERMINATION_LOG": str(tmp / f"termination-hfcache-{node_rank}.json")})  # fmt: skip
    full.pop("WORLD_SIZE", None)
    log_path = tmp / f"hfcache-{node_rank}-{time.monotonic_ns()}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "finetune_trainer.hfcache"], cwd=REPO, env=full,
                                stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    return CacheStep(proc, log_path)


# ---------------------------------------------------------------------------------------------------- pure parts


def markers(cache: Path) -> list[Path]:
    return sorted((cache / hfcache.MARKER_DIR).glob("*.json"))


def make_plan(**over: Any) -> hfcache.FetchPlan:
    base: dict[str, Any] = {
        "model": MODEL,
        "revision": "main",
        "weights": True,
        "dataset": DATASET,
        "dataset_config": None,
        "splits": ("train",),
        "libraries": (("datasets", "3.6.0"),),
    }
    base.update(over)
    return hfcache.FetchPlan(**base)


@pytest.mark.parametrize(
    "change",
    [
        {"revision": "v2"},
        {"weights": False},
        {"dataset_config": "small"},
        {"splits": ("train", "validation")},
        {"model": "tiny-org/other"},
        {"dataset": None, "splits": ()},
        {"libraries": (("datasets", "4.0.0"),)},
    ],
    ids=["revision", "weights", "dataset-config", "splits", "model", "no-dataset", "library-version"],
)
def test_marker_key_changes_with_what_is_fetched(change: dict[str, Any]) -> None:
    assert make_plan(**change).digest() != make_plan().digest()
    assert hfcache.marker_path("/c", make_plan(**change)) != hfcache.marker_path("/c", make_plan())


def test_marker_key_is_stable_and_ignores_split_order() -> None:
    assert make_plan().digest() == make_plan().digest()
    assert make_plan(splits=("a", "b")).digest() == make_plan(splits=("b", "a")).digest()
    path = hfcache.marker_path("/cache/huggingface", make_plan())
    assert path == f"/cache/huggingface/finetune-ready/{make_plan().digest()}.json"


def test_plan_follows_the_config(tmp_path: Path) -> None:
    cfg = parse_config(hub_config(tmp_path, tmp_path / "cache", model={"revision": None}))
    p = hfcache.plan(cfg, libraries=())
    assert p == hfcache.FetchPlan(MODEL, "main", True, DATASET, None, ("train", "validation"), ())
    no_eval = parse_config(hub_config(tmp_path, None, training={"evaluation": {"strategy": "no"}}))
    assert hfcache.plan(no_eval, libraries=()).splits == ("train",)  # type: ignore[union-attr]
    local = parse_config(tiny_config(tmp_path / "out", cache={"path": "/c"}))
    assert hfcache.plan(local) is None  # nothing from the Hub: nothing to share
    scratch = parse_config(hub_config(tmp_path, None, model={"initFromConfig": True, "revision": "v1"}))
    assert hfcache.plan(scratch, libraries=()).weights is False  # type: ignore[union-attr]


def test_wait_for_marker_times_out_naming_marker_and_rank_0(tmp_path: Path) -> None:
    now = [0.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    path = str(tmp_path / "finetune-ready" / "x.json")
    with pytest.raises(RendezvousTimeout) as e:
        hfcache.wait_for_marker(path, make_plan(), timeout_s=30, clock=lambda: now[0], sleep=sleep)
    assert path in str(e.value) and "rank 0" in str(e.value) and "spec.rendezvousTimeoutSeconds" in str(e.value)
    assert now[0] == pytest.approx(30) and max(sleeps) <= 5.0


def test_wait_for_marker_waits_while_rank_0_downloads(tmp_path: Path) -> None:
    """A first download longer than the timeout is not a failure while rank 0's heartbeat is fresh; once the
    heartbeat stops (rank 0 hung or gone), the timeout runs from the last sign of life."""
    path = str(tmp_path / "finetune-ready" / "x.json")
    os.makedirs(os.path.dirname(path))
    beat = hfcache.heartbeat_path(path)
    now = [0.0]  # both clocks: monotonic and wall

    def sleep(s: float) -> None:
        now[0] += s
        if now[0] < 100:  # rank 0 beats for 100 s, then stops
            open(beat, "a").close()
            os.utime(beat, (now[0], now[0]))

    with pytest.raises(RendezvousTimeout):
        hfcache.wait_for_marker(path, make_plan(), timeout_s=30, clock=lambda: now[0], sleep=sleep, wall=lambda: now[0])
    assert 100 + 30 <= now[0] <= 100 + hfcache.HEARTBEAT_FRESH + 30 + 5


def test_heartbeat_touches_while_running_and_is_removed(tmp_path: Path) -> None:
    beat = str(tmp_path / "m.json.fetching")
    with hfcache.heartbeat(beat, every=0.05):
        first = poll(
            lambda: os.path.exists(beat) and os.path.getmtime(beat),
            timeout=10,
            interval=0.01,
            what="the first heartbeat",
        )
        poll(lambda: os.path.getmtime(beat) > first, timeout=10, interval=0.01, what="a later heartbeat")
    assert not os.path.exists(beat)


def test_wait_for_marker_returns_once_rank_0_wrote_it(tmp_path: Path) -> None:
    path = str(tmp_path / "finetune-ready" / "x.json")
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s
        if now[0] > 1:
            hfcache.write_marker(path, make_plan(), {})

    waited = hfcache.wait_for_marker(path, make_plan(), timeout_s=30, clock=lambda: now[0], sleep=sleep)
    assert 1 < waited < 30


def test_marker_is_written_atomically_and_checked_against_the_key(tmp_path: Path, monkeypatch) -> None:
    path = str(tmp_path / "ready" / "m.json")
    hfcache.write_marker(path, make_plan(), {"model_snapshot": "/x"})
    assert hfcache.read_marker(path, make_plan())["fetched"] == {"model_snapshot": "/x"}  # type: ignore[index]
    assert hfcache.read_marker(path, make_plan(revision="v2")) is None  # same file, other inputs: not ready
    assert os.listdir(tmp_path / "ready") == ["m.json"]  # no temp file left behind

    other = str(tmp_path / "ready" / "n.json")

    def crash(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(hfcache.os, "replace", crash)
    with pytest.raises(OSError):
        hfcache.write_marker(other, make_plan(), {})
    assert os.listdir(tmp_path / "ready") == ["m.json"]  # a failed write leaves no marker, not half of one


def test_prepare_fetches_on_rank_0_only_and_once(tmp_path: Path) -> None:
    cfg = parse_config(hub_config(tmp_path, tmp_path / "cache", preflight={"timeoutSeconds": 1}))
    calls: list[hfcache.FetchPlan] = []

    def fetcher(p: hfcache.FetchPlan, cache_path: str) -> dict[str, Any]:
        calls.append(p)
        return {"fake": True}

    rank = {r: RunEnv(2, 1, r, "127.0.0.1", 29500, "j", "ns", 0) for r in (0, 1)}
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with pytest.raises(RendezvousTimeout):  # rank 1 before rank 0 wrote the marker
        hfcache.prepare(cfg, rank[1], fetcher=fetcher, clock=lambda: now[0], sleep=sleep)
    marker = hfcache.prepare(cfg, rank[0], fetcher=fetcher)
    assert marker and len(calls) == 1 and calls[0].dataset == DATASET
    assert hfcache.prepare(cfg, rank[0], fetcher=fetcher) == marker and len(calls) == 1  # a gang restart
    assert hfcache.prepare(cfg, rank[1], fetcher=fetcher) == marker and len(calls) == 1
    assert hfcache.prepare(parse_config(hub_config(tmp_path, None)), rank[0], fetcher=fetcher) is None  # no cache


def test_unwritable_cache_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    cfg = parse_config(hub_config(tmp_path, tmp_path / "file" / "cache"))
    with pytest.raises(ConfigError) as e:
        hfcache.prepare(cfg, RunEnv(1, 1, 0, "127.0.0.1", 29500, "j", "ns", 0), fetcher=lambda p, c: {})
    assert e.value.field == "cache.path"


def hub_http_error(cls: type, message: str, status: int) -> Exception:
    """An HTTP error of huggingface_hub as it raises it: 2.x errors carry their (httpx2) response."""
    import inspect

    if "response" not in inspect.signature(cls.__init__).parameters:
        return cls(message)
    import httpx2

    request = httpx2.Request("GET", "https://huggingface.co/api/models/x")
    return cls(message, response=httpx2.Response(status, request=request))


def test_errors_split_into_config_errors_and_retryable_ones() -> None:
    from datasets.exceptions import DatasetNotFoundError
    from huggingface_hub import errors as hub

    repo_missing = hub_http_error(hub.RepositoryNotFoundError, "404 Repository Not Found", 404)
    missing = hfcache.classify(repo_missing, "model.name", "model 'x'")
    assert isinstance(missing, ConfigError) and missing.field == "model.name" and "spec.model.name" in str(missing)
    gated = hfcache.classify(hub_http_error(hub.GatedRepoError, "403 gated", 403), "model.name", "model 'x'")
    assert isinstance(gated, ConfigError) and "HF_TOKEN" in str(gated)
    revision = hub_http_error(hub.RevisionNotFoundError, "rev", 404)
    assert isinstance(hfcache.classify(revision, "model.name", "m"), ConfigError)
    assert isinstance(hfcache.classify(DatasetNotFoundError("gone"), "dataset.name", "d"), ConfigError)
    # "Not cached and no network" subclasses EntryNotFoundError, but it is the network: retried, not exit 78.
    offline = hfcache.classify(hub.LocalEntryNotFoundError("check your connection"), "model.name", "m")
    assert isinstance(offline, hfcache.HubUnavailable)
    assert isinstance(hfcache.classify(ConnectionError("refused"), "dataset.name", "d"), hfcache.HubUnavailable)


def test_worker_env_goes_offline_on_the_cache_and_keeps_endpoint_and_token(monkeypatch) -> None:
    run = RunEnv(2, 1, 1, "10.0.0.1", 29500, "j", "ns", 0)
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example")
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    monkeypatch.setenv("TRANSFORMERS_CACHE", "/elsewhere")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    plain = launcher.worker_env(run, 0.0, "/e.json")
    assert "HF_HUB_OFFLINE" not in plain and plain["TRANSFORMERS_CACHE"] == "/elsewhere"  # no cache: as before
    env = launcher.worker_env(run, 0.0, "/e.json", cache_path="/cache/huggingface")
    assert {k: env[k] for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")} == dict.fromkeys(
        ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"), "1"
    )
    assert env["HF_HOME"] == "/cache/huggingface" and env["HF_HUB_CACHE"] == "/cache/huggingface/hub"
    assert env["HF_DATASETS_CACHE"] == "/cache/huggingface/datasets" and "TRANSFORMERS_CACHE" not in env
    assert env["HF_ENDPOINT"] == "https://mirror.example" and env["HF_TOKEN"] == "hf_x"


@pytest.mark.parametrize(
    ("cache", "expected"),
    [(None, None), ({"path": "/cache/huggingface"}, "/cache/huggingface"), ("absent", None)],
    ids=["null", "set", "absent"],
)
def test_config_cache_is_optional(tmp_path: Path, cache: Any, expected: str | None) -> None:
    raw = tiny_config(tmp_path)
    if cache != "absent":
        raw["cache"] = cache
    assert parse_config(raw).cache_path == expected


@pytest.mark.parametrize("cache", [{}, {"path": ""}, {"path": "/c", "size": 1}], ids=["no-path", "empty", "extra"])
def test_config_cache_rejects_bad_values(tmp_path: Path, cache: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config({**tiny_config(tmp_path), "cache": cache})
    assert e.value.field.startswith("cache")


# ---------------------------------------------------------------------------------------------------- fetch


def test_rank_0_fetches_once_and_the_marker_skips_the_next_fetch(tmp_path: Path, hub: FakeHub) -> None:
    cache = tmp_path / "cache"
    cfg = hub_config(tmp_path, cache)
    rc, out = run_hfcache(tmp_path, cfg, hub_env(hub.url)).finish()
    assert rc == 0, out
    assert hub.downloads() == dict.fromkeys(WANTED, 1)  # other formats and pickles (DECOYS) are not fetched
    assert (cache / "hub" / "models--tiny-org--tiny-bert" / "snapshots" / MODEL_SHA / "model.safetensors").exists()
    assert (cache / "datasets" / "tiny-org___tiny-sentiment").is_dir()
    (marker,) = markers(cache)
    assert read_json(marker)["key"]["model"] == MODEL

    before = len(hub.snapshot())
    rc, out = run_hfcache(tmp_path, cfg, hub_env(hub.url)).finish()
    assert rc == 0, out
    assert len(hub.snapshot()) == before, hub.snapshot()[before:]  # the marker says ready: no request at all


def test_other_ranks_wait_for_the_marker_and_never_contact_the_hub(tmp_path: Path, hub: FakeHub) -> None:
    cfg = hub_config(tmp_path, tmp_path / "cache")
    waiter = run_hfcache(tmp_path, cfg, hub_env(hub.url), node_rank=1, nnodes=2)
    poll(lambda: "waiting for node rank 0" in waiter.log(), timeout=120, what="node rank 1 waiting", on_fail=waiter.log)
    assert waiter.proc.poll() is None and hub.snapshot() == []
    rc0, out0 = run_hfcache(tmp_path, cfg, hub_env(hub.url)).finish()
    assert rc0 == 0, out0
    fetched = len(hub.snapshot())
    rc1, out1 = waiter.finish()
    assert rc1 == 0, out1
    assert "waiting for node rank 0" in out1 and "fetching" not in out1
    assert len(hub.snapshot()) == fetched  # everything the hub saw came from rank 0


def test_other_rank_times_out_with_75_naming_the_marker(tmp_path: Path, hub: FakeHub) -> None:
    cfg = hub_config(tmp_path, tmp_path / "cache", preflight={"timeoutSeconds": 1})
    rc, out = run_hfcache(tmp_path, cfg, hub_env(hub.url), node_rank=1, nnodes=2).finish()
    assert rc == 75, out
    term = read_json(tmp_path / "termination-hfcache-1.json")
    assert term["reason"] == "RendezvousTimeout"
    assert "node rank 0" in term["message"] and str(tmp_path / "cache" / hfcache.MARKER_DIR) in term["message"]
    assert hub.snapshot() == []


def test_missing_model_repo_is_a_config_error_78(tmp_path: Path, hub: FakeHub) -> None:
    """Through the real launcher: the fake hub answers 404 + ``X-Error-Code: RepoNotFound`` as the Hub does."""
    cfg = hub_config(tmp_path, tmp_path / "cache", model={"name": "tiny-org/no-such-model"})
    node = Node(tmp_path, cfg, extra_env=hub_env(hub.url))
    assert node.wait(RUN_TIMEOUT) == 78, node.log()
    term = node.termination()
    assert term is not None and term["reason"] == "ConfigError"
    assert term["message"].startswith("model.name: ") and "tiny-org/no-such-model" in term["message"]
    assert "spec.model.name" in term["message"]
    assert markers(tmp_path / "cache") == []


def test_missing_dataset_repo_is_a_config_error_78(tmp_path: Path, hub: FakeHub) -> None:
    cfg = hub_config(tmp_path, tmp_path / "cache", dataset={"name": "tiny-org/no-such-data"})
    rc, out = run_hfcache(tmp_path, cfg, hub_env(hub.url)).finish()
    assert rc == 78, out
    term = read_json(tmp_path / "termination-hfcache-0.json")
    assert term["message"].startswith("dataset.name: ") and "tiny-org/no-such-data" in term["message"]


@pytest.mark.parametrize(
    ("dataset", "needle"),
    [({"split": "nosuch"}, "nosuch"), ({"config": "nosuch"}, "nosuch")],
    ids=["unknown-split", "unknown-config"],
)
def test_unknown_dataset_split_or_config_is_a_config_error_78(
    tmp_path: Path, hub: FakeHub, dataset: dict[str, Any], needle: str
) -> None:
    cfg = hub_config(tmp_path, tmp_path / "cache", dataset=dataset)
    rc, out = run_hfcache(tmp_path, cfg, hub_env(hub.url)).finish()
    assert rc == 78, out
    message = read_json(tmp_path / "termination-hfcache-0.json")["message"]
    assert message.startswith("dataset.name: ") and needle in message
    assert markers(tmp_path / "cache") == []


def test_offline_pod_only_checks_the_cache(tmp_path: Path, hub: FakeHub) -> None:
    """``HF_HUB_OFFLINE=1`` on the pod itself (a pre-filled cache): rank 0 verifies, never downloads."""
    offline = {**hub_env(hub.url), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    rc, out = run_hfcache(tmp_path, hub_config(tmp_path, tmp_path / "empty"), offline).finish()
    assert rc == 78, out  # nothing cached and no way to fetch it: a configuration problem, not a retry
    assert "HF_HUB_OFFLINE=1" in read_json(tmp_path / "termination-hfcache-0.json")["message"]

    cfg = hub_config(tmp_path, tmp_path / "cache")
    assert run_hfcache(tmp_path, cfg, hub_env(hub.url)).finish()[0] == 0
    (marker,) = markers(tmp_path / "cache")
    marker.unlink()
    before = len(hub.snapshot())
    rc, out = run_hfcache(tmp_path, cfg, offline).finish()
    assert rc == 0, out
    assert len(hub.snapshot()) == before and markers(tmp_path / "cache") == [marker]


def test_unreachable_hub_is_a_retryable_failure_1(tmp_path: Path) -> None:
    cfg = hub_config(tmp_path, tmp_path / "cache")
    rc, out = run_hfcache(tmp_path, cfg, hub_env(f"http://127.0.0.1:{free_port()}")).finish()
    assert rc == 1, out
    assert read_json(tmp_path / "termination-hfcache-0.json")["reason"] == "TrainingError"
    assert markers(tmp_path / "cache") == []


# ---------------------------------------------------------------------------------------------------- end to end


def test_two_nodes_train_from_the_hub_with_one_download(tmp_path: Path, hub: FakeHub) -> None:
    """Two launchers (node ranks 0 and 1) share one cache: every file is downloaded once, the workers of both
    nodes load the model and dataset offline, and training succeeds over gloo."""
    cache = tmp_path / "cache"
    cfg = hub_config(tmp_path, cache)
    port = free_port()
    env = hub_env(hub.url)
    nodes = [Node(tmp_path, cfg, node_rank=r, nnodes=2, master_port=port, extra_env=env) for r in (1, 0)]
    for node in nodes:
        assert node.wait(RUN_TIMEOUT) == 0, node.log()

    result = read_json(tmp_path / "out" / "result.json")
    assert result["world_size"] == 2 and result["steps"] == 6
    ranks = [read_json(tmp_path / "out" / "ranks" / f"rank-{r}.json") for r in (0, 1)]
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]

    assert hub.downloads() == dict.fromkeys(WANTED, 1)  # once per job, not once per rank
    (marker,) = markers(cache)
    written = marker.stat().st_mtime
    late = [h for h in hub.snapshot() if h.time > written]
    assert late == [], late  # after the marker, nobody (no launcher, no worker) asked the hub anything
    assert "waiting for node rank 0" in nodes[0].log()  # node rank 1 (started first) waited for the fetch
    for node in nodes:  # the workers of both nodes found the dataset in the cache with the Hub switched off
        assert "couldn't be found on the Hugging Face Hub (offline mode is enabled)" in node.log_path.read_text()
