"""``finetune-trainer``: the pod's container command (PID 1).

1. read the config (``$FINETUNE_CONFIG``) and the env contract, and start the agent (``finetune_trainer.agent``):
   it imports the training stack once and validates config and dataset with it, *before* any worker starts,
   because a worker's failure is only an exit code; this process stays light (it never imports torch) and checks
   only the export's credentials, which the agent never sees;
2. with a shared Hugging Face cache (config ``cache``), fill it once from node rank 0 while the other ranks wait
   for its ready marker (``hfcache``); the workers then run with the Hub offline;
3. distributed preflight (rank 0 resolves its own address; other ranks wait until they can connect to it);
4. tell the agent to go: it runs torch's elastic agent (torchrun's flags and ``PET_*`` variables) and forks the
   workers (``finetune_trainer.worker.forked_entry``). The ONNX Runtime image, or ``FINETUNE_WORKER_START=torchrun``,
   runs ``python -m torch.distributed.run -m finetune_trainer.worker`` instead, after validating here;
5. exit with a documented code and, on failure, write ``{"reason", "message"}`` to the termination log.

Exit codes: 0 success; 78 configuration or data error (never retried: also a Hub model or dataset that does not
exist or cannot be read); 75 rendezvous/preflight timeout (also: node rank 0's cache fill did not finish in time);
77 CUDA out of memory; 74 the export failed; 73 the output volume is full; 143 stopped by SIGTERM (before
training: at once; during training: after a collective checkpoint when possible, on every node whose workers
stopped by the ranks' agreement); 1 anything else (training crash).

The SIGTERM handler is installed first: the launcher is the container's PID 1, which receives only the signals it
handles, so without one a gang restart during a model download or the preflight would wait out the grace period.
A launcher that ends before the go closes the agent's input, and the agent exits without training.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, NoReturn

from finetune_trainer import errors, hfcache, podlog, rounds
from finetune_trainer.config import CONFIG_SETTLE_SECONDS, Config, load_config
from finetune_trainer.env import RunEnv, read_env
from finetune_trainer.errors import ConfigError, RendezvousTimeout

log = logging.getLogger("finetune_trainer.launcher")

WORKER_START_ENV = "FINETUNE_WORKER_START"
AGENT_VERDICT_FD_ENV = "FINETUNE_AGENT_VERDICT_FD"  # where the agent writes its validation of the job


def validate(config: Config, run: RunEnv, *, cuda_available: bool) -> None:
    """Everything that can be checked without training. Raises :class:`ConfigError`."""
    from finetune_trainer import accel, compat, data, rewards

    m = config.model
    if m.path:
        if not os.path.isdir(m.path):
            raise ConfigError("model.path", f"{m.path!r} is not a directory; check spec.model.path and the volume")
        if not os.path.isfile(os.path.join(m.path, "config.json")):
            raise ConfigError("model.path", f"{m.path!r} has no config.json; it must be a saved Hugging Face model")
    elif os.environ.get("HF_HUB_OFFLINE") == "1" and not m.init_from_config:
        log.info("HF_HUB_OFFLINE=1: %r must already be in the Hugging Face cache", m.name)

    data.validate_local_dataset(config)

    accel.auto_table()  # a malformed FINETUNE_AUTO_TABLE fails here, naming it, before any worker starts
    kind = accel.resolve_acceleration(config.acceleration)
    accel.check_available(kind, nproc_per_node=run.nproc_per_node, cuda_available=cuda_available)
    if config.training.kernels == "liger" and not cuda_available:  # refused before torchrun (the model type waits)
        accel.require_liger("cpu", None, task=config.task)
    if data.uses_sft(config):
        field = (
            "training.packing"
            if not config.dataset.sft_format
            else ("dataset.messagesField" if config.dataset.sft_format == "chat" else "dataset.promptField")
        )
        if kind == "ort":
            raise ConfigError(
                field,
                "chat, prompt/completion data and packing train with TRL's SFTTrainer, not "
                "ONNX Runtime's ORTTrainer; set spec.acceleration to 'auto', 'none' or 'compile'",
            )
        if importlib.util.find_spec("trl") is None:
            raise ConfigError(
                field,
                "chat, prompt/completion data and packing need TRL, which this image lacks; use "
                "the default trainer image (remove spec.image)",
            )
    if config.task in ("dpo", "grpo") and importlib.util.find_spec("trl") is None:
        raise ConfigError(
            "task", f"task {config.task} needs TRL, which this image lacks; use the default trainer image"
        )
    if config.task == "grpo":
        rewards.check(config, world_size=run.world_size)
    if config.evaluation is not None:  # the stage's metrics, before the training they would follow
        rewards.scorers(config.evaluation.metrics, "evaluation.metrics")
    validate_llm(config, kind, cuda_available=cuda_available)
    if config.training.precision == "fp16" and not cuda_available:
        raise ConfigError("training.precision", "fp16 needs a GPU; use 'auto', 'bf16' or 'fp32' on CPU")

    args_cls = accel.make_backend(kind).args_class()
    if config.task in ("dpo", "grpo") or data.uses_sft(config):  # TRL's config classes add fields of their own
        from trl.trainer.dpo_config import DPOConfig
        from trl.trainer.grpo_config import GRPOConfig
        from trl.trainer.sft_config import SFTConfig

        args_cls = {"dpo": DPOConfig, "grpo": GRPOConfig}.get(config.task, SFTConfig)
    known = compat.training_arg_names(args_cls)
    for key in config.training.extra_args:
        if key not in known:
            close = sorted(k for k in known if key.replace("_", "") in k.replace("_", ""))[:3]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(
                f"training.extraArgs.{key}",
                f"{key!r} is not a transformers TrainingArguments field{hint}; "
                f"fix or remove spec.training.extraArgs.{key}",
            )

    try:
        os.makedirs(config.checkpoints_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=config.output_path, prefix=".write-test-"):
            pass
    except OSError as e:
        raise ConfigError(
            "output.path", f"cannot write to {config.output_path!r}: {e}; check the output volume"
        ) from None


def validate_llm(config: Config, kind: str, *, cuda_available: bool) -> None:
    """QLoRA, merging, FSDP and exports: refused before any work when this image or machine cannot do them."""
    t, m = config.training, config.model
    if t.lora is not None and t.lora.quantization:
        field = "training.lora.quantization"
        if not cuda_available:
            raise ConfigError(
                field,
                "QLoRA loads the frozen base in 4-bit NF4 through bitsandbytes, whose 4-bit training kernels need a "
                "CUDA GPU, and this pod sees none; request GPUs (spec.resources.limits nvidia.com/gpu) or remove "
                "spec.training.lora.quantization to train plain LoRA",
            )
        if kind == "ort" or importlib.util.find_spec("bitsandbytes") is None:
            raise ConfigError(field, "QLoRA needs bitsandbytes, which this image lacks; use the default trainer image")
        if m.init_from_config:
            raise ConfigError(
                field,
                "QLoRA quantizes pretrained weights as they load; spec.model.initFromConfig builds random ones in "
                "memory. Save the model and set spec.model.path, or remove the quantization",
            )
    if t.sharding == "fsdp" and kind == "ort":
        raise ConfigError(
            "training.sharding",
            "FSDP is not supported with ORTTrainer; set spec.acceleration to 'auto', 'none' or 'compile'",
        )
    if config.s3 and importlib.util.find_spec("boto3") is None:
        raise ConfigError("output.s3", "copying to S3 needs boto3, which this image lacks; use the default image")


def validate_credentials(config: Config) -> None:
    """What only the launcher can check: the export's credentials, which the training processes never see."""
    from finetune_trainer import export

    if config.push_to_hub and not export.hub_token():
        raise ConfigError(
            "output.pushToHub.secretRef",
            "pushing to the Hub needs a token with write access: set spec.output.pushToHub.secretRef (or "
            "spec.hfTokenSecretRef) to a Secret holding it",
        )


