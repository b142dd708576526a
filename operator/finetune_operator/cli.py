"""The ``finetune`` command line. For users: ``submit``, ``validate``, ``status``, ``list``, ``logs``, ``wait``,
``suspend``, ``resume``, ``delete`` (finetune_operator.jobctl over finetune_operator.client, docs/cli.md) and ``ui``
(finetune_operator.webui). ``finetune operator`` runs the operator; ``finetune run-local`` runs a FineTuneJob manifest
on this machine with the same config and env contract as the pods."""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import hashlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from finetune_operator.settings import Settings

log = logging.getLogger(__name__)


def peering_priority(pod_name: str) -> int:
    """Distinct per replica: two live replicas with equal priorities both pause in kopf (and in the backstop gate),
    a silent outage until one restarts. 48 bits of the pod name's SHA-256 make a tie between the replicas of a
    rollout (three pods in a surge) about 1e-14 likely, where 10,000 values made it 1e-4; 48 bits stay exact in the
    peering object's JSON numbers."""
    return int.from_bytes(hashlib.sha256(pod_name.encode()).digest()[:6], "big") + 1


def _peering_priority() -> int:
    """From the pod name unless given."""
    if os.environ.get("FINETUNE_PEERING_PRIORITY"):
        return int(os.environ["FINETUNE_PEERING_PRIORITY"])
    return peering_priority(os.environ.get("POD_NAME", os.uname().nodename))


class PeeringGate:
    """Whether this replica runs the backstop (finetune_operator.peering.backstop_active), from kopf's peering object
    of every watched namespace (or the cluster-wide one), read at most every few seconds; a failed read keeps the
    last answer (off until one read succeeded). Exports the answer, also while reads fail (so an operator that may
    not read its peering objects shows inactive and alerts), and the missing objects, and logs each object that goes
    missing or comes back. The reads run on a thread of their own: the backstop's loop, whose heartbeat is the
    liveness probe's, only reads the last answer and never waits on the API server (one slow GET per watched
    namespace could otherwise hold it past the liveness limit)."""

    def __init__(
        self, kube: Any, namespaces: tuple[str, ...], priority: int, metrics: Any = None, every: float = 1.0
    ) -> None:
        self.kube, self.priority, self.metrics, self.every = kube, priority, metrics, every
        self.namespaces: tuple[str | None, ...] = namespaces or (None,)
        self._at, self._answer = float("-inf"), False
        self._missing: set[str | None] = set()
        self._reading = threading.Lock()

    def __call__(self) -> bool:
        """The last answer; starts a read when it is older than ``every`` and none is running."""
        if time.monotonic() - self._at >= self.every and self._reading.acquire(blocking=False):
            self._at = time.monotonic()
            threading.Thread(target=self._read_and_release, name="peering-gate", daemon=True).start()
        return self._answer

    def _read_and_release(self) -> None:
        try:
            self.read()
        finally:
            self._reading.release()

    def read(self) -> bool:
        """Read every peering object now and settle the answer (what the reading thread runs)."""
        from datetime import UTC, datetime

        from finetune_operator.peering import backstop_active

        try:
            objects = {ns: self.kube.get_peering("finetune-operator", ns) for ns in self.namespaces}
        except Exception as e:  # keep the last answer; kopf's own peering also rides out API hiccups
            log.warning("reading the peering objects failed, the backstop stays %s: %s", self._state(), e)
            if self.metrics is not None:
                self.metrics.backstop_active.set(1 if self._answer else 0)
            return self._answer
        self._answer, missing = backstop_active(objects, own_priority=self.priority, now=datetime.now(UTC))
        for ns in set(missing) - self._missing:
            log.error(
                "the KopfPeering finetune-operator %s is missing: replicas cannot coordinate through it "
                "(kopf and the backstop ignore it); the chart creates it: `helm upgrade` the release",
                f"in namespace {ns}" if ns else "(cluster-wide)",
            )
        for ns in self._missing - set(missing):
            log.info("the KopfPeering finetune-operator %s is back", f"in namespace {ns}" if ns else "(cluster-wide)")
        self._missing = set(missing)
        if self.metrics is not None:
            self.metrics.backstop_active.set(1 if self._answer else 0)
            self.metrics.peering_missing.set(len(missing))
        return self._answer

    def _state(self) -> str:
        return "active" if self._answer else "inactive"


