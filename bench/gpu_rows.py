"""Run several FineTuneJob manifests as the GPU check's rows in one process that imports the training stack once.

    python bench/gpu_rows.py --out DIR [--budget NAME=SECONDS ...] [--separate NAME ...] job-a.yaml job-b.yaml ...

Each manifest becomes the config and environment ``finetune run-local`` would give its single node (the operator's
own builders, through ``runlocal.local_plan``); a child forked from this process (the stack already imported, as the
trainer's agent forks its workers) runs the launcher's checks and then the worker, as a one-process torchrun world
would. What a row costs is then its data, model and training, not the 15-20 s of imports every ``run-local`` pays
again, so every row fits its budget in bench/gpu_check.sh.

bitsandbytes is kept out of this process (peft and transformers then see it as not installed): importing it may
initialise CUDA, and a forked child could not use the device. No row but QLoRA needs it; a QLoRA row, and any other
``--separate`` row, runs through ``finetune run-local`` in a process of its own. Were CUDA initialised here anyway,
every row runs that way, and the output says so.

A row prints one line as soon as it ends: steps, loss, tokens/s, MFU, peak GPU memory, start-up, what ``auto``
picked and why, and whether it stayed inside its budget (seconds, from the figures the rows were sized by). A job a
CPU must refuse (QLoRA, Liger) is a row too: it must exit 78 there. Exit status: non-zero when a row failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import yaml

GPU_ONLY = ("qlora", "liger")  # rows a CPU must refuse with exit 78 (name prefixes)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def row_env(manifest: Path, workdir: Path) -> tuple[Path, dict[str, str]]:
    """The config file and environment of the job's single node, as ``finetune run-local`` prepares them, plus the
    one-process world torchrun would give its only worker."""
    from finetune_operator.runlocal import local_plan

    job = yaml.safe_load(manifest.read_text())
    port = _free_port()
    [(cfg, env)] = local_plan(job, manifest_dir=manifest.parent, workdir=workdir, mounts=[], master_port=port)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_file = workdir / "config-node0.json"
    cfg_file.write_text(json.dumps(cfg, indent=2))
    env.pop("FINETUNE_CONFIG_SHA256", None)  # the file is written here, not by the operator
    env.pop("HF_HOME", None)  # huggingface_hub read it as this process imported it (main sets it first)
    env.update(
        FINETUNE_CONFIG=str(cfg_file),
        FINETUNE_TERMINATION_LOG=str(workdir / "termination-node0.json"),
        RANK="0",
        LOCAL_RANK="0",
        GROUP_RANK="0",
        ROLE_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_RESTART_COUNT="0",
        FINETUNE_START_METHOD="fork (bench/gpu_rows.py)",
    )
    return cfg_file, env


def run_forked(env: dict[str, str], log_path: Path) -> int:
    """The launcher's checks and the worker in a child of this process; its exit code (78 for a refused config)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            with open(log_path, "wb") as log:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
            os.environ.update(env)
            os.environ["FINETUNE_LAUNCH_TIME"] = os.environ["FINETUNE_TORCHRUN_TIME"] = repr(time.time())
            import torch
            from finetune_trainer import worker
            from finetune_trainer.config import load_config
            from finetune_trainer.env import read_env
            from finetune_trainer.errors import ConfigError
            from finetune_trainer.launcher import validate

            try:
                validate(load_config(), read_env(), cuda_available=torch.cuda.is_available())
                code, _ = worker.run()
            except ConfigError as e:
                print(f"ConfigError: {e.field}: {e.message}", flush=True)
                code = 78
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    CHILDREN.append(pid)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        CHILDREN.remove(pid)
    return os.waitstatus_to_exitcode(status)


CHILDREN: list[int] = []  # the row running now: a SIGTERM to this process stops it first (it holds the GPU)


def _stop_children(signum: int, frame: Any) -> None:
    for pid in CHILDREN:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    raise SystemExit(128 + signum)


def run_local(manifest: Path, workdir: Path, log_path: Path) -> int:
    with open(log_path, "wb") as log:
        cmd = [sys.executable, "-m", "finetune_operator.cli", "run-local", str(manifest), "--workdir", str(workdir)]
        env = {k: v for k, v in os.environ.items() if k != "HF_HOME"}  # run-local gives each node its own
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        CHILDREN.append(proc.pid)
        try:
            return proc.wait()
        finally:
            CHILDREN.remove(proc.pid)


