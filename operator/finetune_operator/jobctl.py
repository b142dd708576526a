"""The ``finetune`` user commands: submit, validate, status, list, logs, wait, suspend, resume, delete.

They use the user's kubeconfig and RBAC, as kubectl does (``--kubeconfig``, ``--context``, ``-n``; the context's
namespace, else ``default``), talk to the API server through ``k8s.Kube`` and print through ``render``. Exit codes:
0 done (for ``submit --follow`` and ``wait``: the job reached the wanted state), 1 the job failed (or ended in
another terminal state than the one waited for), 2 bad input (a manifest the typed spec or the API server refuses, a
job that does not exist), 124 ``--timeout`` passed, 130 interrupted. See docs/cli.md.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from finetune_operator import render
from finetune_operator.builders import JobRef, output_claim_name, output_path
from finetune_operator.k8s import ApiError, Kube, Rejected
from finetune_operator.settings import GROUP, LABEL_ATTEMPT, LABEL_RANK, OUTPUT_MOUNT, VERSION
from finetune_operator.spec import SpecError, check_name, parse_spec
from finetune_operator.status import FAILED, SUCCEEDED, TERMINAL

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 2, 124, 130


class UserError(Exception):
    """Bad input: printed as it is, exit 2."""


@dataclass
class Context:
    api: Kube | None  # None: no cluster (validate --offline)
    namespace: str  # from -n, the kubeconfig context, or "default"
    explicit_namespace: bool
    out: Console
    err: Console
    poll_seconds: float = 1.0

    @property
    def kube(self) -> Kube:
        if self.api is None:
            raise UserError("this needs a cluster (drop --offline)")
        return self.api


def connect(args: argparse.Namespace) -> Context:
    """The user's kubeconfig (``--kubeconfig``, else ``$KUBECONFIG`` or ``~/.kube/config``), else in-cluster."""
    from kubernetes import config

    try:
        api = config.new_client_from_config(config_file=args.kubeconfig, context=args.context)  # type: ignore[no-untyped-call]
        try:
            contexts, active = config.list_kube_config_contexts(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
            if args.context:
                active = next((c for c in contexts if c["name"] == args.context), active)
            ctx_ns = (active.get("context") or {}).get("namespace")
        except (config.ConfigException, KeyError, TypeError):
            ctx_ns = None
    except config.ConfigException as kube_err:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            raise UserError(f"no kubeconfig: {kube_err} (give --kubeconfig or set $KUBECONFIG)") from None
        from kubernetes import client

        api = client.ApiClient()
        ns_file = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        ctx_ns = ns_file.read_text().strip() if ns_file.exists() else None
    return Context(
        api=Kube(api),
        namespace=args.namespace or ctx_ns or "default",
        explicit_namespace=bool(args.namespace),
        out=Console(soft_wrap=True),
        err=Console(stderr=True, soft_wrap=True),
    )


# -- manifests --------------------------------------------------------------------------------------------------


def load_manifest(path: str, ctx: Context) -> dict[str, Any]:
    """The one FineTuneJob in ``path`` (``-``: standard input), its namespace resolved as kubectl does."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except OSError as e:
        raise UserError(f"{path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML: {e}") from None
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "FineTuneJob"]
    if len(jobs) != 1:
        raise UserError(
            f"{path}: holds {len(jobs)} FineTuneJob(s); give a file with exactly one "
            "(other objects, such as the claim it mounts, are applied with kubectl)"
        )
    job = jobs[0]
    if job.get("apiVersion") != f"{GROUP}/{VERSION}":
        raise UserError(f"{path}: apiVersion {job.get('apiVersion')!r}: this finetune speaks {GROUP}/{VERSION}")
    meta = job.setdefault("metadata", {})
    if not isinstance(meta, dict) or not meta.get("name"):
        raise UserError(f"{path}: metadata.name is required")
    ns = meta.get("namespace")
    if ns and ctx.explicit_namespace and ns != ctx.namespace:
        raise UserError(f"{path}: metadata.namespace is {ns!r} but -n says {ctx.namespace!r}; drop one of them")
    meta["namespace"] = ns or ctx.namespace
    return job


def local_errors(job: dict[str, Any]) -> list[str]:
    """What the operator's typed spec refuses, each with its field (the same parser the operator runs)."""
    errors = []
    try:
        check_name(job["metadata"]["name"])
    except SpecError as e:
        errors.append(str(e))
    try:
        parse_spec(job.get("spec") or {})
    except SpecError as e:
        errors.extend(e.lines())
    except (KeyError, TypeError, ValueError) as e:
        errors.append(f"spec: {e}")
    return errors


def server_errors(ctx: Context, job: dict[str, Any]) -> list[str]:
    """What the API server refuses in a dry run (the CRD's schema and CEL rules, admission)."""
    try:
        ctx.kube.apply_job(job, dry_run=True)
    except Rejected as e:
        # One line per invalid field when the server lists them (a 422 does), else its message.
        return [f"{f}: {m}" if f else m for f, m in e.causes] or [e.message]
    except ApiError as e:
        # Server-side apply answers a field the schema does not declare with a 500 ("failed to create typed patch
        # object (...): .spec.x: field not declared in schema"): the manifest's fault, not the server's.
        if e.code == 500 and "failed to create typed patch object" in e.message:
            return typed_patch_errors(e.message)
        raise
    return []


def typed_patch_errors(message: str) -> list[str]:
    """The fields of server-side apply's "failed to create typed patch object (...): <errors>" answer, one line each:
    one error is written inline (".spec.x: field not declared in schema"), several as an indented list after
    "errors:"."""
    tail = message.rpartition("): ")[2].strip() or message
    if not tail.startswith("errors:"):
        return [tail]
    return [line.strip() for line in tail.removeprefix("errors:").splitlines() if line.strip()] or [message]


def merged_errors(local: list[str], server: list[str]) -> list[str]:
    """Every error of a manifest at once: the typed spec's, then the server's about fields the typed spec did not
    already name (both check some of the same rules; each field is reported once)."""
    named = {e.split(":", 1)[0].removeprefix(".") for e in local}
    return local + [e for e in server if e.split(":", 1)[0].removeprefix(".") not in named]


def cmd_validate(ctx: Context, args: argparse.Namespace) -> int:
    job = load_manifest(args.file, ctx)
    errors = local_errors(job)
    if not args.offline:
        errors = merged_errors(errors, server_errors(ctx, job))
    where = "the typed spec" if args.offline else "the typed spec and a server dry run"
    if errors:
        for e in errors:
            ctx.err.print(f"[red]error[/red] {args.file}: {e}", highlight=False)
        return EXIT_USAGE
    ctx.out.print(
        f"{args.file}: FineTuneJob {job['metadata']['namespace']}/{job['metadata']['name']} is valid ({where})",
        highlight=False,
    )
    return EXIT_OK


def cmd_submit(ctx: Context, args: argparse.Namespace) -> int:
    job = load_manifest(args.file, ctx)
    errors = merged_errors(local_errors(job), server_errors(ctx, job))
    if errors:
        for e in errors:
            ctx.err.print(f"[red]error[/red] {args.file}: {e}", highlight=False)
        return EXIT_USAGE
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    before = ctx.kube.get_job(ns, name)
    try:
        applied = ctx.kube.apply_job(job, dry_run=False, force=args.force_conflicts)
    except ApiError as e:
        if e.code == 409:
            raise UserError(
                f"{name}: {e.message} (another manager owns these fields; --force-conflicts takes them over)"
            ) from None
        raise
    if before is None:
        verb = "created"
    elif before["metadata"].get("uid") != applied["metadata"].get("uid"):
        verb = "created (a job of that name was being deleted)"
    elif before["metadata"].get("generation") == applied["metadata"].get("generation"):
        verb = "unchanged"
    else:
        verb = "configured"
    if before is not None and (before.get("status") or {}).get("state") in TERMINAL and verb != "created":
        ctx.err.print(
            f"[yellow]note[/yellow]: {name} has already finished ({before['status']['state']}); a finished "
            "job never runs again: delete it first (finetune delete) to run it anew",
            highlight=False,
        )
    ctx.out.print(f"finetunejob.{GROUP}/{name} {verb}", highlight=False)
    if not args.follow:
        return EXIT_OK
    return follow(ctx, ns, name, uid=applied["metadata"]["uid"])


# -- following a job --------------------------------------------------------------------------------------------


def _job_or_fail(ctx: Context, name: str) -> dict[str, Any]:
    job = ctx.kube.get_job(ctx.namespace, name)
    if job is None:
        raise UserError(f"FineTuneJob {ctx.namespace}/{name} not found")
    return job


def _pods(ctx: Context, ns: str, name: str) -> list[dict[str, Any]]:
    return ctx.kube.list_pods(ns, name)


def _labels(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["metadata"].get("labels") or {})


def _rank_pod(pods: list[dict[str, Any]], rank: int, attempt: int | None) -> dict[str, Any] | None:
    for p in pods:
        labels = _labels(p)
        if labels.get(LABEL_RANK) == str(rank) and (attempt is None or labels.get(LABEL_ATTEMPT) == str(attempt)):
            return p
    return None


def _started(pod: dict[str, Any]) -> bool:
    """The container has started (or already ended): its log can be read."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if "running" in (cs.get("state") or {}) or "terminated" in (cs.get("state") or {}):
            return True
    return False


def _raw(line: str) -> None:
    """A log line as the trainer wrote it (no markup, no wrapping, control characters kept), as kubectl logs."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def stream_log(
    ctx: Context,
    ns: str,
    pod: str,
    *,
    follow: bool,
    tail: int | None,
    prefix: str = "",
    write: Callable[[str], None] | None = None,
) -> None:
    """Print a pod's trainer log (line by line, ``prefix`` before each), following it while it runs."""
    write = write or _raw
    resp = ctx.kube.pod_log(ns, pod, follow=follow, tail_lines=tail)
    pending = b""
    try:
        for chunk in resp.stream(4096, decode_content=True):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                write(prefix + line.decode(errors="replace"))
        if pending:
            write(prefix + pending.decode(errors="replace"))
    finally:
        resp.release_conn()


