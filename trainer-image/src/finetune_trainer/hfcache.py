"""The optional shared Hugging Face cache (config ``cache.path``, a ReadWriteMany volume mounted in every pod).

With a cache, Hub inputs (``model.name``, ``dataset.name``) are fetched once per job instead of once per rank:

1. the launcher of node rank 0 fetches the model snapshot and the dataset splits the workers use into the cache,
   then writes a *ready marker* (``<cache>/finetune-ready/<digest>.json``, atomically) keyed by what it fetched;
   a marker that is already there (a gang restart, a later job with the same inputs) skips the fetch;
2. launchers of the other node ranks wait for that marker while rank 0's heartbeat file is fresh, and at most
   ``preflight.timeoutSeconds`` (spec.rendezvousTimeoutSeconds) without one, then exit 75;
3. every worker runs with the Hub offline (``HF_HUB_OFFLINE=1``...) and reads only the cache.

The cache path is the workers' ``HF_HOME``. ``HF_ENDPOINT`` (a Hub mirror) and ``HF_TOKEN`` are read by
huggingface_hub and datasets themselves; nothing here overrides them.

``python -m finetune_trainer.hfcache`` runs step 1 or 2 alone (same config, env contract and exit codes), e.g.
to warm a cache ahead of a job.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

from finetune_trainer.config import Config
from finetune_trainer.env import RunEnv
from finetune_trainer.errors import ConfigError, RendezvousTimeout

log = logging.getLogger(__name__)

MARKER_DIR = "finetune-ready"
MARKER_FORMAT = 1
DEFAULT_REVISION = "main"

# Set for the workers: they read only what the launcher fetched.
OFFLINE_ENV: Mapping[str, str] = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# Older cache variables that would win over HF_HOME in some library and point the workers elsewhere.
LEGACY_CACHE_VARS = ("HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "PYTORCH_TRANSFORMERS_CACHE",
                     "PYTORCH_PRETRAINED_BERT_CACHE")  # fmt: skip

# Files the PyTorch loaders of transformers never read (other frameworks, exported formats).
UNUSED_MODEL_FILES = ("*.h5", "*.msgpack", "*.ot", "*.tflite", "*.onnx", "*.onnx_data", "onnx/*", "openvino/*",
                      "coreml/*", "*.mlmodel", "*.gguf")  # fmt: skip
PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt")  # not read when safetensors weights exist
SAFETENSORS_WEIGHTS = ("*.safetensors",)


class HubUnavailable(Exception):
    """The Hub (or ``HF_ENDPOINT``) could not be reached or failed: transient, so exit 1 and a gang restart."""


@dataclass(frozen=True)
class FetchPlan:
    """What node rank 0 fetches; its :meth:`key` names the ready marker."""

    model: str | None
    revision: str
    weights: bool  # False with initFromConfig: config and tokenizer only
    dataset: str | None
    dataset_config: str | None
    splits: tuple[str, ...]
    libraries: tuple[tuple[str, str], ...] = ()  # (package, version) that wrote the cache

    def key(self) -> dict[str, Any]:
        k = asdict(self)
        k["format"] = MARKER_FORMAT
        k["splits"] = sorted(self.splits)
        k["libraries"] = dict(self.libraries)
        return k

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.key(), sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        parts = []
        if self.model:
            parts.append(f"model {self.model}@{self.revision}")
        if self.dataset:
            parts.append(f"dataset {self.dataset} ({self.dataset_config or 'default'}: {', '.join(self.splits)})")
        return " and ".join(parts)


def library_versions() -> tuple[tuple[str, str], ...]:
    out = []
    for pkg in ("huggingface_hub", "datasets", "transformers"):
        try:
            out.append((pkg, metadata.version(pkg)))
        except metadata.PackageNotFoundError:
            out.append((pkg, "none"))
    return tuple(out)


def splits_used(config: Config) -> tuple[str, ...]:
    """The splits the workers load (worker.py): the train split, and the evaluation split when evaluating."""
    ds = config.dataset
    if ds.eval_split and config.training.eval_strategy != "no":
        return (ds.split, ds.eval_split)
    return (ds.split,)


def plan(config: Config, libraries: tuple[tuple[str, str], ...] | None = None) -> FetchPlan | None:
    """What to fetch from the Hub, or None when the model and dataset are both local (nothing to share)."""
    m, ds = config.model, config.dataset
    model = None if m.path else m.name
    dataset = None if ds.path else ds.name
    if not model and not dataset:
        return None
    return FetchPlan(
        model=model,
        revision=(m.revision or DEFAULT_REVISION) if model else DEFAULT_REVISION,
        weights=bool(model) and not m.init_from_config,
        dataset=dataset,
        dataset_config=ds.config if dataset else None,
        splits=splits_used(config) if dataset else (),
        libraries=library_versions() if libraries is None else libraries,
    )


def marker_path(cache_path: str, fetch_plan: FetchPlan) -> str:
    return os.path.join(cache_path, MARKER_DIR, f"{fetch_plan.digest()}.json")


def cache_env(cache_path: str) -> dict[str, str]:
    """The cache variables for the launcher and the workers: ``cache.path`` is ``HF_HOME``."""
    return {
        "HF_HOME": cache_path,
        "HF_HUB_CACHE": os.path.join(cache_path, "hub"),
        "HF_DATASETS_CACHE": os.path.join(cache_path, "datasets"),
    }


def apply_cache_env(env: MutableMapping[str, str], cache_path: str, *, offline: bool) -> None:
    """Point ``env`` at the shared cache (and, for workers, take the Hub offline). ``HF_ENDPOINT`` and
    ``HF_TOKEN`` are left as they are."""
    for name in LEGACY_CACHE_VARS:
        env.pop(name, None)
    env.update(cache_env(cache_path))
    if offline:
        env.update(OFFLINE_ENV)


def read_marker(path: str, fetch_plan: FetchPlan) -> dict[str, Any] | None:
    """The marker's content when it exists and records exactly this plan, else None."""
    try:
        with open(path, encoding="utf-8") as f:
            payload = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(payload, dict) or payload.get("key") != fetch_plan.key():
        return None
    return payload


