"""Reading rank 0's metrics page (finetune_operator.scrape.fetch_metrics) from real local HTTP servers: a total
deadline, no redirects, a size cap."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest
from finetune_operator.scrape import MAX_METRICS_BYTES, fetch_metrics

pytestmark = pytest.mark.unit


def serve(answer: bytes, *, trickle: bool = False) -> Iterator[str]:
    """A one-connection-at-a-time server on 127.0.0.1 that sends ``answer`` (then, with ``trickle``, a byte every
    50 ms until the client hangs up)."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def run() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                try:
                    conn.recv(4096)
                    conn.sendall(answer)
                    while trickle and not stop.wait(0.05):
                        conn.sendall(b"#")
                except OSError:
                    pass

    server = threading.Thread(target=run, daemon=True)
    server.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/metrics"
    stop.set()
    server.join(timeout=5)
    srv.close()


def http(status: str, body: bytes, *headers: str, length: int | None = None) -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body) if length is None else length}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def test_a_page_is_read() -> None:
    for url in serve(http("200 OK", b"finetune_train_step 3\n")):
        assert fetch_metrics(url) == "finetune_train_step 3\n"


def test_the_trainers_own_exporter_is_read() -> None:
    """prometheus_client's server (what the trainer serves) answers HTTP/1.0 and closes the connection."""
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    registry = CollectorRegistry()
    Gauge("finetune_train_step", "step", registry=registry).set(42)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        text = fetch_metrics(f"http://127.0.0.1:{server.server_port}/metrics")
        assert "finetune_train_step 42.0" in text
    finally:
        server.shutdown()
        thread.join(timeout=5)


def test_a_trickling_page_is_given_up_at_the_deadline() -> None:
    """Each byte would reset a per-read timeout; the deadline covers the whole answer."""
    for url in serve(http("200 OK", b"", length=10_000), trickle=True):
        with pytest.raises(TimeoutError, match=r"no complete answer within 0\.5s"):
            fetch_metrics(url, deadline=0.5)


def test_trickling_headers_are_given_up_at_the_deadline() -> None:
    """Header lines one at a time, each inside any per-read timeout: the deadline still cuts the answer."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def run() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            i = 0
            while not stop.wait(0.1):
                with contextlib.suppress(OSError):
                    conn.sendall(f"X-Header-{i}: 1\r\n".encode())
                i += 1

    server = threading.Thread(target=run, daemon=True)
    server.start()
    try:
        with pytest.raises(TimeoutError, match="no complete answer"):
            fetch_metrics(f"http://127.0.0.1:{srv.getsockname()[1]}/metrics", deadline=0.5)
    finally:
        stop.set()
        server.join(timeout=5)
        srv.close()


def test_redirects_are_not_followed() -> None:
    for url in serve(http("302 Found", b"", "Location: http://169.254.169.254/latest/meta-data/")):
        with pytest.raises(ValueError, match="HTTP 302"):
            fetch_metrics(url)


def test_a_page_over_the_cap_is_refused() -> None:
    body = b"#" * (MAX_METRICS_BYTES + 10)
    for url in serve(http("200 OK", body)):
        with pytest.raises(ValueError, match="larger than"):
            fetch_metrics(url)


def test_the_real_trainer_page_is_far_below_the_cap() -> None:
    """The cap is not a guess: the trainer's whole exporter (every family, histograms observed) fits a quarter of it."""
    from finetune_trainer.metrics import TrainerMetrics
    from prometheus_client import generate_latest

    m = TrainerMetrics(namespace="a-long-namespace-name-of-a-team", job="a-job-name-that-is-long-too", node_rank=511)
    m.step_duration.observe(0.5)
    size = len(generate_latest(m.registry))
    assert size < MAX_METRICS_BYTES / 4, size


def test_a_hostile_page_yields_only_values_the_status_can_hold() -> None:
    """A tenant's rank 0 pads its page with other series and reports absurd values: only our gauges are parsed, and a
    value the status cannot hold (an int64 overflow, a negative step) is left out, not written to fail every PUT."""
    from finetune_operator.progress import parse_metrics

    padding = "".join(f'other_series{{i="{i}"}} {i}\n' for i in range(2000))
    page = padding + (
        "finetune_train_total_steps 100\nfinetune_train_step 1e19\nfinetune_train_loss 0.5\n"
        "finetune_checkpoint_last_step -3\nfinetune_train_samples_per_second 1e300\n"
        "finetune_train_eta_seconds 12\n"
    )
    progress = parse_metrics(page, nodes=2)
    assert progress is not None
    assert (
        progress.total_steps,
        progress.step,
        progress.loss,
        progress.last_checkpoint_step,
        progress.samples_per_second,
        progress.eta_seconds,
    ) == (100, None, 0.5, None, None, 12)


def test_slow_pages_are_scraped_in_a_lane_of_their_own() -> None:
    """Jobs whose pages were slow (a trickle cut at the deadline) are scraped on the slow lane from then on: a healthy
    job's scrape is never queued behind theirs, and a job whose page is quick again comes back."""
    import time

    from finetune_operator.scrape import SLOW_SECONDS, Scraper

    slow_pages = {"http://h0/", "http://h1/", "http://h2/"}
    log: list[str] = []
    done = threading.Event()

    def fetch(url: str) -> str:
        if url in slow_pages:
            time.sleep(SLOW_SECONDS + 0.05)
            log.append(f"slow {url}")
            raise TimeoutError("cut at the deadline")
        log.append(f"quick {url}")
        if url == "http://ok/":
            done.set()
        return "finetune_train_step 1\nfinetune_train_total_steps 2\n"

    s = Scraper(interval=0, on_done=lambda key: None, workers=1, slow_workers=1, fetch=fetch)
    try:
        for i in range(3):  # first scrapes: on the main lane (nothing known yet), each found slow
            s.take(("ns", f"h{i}"), f"http://h{i}/", nodes=1, attempt=0)
        wait = time.monotonic() + 30
        while s.slow() < 3 and time.monotonic() < wait:
            time.sleep(0.05)
        assert s.slow() == 3
        log.clear()
        for i in range(3):  # now queued on the slow lane, one at a time
            s.take(("ns", f"h{i}"), f"http://h{i}/", nodes=1, attempt=0)
        s.take(("ns", "ok"), "http://ok/", nodes=1, attempt=0)
        assert done.wait(30)
        assert log.index("quick http://ok/") <= 1, log  # at most the one slow scrape already running came first
        slow_pages.discard("http://h0/")  # its page is quick again
        wait = time.monotonic() + 30
        while len([x for x in log if x.startswith("slow")]) < 3 and time.monotonic() < wait:
            time.sleep(0.05)
        s.take(("ns", "h0"), "http://h0/", nodes=1, attempt=0)
        while s.slow() != 2 and time.monotonic() < wait:
            time.sleep(0.05)
        assert s.slow() == 2
    finally:
        s.shutdown()
