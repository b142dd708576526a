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
    # a GRPO run's page: its series and the most reward functions a job may name (16), each with a 40-character name
    m = TrainerMetrics(
        namespace="a-long-namespace-name-of-a-team", job="a-job-name-that-is-long-too", node_rank=511, rollouts=True
    )
    m.step_duration.observe(0.5)
    for i in range(16):
        m.set_reward_function(f"a-reward-name-of-forty-characters-lon{i:03d}", 0.5)
    size = len(generate_latest(m.registry))
    assert size < MAX_METRICS_BYTES / 3, size


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
    """Jobs known to answer quickly are scraped on their own lane: jobs never scraped yet wait on another lane, and
    jobs whose page was slow (a trickle cut at the deadline) on a third from then on, so neither a crowd of new jobs
    with slow pages nor the slow ones already known delay a healthy job's scrape; a page quick again comes back."""
    import time

    from finetune_operator.scrape import SLOW_SECONDS, Scraper

    slow_pages = {f"http://h{i}/" for i in range(6)}
    log: list[str] = []

    def fetch(url: str) -> str:
        if url in slow_pages:
            time.sleep(SLOW_SECONDS + 0.05)
            log.append(f"slow {url}")
            raise TimeoutError("cut at the deadline")
        log.append(f"quick {url}")
        return "finetune_train_step 1\nfinetune_train_total_steps 2\n"

    def until(cond, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 60
        while not cond():
            assert time.monotonic() < deadline, what
            time.sleep(0.02)

    s = Scraper(interval=0, on_done=lambda key: None, workers=1, new_workers=1, slow_workers=1, fetch=fetch)
    try:
        s.take(("ns", "ok"), "http://ok/", nodes=1, attempt=0)  # new: its first scrape, quick
        until(lambda: "quick http://ok/" in log, "the healthy job's first scrape")
        for i in range(3):  # three new jobs with slow pages: one at a time on the new jobs' lane
            s.take(("ns", f"h{i}"), f"http://h{i}/", nodes=1, attempt=0)
        s.take(("ns", "ok"), "http://ok/", nodes=1, attempt=0)  # known quick: its own lane, not behind them
        until(lambda: log.count("quick http://ok/") == 2, "the healthy job's second scrape")
        assert log.index("quick http://ok/", 1) <= 2, log  # at most the one slow scrape already running came first
        until(lambda: s.slow() == 3, "the three slow jobs to be known")
        log.clear()
        for i in range(3):  # now on the slow lane; three more new ones on the new lane
            s.take(("ns", f"h{i}"), f"http://h{i}/", nodes=1, attempt=0)
            s.take(("ns", f"h{i + 3}"), f"http://h{i + 3}/", nodes=1, attempt=0)
        s.take(("ns", "ok"), "http://ok/", nodes=1, attempt=0)
        until(lambda: "quick http://ok/" in log, "the healthy job's third scrape")
        assert log.index("quick http://ok/") <= 2, log  # at most one slow scrape per busy lane came first
        slow_pages.discard("http://h0/")  # its page is quick again
        until(lambda: len(log) >= 7, "the slow scrapes of this round")
        s.take(("ns", "h0"), "http://h0/", nodes=1, attempt=0)
        until(lambda: s.slow() == 5, "h0 back among the quick ones, h1-h5 slow")
    finally:
        s.shutdown()


def test_an_attempt_that_has_not_stepped_yet_is_scraped_again_within_seconds() -> None:
    """A new attempt's rank 0 refuses (its trainer starting) or serves no step yet: the next scrape is due in
    START_RETRY_SECONDS, not a whole interval later; once a step shows, the interval again."""
    import time

    from finetune_operator.scrape import START_RETRY_SECONDS, Scraper

    pages = iter(
        [
            ConnectionRefusedError("not serving yet"),
            "finetune_checkpoint_last_step 262\n",  # serving, the loop not started: the checkpoint it resumes
            "finetune_train_step 263\nfinetune_train_total_steps 1200\nfinetune_checkpoint_last_step 262\n",
        ]
    )

    def fetch(url: str) -> str:
        page = next(pages)
        if isinstance(page, Exception):
            raise page
        return page

    retries: list[float] = []
    done: list[tuple[str, str]] = []
    s = Scraper(interval=60, on_done=done.append, on_retry=lambda key, after: retries.append(after), fetch=fetch)
    key = ("ns", "ft")

    def scrape_once() -> object:
        before = len(retries) + len(done)
        assert s.take(key, "http://r0/", nodes=1, attempt=2) is None  # started (the result comes back later)
        deadline = time.monotonic() + 10
        while len(retries) + len(done) == before:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return s.take(key, None, nodes=1, attempt=2) if done else None

    try:
        scrape_once()
        assert retries == [START_RETRY_SECONDS] and not done  # refused: due again in seconds
        time.sleep(START_RETRY_SECONDS)
        s.take(key, "http://r0/", nodes=1, attempt=2)  # due again well before the 60 s interval
        deadline = time.monotonic() + 10
        while not done:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert len(retries) == 2  # no step yet: again in seconds
        progress = s.take(key, "http://r0/", nodes=1, attempt=2)
        assert progress is not None and progress.last_checkpoint_step == 262 and progress.step is None
    finally:
        s.shutdown()