def preflight(config: Config, run: RunEnv) -> float:
    """Seconds spent; raises :class:`RendezvousTimeout`."""
    from finetune_trainer.preflight import wait_for_master

    if run.nnodes == 1:
        return 0.0
    return wait_for_master(
        run.master_addr, run.master_port, connect=run.node_rank > 0, timeout_s=config.preflight_timeout_seconds
    )


def launch_args(config: Config, *, restarts: int = 0) -> list[str]:
    """torchrun's flags, for torchrun and the agent alike (both read the ``PET_*`` variables for the rest). torchrun
    restarts nothing itself (its agents do not agree on a restart: the operator recreates the gang); the agent restarts
    the gang in place, at most ``restarts`` times (``finetune_trainer.rounds``)."""
    timeout = max(60, config.preflight_timeout_seconds)
    return [
        "--max-restarts", str(restarts),
        "--rdzv-conf", f"timeout={timeout}",
    ]  # fmt: skip


def torchrun_command(config: Config) -> list[str]:
    """The ONNX Runtime image's workers: torchrun starts each as its own interpreter (``finetune_trainer.worker``)."""
    return [sys.executable, "-m", "torch.distributed.run", *launch_args(config), "-m", "finetune_trainer.worker"]


def agent_command(config: Config) -> list[str]:
    """The default image's workers: forked by the agent, which imports the training stack once while the launcher
    validates (``finetune_trainer.agent``)."""
    return [sys.executable, "-m", "finetune_trainer.agent", *launch_args(config, restarts=rounds.budget())]