def run_operator(args: argparse.Namespace) -> int:
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # before the kubernetes client reads it at import
    import kopf
    from prometheus_client import start_http_server

    from finetune_operator.controller import Controller
    from finetune_operator.handlers import build_registry
    from finetune_operator.k8s import Kube, load_api_client
    from finetune_operator.store import Store

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1` dumps every thread's stack: for stuck operators
    settings = Settings.from_env()
    if args.namespace:
        settings = Settings(**{**settings.__dict__, "namespaces": tuple(args.namespace)})
    kopf.configure(log_format=kopf.LogFormat.JSON if args.log_json else kopf.LogFormat.PLAIN, verbose=args.verbose)
    if not args.verbose:
        # kopf logs every handled watch event ("Handler ... succeeded.") at INFO: a line per pod event, noise at
        # scale and CPU; the operator logs its own state transitions. --verbose brings them back.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    controller = Controller(
        Kube(load_api_client(args.kubeconfig)), settings, store=Store() if settings.watch_cache else None
    )
    _priority = _peering_priority()
    if settings.metrics_port:
        start_http_server(settings.metrics_port, registry=controller.metrics.registry)
    if not args.standalone:
        controller.active = PeeringGate(controller.kube, tuple(settings.namespaces), _priority, controller.metrics)
    stop = threading.Event()
    backstop = threading.Thread(target=controller.loop, args=(stop,), name="backstop", daemon=True)
    backstop.start()
    priority = _priority
    try:
        asyncio.run(
            kopf.operator(
                registry=build_registry(
                    controller,
                    peering_priority=priority,
                    peering_lifetime=settings.peering_lifetime_seconds,
                    on_cleanup=stop.set,
                ),
                standalone=args.standalone,
                priority=priority,
                # A peering name makes peering mandatory in kopf: only when not standalone.
                peering_name=None if args.standalone else "finetune-operator",
                clusterwide=not settings.namespaces,
                namespaces=list(settings.namespaces),
                liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz" if settings.health_port else None,
            )
        )
    finally:
        stop.set()
        backstop.join(timeout=5)
    return 0


def add_user_parsers(sub: Any) -> None:
    """The user commands (finetune_operator.jobctl), on the ``finetune`` parser's subcommands. Here, not in jobctl:
    building the parser must not import the kubernetes client, which reads $KUBECONFIG at import, before
    ``finetune operator`` has set it."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", help="the namespace (default: the kubeconfig context's, else default)")
    common.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    common.add_argument("--context", help="the kubeconfig context to use")

    p = sub.add_parser("submit", parents=[common], help="validate a FineTuneJob manifest, then apply it")
    p.add_argument("file", help="the manifest (- for standard input)")
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="then show its progress and rank 0's log until it ends; exit with its result",
    )
    p.add_argument("--force-conflicts", action="store_true", help="take over fields another manager set")
    p = sub.add_parser("validate", parents=[common], help="check a manifest: typed spec and a server dry run")
    p.add_argument("file")
    p.add_argument("--offline", action="store_true", help="the typed spec only (no cluster needed)")
    p = sub.add_parser("status", parents=[common], help="state, reason, progress, pods, conditions and events")
    p.add_argument("name")
    sub.add_parser("runtimes", parents=[common], help="the runtimes a job of the namespace may name (spec.runtimeRef)")
    p = sub.add_parser("list", parents=[common], help="the FineTuneJobs of the namespace")
    p.add_argument("-A", "--all-namespaces", action="store_true")
    p = sub.add_parser("logs", parents=[common], help="a rank's trainer log (default rank 0, current attempt)")
    p.add_argument("name")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, default=0, help="the node rank (default 0)")
    which.add_argument("--all", action="store_true", help="every rank, each line prefixed with [node N]")
    p.add_argument("--attempt", type=int, help="the attempt (default: the current one)")
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming while the rank runs")
    p.add_argument("--tail", type=int, help="only the last N lines")
    p = sub.add_parser("wait", parents=[common], help="block until the job reaches a state")
    p.add_argument("name")
    p.add_argument(
        "--for",
        dest="for_",
        choices=("Succeeded", "Failed", "Running", "Suspended", "finished"),
        default="finished",
        help="the state to wait for (default finished: Succeeded or Failed)",
    )
    p.add_argument("--timeout", type=float, help="give up after this many seconds (exit 124)")
    for verb, text in (
        ("suspend", "stop the job's pods (spec.suspend=true); it keeps its checkpoints"),
        ("resume", "start a suspended job again, from its newest checkpoint"),
    ):
        p = sub.add_parser(verb, parents=[common], help=text)
        p.add_argument("name")
    p = sub.add_parser("delete", parents=[common], help="delete the job (its pods, Service and ConfigMap go with it)")
    p.add_argument("name")
    p.add_argument("--wait", action="store_true", help="until the job and its pods are gone")
    p.add_argument("--timeout", type=float, default=300.0, help="for --wait (default 300 s)")
    p = sub.add_parser(
        "ui",
        parents=[common],
        help="serve a web view of the jobs and their curves on localhost, with your kubeconfig",
    )
    p.add_argument(
        "--address", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=8080, help="the port (default 8080; 0: any free one)")
    p.add_argument(
        "--also-namespace",
        action="append",
        default=[],
        metavar="NS",
        help="when you may not list jobs in every namespace: list these too (repeat; -n and the context's always)",
    )
    p.add_argument("--open", action="store_true", help="open the page in the default browser")


USER_COMMANDS = (
    "submit",
    "validate",
    "status",
    "runtimes",
    "list",
    "logs",
    "wait",
    "suspend",
    "resume",
    "delete",
    "ui",
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="finetune",
        description="Fine-tune Hugging Face models as FineTuneJobs on "
        "Kubernetes: submit and follow jobs, or run the operator.",
    )
    sub = ap.add_subparsers(dest="command", required=True)
    op = sub.add_parser("operator", help="run the FineTuneJob operator")
    op.add_argument("--namespace", "-n", action="append", help="watch this namespace (repeat); default: all")
    op.add_argument("--standalone", action="store_true", help="no peering (a single replica, or tests)")
    op.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    op.add_argument("--log-json", action="store_true", help="structured JSON logs")
    op.add_argument("--verbose", "-v", action="store_true")
    rl = sub.add_parser("run-local", help="run a FineTuneJob manifest on this machine")
    rl.add_argument("manifest")
    rl.add_argument("--workdir", help="where the output claim and logs go (default: ./output/<job>)")
    rl.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="MOUNTPATH=DIR",
        help="map a volume mount path of the manifest to a local directory (repeat)",
    )
    add_user_parsers(sub)
    args = ap.parse_args(argv)
    if args.command in USER_COMMANDS:
        from finetune_operator import jobctl

        return jobctl.run(args)
    if args.command == "operator":
        return run_operator(args)  # kopf configures logging (plain or JSON)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from finetune_operator.runlocal import run_local

    return int(run_local(args.manifest, workdir=args.workdir, mounts=args.mount))


if __name__ == "__main__":
    sys.exit(main())
