"""``finetune run-local job.yaml``: run a FineTuneJob manifest on this machine.

Each of the job's N nodes becomes a local process group running the trainer image's entrypoint
(``finetune-trainer``) with exactly the env contract and config JSON the operator would give the pod
(the same builders produce them). What differs from a cluster, and why:

- rank 0's address is 127.0.0.1 and the rendezvous port is a free port (no per-pod network here);
- each node's metrics port is 9400 + rank, since local processes share one network namespace;
- paths inside volumes are mapped to local directories: the output claim to ``--workdir`` (default
  ``./output/<job>``), other mount paths by ``--mount MOUNTPATH=DIR`` or the manifest's annotation
  ``finetune.dev/run-local-mounts: "/workspace=.."`` (directories relative to the manifest).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from finetune_operator.builders import JobRef, env_contract, trainer_config
from finetune_operator.settings import METRICS_PORT, OUTPUT_MOUNT
from finetune_operator.spec import CACHE_MOUNT, SpecError, check_name, parse_spec

MOUNTS_ANNOTATION = "finetune.dev/run-local-mounts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun puts its workers in their own sessions)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _terminate(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the node and everything below it, SIGKILL after the grace period (as a kubelet does)."""
    if proc.poll() is not None:
        return
    pids = [proc.pid, *_descendants(proc.pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *_descendants(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def parse_mounts(items: list[str], base: Path) -> dict[str, Path]:
    mounts = {}
    for item in items:
        if "=" not in item:
            raise SpecError("--mount", f"{item!r} must be MOUNTPATH=DIR")
        mount, local = item.split("=", 1)
        mounts[mount.rstrip("/") or "/"] = (base / local).resolve()
    return mounts


def map_path(path: str | None, mounts: dict[str, Path]) -> str | None:
    if path is None:
        return None
    for mount in sorted(mounts, key=len, reverse=True):
        if path == mount or path.startswith(mount + "/"):
            return str(mounts[mount] / path[len(mount) :].lstrip("/"))
    return path


def local_plan(
    manifest: dict[str, Any], *, manifest_dir: Path, workdir: Path, mounts: list[str], master_port: int
) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """Per node: (config JSON, env) — the operator's, with paths and ports mapped to this machine."""
    meta = manifest.get("metadata") or {}
    name = str(meta.get("name", ""))
    check_name(name)
    spec = parse_spec(manifest.get("spec") or {}, complete=False)  # run-local writes under its own directory
    ref = JobRef(name=name, namespace=str(meta.get("namespace") or "default"), uid="local")
    annotated = [
        m.strip() for m in str((meta.get("annotations") or {}).get(MOUNTS_ANNOTATION, "")).split(",") if m.strip()
    ]
    mount_map = parse_mounts(annotated, manifest_dir)
    mount_map.update(parse_mounts(mounts, Path.cwd()))
    mount_map[OUTPUT_MOUNT] = workdir / "output"
    if spec.cache:  # the shared Hugging Face cache: one directory for every local node, as one claim would be
        mount_map.setdefault(CACHE_MOUNT, workdir / "cache")
    nodes = []
    for rank in range(spec.nodes):
        cfg = trainer_config(ref, spec)
        cfg["model"]["path"] = map_path(cfg["model"]["path"], mount_map)
        cfg["dataset"]["path"] = map_path(cfg["dataset"]["path"], mount_map)
        cfg["output"]["path"] = map_path(cfg["output"]["path"], mount_map)
        cfg["metrics"]["port"] = METRICS_PORT + rank
        if cfg.get("cache"):
            cfg["cache"]["path"] = map_path(cfg["cache"]["path"], mount_map)
        env = {e["name"]: e["value"] for e in env_contract(ref, spec, rank=rank, attempt=0)}
        for key in ("PET_MASTER_ADDR", "MASTER_ADDR"):
            env[key] = "127.0.0.1"
        for key in ("PET_MASTER_PORT", "MASTER_PORT"):
            env[key] = str(master_port)
        env.update({e["name"]: str(e.get("value", "")) for e in spec.env if "value" in e})
        if cfg.get("cache"):
            env["HF_HOME"] = cfg["cache"]["path"]
        nodes.append((cfg, env))
    return nodes


def _trainer_command() -> list[str]:
    script = Path(sys.executable).with_name("finetune-trainer")
    if script.exists():
        return [str(script)]
    found = shutil.which("finetune-trainer")
    if found:
        return [found]
    return [sys.executable, "-m", "finetune_trainer.launcher"]


def _pump(src: Any, prefix: str, log: Any, echo: bool) -> None:
    for raw in iter(src.readline, b""):
        log.write(raw)
        log.flush()
        if echo:
            sys.stdout.write(f"{prefix}{raw.decode(errors='replace')}")
            sys.stdout.flush()


def run_local(manifest_path: str, *, workdir: str | None = None, mounts: list[str] | None = None) -> int:
    path = Path(manifest_path)
    manifest = yaml.safe_load(path.read_text())
    if not isinstance(manifest, dict) or manifest.get("kind") != "FineTuneJob":
        print(f"{manifest_path}: not a FineTuneJob manifest", file=sys.stderr)
        return 2
    name = str((manifest.get("metadata") or {}).get("name", "job"))
    wd = Path(workdir or Path("output") / name).resolve()
    wd.mkdir(parents=True, exist_ok=True)
    try:
        nodes = local_plan(
            manifest, manifest_dir=path.resolve().parent, workdir=wd, mounts=mounts or [], master_port=_free_port()
        )
    except (SpecError, KeyError, TypeError, ValueError) as e:
        print(f"invalid FineTuneJob {manifest_path}: {e}", file=sys.stderr)
        return 78
    grace = float((manifest.get("spec") or {}).get("terminationGracePeriodSeconds", 120))
    base_env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    procs: list[subprocess.Popen[bytes]] = []
    pumps = []
    print(f"run-local: {name}: {len(nodes)} node(s); output in {wd / 'output'}; logs in {wd}")
    for rank, (cfg, env) in enumerate(nodes):
        cfg_file = wd / f"config-node{rank}.json"
        cfg_file.write_text(json.dumps(cfg, indent=2))
        node_env = {
            **base_env,
            **env,
            "FINETUNE_CONFIG": str(cfg_file),
            "FINETUNE_TERMINATION_LOG": str(wd / f"termination-node{rank}.json"),
            "HF_HOME": str(wd / "hf-home"),
            "PYTHONUNBUFFERED": "1",
        }
        print(f"run-local: node {rank}: metrics at http://127.0.0.1:{cfg['metrics']['port']}/metrics")
        proc = subprocess.Popen(
            _trainer_command(), env=node_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        log = open(wd / f"node{rank}.log", "wb")  # noqa: SIM115 - closed when the pump ends
        t = threading.Thread(target=_pump, args=(proc.stdout, f"[node {rank}] ", log, rank == 0), daemon=True)
        t.start()
        procs.append(proc)
        pumps.append((t, log))
    code = 0

    def on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # stop every node (they run in sessions of their own) before exiting

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                print(
                    f"run-local: node {rank} exited {code}; stopping the other nodes (see {wd / f'node{rank}.log'})",
                    file=sys.stderr,
                )
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        code = 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        for p in procs:
            _terminate(p, grace)
        for t, log in pumps:
            t.join(timeout=5)
            log.close()
    if code == 0:
        result = wd / "output" / Path(str(nodes[0][0]["output"]["path"])).relative_to(wd / "output") / "result.json"
        print(f"run-local: {name} succeeded; result: {result}")
        if result.exists():
            print(result.read_text())
    return code
