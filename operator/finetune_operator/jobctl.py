"""The ``finetune`` user commands: submit, validate, status, list, logs, wait, suspend, resume, delete.

They use the user's kubeconfig and RBAC, as kubectl does (``--kubeconfig``, ``--context``, ``-n``; the context's
namespace, else ``default``), talk to the API server through ``k8s.Kube`` and print through ``render``. Exit codes:
0 done (for ``submit --follow`` and ``wait``: the job reached the wanted state), 1 the job failed (or ended in
another terminal state than the one waited for), 2 bad input (a manifest the typed spec or the API server refuses, a
job that does not exist), 124 ``--timeout`` passed, 130 interrupted. See docs/cli.md.

Everything but the printing and the exit codes is the Python client's (finetune_operator.client): one implementation
for the command and for notebooks.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.text import Text

from finetune_operator import render
from finetune_operator.client import (
    FineTuneClient,
    InvalidManifest,
    Unreachable,
    UserError,
    WaitTimeout,
    no_pod,
    raw_line,
)
from finetune_operator.k8s import ApiError
from finetune_operator.settings import GROUP
from finetune_operator.status import FAILED, SUCCEEDED

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 2, 124, 130


@dataclass
class Context:
    client: FineTuneClient
    out: Console
    err: Console


def _print_errors(ctx: Context, e: InvalidManifest) -> int:
    for line in e.errors:
        ctx.err.print(Text.assemble(("error", "red"), f" {render.clean(e.source)}: {render.clean(line)}"))
    return EXIT_USAGE


def cmd_validate(ctx: Context, args: argparse.Namespace) -> int:
    where = "the typed spec" if args.offline else "the typed spec and a server dry run"
    job, errors = ctx.client.check(args.file, offline=args.offline)
    if errors:
        return _print_errors(ctx, InvalidManifest(args.file, errors))
    meta = job["metadata"]
    ctx.out.print(f"{args.file}: FineTuneJob {meta['namespace']}/{meta['name']} is valid ({where})", highlight=False)
    eff = None if args.offline else ctx.client.effective(job)
    if eff is not None:
        record = {**(eff.runtime.snapshot() if eff.runtime else {}), "chosenBy": eff.how}
        ctx.out.print(f"Runtime: {render.clean(render.runtime_line(record))}", highlight=False)
        values = [v.to_wire() for v in eff.values]
        ctx.out.print(render.effective_table(values, title="Effective values", operator_known=False), highlight=False)
    return EXIT_OK


def cmd_runtimes(ctx: Context, args: argparse.Namespace) -> int:
    found = ctx.client.runtimes()
    if not found:
        ctx.err.print(
            f"No runtimes a job of namespace {ctx.client.namespace} may name: jobs run with the operator's own "
            "settings.",
            highlight=False,
        )
        return EXIT_OK
    ctx.out.print(render.runtimes_table(found), highlight=False)
    return EXIT_OK


def cmd_submit(ctx: Context, args: argparse.Namespace) -> int:
    try:
        done = ctx.client.submit(args.file, force_conflicts=args.force_conflicts)
    except InvalidManifest as e:
        return _print_errors(ctx, e)
    if done.finished_before:
        ctx.err.print(
            Text.assemble(
                ("note", "yellow"),
                f": {done.job.name} has already finished ({render.clean(done.finished_before)}); a finished "
                "job never runs again: delete it first (finetune delete) to run it anew",
            ),
            highlight=False,
        )
    ctx.out.print(f"finetunejob.{GROUP}/{done.job.name} {done.verb}", highlight=False)
    if not args.follow:
        return EXIT_OK
    job = ctx.client.follow(done.job.name, uid=done.job.uid, console=ctx.err)
    style = "green" if job.state == SUCCEEDED else "red"
    ctx.out.print(Text(job.final_line(), style=style), highlight=False)
    return EXIT_OK if job.state == SUCCEEDED else EXIT_FAILED


def cmd_status(ctx: Context, args: argparse.Namespace) -> int:
    job = ctx.client.get(args.name)
    block = render.status_block(job.raw, ctx.client.status_pods(job), ctx.client.events(args.name))
    ctx.out.print(block, highlight=False)
    return EXIT_OK


def cmd_list(ctx: Context, args: argparse.Namespace) -> int:
    jobs = ctx.client.list_jobs(all_namespaces=args.all_namespaces)
    if not jobs:
        where = "any namespace" if args.all_namespaces else f"namespace {ctx.client.namespace}"
        ctx.err.print(f"No FineTuneJobs in {where}.", highlight=False)
        return EXIT_OK
    ctx.out.print(render.jobs_table([j.raw for j in jobs], all_namespaces=args.all_namespaces), highlight=False)
    return EXIT_OK


def cmd_logs(ctx: Context, args: argparse.Namespace) -> int:
    job = ctx.client.get(args.name)
    attempt = job.attempt if args.attempt is None else args.attempt
    nodes = int((job.raw.get("spec") or {}).get("nodes") or 1)
    ranks = list(range(nodes)) if args.all else [args.rank]
    pods = ctx.client.rank_pods(args.name, ranks=ranks, attempt=attempt, job=job)
    for rank in ranks:
        if rank not in pods:
            ctx.err.print(
                Text.assemble(("note", "yellow"), f": {render.clean(no_pod(job.raw, attempt, [rank], job.attempt))}")
            )
    if len(pods) == 1:
        for line in ctx.client.log_lines(next(iter(pods.values())), follow=args.follow, tail=args.tail):
            raw_line(line)
        return EXIT_OK
    for rank, line in ctx.client.logs_all(args.name, follow=args.follow, tail=args.tail, pods=pods):
        raw_line(f"[node {rank}] {line}")
    return EXIT_OK


def cmd_wait(ctx: Context, args: argparse.Namespace) -> int:
    try:
        job = ctx.client.wait(args.name, for_=args.for_, timeout=args.timeout)
    except Unreachable as e:
        ctx.err.print(render.clean(e), highlight=False)
        return EXIT_FAILED
    except WaitTimeout as e:
        ctx.err.print(render.clean(e), highlight=False)
        return EXIT_TIMEOUT
    ctx.out.print(job.final_line(), highlight=False)
    return EXIT_FAILED if args.for_ == "finished" and job.state == FAILED else EXIT_OK


def _set_suspend(ctx: Context, name: str, suspend: bool) -> int:
    if suspend:
        ctx.client.suspend(name)
        what = "suspended: its pods are deleted (each rank saves a checkpoint on SIGTERM)"
    else:
        ctx.client.resume(name)
        what = "resumed: a new attempt starts from the newest checkpoint"
    ctx.out.print(f"finetunejob.{GROUP}/{name} {what}", highlight=False)
    return EXIT_OK


def cmd_delete(ctx: Context, args: argparse.Namespace) -> int:
    ctx.client.delete(args.name)
    ctx.out.print(f"finetunejob.{GROUP}/{args.name} deleted", highlight=False)
    if args.wait:
        try:
            ctx.client.delete_wait(args.name, timeout=args.timeout)
        except TimeoutError as e:
            ctx.err.print(render.clean(e), highlight=False)
            return EXIT_TIMEOUT
    return EXIT_OK


def cmd_ui(ctx: Context, args: argparse.Namespace) -> int:
    from finetune_operator.webui import UiServer, Views

    namespaces = tuple(dict.fromkeys([ctx.client.namespace, *args.also_namespace]))
    try:
        server = UiServer(Views(ctx.client, namespaces), address=args.address, port=args.port)
    except OSError as e:
        raise UserError(f"cannot listen on {args.address}:{args.port}: {e.strerror} (pick another --port)") from None
    ctx.err.print(f"finetune ui: serving {server.url} (Ctrl-C stops it)", highlight=False)
    if args.open:
        import webbrowser

        webbrowser.open(server.url)
    try:
        server.serve_forever()
    finally:
        server.stop()
    return EXIT_OK


# -- the parser -------------------------------------------------------------------------------------------------

COMMANDS: dict[str, Callable[[Context, argparse.Namespace], int]] = {
    "submit": cmd_submit,
    "validate": cmd_validate,
    "status": cmd_status,
    "runtimes": cmd_runtimes,
    "list": cmd_list,
    "logs": cmd_logs,
    "wait": cmd_wait,
    "suspend": lambda c, a: _set_suspend(c, a.name, True),
    "resume": lambda c, a: _set_suspend(c, a.name, False),
    "delete": cmd_delete,
    "ui": cmd_ui,
}


def run(args: argparse.Namespace) -> int:
    err = Console(stderr=True, soft_wrap=True, markup=False)  # cluster text is never markup (render.clean)
    try:
        client = FineTuneClient(
            args.namespace,
            kubeconfig=getattr(args, "kubeconfig", None),
            context=getattr(args, "context", None),
            offline=bool(getattr(args, "offline", False)),
        )
        return COMMANDS[args.command](Context(client, Console(soft_wrap=True, markup=False), err), args)
    except UserError as e:
        err.print(Text.assemble(("error", "red"), f": {render.clean(e)}"), highlight=False)
        return EXIT_USAGE
    except ApiError as e:
        err.print(Text.assemble(("error", "red"), f": the API server answered {render.clean(e)}"), highlight=False)
        return EXIT_FAILED if e.code != 403 else EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