class _LogFollower(threading.Thread):
    """Streams rank 0's log of each attempt in turn, while the job runs (a gang restart moves it to the new pod)."""

    def __init__(self, ctx: Context, ns: str, name: str, write: Callable[[str], None]) -> None:
        super().__init__(daemon=True, name="log-follower")
        self.ctx, self.ns, self.name, self.write = ctx, ns, name, write
        self.done = threading.Event()  # stop now
        self.finishing = threading.Event()  # the job ended: stop once no rank 0 log is left to stream
        self.followed: set[str] = set()  # pod uids whose log was streamed to its end

    def run(self) -> None:
        while not self.done.is_set():
            pod = next(
                (
                    p
                    for p in _pods(self.ctx, self.ns, self.name)
                    if _labels(p).get(LABEL_RANK) == "0" and p["metadata"]["uid"] not in self.followed and _started(p)
                ),
                None,
            )
            if pod is None:
                if self.finishing.is_set():
                    return
                self.done.wait(self.ctx.poll_seconds)
                continue
            attempt = _labels(pod).get(LABEL_ATTEMPT)
            self.write(f"--- {pod['metadata']['name']} (attempt {attempt}, rank 0) ---")
            try:
                stream_log(self.ctx, self.ns, pod["metadata"]["name"], follow=True, tail=None, write=self.write)
            except ApiError as e:
                if e.code not in (400, 404):  # 400: not started yet, or the pod is gone; 404: deleted
                    self.write(f"(log of {pod['metadata']['name']}: {e.message})")
                self.done.wait(self.ctx.poll_seconds)
                if e.code in (400,) and not _started(pod):
                    continue
            self.followed.add(pod["metadata"]["uid"])


