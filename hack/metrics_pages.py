"""Metrics pages as a trainer's rank 0 might serve them on port 9400 of a loopback address (which a pod reports as its
IP), healthy or hostile: for the operator's fault tests and the hostile-metrics benchmark.

Kinds: ``healthy`` (the trainer's own gauges, a step that moves every second), ``still`` (healthy, never moves),
``trickle`` (a byte every 0.2 s without end), ``huge`` (1 MiB of padding), ``absurd`` (an int64 overflow, NaN, 1e300,
a negative step), ``overflow`` (a total the status can hold beside an int64 overflow, NaN, -Inf, 1e300 and negative
counters)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PORT = 9400
T0 = time.time()
HOSTILE = ("trickle", "huge", "absurd", "overflow")


def page(kind: str) -> bytes:
    if kind == "healthy":  # the trainer's own gauges; the step moves every second
        step = int(time.time() - T0)
        return f"finetune_train_total_steps 100000\nfinetune_train_step {step}\nfinetune_train_loss 0.5\n".encode()
    if kind == "still":
        return b"finetune_train_total_steps 100000\nfinetune_train_step 7\nfinetune_train_loss 0.5\n"
    if kind == "huge":
        return b"".join(b'padding{i="%d"} %d\n' % (i, i) for i in range(40_000))[: 1 << 20]
    if kind == "absurd":  # no total the status can hold: no progress at all
        return (
            b"finetune_train_total_steps 1e19\nfinetune_train_step -4\nfinetune_train_loss NaN\n"
            b"finetune_train_samples_per_second 1e300\nfinetune_train_eta_seconds -1\n"
        )
    return (  # overflow: a total the status can hold, so the rest is written beside it (or must be left out)
        b"finetune_train_total_steps 100\nfinetune_train_step 9223372036854775807\nfinetune_train_loss NaN\n"
        b"finetune_train_samples_per_second 1e300\nfinetune_train_eta_seconds -1\nfinetune_train_epoch -Inf\n"
        b"finetune_train_tokens_per_second 1e14\nfinetune_checkpoint_last_step -4\n"
        b"finetune_train_learning_rate 1e-300\n"
    )


def serve(ip: str, kind: str) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            if kind == "trickle":
                self.send_header("Content-Length", str(1 << 20))
                self.end_headers()
                try:
                    while True:
                        self.wfile.write(b"#")
                        self.wfile.flush()
                        time.sleep(0.2)
                except OSError:
                    return  # the scraper gave up on it
            body = page(kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer((ip, PORT), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv
