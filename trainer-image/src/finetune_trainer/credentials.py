"""The export's write credentials stay with rank 0's launcher: the training processes, whose code may come from a model
repository, neither inherit them nor can read them from the launcher. Standard library only."""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

HUB_TOKEN_ENV = "FINETUNE_HUB_TOKEN"
# The export's write credentials: never in a training process's environment.
SECRET_ENV = (HUB_TOKEN_ENV, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
PR_SET_DUMPABLE = 4


def without_secrets(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a training process: the export credentials left out."""
    return {k: v for k, v in env.items() if k not in SECRET_ENV}


def hide_secrets() -> bool:
    """When this process holds export credentials, make it non-dumpable: its ``/proc/<pid>/environ`` and memory are
    then readable only by root, and no process of the same user (the training processes) can ptrace it. True when the
    process holds credentials and is now hidden."""
    if not any(os.environ.get(k) for k in SECRET_ENV):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning(
            "could not make the launcher non-dumpable (errno %d): its export credentials are readable by "
            "the training processes through /proc",
            ctypes.get_errno(),
        )
        return False
    return True