def follow(ctx: Context, ns: str, name: str, *, uid: str | None = None, logs: bool = True) -> int:
    """A progress bar from ``status.progress`` (and the state) while rank 0's log streams above it, until the job
    ends; the exit code is the job's result."""
    bar = Progress(
        TextColumn("{task.fields[state]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=ctx.err,
        transient=False,
    )
    # The bar is on stderr; the log lines go to stdout (above the bar on a terminal: rich redirects stdout there).
    follower = _LogFollower(ctx, ns, name, _raw) if logs else None
    task = bar.add_task(name, total=None, state="Pending", detail="")
    job: dict[str, Any] | None = None
    try:
        with bar:
            if follower is not None:
                follower.start()
            while True:
                job = ctx.kube.get_job(ns, name)
                if job is None or (uid is not None and job["metadata"].get("uid") != uid):
                    raise UserError(f"FineTuneJob {ns}/{name} was deleted")
                st = job.get("status") or {}
                prog = st.get("progress") or {}
                bar.update(
                    task,
                    total=prog.get("totalSteps"),
                    completed=prog.get("step") or 0,
                    state=f"{st.get('state') or 'Pending'} (attempt {st.get('attempt', 0)})",
                    detail=render.progress_line(prog).partition(", ")[2],
                )
                if st.get("state") in TERMINAL:
                    break
                time.sleep(ctx.poll_seconds)
            if follower is not None:  # the last lines of rank 0: its stream ends with the container
                follower.finishing.set()
                follower.join(timeout=30)
    finally:
        if follower is not None:
            follower.done.set()
    assert job is not None
    state = (job.get("status") or {}).get("state")
    style = "green" if state == SUCCEEDED else "red"
    ctx.out.print(f"[{style}]{render.final_line(job)}[/{style}]", highlight=False)
    return EXIT_OK if state == SUCCEEDED else EXIT_FAILED


# -- the other commands ---------------------------------------------------------------------------------------


def cmd_status(ctx: Context, args: argparse.Namespace) -> int:
    job = _job_or_fail(ctx, args.name)
    status = job.get("status") or {}
    pods = [
        p
        for p in _pods(ctx, ctx.namespace, args.name)
        if _labels(p).get(LABEL_ATTEMPT) == str(status.get("attempt", 0))
        or p["metadata"]["name"] == (status.get("failure") or {}).get("podName")
    ]
    events = ctx.kube.list_job_events(ctx.namespace, args.name)
    ctx.out.print(render.status_block(job, pods, events), highlight=False)
    return EXIT_OK


def cmd_list(ctx: Context, args: argparse.Namespace) -> int:
    jobs = ctx.kube.list_jobs(None if args.all_namespaces else ctx.namespace)
    if not jobs:
        where = "any namespace" if args.all_namespaces else f"namespace {ctx.namespace}"
        ctx.err.print(f"No FineTuneJobs in {where}.", highlight=False)
        return EXIT_OK
    ctx.out.print(render.jobs_table(jobs, all_namespaces=args.all_namespaces), highlight=False)
    return EXIT_OK


def cmd_logs(ctx: Context, args: argparse.Namespace) -> int:
    job = _job_or_fail(ctx, args.name)
    st = job.get("status") or {}
    current = int(st.get("attempt", 0))
    attempt = current if args.attempt is None else args.attempt
    pods = _pods(ctx, ctx.namespace, args.name)
    nodes = int((job.get("spec") or {}).get("nodes") or 1)
    ranks = list(range(nodes)) if args.all else [args.rank]
    found = {rank: _rank_pod(pods, rank, attempt) for rank in ranks}
    missing = [r for r, p in found.items() if p is None]
    if len(missing) == len(ranks):
        raise UserError(_no_pod(job, attempt, missing, current))
    for rank in missing:
        ctx.err.print(f"[yellow]note[/yellow]: {_no_pod(job, attempt, [rank], current)}", highlight=False)
    present = [(r, p["metadata"]["name"]) for r, p in found.items() if p is not None]
    if len(present) == 1:
        stream_log(ctx, ctx.namespace, present[0][1], follow=args.follow, tail=args.tail)
        return EXIT_OK
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock:
            _raw(line)

    threads = [
        threading.Thread(
            target=stream_log,
            args=(ctx, ctx.namespace, pod),
            kwargs={"follow": args.follow, "tail": args.tail, "prefix": f"[node {rank}] ", "write": write},
            daemon=True,
        )
        for rank, pod in present
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return EXIT_OK


def _no_pod(job: dict[str, Any], attempt: int, ranks: list[int], current: int) -> str:
    name = job["metadata"]["name"]
    which = ", ".join(str(r) for r in ranks)
    if attempt < current:
        try:
            spec = parse_spec(job.get("spec") or {})
        except (SpecError, KeyError, TypeError, ValueError):
            return f"{name}: no pod of attempt {attempt} for rank {which}: a gang restart replaces an attempt's pods"
        ref = JobRef(name=name, namespace=job["metadata"]["namespace"], uid=job["metadata"].get("uid", ""))
        inside = output_path(ref, spec)[len(OUTPUT_MOUNT) + 1 :]
        return (
            f"{name}: no pod of attempt {attempt} for rank {which}: a gang restart replaces an attempt's pods. "
            f"Every rank also writes its log to the output claim {output_claim_name(name, spec)}, at "
            f'{inside}/logs/attempt-{attempt}/node-<rank>.log (docs/cli.md, "Logs of earlier attempts")'
        )
    if attempt > current:
        return f"{name}: attempt {attempt} has not started (the current attempt is {current})"
    return f"{name}: rank {which} of attempt {attempt} has no pod (yet): see finetune status {name}"


def _reached(state: str | None, want: str) -> bool:
    return state in TERMINAL if want == "finished" else state == want


def cmd_wait(ctx: Context, args: argparse.Namespace) -> int:
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while True:
        job = _job_or_fail(ctx, args.name)
        state = (job.get("status") or {}).get("state")
        if _reached(state, args.for_):
            ctx.out.print(render.final_line(job), highlight=False)
            return EXIT_FAILED if args.for_ == "finished" and state == FAILED else EXIT_OK
        if state in TERMINAL:  # it will never get there
            ctx.err.print(f"{render.final_line(job)} (waited for {args.for_})", highlight=False)
            return EXIT_FAILED
        if deadline is not None and time.monotonic() >= deadline:
            ctx.err.print(
                f"{args.name}: still {state or 'Pending'} after {args.timeout:g}s (waited for {args.for_})",
                highlight=False,
            )
            return EXIT_TIMEOUT
        time.sleep(ctx.poll_seconds)


def _set_suspend(ctx: Context, name: str, suspend: bool) -> int:
    job = _job_or_fail(ctx, name)
    if (job.get("status") or {}).get("state") in TERMINAL:
        raise UserError(
            f"{name} has finished ({job['status']['state']}): nothing to {'suspend' if suspend else 'resume'}"
        )
    if ctx.kube.patch_job_spec(ctx.namespace, name, {"suspend": suspend}) is None:
        raise UserError(f"FineTuneJob {ctx.namespace}/{name} not found")
    what = (
        "suspended: its pods are deleted (each rank saves a checkpoint on SIGTERM)"
        if suspend
        else "resumed: a new attempt starts from the newest checkpoint"
    )
    ctx.out.print(f"finetunejob.{GROUP}/{name} {what}", highlight=False)
    return EXIT_OK


def cmd_delete(ctx: Context, args: argparse.Namespace) -> int:
    if not ctx.kube.delete_job_named(ctx.namespace, args.name):
        raise UserError(f"FineTuneJob {ctx.namespace}/{args.name} not found")
    ctx.out.print(f"finetunejob.{GROUP}/{args.name} deleted", highlight=False)
    if args.wait:
        deadline = time.monotonic() + args.timeout
        while ctx.kube.get_job(ctx.namespace, args.name) is not None or ctx.kube.list_pods(ctx.namespace, args.name):
            if time.monotonic() >= deadline:
                ctx.err.print(f"{args.name}: still terminating after {args.timeout:g}s", highlight=False)
                return EXIT_TIMEOUT
            time.sleep(ctx.poll_seconds)
    return EXIT_OK


# -- the parser -------------------------------------------------------------------------------------------------

COMMANDS: dict[str, Callable[[Context, argparse.Namespace], int]] = {
    "submit": cmd_submit,
    "validate": cmd_validate,
    "status": cmd_status,
    "list": cmd_list,
    "logs": cmd_logs,
    "wait": cmd_wait,
    "suspend": lambda c, a: _set_suspend(c, a.name, True),
    "resume": lambda c, a: _set_suspend(c, a.name, False),
    "delete": cmd_delete,
}


def run(args: argparse.Namespace) -> int:
    try:
        if getattr(args, "offline", False):
            ctx = Context(
                api=None,
                namespace=args.namespace or "default",
                explicit_namespace=bool(args.namespace),
                out=Console(soft_wrap=True),
                err=Console(stderr=True, soft_wrap=True),
            )
        else:
            ctx = connect(args)
        return COMMANDS[args.command](ctx, args)
    except UserError as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]error[/red]: {e}", highlight=False)
        return EXIT_USAGE
    except ApiError as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]error[/red]: the API server answered {e}", highlight=False)
        return EXIT_FAILED if e.code != 403 else EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
