"""Distributed preflight: make sure rank 0's address resolves (and, from other ranks, accepts connections)
before torchrun starts its rendezvous, so a missing peer becomes a clear ``RendezvousTimeout`` (exit 75) instead
of a torchrun hang.

DNS answers for a pod name appear only once the pod has an IP and negative answers are cached for up to 30 s,
so both steps retry with capped exponential backoff until the deadline.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable

from finetune_trainer.errors import RendezvousTimeout

log = logging.getLogger(__name__)


def _backoff(attempt: int, initial: float = 0.2, cap: float = 5.0) -> float:
    return min(cap, initial * (2.0**attempt))


def wait_for_master(
    addr: str,
    port: int,
    *,
    connect: bool,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Resolve ``addr`` (and when ``connect``, open a TCP connection to ``addr:port``) until it works or
    ``timeout_s`` passes. Returns the seconds it took; raises :class:`RendezvousTimeout` naming the address."""
    start = clock()
    deadline = start + timeout_s
    attempt = 0
    last_error = "not tried"
    while True:
        try:
            infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
            if not connect:
                return clock() - start
            for family, socktype, proto, _, sockaddr in infos:
                with socket.socket(family, socktype, proto) as s:
                    s.settimeout(max(0.5, min(5.0, deadline - clock())))
                    try:
                        s.connect(sockaddr)
                        return clock() - start
                    except OSError as e:
                        last_error = f"connect {sockaddr[0]}:{port}: {e}"
        except socket.gaierror as e:
            last_error = f"resolve {addr}: {e}"
        now = clock()
        if now >= deadline:
            what = "reach" if connect else "resolve"
            raise RendezvousTimeout(
                f"could not {what} rank 0 at {addr}:{port} within {timeout_s:g}s (last error: {last_error}); "
                "check that the rank-0 pod is running and the headless Service exists "
                "(spec.rendezvousTimeoutSeconds sets this limit)"
            )
        delay = min(_backoff(attempt), max(0.0, deadline - now))
        attempt += 1
        log.info("preflight: waiting for %s:%s (%s); retrying in %.1fs", addr, port, last_error, delay)
        sleep(delay)
