"""Poll for a condition with a timeout: tests never sleep and hope."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
) -> T:
    """Call ``probe`` until it returns something truthy; return it, or fail naming ``what``.

    Exceptions raised by ``probe`` count as "not yet" until the deadline, then are chained.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    last: T | None = None
    while True:
        try:
            last = probe()
            last_exc = None
            if last:
                return last
        except Exception as e:  # probe not ready yet
            last_exc = e
        if time.monotonic() > deadline:
            msg = f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}"
            raise AssertionError(msg) from last_exc
        time.sleep(interval)
