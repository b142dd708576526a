"""``python -m finetune_trainer.agent``: torchrun's elastic agent in a process that imports the training stack once and
forks every worker from it.

The launcher starts the agent as soon as it has read its config and stays light itself (it never imports torch): the
agent imports the stack (torch, transformers, peft: about 3.5 s of CPU), validates the job with it (the launcher's
``validate``, every check that needs no export credential) and writes its verdict, one JSON line, to the pipe named by
``FINETUNE_AGENT_VERDICT_FD``. Meanwhile the launcher fills the shared cache (node rank 0) or waits for rank 0. The
agent then waits for one line on its standard input: the launcher's go (a JSON object of environment variables to
add), or end of file when the launcher gives up (a bad config, a timeout, SIGTERM), and exits 0 without training.

On the go it runs torch's own agent (``torch.distributed.run``'s arguments, read from the same ``PET_*`` variables and
flags as ``torchrun``: static rendezvous) with the worker's ``forked_entry`` as its entry point; when a rank's process
fails it restarts every node's workers in place, agreed with the other nodes' agents, within the restarts the operator
left the attempt (``finetune_trainer.rounds``). The workers are forked, so none of them imports anything again: what
torchrun paid per process (its own interpreter, then each worker's imports) is paid once per pod. Forking is safe
while this process has not initialised CUDA: on a CPU pod the imports do not (``PYTORCH_NVML_BASED_CUDA_CHECK`` keeps
availability checks from doing it). With a GPU, bitsandbytes (imported through peft, which transformers' trainer
imports) may query the device at import and so initialise CUDA; the workers are then spawned instead, importing the
stack again as torchrun's would, with the agent's imports still beside the launcher's work. ``FINETUNE_START_METHOD``
tells the workers which, and result.json's ``workers.start_method`` records it. ``OMP_NUM_THREADS`` is 1 with several
processes a node unless set (torchrun's default), set before torch is imported, which reads it only then.

Failures reach the launcher as with torchrun: ``@record`` copies the failed worker's error file to
``TORCHELASTIC_ERROR_FILE``, and the process exits non-zero.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import os
import sys
import time
import types
from collections.abc import Iterator


def start_method() -> str:
    """``fork`` unless this process has initialised CUDA (a forked child could not use it)."""
    import torch

    return "spawn" if torch.cuda.is_initialized() else "fork"


def _validate() -> None:
    """The launcher's checks, run here where the stack is imported; the verdict goes to the launcher's pipe."""
    import torch

    from finetune_trainer.config import load_config
    from finetune_trainer.env import read_env
    from finetune_trainer.errors import ConfigError
    from finetune_trainer.launcher import AGENT_VERDICT_FD_ENV, validate

    verdict: dict[str, object] = {"ok": True}
    try:
        validate(load_config(), read_env(), cuda_available=torch.cuda.is_available())
    except ConfigError as e:
        verdict = {"ok": False, "field": e.field, "message": e.message}
    fd = os.environ.pop(AGENT_VERDICT_FD_ENV, None)
    if fd is not None:
        with contextlib.suppress(BrokenPipeError), os.fdopen(int(fd), "w") as f:  # closed here: no worker holds it
            f.write(json.dumps(verdict) + "\n")  # a launcher that gave up first has closed its end


@contextlib.contextmanager
def stand_in(name: str) -> Iterator[bool]:
    """While the block runs, ``import name`` gives an empty stand-in module (with the real module's spec, so checks
    of what is installed still find it) instead of running the module; afterwards the next ``import name`` (a worker
    that needs it) loads the real one. Yields whether it stood in (False: not installed, or imported already).

    A lazy module (``importlib.util.LazyLoader``) would not do: anything that scans ``sys.modules`` (``inspect``,
    which torch's own import calls) reads it, and loading it then, half-way through torch's import, fails."""
    spec = importlib.util.find_spec(name) if name not in sys.modules else None
    if spec is None:
        yield False
        return
    stub = types.ModuleType(name)
    stub.__spec__ = spec
    sys.modules[name] = stub
    try:
        yield True
    finally:
        if sys.modules.get(name) is stub:
            del sys.modules[name]


def _without_lora() -> bool:
    """The job trains no adapter, so nothing of it needs bitsandbytes (an unreadable config: assume it may)."""
    try:
        from finetune_trainer.config import load_config

        return load_config().training.lora is None
    except Exception:
        return False


def main() -> int:
    started = time.time()
    # The imports allocate millions of objects that live as long as the process: the collector's passes over them
    # while they load are a sixth of the imports' CPU. It runs again once they are frozen, before the workers fork.
    gc.disable()
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    if "OMP_NUM_THREADS" not in os.environ and int(os.environ.get("PET_NPROC_PER_NODE") or 1) > 1:
        # torchrun's default for several processes a node; torch reads it once, at import, so it is set before
        os.environ["OMP_NUM_THREADS"] = "1"
    # peft imports bitsandbytes as it is imported (1.2-1.5 s of CPU, torch's inductor with it; on a GPU it may also
    # initialise CUDA, which would make the workers spawned): a job without adapters never uses it
    with stand_in("bitsandbytes") if _without_lora() else contextlib.nullcontext():
        from torch.distributed.elastic.multiprocessing.errors import record

        from finetune_trainer import worker  # the whole training stack, once

    imported = time.time() - started
    _validate()
    # The stack's objects leave the collector's generations: no pass walks them again, in this process or in the
    # forked workers (whose pages then stay shared with this one's instead of being copied as a pass touches them).
    gc.freeze()
    gc.enable()
    line = sys.stdin.readline()
    if not line.strip():
        return 0  # the launcher gave up before training
    os.environ.update({str(k): str(v) for k, v in json.loads(line).items()})
    method = start_method()
    os.environ["FINETUNE_START_METHOD"] = method
    os.environ["FINETUNE_AGENT_IMPORT_SECONDS"] = f"{imported:.3f}"

    os.environ["TORCH_ELASTIC_WORKER_IDENTICAL"] = "1"  # every node runs nproc workers: ranks need no store round

    @record
    def launch() -> None:
        from torch.distributed.launcher import api
        from torch.distributed.run import config_from_args, parse_args

        from finetune_trainer.rounds import agent_class

        # torch's launch_agent builds the agent it names here: ours restarts the gang in place (finetune_trainer.rounds)
        api.LocalElasticAgent = agent_class()  # type: ignore[attr-defined]

        argv = [*sys.argv[1:], "--start-method", method, "-m", "finetune_trainer.worker"]
        config, _, _ = config_from_args(parse_args(argv))
        api.elastic_launch(config, worker.forked_entry)()

    launch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
