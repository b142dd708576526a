"""A real OCI registry on this machine, for the local release (``python -m hack.release local``) and the tests that
install from it: the CNCF distribution registry, built from the Go module proxy by ``build.sh`` (cached under
``$FINETUNE_CACHE/registry-<version>``), run as a process serving plain HTTP on 127.0.0.1 with its blobs and
manifests under a directory of the caller's.

Plain HTTP on loopback is what Helm (``--plain-http``), buildah (``--tls-verify=false``) and containerd (which speaks
HTTP to a ``localhost``/``127.0.0.1`` registry without being told) accept from a registry of this machine; the real
nodes' containerds run in the host's network namespace, so 127.0.0.1 is this registry for them too.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from hack.localcluster.cluster import free_port, stop_group

HERE = Path(__file__).resolve().parent
VERSION = (HERE / "version").read_text().strip()
CACHE = Path(os.environ.get("FINETUNE_CACHE", Path.home() / ".cache" / "finetune-operator"))
BINARY = CACHE / f"registry-{VERSION}" / "bin" / "registry"


def ensure_built() -> Path:
    """The registry binary, built first when the cache lacks it (waits on a build another process runs)."""
    if not (BINARY.parent.parent / ".complete").exists():
        subprocess.run(["bash", str(HERE / "build.sh")], check=True, stdout=subprocess.DEVNULL)
    return BINARY


# Where the tests' registry keeps its blobs between runs: a warm run's push then finds the unchanged layers there (as
# any registry that holds a previous release does) and uploads only the manifests, configs and what changed.
CACHED_STORAGE = CACHE / "registry-storage"


class Registry:
    """One registry process, its config and log under ``root`` and its blobs and manifests under ``storage`` (default
    ``root/data``); ``host`` (``127.0.0.1:<port>``) once started."""

    def __init__(self, root: Path, storage: Path | None = None) -> None:
        self.root = Path(root)
        self.storage = Path(storage) if storage else self.root / "data"
        self.host = ""
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.root / "registry.log"

    def start(self, timeout: float = 30.0) -> str:
        binary = ensure_built()
        self.root.mkdir(parents=True, exist_ok=True)
        port = free_port()
        config = self.root / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: info\n  formatter: text\n  accesslog:\n    disabled: false\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{port}\n"
        )
        if self.storage.exists():  # what no tag names any more (an older build's layers) goes before it serves
            with self.log.open("ab") as log:
                subprocess.run(
                    [str(binary), "garbage-collect", "--delete-untagged", str(config)], stdout=log, stderr=log
                )
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(binary), "serve", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.host = f"127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the registry exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as r,
            ):
                if r.status == 200:
                    return self.host
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the registry did not answer on {self.host} within {timeout:.0f}s")

    def stop(self) -> None:
        stop_group(self.proc)

    def pulls(self) -> list[tuple[str, str, str]]:
        """``(repository, reference, user agent)`` of every manifest GET the registry answered 200, from its log."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            m = re.search(r'"GET /v2/(.+)/manifests/(\S+) HTTP/[\d.]+" 200 \d+ "[^"]*" "([^"]*)"', line)
            if m:
                found.append((m.group(1), m.group(2), m.group(3)))
        return found

    def __enter__(self) -> Registry:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["BINARY", "CACHED_STORAGE", "VERSION", "Registry", "ensure_built"]