class Workers:
    """The parent of the training processes: the agent, started as soon as the config is read (it imports the stack
    and validates the job, :meth:`verdict`) and told to go once the launcher's own work is done, or torchrun (the ONNX
    Runtime image, or ``FINETUNE_WORKER_START=torchrun``), started then; the launcher then validates itself."""

    def __init__(self, config: Config, env: dict[str, str]) -> None:
        self.env = env
        # FINETUNE_WORKER_START=torchrun in the launcher's environment (bench/startup.py compares the two) starts every
        # worker as its own interpreter; a job's spec.env cannot set it (FINETUNE_* names belong to the contract)
        self.agent = config.acceleration != "ort" and os.environ.get(WORKER_START_ENV) != "torchrun"
        self.proc: subprocess.Popen[bytes] | None = None
        self._verdict: int | None = None
        if self.agent:
            self.command = agent_command(config)
            self._verdict, write_end = os.pipe()
            self.proc = subprocess.Popen(
                self.command,
                env={**env, AGENT_VERDICT_FD_ENV: str(write_end)},
                stdin=subprocess.PIPE,
                pass_fds=(write_end,),
            )
            os.close(write_end)
        else:
            self.command = torchrun_command(config)

    def verdict(self) -> None:
        """The agent's validation of the job (with the stack it imported): returns when it passed, raises
        :class:`ConfigError` with the field and the fix, or :class:`AgentFailed` when the agent died first."""
        assert self._verdict is not None and self.proc is not None
        with os.fdopen(self._verdict, "rb") as f:
            self._verdict = None
            line = f.readline()
        try:
            answer = json.loads(line) if line.strip() else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            code = self.proc.wait()
            raise AgentFailed(f"the training agent exited with code {code} before it validated the job; see the log")
        if not answer.get("ok"):
            raise ConfigError(str(answer.get("field") or ""), str(answer.get("message") or ""))

    def go(self) -> subprocess.Popen[bytes]:
        """Start training: ``FINETUNE_TORCHRUN_TIME`` marks the end of the launcher's own work."""
        now = {"FINETUNE_TORCHRUN_TIME": repr(time.time())}
        log.info("starting the workers: %s", " ".join(self.command))
        if self.proc is None:
            self.proc = subprocess.Popen(self.command, env={**self.env, **now})
            return self.proc
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(now).encode() + b"\n")
            self.proc.stdin.close()
        except OSError:  # the agent died: its exit code and output say why
            pass
        return self.proc

    def discard(self) -> None:
        """No training after all: an agent still waiting is told so (end of input) and exits 0."""
        if self._verdict is not None:
            os.close(self._verdict)
            self._verdict = None
        proc, self.proc = self.proc, None
        if proc is None or proc.stdin is None or proc.stdin.closed:
            return
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class AgentFailed(Exception):
    """The agent exited before it validated the job (a broken image, a crash while importing)."""


