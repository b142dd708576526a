"""Helpers for the trainer tests: configs built from the tiny example, free ports, and launcher processes started
with the env contract exactly as the operator would set it on a pod."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def tiny_config(out_dir: Path, example: str = "sequence-classification", **over: Any) -> dict[str, Any]:
    """The tiny example config with absolute paths and its output under ``out_dir``."""
    name = "config-seqcls.json" if example == "sequence-classification" else "config-causal-lm.json"
    cfg = json.loads((TINY / name).read_text())
    cfg["model"]["path"] = str(REPO / cfg["model"]["path"])
    cfg["dataset"]["path"] = str(REPO / cfg["dataset"]["path"])
    cfg["output"]["path"] = str(out_dir)
    cfg["metrics"]["port"] = 0
    return deep_merge(cfg, over)


def ort_venv() -> Path:
    """The ONNX Runtime stack's venv (``$FINETUNE_ORT_VENV``, else where ``.ci/venv.sh`` builds it)."""
    venv = (
        os.environ.get("FINETUNE_ORT_VENV")
        or subprocess.run(
            ["bash", str(REPO / ".ci" / "venv.sh"), "--ort-path"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    return Path(venv)


def ort_venv_problem() -> str | None:
    """None when the ORT venv is built, else what is missing (a broken environment: tests fail on it)."""
    venv = ort_venv()
    if not (venv / ".complete").exists() or not (venv / "bin" / "finetune-trainer").exists():
        return f"no ONNX Runtime trainer venv at {venv}: run `make setup` (or .ci/venv.sh)"
    return None


def launcher_cmd() -> list[str]:
    script = Path(sys.executable).with_name("finetune-trainer")
    return [str(script)] if script.exists() else [sys.executable, "-m", "finetune_trainer.launcher"]


class Node:
    """One "pod": the ``finetune-trainer`` launcher in its own session, with the env contract."""

    def __init__(
        self,
        workdir: Path,
        config: dict[str, Any],
        *,
        node_rank: int = 0,
        nnodes: int = 1,
        master_port: int | None = None,
        attempt: int = 0,
        extra_env: dict[str, str] | None = None,
        launcher: list[str] | None = None,
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / f"config-node{node_rank}.json"
        self.config_path.write_text(json.dumps(config))
        self.log_path = workdir / f"node{node_rank}-attempt{attempt}.log"
        self.termination_log = workdir / f"termination-node{node_rank}.json"
        if self.termination_log.exists():
            self.termination_log.unlink()
        port = master_port or free_port()
        env = dict(os.environ)
        env.update(
            {
                "PET_NNODES": str(nnodes), "NNODES": str(nnodes),
                "PET_NPROC_PER_NODE": "1", "NPROC_PER_NODE": "1",
                "PET_NODE_RANK": str(node_rank), "NODE_RANK": str(node_rank),
                "PET_MASTER_ADDR": "127.0.0.1", "MASTER_ADDR": "127.0.0.1",
                "PET_MASTER_PORT": str(port), "MASTER_PORT": str(port),
                "WORLD_SIZE": str(nnodes),
                "FINETUNE_JOB_NAME": config["job"]["name"],
                "FINETUNE_NAMESPACE": config["job"]["namespace"],
                "FINETUNE_ATTEMPT": str(attempt),
                "FINETUNE_CONFIG": str(self.config_path),
                "FINETUNE_TERMINATION_LOG": str(self.termination_log),
                "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": "1" if nnodes > 1 else "2",
            }
        )  # fmt: skip
        env.setdefault("HF_HOME", str(workdir.parent / "hf-home"))
        env.update(extra_env or {})
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            launcher or launcher_cmd(),
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait(self, timeout: float = 300) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"launcher did not finish in {timeout}s; log:\n{self.log()}") from None
        finally:
            self._log.close()
        return rc

    def kill(self) -> None:
        """SIGKILL the launcher and every descendant (a node that vanished). torchrun starts its workers in
        sessions of their own, so killing the process group alone would leave them training."""
        import psutil

        try:
            victims = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            victims = []
        for p in victims:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(victims, timeout=60)
        self.proc.wait(timeout=60)

    def terminate(self) -> None:
        """SIGTERM to the launcher only, as the kubelet does to PID 1."""
        self.proc.send_signal(signal.SIGTERM)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-8000:]

    def termination(self) -> dict[str, Any] | None:
        if not self.termination_log.exists():
            return None
        return json.loads(self.termination_log.read_text())


def poll(
    condition: Callable[[], Any],
    *,
    timeout: float,
    interval: float = 0.1,
    what: str = "",
    on_fail: Callable[[], str] | None = None,
) -> Any:
    """Call ``condition`` until it returns something truthy; fail with ``what`` (and ``on_fail()``) on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = on_fail() if on_fail else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{detail}")
        time.sleep(interval)


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


@contextlib.contextmanager
def small_volume(path: Path, size: str) -> Iterator[Path]:
    """A real size-limited filesystem at ``path`` (tmpfs of ``size``, e.g. "256k"), unmounted afterwards: writes
    past its size fail with ENOSPC as on a full claim. Mounting needs root, which the test machines are; elsewhere
    the test fails saying so (a disk-full test that silently did not run would prove nothing)."""
    path.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                           capture_output=True, text=True)  # fmt: skip
    if mount.returncode != 0:
        raise AssertionError(f"cannot mount a {size} tmpfs at {path} (root needed): {mount.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True)


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def import_required(module: str) -> object:
    """Import a dependency the test needs; its absence is a broken environment, never a skip."""
    import importlib

    return importlib.import_module(module)


def refused_rows(cfg: dict[str, Any]) -> Any:
    """The ConfigError that the worker's dataset checks raise for ``cfg`` (its tokenizer, the training split's columns
    and every row, as the worker checks them before it builds a model), run in this process: the exit 78 and the
    termination message that carry such an error out of a real launch are tested once per family, the checks
    themselves for every case here, without paying a launch for each."""
    from finetune_trainer import data, worker
    from finetune_trainer.config import parse_config
    from finetune_trainer.errors import ConfigError

    config = parse_config(cfg)
    split = config.dataset.split
    with pytest.raises(ConfigError) as refused:
        tokenizer = worker.load_tokenizer(config)
        raw = data.load_split(config, split)
        data.check_columns(config, list(raw.column_names))
        if config.task == "dpo":
            data.check_preference_rows(config, data.preference_dataset(config, raw), tokenizer, split)
        elif config.task == "grpo":
            data.check_prompt_rows(config, data.prompt_dataset(config, raw), tokenizer, split)
        else:
            data.check_sft_rows(config, data.sft_dataset(config, raw), tokenizer, split)
    return refused.value
