"""Rank 0's metrics page, read off the reconcile path: a trainer is tenant code, and one that answers slowly, trickles
bytes or never answers must not hold a job's lock, the backstop loop or kopf's workers.

A pass asks :meth:`Scraper.take` for the newest finished scrape of its job and, when the progress interval has passed,
starts the next one in a small pool of its own. Each scrape has a total deadline (not a per-read timeout, which a
trickling server resets with every byte), follows no redirects and reads at most :data:`MAX_METRICS_BYTES`. A finished
scrape asks for a pass of its job, which merges it into the status.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from finetune_operator.progress import parse_metrics
from finetune_operator.status import Progress

log = logging.getLogger(__name__)
Key = tuple[str, str]
# A trainer's page is a few KiB (tests/unit/test_scrape.py measures the real exporter's); a tenant's code can serve
# anything, and every byte read is parsed under the operator's GIL: never more than this.
MAX_METRICS_BYTES = 64 << 10
DEADLINE_SECONDS = 2.0  # the whole scrape: connect, request, headers and body


def fetch_metrics(url: str, deadline: float = DEADLINE_SECONDS) -> str:
    """GET ``url`` within ``deadline`` seconds in all; no redirects, at most :data:`MAX_METRICS_BYTES`."""
    end = time.monotonic() + deadline

    def left() -> float:
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{url}: no complete answer within {deadline:g}s")
        return remaining

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=left())
    expired = threading.Event()

    def cut() -> None:  # a read that trickles (headers included) is cut at the deadline, whatever its timeouts
        expired.set()
        if conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(deadline, cut)
    watchdog.start()
    try:
        text = _read(conn, url, parts.path or "/", left)
        if expired.is_set():  # cut short: what was read is not the whole page
            raise TimeoutError("cut at the deadline")
        return text
    except (TimeoutError, OSError, http.client.HTTPException) as e:
        if isinstance(e, TimeoutError) or expired.is_set():
            raise TimeoutError(f"{url}: no complete answer within {deadline:g}s") from e
        raise
    finally:
        watchdog.cancel()
        conn.close()


def _read(conn: http.client.HTTPConnection, url: str, path: str, left: Callable[[], float]) -> str:
    conn.request("GET", path)
    sock = conn.sock  # the response reads through it; http.client drops its own reference for a closing answer
    assert sock is not None
    sock.settimeout(left())
    resp = conn.getresponse()
    if resp.status != 200:
        raise ValueError(f"{url}: HTTP {resp.status} (redirects are not followed)")
    body = bytearray()
    while True:
        sock.settimeout(left())
        chunk = resp.read1(64 * 1024)
        if not chunk:
            break
        body += chunk
        if len(body) > MAX_METRICS_BYTES:
            raise ValueError(f"{url}: metrics page larger than {MAX_METRICS_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


SLOW_SECONDS = DEADLINE_SECONDS / 2  # a scrape that took this long sends its job's next ones to the slow lane
# An attempt whose rank 0 has not reported a step yet (its trainer starting, its page not served) is scraped again this
# soon, at most this many times: its first progress shows within seconds of the loop starting, not an interval later.
START_RETRY_SECONDS = 2.0
START_RETRIES = 60


class Scraper:
    """At most one scrape in flight per job, in three lanes: jobs whose last scrape was quick on ``workers`` threads;
    jobs not scraped yet on ``new_workers``; jobs whose last scrape was slow (over :data:`SLOW_SECONDS`: a page that
    trickles, hangs or is huge) on ``slow_workers``, until a scrape of theirs is quick again. However many tenants
    serve such pages, and however many such jobs appear at once, the jobs already known to answer quickly keep their
    progress interval: the others wait only for each other."""

    def __init__(
        self,
        *,
        interval: float,
        on_done: Callable[[Key], None],
        on_retry: Callable[[Key, float], None] | None = None,
        workers: int = 3,
        new_workers: int = 1,
        slow_workers: int = 1,
        fetch: Callable[[str], str] = fetch_metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.on_done = on_done
        self.on_retry = on_retry
        self.fetch = fetch
        self.clock = clock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="scrape")
        self._new_pool = ThreadPoolExecutor(max_workers=new_workers, thread_name_prefix="scrape-new")
        self._slow_pool = ThreadPoolExecutor(max_workers=slow_workers, thread_name_prefix="scrape-slow")
        self._lock = threading.Lock()
        self._started: dict[Key, float] = {}  # monotonic start of the job's last scrape
        self._inflight: set[Key] = set()
        self._was_slow: dict[Key, bool] = {}  # whether each job's last scrape was slow (absent: not scraped yet)
        self._done: dict[Key, tuple[str, int, Progress]] = {}  # url and attempt scraped, what came back
        self._starting: dict[Key, tuple[int, int]] = {}  # (attempt, scrapes without a step; -1 once a step showed)

    def take(self, key: Key, url: str | None, *, nodes: int, attempt: int) -> Progress | None:
        """The newest finished scrape of the job's rank 0 at ``url`` in ``attempt`` (once; a scrape of an earlier
        attempt's rank 0 is dropped), and the next one started when it is due. ``url`` None: the job has no rank 0 to
        scrape now."""
        with self._lock:
            done = self._done.pop(key, None)
            result = done[2] if done is not None and done[:2] == (url, attempt) else None
            due = time.monotonic() - self._started.get(key, float("-inf")) >= self.interval
            if url is None or not due or key in self._inflight:
                return result
            self._inflight.add(key)
            self._started[key] = time.monotonic()
            was_slow = self._was_slow.get(key)
            pool = self._new_pool if was_slow is None else self._slow_pool if was_slow else self._pool
        pool.submit(self._scrape, key, url, nodes, attempt)
        return result

    def slow(self) -> int:
        """How many jobs are in the slow lane now."""
        with self._lock:
            return sum(self._was_slow.values())

    def _scrape(self, key: Key, url: str, nodes: int, attempt: int) -> None:
        progress = None
        began = self.clock()
        try:
            progress = parse_metrics(self.fetch(url), nodes=nodes)
        except Exception as e:  # a scrape failure never fails the job
            log.debug("%s/%s: scraping %s failed: %s", key[0], key[1], url, e)
        took = self.clock() - began
        with self._lock:
            self._inflight.discard(key)
            if key in self._started:  # not forgotten meanwhile
                self._was_slow[key] = took >= SLOW_SECONDS
            if progress is not None and key in self._started:
                self._done[key] = (url, attempt, progress)
            retry = self._soon_again(key, attempt, stepping=progress is not None and progress.step is not None)
        if progress is not None:
            self.on_done(key)
        if retry is not None and self.on_retry is not None:
            self.on_retry(key, retry)

    def _soon_again(self, key: Key, attempt: int, *, stepping: bool) -> float | None:
        """After a scrape of ``attempt`` that saw no step: due again in START_RETRY_SECONDS (the seconds to wait), a
        bounded number of times per attempt; None once a step shows. Holds the lock."""
        if key not in self._started:
            return None
        seen, empty = self._starting.get(key, (attempt, 0))
        if seen != attempt:
            empty = 0
        if stepping or empty < 0:  # stepping, or stepped before in this attempt: the interval, as always
            self._starting[key] = (attempt, -1)
            return None
        empty += 1
        self._starting[key] = (attempt, empty)
        if empty > START_RETRIES or self.interval <= START_RETRY_SECONDS:
            return None
        self._started[key] = time.monotonic() - self.interval + START_RETRY_SECONDS
        return START_RETRY_SECONDS

    def forget(self, key: Key) -> None:
        with self._lock:
            self._started.pop(key, None)
            self._done.pop(key, None)
            self._was_slow.pop(key, None)
            self._starting.pop(key, None)

    def shutdown(self) -> None:
        for pool in (self._pool, self._new_pool, self._slow_pool):
            pool.shutdown(wait=False, cancel_futures=True)
