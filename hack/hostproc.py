"""What the components run as processes of this host (Kueue, the coscheduling scheduler) share: their log's tail, and
whether their HTTPS endpoint answers."""

from __future__ import annotations

import contextlib
import ssl
import urllib.error
import urllib.request
from pathlib import Path


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
