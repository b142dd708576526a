"""The ``finetune`` command line. For users: ``submit``, ``validate``, ``status``, ``list``, ``logs``, ``wait``,
``suspend``, ``resume``, ``delete`` (finetune_operator.jobctl, docs/cli.md). ``finetune operator`` runs the operator;
``finetune run-local`` runs a FineTuneJob manifest on this machine with the same config and env contract as the
pods."""

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
    """Reads kopf's peering object at most every few seconds; a failed read keeps the last answer."""

    def __init__(self, kube: Any, namespace: str | None, priority: int, every: float = 1.0) -> None:
        self.kube, self.namespace, self.priority, self.every = kube, namespace, priority, every
        self._at, self._answer = float("-inf"), False

    def __call__(self) -> bool:
        from datetime import UTC, datetime

        from finetune_operator.peering import peering_active

        if time.monotonic() - self._at >= self.every:
            self._at = time.monotonic()
            try:
                obj = self.kube.get_peering("finetune-operator", self.namespace) or {}
                self._answer = peering_active(obj.get("status") or {}, own_priority=self.priority,
                                              now=datetime.now(UTC))
            except Exception:  # keep the last answer; kopf's own peering also rides out API hiccups
                pass
        return self._answer


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
    kopf.configure(log_format=kopf.LogFormat.JSON if args.log_json else kopf.LogFormat.PLAIN,
                   verbose=args.verbose)
    if not args.verbose:
        # kopf logs every handled watch event ("Handler ... succeeded.") at INFO: a line per pod event, noise at
        # scale and CPU; the operator logs its own state transitions. --verbose brings them back.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    controller = Controller(Kube(load_api_client(args.kubeconfig)), settings,
                            store=Store() if settings.watch_cache else None)
    _priority = _peering_priority()
    if settings.metrics_port:
        start_http_server(settings.metrics_port, registry=controller.metrics.registry)
    if not args.standalone:
        controller.active = PeeringGate(controller.kube, next(iter(settings.namespaces), None), _priority)
    stop = threading.Event()
    backstop = threading.Thread(target=controller.loop, args=(stop,), name="backstop", daemon=True)
    backstop.start()
    priority = _priority
    try:
        asyncio.run(kopf.operator(
            registry=build_registry(controller, peering_priority=priority,
                                    peering_lifetime=settings.peering_lifetime_seconds, on_cleanup=stop.set),
            standalone=args.standalone,
            priority=priority,
            # A peering name makes peering mandatory in kopf: only when not standalone.
            peering_name=None if args.standalone else "finetune-operator",
            clusterwide=not settings.namespaces,
            namespaces=list(settings.namespaces),
            liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz" if settings.health_port else None,
        ))
    finally:
        stop.set()
        backstop.join(timeout=5)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="finetune", description="Fine-tune Hugging Face models as FineTuneJobs on "
                                 "Kubernetes: submit and follow jobs, or run the operator.")
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
    rl.add_argument("--mount", action="append", default=[], metavar="MOUNTPATH=DIR",
                    help="map a volume mount path of the manifest to a local directory (repeat)")
    from finetune_operator import jobctl

    jobctl.add_parsers(sub)
    args = ap.parse_args(argv)
    if args.command in jobctl.COMMANDS:
        return jobctl.run(args)
    if args.command == "operator":
        return run_operator(args)  # kopf configures logging (plain or JSON)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from finetune_operator.runlocal import run_local

    return int(run_local(args.manifest, workdir=args.workdir, mounts=args.mount))


if __name__ == "__main__":
    sys.exit(main())
