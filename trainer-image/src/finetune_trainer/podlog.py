"""Every node's log, also kept on the output volume: ``<output>/logs/attempt-<k>/node-<rank>.log``.

A gang restart replaces the pods of an attempt under the same names, so ``kubectl logs`` can only show the current
attempt; this copy keeps the earlier ones (``finetune logs --attempt K`` says where, docs/cli.md).

The launcher's standard output and error (and so torchrun's and every worker's, which inherit them) go through a
pipe that :class:`Tee` copies to the original standard output first, then, through a bounded queue, to the file. A
slow or full output volume can therefore never stall training or the pod log: the file then misses lines (and says
how many bytes), and after a write error it is given up.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading

QUEUE_CHUNKS = 1024  # chunks of up to 64 KiB waiting for the file; more are dropped
_active: list[Tee] = []  # the process's tee, for close_active()


def path_for(output_path: str, attempt: int, node_rank: int) -> str:
    return os.path.join(output_path, "logs", f"attempt-{attempt}", f"node-{node_rank}.log")


class Tee:
    def __init__(self, path: str) -> None:
        self.path = path
        self._queue: queue.Queue[bytes | None] = queue.Queue(QUEUE_CHUNKS)
        self._dropped = 0
        self._saved_out = self._saved_err = -1
        self._threads: list[threading.Thread] = []

    def start(self) -> Tee:
        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        self._saved_out, self._saved_err = os.dup(1), os.dup(2)
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        os.close(write_end)
        for target, args in ((self._pump, (read_end,)), (self._write_file, ())):
            t = threading.Thread(target=target, args=args, name=f"podlog-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _pump(self, read_end: int) -> None:
        """Pipe → the pod's standard output (always), then the file's queue (when it has room)."""
        out = self._saved_out
        while chunk := os.read(read_end, 65536):
            view = memoryview(chunk)
            while view:
                try:
                    view = view[os.write(out, view) :]
                except OSError:
                    break  # nobody reads the pod's stdout any more: the file still gets it
            try:
                self._queue.put_nowait(chunk)
            except queue.Full:
                self._dropped += len(chunk)
        os.close(read_end)
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=5)

    def _write_file(self) -> None:
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "ab", buffering=0) as f:
                while (chunk := self._queue.get()) is not None:
                    if self._dropped:
                        dropped, self._dropped = self._dropped, 0
                        f.write(f"\n[finetune: {dropped} bytes of log dropped: the output volume was slow]\n".encode())
                    f.write(chunk)
        except OSError as e:
            # To the pod's stderr: only the pump writes its stdout, so this line never lands inside another (an
            # unbuffered print writes its text and its newline apart).
            with contextlib.suppress(OSError):
                os.write(self._saved_err, f"finetune: the log copy {self.path} stopped: {e}\n".encode())
            while self._queue.get() is not None:  # keep draining: the pump must never block on the queue
                pass

    def close(self, timeout: float = 5.0) -> None:
        """Restore standard output and error; the copy gets what was written (within ``timeout``)."""
        if self._saved_out < 0:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._saved_out, 1)  # the pipe's last write ends go: the pump reads to its end
        os.dup2(self._saved_err, 2)
        for t in self._threads:
            t.join(timeout)
        if not any(t.is_alive() for t in self._threads):  # a lingering child may still hold the pipe
            for fd in (self._saved_out, self._saved_err):
                os.close(fd)
        self._saved_out = self._saved_err = -1


def start(output_path: str, attempt: int, node_rank: int) -> Tee | None:
    """Tee this process's output to the node's log file; None when that cannot be set up (logged, not fatal)."""
    try:
        tee = Tee(path_for(output_path, attempt, node_rank)).start()
    except OSError as e:
        print(f"finetune: no log copy on the output volume: {e}", file=sys.stderr)
        return None
    _active.append(tee)
    return tee


def close_active(timeout: float = 5.0) -> None:
    """Before the process exits: what it wrote reaches the pod log and the file (``os._exit`` skips threads)."""
    while _active:
        _active.pop().close(timeout)
