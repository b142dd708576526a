"""The env contract every trainer pod receives (trainer-image/README.md, "Env contract")."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from finetune_trainer.errors import ConfigError


@dataclass(frozen=True)
class RunEnv:
    nnodes: int
    nproc_per_node: int
    node_rank: int
    master_addr: str
    master_port: int
    job_name: str
    namespace: str
    attempt: int

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


def _get(env: Mapping[str, str], names: tuple[str, ...], default: str) -> tuple[str, str]:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            return name, value
    return names[0], default


def _int(env: Mapping[str, str], names: tuple[str, ...], default: int, minimum: int) -> int:
    name, value = _get(env, names, str(default))
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(name, f"must be an integer, got {value!r}") from None
    if number < minimum:
        raise ConfigError(name, f"must be >= {minimum}, got {number}")
    return number


def read_env(env: Mapping[str, str] | None = None, *, job_name: str = "", namespace: str = "") -> RunEnv:
    """Read the contract; ``PET_*`` (what torchrun reads) wins over the plain names. Missing values default to a
    single local node, so the trainer also runs outside Kubernetes."""
    env = os.environ if env is None else env
    nproc_name, nproc = _get(env, ("PET_NPROC_PER_NODE", "NPROC_PER_NODE"), "1")
    if not nproc.isdigit() or int(nproc) < 1:
        raise ConfigError(nproc_name, f"must be a positive integer (processes per node), got {nproc!r}")
    run = RunEnv(
        nnodes=_int(env, ("PET_NNODES", "NNODES"), 1, 1),
        nproc_per_node=int(nproc),
        node_rank=_int(env, ("PET_NODE_RANK", "NODE_RANK"), 0, 0),
        master_addr=_get(env, ("PET_MASTER_ADDR", "MASTER_ADDR"), "127.0.0.1")[1],
        master_port=_int(env, ("PET_MASTER_PORT", "MASTER_PORT"), 29500, 1),
        job_name=env.get("FINETUNE_JOB_NAME") or job_name,
        namespace=env.get("FINETUNE_NAMESPACE") or namespace,
        attempt=_int(env, ("FINETUNE_ATTEMPT",), 0, 0),
    )
    if run.node_rank >= run.nnodes:
        raise ConfigError("PET_NODE_RANK", f"node rank {run.node_rank} is not below the node count {run.nnodes}")
    world = env.get("WORLD_SIZE")
    if world not in (None, "") and world.isdigit() and int(world) != run.world_size:
        raise ConfigError(
            "WORLD_SIZE", f"WORLD_SIZE={world} but nodes x processes per node = {run.nnodes} x {run.nproc_per_node}"
        )
    return run
