"""What the components run as processes of this host (Kueue, the coscheduling scheduler) share: a working directory,
one process group logging to a file in it, waits that fail with the log's tail when the process dies or stays unready,
and whether an HTTPS endpoint answers."""

from __future__ import annotations

import contextlib
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from hack.localcluster.cluster import stop_group


def log_tail(log: Path, lines: int = 60) -> str:
    """The last ``lines`` of a component's log ("" before it wrote one)."""
    with contextlib.suppress(FileNotFoundError):
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return ""


def https_answers(port: int, path: str = "/healthz", *, any_status: bool = False) -> bool:
    """The component's HTTPS server on 127.0.0.1:``port`` answers ``path`` with 200 (``any_status``: with anything,
    an error status included: the server is up). Its certificate is not checked: a test's own, on loopback."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", timeout=2, context=ctx) as r:
            return bool(r.status == 200)
    except urllib.error.HTTPError:
        return any_status
    except (urllib.error.URLError, OSError):
        return False


class HostProcess:
    """One component run here in a process group of its own, with a temporary directory holding its files and its
    log. Subclasses name it (``label``), its log file and the error their waits raise."""

    label = "the component"
    log_name = "component.log"
    error: type[RuntimeError] = RuntimeError

    def __init__(self, prefix: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.proc: subprocess.Popen[bytes] | None = None

    def launch(self, argv: list[str], kubeconfig: str) -> None:
        """Start ``argv`` with ``KUBECONFIG`` set, its output appended to the log."""
        with open(self.dir / self.log_name, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "KUBECONFIG": kubeconfig},
                start_new_session=True,
            )

    def wait_until(self, ready: Callable[[], bool], what: str, timeout: float) -> None:
        """Poll ``ready`` until it holds; raise with the log's tail if the process exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not ready():
            self.check()
            if time.monotonic() > deadline:
                raise self.error(f"{what}: not after {timeout:.0f}s; last lines of its log:\n{self.log_tail()}")
            time.sleep(0.3)

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise self.error(
                f"{self.label} exited with {self.proc.returncode}; last lines of its log:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.dir / self.log_name, lines)

    def stop(self) -> None:
        """Stop the process group and remove the directory."""
        stop_group(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)