def write_marker(path: str, fetch_plan: FetchPlan, details: Mapping[str, Any]) -> None:
    """Write the marker atomically (temp file in the same directory, fsync, rename): readers on other nodes see
    nothing or all of it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    payload = {"key": fetch_plan.key(), "fetched": dict(details), "time": time.time()}
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".ready-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


HEARTBEAT_EVERY = 15.0  # seconds between node rank 0's "still fetching" touches
HEARTBEAT_FRESH = 60.0  # a heartbeat younger than this means rank 0 is alive and downloading


def heartbeat_path(marker: str) -> str:
    return marker + ".fetching"


@contextlib.contextmanager
def heartbeat(path: str, every: float = HEARTBEAT_EVERY) -> Iterator[None]:
    """Touch ``path`` every ``every`` seconds while the body runs (node rank 0's fetch), then remove it."""
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(OSError), open(path, "a"):
                os.utime(path)
            if stop.wait(every):
                return

    thread = threading.Thread(target=beat, name="hfcache-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(path)


def wait_for_marker(
    path: str,
    fetch_plan: FetchPlan,
    *,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    wall: Callable[[], float] = time.time,
) -> float:
    """Poll until node rank 0's marker appears; returns the seconds waited or raises :class:`RendezvousTimeout`
    naming the marker. The wait is bounded by ``timeout_s`` *without sign of life* from rank 0: while rank 0's
    heartbeat file is fresh (it is downloading), the deadline moves, so a large first download never times out."""
    start = clock()
    deadline = start + timeout_s
    attempt = 0
    beat = heartbeat_path(path)
    while True:
        if read_marker(path, fetch_plan) is not None:
            return clock() - start
        now = clock()
        with contextlib.suppress(OSError):
            if wall() - os.path.getmtime(beat) < HEARTBEAT_FRESH:
                deadline = max(deadline, now + timeout_s)
        if now >= deadline:
            raise RendezvousTimeout(
                f"node rank 0 did not finish fetching {fetch_plan.describe()} into the shared cache and showed no "
                f"sign of life for {timeout_s:g}s: no ready marker at {path} (nor a fresh {beat}); check the rank-0 "
                "pod (is it running? its log), or raise spec.rendezvousTimeoutSeconds"
            )
        delay = min(0.2 * 2 ** min(attempt, 5), 5.0, max(0.0, deadline - now))
        attempt += 1
        sleep(delay)


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def classify(error: BaseException, field: str, what: str) -> Exception:
    """A fetch error as :class:`ConfigError` (the inputs are wrong: exit 78) or :class:`HubUnavailable` (exit 1)."""
    import requests
    from datasets.exceptions import DatasetNotFoundError
    from huggingface_hub import errors as hub

    spec = f"spec.{field}"
    text = " ".join(f"{type(error).__name__}: {error}".split())
    where = f"the Hugging Face Hub at {hub_endpoint()}"
    if isinstance(error, (hub.LocalEntryNotFoundError, ConnectionError, requests.ConnectionError)):
        # LocalEntryNotFoundError subclasses EntryNotFoundError, but it means "no network and not cached".
        if _hub_offline():
            fix = "unset HF_HUB_OFFLINE, or fill the cache first"
            return ConfigError(field, f"{what} is not in the shared cache and HF_HUB_OFFLINE=1 is set; {fix} ({text})")
        return HubUnavailable(f"could not fetch {what} from {where}: {text}")
    if isinstance(error, (hub.RepositoryNotFoundError, hub.DisabledRepoError, DatasetNotFoundError)):
        fix = f"fix {spec}, or give the job an HF_TOKEN that can read it"
        return ConfigError(field, f"{what} does not exist on {where}, or is private or gated ({text}); {fix}")
    if isinstance(error, hub.RevisionNotFoundError):
        return ConfigError("model.revision", f"{what}: no such revision on {where} ({text}); fix spec.model.revision")
    if isinstance(error, hub.EntryNotFoundError):
        return ConfigError(field, f"{what}: a file is missing from the repository ({text}); fix {spec}")
    status = error.response.status_code if isinstance(error, hub.HfHubHTTPError) and error.response is not None else 0
    if status in (401, 403):
        return ConfigError(field, f"{what}: access denied by {where} ({text}); check HF_TOKEN's access to {spec}")
    if field == "dataset.name" and isinstance(error, (ValueError, FileNotFoundError)):
        # datasets: unknown config or split ("BuilderConfig 'x' not found", 'Unknown split "y"'), no data files.
        return ConfigError(field, f"{what}: {text}; fix spec.dataset.name, config, split or evalSplit")
    return HubUnavailable(f"could not fetch {what} from {where}: {text}")


def model_ignore_patterns(files: list[str], *, weights: bool) -> list[str]:
    """Files of a model repo the workers never read: other frameworks' weights, pickles when safetensors exist,
    all weights with ``initFromConfig``."""
    ignore = list(UNUSED_MODEL_FILES)
    if not weights:
        return ignore + list(PICKLE_WEIGHTS + SAFETENSORS_WEIGHTS)
    if any(f.endswith(".safetensors") for f in files):
        ignore += PICKLE_WEIGHTS
    return ignore


def cached_model_files(hub_cache: str, repo_id: str, revision: str) -> list[str]:
    """Files of the cached snapshot of ``repo_id`` at ``revision`` (a branch, tag or commit), [] when absent.
    Offline, huggingface_hub (2.x) checks a snapshot against the repository's cached file listing, filtered by the
    ignore patterns: the patterns must be those of the fetch that filled the cache (no pickles next to
    safetensors), or the pickles it skipped count as missing."""
    repo = os.path.join(hub_cache, "models--" + repo_id.replace("/", "--"))
    ref = os.path.join(repo, "refs", revision)
    commit = revision
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as f:
            commit = f.read().strip()
    snapshot = os.path.join(repo, "snapshots", commit)
    return [os.path.relpath(os.path.join(d, name), snapshot) for d, _, names in os.walk(snapshot) for name in names]


def fetch(fetch_plan: FetchPlan, cache_path: str) -> dict[str, Any]:
    """Download into the shared cache what the offline workers will load; returns what was fetched.
    Raises :class:`ConfigError` or :class:`HubUnavailable`."""
    token = os.environ.get("HF_TOKEN") or None
    env = cache_env(cache_path)
    details: dict[str, Any] = {}
    if fetch_plan.model:
        what = f"model {fetch_plan.model!r} (revision {fetch_plan.revision!r})"
        try:
            from huggingface_hub import HfApi, snapshot_download

            files: list[str] = []
            if fetch_plan.weights and not _hub_offline():  # which weight formats the repo has
                info = HfApi(token=token).model_info(fetch_plan.model, revision=fetch_plan.revision)
                files = [s.rfilename for s in info.siblings or []]
            elif fetch_plan.weights:  # offline: what the earlier fetch left in the cache decides the same patterns
                files = cached_model_files(env["HF_HUB_CACHE"], fetch_plan.model, fetch_plan.revision)
            folder = snapshot_download(
                fetch_plan.model,
                revision=fetch_plan.revision,
                cache_dir=env["HF_HUB_CACHE"],
                token=token,
                ignore_patterns=model_ignore_patterns(files, weights=fetch_plan.weights),
            )
        except Exception as e:
            raise classify(e, "model.name", what) from e
        details["model_snapshot"] = folder
        log.info("hfcache: %s in %s", what, folder)
    if fetch_plan.dataset:
        what = f"dataset {fetch_plan.dataset!r}" + (
            f" (config {fetch_plan.dataset_config!r})" if fetch_plan.dataset_config else ""
        )
        try:
            import datasets

            rows = {}
            for split in fetch_plan.splits:
                ds = datasets.load_dataset(
                    fetch_plan.dataset,
                    fetch_plan.dataset_config,
                    split=split,
                    cache_dir=env["HF_DATASETS_CACHE"],
                    token=token,
                )
                rows[split] = len(ds)
        except Exception as e:
            raise classify(e, "dataset.name", what) from e
        details["dataset_rows"] = rows
        log.info("hfcache: %s splits %s", what, rows)
    return details


def prepare(
    config: Config,
    run: RunEnv,
    *,
    fetcher: Callable[[FetchPlan, str], Mapping[str, Any]] = fetch,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """Fill (node rank 0) or wait for (other ranks) the shared cache. Returns the marker path, or None when
    there is no cache or nothing comes from the Hub. Raises :class:`ConfigError`, :class:`RendezvousTimeout` or
    :class:`HubUnavailable`."""
    if not config.cache_path:
        return None
    fetch_plan = plan(config)
    if fetch_plan is None:
        return None
    path = marker_path(config.cache_path, fetch_plan)
    if run.node_rank != 0:
        log.info("hfcache: waiting for node rank 0 to fetch %s (marker %s)", fetch_plan.describe(), path)
        waited = wait_for_marker(path, fetch_plan, timeout_s=config.preflight_timeout_seconds, clock=clock, sleep=sleep)
        log.info("hfcache: ready after %.1fs", waited)
        return path
    if read_marker(path, fetch_plan) is not None:
        log.info("hfcache: %s already in the shared cache (%s)", fetch_plan.describe(), path)
        return path
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=os.path.dirname(path), prefix=".write-test-"):
            pass
    except OSError as e:
        raise ConfigError(
            "cache.path", f"cannot write to the shared cache {config.cache_path!r}: {e}; check the cache volume "
            "(ReadWriteMany, mounted in every pod) and its permissions"
        ) from None  # fmt: skip
    log.info("hfcache: fetching %s into %s", fetch_plan.describe(), config.cache_path)
    with heartbeat(heartbeat_path(path)):  # the other nodes wait as long as this download shows progress
        details = fetcher(fetch_plan, config.cache_path)
    write_marker(path, fetch_plan, details)
    log.info("hfcache: wrote %s", path)
    return path


def main() -> None:
    """Fill or wait for the shared cache of ``$FINETUNE_CONFIG`` and exit with the launcher's codes."""
    from finetune_trainer import errors
    from finetune_trainer.config import load_config
    from finetune_trainer.env import read_env

    logging.basicConfig(level=logging.INFO, format="%(asctime)s hfcache %(levelname)s %(message)s")
    try:
        config = load_config()
        run = read_env(job_name=config.job.name, namespace=config.job.namespace)
        if config.cache_path:
            apply_cache_env(os.environ, config.cache_path, offline=False)
        prepare(config, run)
    except ConfigError as e:
        code, message = errors.EXIT_CONFIG_ERROR, str(e)
    except RendezvousTimeout as e:
        code, message = errors.EXIT_RENDEZVOUS_TIMEOUT, str(e)
    except HubUnavailable as e:
        code, message = errors.EXIT_TRAINING_ERROR, str(e)
    else:
        sys.exit(errors.EXIT_OK)
    reason = errors.REASON_BY_EXIT[code]
    print(f"finetune-trainer: {reason}: {message}", file=sys.stderr, flush=True)
    errors.write_termination_log(reason, message)
    sys.exit(code)


if __name__ == "__main__":
    main()