def summary(
    name: str, code: int, workdir: Path, *, device: str, seconds: float, budget: float | None
) -> tuple[str, bool]:
    """One line for the row, from its result.json (or why there is none), and whether the row did what it must."""
    over = f", {seconds:.0f} s" + (f" of {budget:.0f} s budgeted" if budget else "")
    if budget and seconds > budget:
        over += " (OVER BUDGET)"
    if device != "cuda" and name.startswith(GPU_ONLY):
        log = (workdir.parent / f"row-{name}.log").read_text(errors="replace")
        field = next(
            (f for f in ("training.kernels", "training.lora.quantization") if f"ConfigError: {f}" in log), None
        )
        line = f"{name}: exit {code} on CPU, refused by the trainer naming {field} (expected 78){over}"
        return line, code == 78 and field is not None
    if code != 0:
        return f"{name}: FAILED with exit {code}{over}", False
    found = next(workdir.rglob("result.json"), None)
    if found is None:
        return f"{name}: FAILED: exit 0 but no result.json under {workdir}{over}", False
    r: dict[str, Any] = json.loads(found.read_text())
    ckpts = sorted(workdir.rglob("checkpoint-*"))
    sharded = bool(ckpts) and (ckpts[-1] / "pytorch_model_fsdp_0").is_dir()
    adapter = (r.get("model") or {}).get("adapter") or {}
    mfu = r.get("mfu")
    first = f"{r['loss_history'][0][1]:.3f} -> " if r.get("loss_history") else ""
    line = (
        f"{name}: {r['params'] / 1e9:.2f} B params, {r['steps']} steps, loss {first}{r['final_loss']:.3f}, "
        f"{(r['tokens_per_second'] or 0):,.0f} tokens/s, MFU {'n/a' if mfu is None else f'{mfu:.3f}'}, "
        f"peak GPU memory {r.get('gpu_memory_peak_gib')} GiB, first step after {r['time_to_first_step_seconds']:.1f} s "
        f"(warm-up step {r['warmup_seconds']:.1f} s), adapter {adapter.get('method')}, sharded checkpoint {sharded}; "
        f"acceleration {r['acceleration']}, kernels {r.get('kernels')}: {r.get('acceleration_reason')}{over}"
    )
    if r.get("dpo"):
        line += f"; rewards {r['dpo']['rewards']}"
    if r.get("grpo"):
        g = r["grpo"]
        line += f"; rollout {g['rollout_tokens_per_second']} completion tokens/s, last log {g['last']}"
    return line, True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifests", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget", action="append", default=[], help="NAME=SECONDS, the row's budget")
    parser.add_argument("--separate", action="append", default=[], help="NAME: a row run by finetune run-local")
    args = parser.parse_args()
    budgets = {k: float(v) for k, v in (b.split("=", 1) for b in args.budget)}
    started = time.time()
    signal.signal(signal.SIGTERM, _stop_children)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # availability checks without initialising CUDA
    os.environ["HF_HOME"] = str((args.out / "hf-home").resolve())  # before huggingface_hub reads it
    sys.modules["bitsandbytes"] = None  # type: ignore[assignment]  # not installed, to peft and transformers
    import torch
    from finetune_operator.spec import SpecError
    from finetune_trainer import worker  # noqa: F401 - the whole training stack, once, before the first fork

    forked = not torch.cuda.is_initialized()
    print(
        f"rows: the stack imported in {time.time() - started:.1f} s; each row "
        + ("forked from this process" if forked else "through finetune run-local (CUDA was initialised by an import)"),
        flush=True,
    )
    failed = 0
    for manifest in args.manifests:
        name = manifest.stem.removeprefix("job-")
        workdir = args.out / f"out-{name}"
        log_path = args.out / f"row-{name}.log"
        t0 = time.time()
        if forked and name not in args.separate:
            try:
                _, env = row_env(manifest, workdir)
            except SpecError as e:  # refused before any process, as the operator and run-local refuse it
                log_path.write_text(f"invalid FineTuneJob {manifest}: {e}\n")
                code = 78
            else:
                code = run_forked(env, log_path)
        else:
            code = run_local(manifest, workdir, log_path)
        line, ok = summary(name, code, workdir, device=args.device, seconds=time.time() - t0, budget=budgets.get(name))
        print(line, flush=True)
        if not ok:
            failed += 1
            print(f"{name}: see {log_path}", flush=True)
    print(f"rows: {len(args.manifests)} in {time.time() - started:.0f} s, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
