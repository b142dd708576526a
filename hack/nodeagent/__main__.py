"""``python -m hack.nodeagent``: run the local node agent until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from hack.nodeagent.agent import NodeAgent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hack.nodeagent", description=__doc__)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--node", default="local-agent", help="Node name to register (default: local-agent)")
    ap.add_argument("--claims-dir", required=True, help="PVC <claimName> in <ns> = <claims-dir>/<ns>/<claimName>")
    ap.add_argument("--namespace", help="only pods of this namespace (default: all namespaces)")
    ap.add_argument("--state-dir", help="pod logs and volumes (default: a new temporary directory)")
    ap.add_argument("--image-venv", help="the virtualenv standing in for the trainer image")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s nodeagent %(levelname)s %(message)s")
    agent = NodeAgent(
        args.kubeconfig,
        node_name=args.node,
        claims_dir=args.claims_dir,
        namespace=args.namespace,
        state_dir=args.state_dir,
        image_venv=args.image_venv,
    )
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    agent.start()
    print(f"node agent {args.node} running; pod logs in {agent.state_dir / 'logs'}", flush=True)
    done.wait()
    agent.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
