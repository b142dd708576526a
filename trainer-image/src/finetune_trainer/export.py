"""The model out of the volume: after a successful run, node rank 0's launcher pushes ``model/`` to a Hugging Face
Hub model repo (``output.pushToHub``) and/or copies it to an S3-compatible bucket (``output.s3``).

Training is never lost to an export: ``result.json`` and the model are written to the claim first; a failed export
exits 74 (``ExportFailed``, not retried) with a message naming the destination and where the model still is, and
``result.json`` gains an ``export`` list saying what went where (or what failed).

Credentials come only from the environment of rank 0's pod, which the operator fills from Secret references: the Hub
token from ``FINETUNE_HUB_TOKEN`` (``spec.output.pushToHub.secretRef``) or else ``HF_TOKEN``; S3 keys from the
standard ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (/ ``AWS_SESSION_TOKEN``), or boto3's other sources (an
IAM role for service accounts, EKS Pod Identity; instance metadata only where the job allows it). The launcher keeps
them out of the training processes' environment, whose code may be a model repository's, and hides its own
(finetune_trainer.credentials): only the export, after the training processes exited, uses them.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable
from typing import Any

from finetune_trainer.config import Config, HubPush, S3Export
from finetune_trainer.credentials import HUB_TOKEN_ENV

log = logging.getLogger(__name__)

# A short outage of the Hub or the bucket must not fail a run that may have taken days: six tries over about three
# minutes, each wait doubling from 5 s (at most 60 s) with full jitter, so jobs ending together do not retry in step.
ATTEMPTS = 6
BACKOFF_SECONDS = 5.0
BACKOFF_MAX_SECONDS = 60.0
# Written last into the S3 prefix (and removed first): a reader knows the copy is complete only when it is there.
MANIFEST = "finetune-export.json"


class ExportError(Exception):
    """An export failed for good: the message names the destination; the model stays on the claim."""


def hub_token() -> str | None:
    return os.environ.get(HUB_TOKEN_ENV) or os.environ.get("HF_TOKEN") or None


def _permanent(exc: BaseException) -> bool:
    """Errors a retry cannot fix: authentication, permission, a missing bucket or repository, bad input."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int) and status in (400, 401, 403, 404, 409, 422):
        return True
    if isinstance(response, dict):  # botocore ClientError
        code = str(response.get("Error", {}).get("Code", ""))
        return code in {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchBucket", "403", "404"}
    return exc.__class__.__name__ in {"NoCredentialsError", "PartialCredentialsError", "ParamValidationError"}


def backoff(attempt: int, *, draw: Callable[[], float] = random.random) -> float:
    """Seconds to wait after failed try ``attempt`` (1-based): full jitter over an exponential bound."""
    return draw() * min(BACKOFF_MAX_SECONDS, BACKOFF_SECONDS * 2.0 ** (attempt - 1))


def _retrying(
    what: str, fn: Callable[[], dict[str, Any]], *, sleep: Callable[[float], None] = time.sleep
) -> dict[str, Any]:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return fn()
        except Exception as e:
            if _permanent(e) or attempt == ATTEMPTS:
                raise ExportError(f"{what}: {type(e).__name__}: {e}") from e
            log.warning("%s failed (attempt %d/%d): %s; retrying", what, attempt, ATTEMPTS, e)
            sleep(backoff(attempt))
    raise AssertionError("unreachable")


def files_under(folder: str) -> list[str]:
    """Every regular file under ``folder``, relative, sorted (what an export sends). Symbolic links are never
    followed nor sent: the training code (a model repository's, perhaps) writes ``model/``, and a link there to
    ``/proc/self/environ`` or a mounted Secret would otherwise upload the launcher's credentials."""
    out: list[str] = []
    for d, dirs, names in os.walk(folder):  # os.walk does not descend into linked directories
        for n in names + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            path = os.path.join(d, n)
            if os.path.islink(path) or not os.path.isfile(path):
                log.warning("export: %s is a symbolic link or not a regular file; not exported", path)
                continue
            out.append(os.path.relpath(path, folder))
    return sorted(out)


def _no_shared_aws_config() -> None:
    """boto3 would read ``~/.aws/config`` and ``credentials`` under ``HOME`` (/tmp, which the training processes
    could write): an endpoint or a profile planted there would steer the export. Only the pod's environment counts."""
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        os.environ.setdefault(name, os.devnull)


def push_to_hub(push: HubPush, folder: str, *, message: str) -> dict[str, Any]:
    from huggingface_hub import HfApi

    token = hub_token()
    api = HfApi(endpoint=push.endpoint or None, token=token)

    def run() -> dict[str, Any]:
        repo = api.create_repo(push.repo, private=push.private, exist_ok=True, repo_type="model")
        names = files_under(folder)  # exactly these; an empty allow-list would mean "everything", so "-" then
        info = api.upload_folder(
            repo_id=push.repo, folder_path=folder, commit_message=message, allow_patterns=names or ["-"]
        )
        return {
            "destination": f"hf://{push.repo}",
            "url": str(repo),
            "commit": getattr(info, "oid", None),
            "files": len(names),
        }

    return _retrying(f"push to the Hub repo {push.repo!r}", run)


def copy_to_s3(s3: S3Export, folder: str) -> dict[str, Any]:
    import boto3
    from botocore.config import Config as BotoConfig

    _no_shared_aws_config()
    client = boto3.client(
        "s3",
        endpoint_url=s3.endpoint or None,
        region_name=s3.region or None,
        config=BotoConfig(retries={"mode": "standard", "max_attempts": 5}),
    )
    names = files_under(folder)

    def key(name: str) -> str:
        return "/".join(p for p in (s3.prefix, name.replace(os.sep, "/")) if p)

    def run() -> dict[str, Any]:
        # No manifest while the prefix is partly written: an earlier copy's manifest goes first, the new one last.
        client.delete_object(Bucket=s3.bucket, Key=key(MANIFEST))
        total, listed = 0, []
        for name in names:  # upload_file switches to multipart uploads for big weight shards
            client.upload_file(os.path.join(folder, name), s3.bucket, key(name))
            size = os.path.getsize(os.path.join(folder, name))
            total += size
            listed.append({"key": key(name), "bytes": size})
        manifest = {"complete": True, "objects": listed, "bytes": total, "time": time.time()}
        client.put_object(
            Bucket=s3.bucket,
            Key=key(MANIFEST),
            Body=json.dumps(manifest, indent=1).encode(),
            ContentType="application/json",
        )
        return {"destination": s3.uri, "objects": len(names), "bytes": total, "manifest": key(MANIFEST)}

    return _retrying(f"copy to {s3.uri}", run)


def run_exports(config: Config) -> list[dict[str, Any]]:
    """Every configured export of ``model/``, in order (Hub, then S3); raises :class:`ExportError` on the first
    that fails, after recording all results so far in ``result.json``."""
    if not (config.push_to_hub or config.s3):
        return []
    folder = config.model_dir
    if not os.path.isdir(folder):
        raise ExportError(f"nothing to export: {folder} does not exist")
    done: list[dict[str, Any]] = []
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = []
    if config.push_to_hub:
        push = config.push_to_hub
        msg = f"finetune-operator: {config.job.namespace}/{config.job.name}"
        steps.append((f"hf://{push.repo}", lambda: push_to_hub(push, folder, message=msg)))
    if config.s3:
        s3 = config.s3
        steps.append((s3.uri, lambda: copy_to_s3(s3, folder)))
    for destination, step in steps:
        started = time.time()
        try:
            result = step()
        except ExportError as e:
            done.append({"destination": destination, "error": str(e)})
            record(config, done)
            raise ExportError(
                f"{e}. Training succeeded: the model is on the output volume at {folder}; fix the destination or "
                "its credentials and copy it from there"
            ) from None
        result["seconds"] = round(time.time() - started, 3)
        done.append(result)
        log.info("exported %s to %s in %.1fs", folder, destination, result["seconds"])
    record(config, done)
    return done


def record(config: Config, exports: list[dict[str, Any]]) -> None:
    """Add the exports to ``result.json`` (written by the trainer's rank 0 before the launcher runs them)."""
    try:
        with open(config.result_path, encoding="utf-8") as f:
            result = json.load(f)
    except (OSError, ValueError):
        result = {}
    result["export"] = exports
    tmp = config.result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    os.replace(tmp, config.result_path)
