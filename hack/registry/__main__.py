"""``python -m hack.registry [--dir DIR]``: a registry on this machine for a local release, in the foreground until
Ctrl-C; prints its address. Then, in another shell: ``python -m hack.release local --registry <address> --version
X.Y.Z`` and ``helm install ... oci://<address>/finetune-operator/charts/finetune-operator --plain-http``
(docs/release.md)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from pathlib import Path

from hack.registry import CACHED_STORAGE, Registry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hack.registry", description=__doc__)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/finetune-registry"), help="its config and log")
    ap.add_argument("--storage", type=Path, default=CACHED_STORAGE, help="its blobs and manifests")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill stops the registry too, as Ctrl-C does
    reg = Registry(args.dir, storage=args.storage)
    host = reg.start()
    print(f"registry: {host} (log {reg.log}); Ctrl-C stops it", file=sys.stderr)
    print(host, flush=True)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            while reg.proc is not None and reg.proc.poll() is None:
                time.sleep(1)
    finally:
        reg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
