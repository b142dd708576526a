"""The operator (``finetune operator``) as a real subprocess watching one namespace, with fast timers: for the
integration tests and the demo behind ``make run``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class OperatorProcess:
    """The operator as a real subprocess, watching one namespace (or more: ``also_watch``), with fast timers for
    tests; ``standalone=False`` takes part in kopf's peering, whose objects the caller creates."""

    def __init__(
        self, kubeconfig: str, namespace: str, *, also_watch: tuple[str, ...] = (), standalone: bool = True, **env: str
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.namespaces = (namespace, *also_watch)
        self.standalone = standalone
        self.env = {
            "FINETUNE_RESYNC_SECONDS": "2",
            "FINETUNE_METRICS_PORT": "0",
            "FINETUNE_HEALTH_PORT": "0",
            "FINETUNE_WAITING_TIMEOUT_SECONDS": "5",
            "FINETUNE_DEFAULT_IMAGE": "trainer:test",
            "FINETUNE_ORT_IMAGE": "trainer-ort:test",
            # test clusters resize in seconds (the platform's floors are a minute and half a minute)
            "FINETUNE_ELASTIC_MIN_RESIZE_COOLDOWN_SECONDS": "0",
            "FINETUNE_ELASTIC_MIN_UNSCHEDULABLE_SECONDS": "1",
            **env,
        }
        self.log = Path(tempfile.mkstemp(prefix="operator-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBECONFIG", None)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "finetune_operator.cli",
                    "operator",
                    *(["--standalone"] if self.standalone else []),
                    "--kubeconfig",
                    self.kubeconfig,
                    *[f"--namespace={ns}" for ns in self.namespaces],
                    "--verbose",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=env,
                start_new_session=True,
            )
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def output(self) -> str:
        return self.log.read_text(errors="replace")