def worker_env(run: RunEnv, launch_time: float, error_file: str, *, cache_path: str | None = None) -> dict[str, str]:
    from finetune_trainer.credentials import without_secrets

    env = without_secrets(dict(os.environ))  # the export's credentials stay with the launcher
    env.pop("WORLD_SIZE", None)  # torchrun computes it for its workers
    if cache_path:
        hfcache.apply_cache_env(env, cache_path, offline=True)  # workers read only what the launcher fetched
    env.update(
        {
            "PET_NNODES": str(run.nnodes),
            "PET_NPROC_PER_NODE": str(run.nproc_per_node),
            "PET_NODE_RANK": str(run.node_rank),
            "PET_MASTER_ADDR": run.master_addr,
            "PET_MASTER_PORT": str(run.master_port),
            "FINETUNE_JOB_NAME": run.job_name,
            "FINETUNE_NAMESPACE": run.namespace,
            "FINETUNE_ATTEMPT": str(run.attempt),
            "FINETUNE_LAUNCH_TIME": repr(launch_time),
            "FINETUNE_TORCHRUN_TIME": repr(time.time()),  # when the launcher's own work (validation, cache) ended
            "TORCHELASTIC_ERROR_FILE": error_file,
        }
    )
    return env


def read_error_file(path: str) -> str:
    """The root-cause message torchrun copied from the failing worker's ``@record`` error file."""
    try:
        with open(path, encoding="utf-8") as f:
            payload: Any = json.load(f)
    except (OSError, ValueError):
        return ""
    message = payload.get("message", "") if isinstance(payload, dict) else ""
    if isinstance(message, dict):
        message = message.get("message", "")
    return str(message)


def classify_failure(message: str) -> tuple[int, str]:
    if message.startswith(errors.CONFIG_ERROR_PREFIX):
        return errors.EXIT_CONFIG_ERROR, message[len(errors.CONFIG_ERROR_PREFIX) :]
    if message.startswith(errors.CUDA_OOM_PREFIX):
        return errors.EXIT_CUDA_OOM, message[len(errors.CUDA_OOM_PREFIX) :]
    if message.startswith(errors.OUTPUT_FULL_PREFIX):
        return errors.EXIT_OUTPUT_FULL, message[len(errors.OUTPUT_FULL_PREFIX) :]
    if any(marker in message for marker in errors.RENDEZVOUS_MARKERS):
        return errors.EXIT_RENDEZVOUS_TIMEOUT, message
    return errors.EXIT_TRAINING_ERROR, message or "a training worker failed; see the pod log"


class _Forwarder:
    """SIGTERM/SIGINT, from the launcher's first instruction on.

    Before torchrun (``phase``: validation, the shared cache, the preflight) there is nothing to save, so the
    launcher ends at once with 143 (:func:`_stop_before_training`). Once torchrun is being started (``phase`` None)
    the signal goes to the workers directly (they agree on a checkpoint and stop together; torchrun itself would give
    them only 30 s before SIGKILL), or to torchrun while it has no workers yet. A signal that lands while torchrun is
    being started is forwarded by :meth:`forward_pending` as soon as the process exists. After torchrun has exited
    (rank 0 exporting the trained model) the signal is only noted: the export goes on, bounded by the grace period,
    since a push cut off half-way helps nobody and the model is already on the claim."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping_file: str | None = None
        self.phase: str | None = "validation"
        self.signalled = False
        self._forwarded = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.signalled = True
        if self.phase is not None:
            _stop_before_training(signum, self.phase)
        self._forward()

    def forward_pending(self) -> None:
        if self.signalled:
            self._forward()

    def _forward(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None or self._forwarded:
            return
        self._forwarded = True
        if self.stopping_file:  # before the workers hear of it: the agent restarts nothing in place after this
            with contextlib.suppress(OSError), open(self.stopping_file, "w", encoding="utf-8") as f:
                f.write("SIGTERM\n")
        try:
            import psutil

            workers = psutil.Process(proc.pid).children(recursive=False)
        except Exception:
            workers = []
        if workers:
            for w in workers:
                with contextlib.suppress(Exception):
                    w.send_signal(signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)


def _stop_before_training(signum: int, phase: str) -> NoReturn:
    """Exit 143 now, from the signal handler. Nothing is saved before training, and unwinding would not be prompt:
    an exception raised into a Hub download waits in the download's thread pool until every file is fetched."""
    message = f"stopped by {signal.Signals(signum).name} before training started (phase: {phase})"
    errors.write_termination_log(errors.REASON_TERMINATED, message)
    with contextlib.suppress(OSError):
        os.write(2, f"finetune-trainer: {errors.REASON_TERMINATED}: {message}\n".encode())
    podlog.close_active(timeout=1.0)
    os._exit(errors.EXIT_TERMINATED)


def _fail(code: int, message: str, *, restarts_in_place: int = 0) -> int:
    reason = errors.REASON_BY_EXIT.get(code, errors.REASON_TRAINING)
    print(f"finetune-trainer: {reason}: {message}", file=sys.stderr, flush=True)
    errors.write_termination_log(reason, message, restarts_in_place=restarts_in_place)
    return code


def run() -> int:
    forwarder = _Forwarder()
    signal.signal(signal.SIGTERM, forwarder)
    signal.signal(signal.SIGINT, forwarder)
    launch_time = time.time()
    from finetune_trainer.credentials import hide_secrets

    hide_secrets()  # before any code of the job's model or data runs in a child process
    original_env = dict(os.environ)
    # Accelerate treats WORLD_SIZE > 1 as "this process is distributed": the launcher is not.
    os.environ.pop("WORLD_SIZE", None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s launcher %(levelname)s %(message)s")

    try:
        config = load_config(settle_seconds=_settle_seconds())
        if config.cache_path:
            # Before anything imports huggingface_hub or datasets: they read their cache paths at import.
            hfcache.apply_cache_env(os.environ, config.cache_path, offline=False)
        run_env = read_env(original_env, job_name=config.job.name, namespace=config.job.namespace)
    except ConfigError as e:
        return _fail(errors.EXIT_CONFIG_ERROR, str(e))
    try:
        validate_credentials(config)  # the launcher's own check, before any other process starts
    except ConfigError as e:
        return _fail(errors.EXIT_CONFIG_ERROR, str(e))
    podlog.start(config.output_path, run_env.attempt, run_env.node_rank)
    with tempfile.TemporaryDirectory(prefix="finetune-") as tmp:
        error_file = os.path.join(tmp, "error.json")
        env = worker_env(run_env, launch_time, error_file, cache_path=config.cache_path)
        env["FINETUNE_STOP_FILE"] = os.path.join(tmp, "stopped")
        env[rounds.STOPPING_ENV] = forwarder.stopping_file = os.path.join(tmp, "stopping")
        env[rounds.ROUNDS_FILE_ENV] = os.path.join(tmp, "rounds.json")
        workers = Workers(config, env)  # the agent imports the training stack and validates the job
        try:
            try:
                if workers.agent:
                    workers.verdict()
                else:
                    import torch

                    validate(config, run_env, cuda_available=torch.cuda.is_available())
                if run_env.node_rank == 0:
                    from finetune_trainer import runid

                    log.info("run %s", runid.claim(config))  # refuses another run's checkpoints and model
            except ConfigError as e:
                return _fail(errors.EXIT_CONFIG_ERROR, str(e))
            except AgentFailed as e:
                return _fail(errors.EXIT_TRAINING_ERROR, str(e))
            return _run_validated(forwarder, config, run_env, workers, error_file)
        finally:
            workers.discard()
            podlog.close_active()


def _settle_seconds() -> float:
    """How long a config file that is not the admitted one is read again (FINETUNE_CONFIG_SETTLE_SECONDS; tests)."""
    try:
        return float(os.environ.get("FINETUNE_CONFIG_SETTLE_SECONDS") or CONFIG_SETTLE_SECONDS)
    except ValueError:
        return CONFIG_SETTLE_SECONDS


def _write_completion(config: Config, *, restarts_in_place: int) -> None:
    """Rank 0's success in the termination log: the end of the job's curves from result.json, for status.history
    (the operator's scrapes, every few seconds, miss the last steps)."""
    try:
        with open(config.result_path, encoding="utf-8") as f:
            result = json.load(f)
    except (OSError, ValueError) as e:
        log.warning("result.json unreadable, the status's curves end at the last scrape: %s", e)
        return
    summary = errors.result_summary(result)
    errors.write_termination_log(
        errors.REASON_COMPLETED,
        f"trained to step {summary['steps']} in attempt {summary['attempt']}",
        result=summary,
        restarts_in_place=restarts_in_place,
    )


def _run_validated(forwarder: _Forwarder, config: Config, run_env: RunEnv, workers: Workers, error_file: str) -> int:
    """From a valid config on: the shared cache, the preflight, the workers, the exports."""
    forwarder.phase = "shared cache"
    try:
        hfcache.prepare(config, run_env)
    except ConfigError as e:
        return _fail(errors.EXIT_CONFIG_ERROR, str(e))
    except RendezvousTimeout as e:
        return _fail(errors.EXIT_RENDEZVOUS_TIMEOUT, str(e))
    except hfcache.HubUnavailable as e:
        return _fail(errors.EXIT_TRAINING_ERROR, str(e))

    forwarder.phase = "preflight"
    try:
        waited = preflight(config, run_env)
        log.info("preflight: rank 0 at %s:%s reachable after %.1fs", run_env.master_addr, run_env.master_port, waited)
    except RendezvousTimeout as e:
        return _fail(errors.EXIT_RENDEZVOUS_TIMEOUT, str(e))

    forwarder.phase = None
    forwarder.proc = workers.go()
    forwarder.forward_pending()
    rc = forwarder.proc.wait()
    message = read_error_file(error_file)
    stopped_together = os.path.exists(workers.env["FINETUNE_STOP_FILE"])
    in_place = int(rounds.read_rounds(workers.env[rounds.ROUNDS_FILE_ENV]).get("restarts") or 0)

    if rc == 0:
        if run_env.node_rank != 0:
            return 0
        from finetune_trainer import export

        try:
            export.run_exports(config)
        except export.ExportError as e:
            return _fail(errors.EXIT_EXPORT_FAILED, str(e), restarts_in_place=in_place)
        _write_completion(config, restarts_in_place=in_place)
        return 0
    if forwarder.signalled or (stopped_together and not message):
        from finetune_trainer.checkpoints import latest_complete

        ckpt = latest_complete(config.checkpoints_dir)
        where = f"newest complete checkpoint: step {ckpt.step}" if ckpt else "no complete checkpoint yet"
        why = "by SIGTERM" if forwarder.signalled else "with every rank after a SIGTERM to another pod"
        return _fail(errors.EXIT_TERMINATED, f"stopped {why} ({where})", restarts_in_place=in_place)
    code, text = classify_failure(message)
    return _fail(code, text, restarts_in_place=in_place)


USAGE = """\
The FineTuneJob trainer, the container command of every trainer pod. It takes no arguments: the job comes from
the config file the operator writes ($FINETUNE_CONFIG, default /etc/finetune/config.json) and the torchrun
environment (PET_*, as the operator sets it). It validates both, runs the Hugging Face Trainer under torchrun,
serves training metrics on :9400, and exits with a documented code.
"""
EXIT_CODES = """\
exit codes: 0 success; 78 configuration or data error (never retried); 75 rendezvous or preflight timeout;
77 CUDA out of memory; 74 the export failed; 73 the output volume is full; 143 stopped by SIGTERM;
1 anything else (a training crash).
"""


def parse_args(argv: list[str]) -> None:
    """``--help`` and ``--version`` (what ``docker run IMAGE --help`` shows); any other argument is an error."""
    import argparse
    from importlib.metadata import PackageNotFoundError, version

    try:
        mine = version("finetune-trainer")
    except PackageNotFoundError:
        mine = "unknown"
    ap = argparse.ArgumentParser(
        prog="finetune-trainer",
        description=USAGE,
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--version", action="version", version=f"finetune-trainer {mine}")
    ap.parse_args(argv)


def main() -> None:
    parse_args(sys.argv[1:])
    sys.exit(run())


if __name__ == "__main__":
    main()
