"""In-place restarts: the agent restarts the whole gang's workers without the pods going away.

When a rank's process fails while every pod is still there, the agents (one per pod, ``finetune_trainer.agent``) stop
their workers and fork new ones from the stack they imported: a few seconds instead of recreating the pods, pulling
nothing, importing nothing again. Each restart is a *round* of the attempt (``TORCHELASTIC_RESTART_COUNT``, 0 first),
and it counts against ``spec.maxRestarts`` exactly as the operator's gang restart does: the operator gives each pod
the restarts left when it creates the attempt (``FINETUNE_RESTARTS_IN_PLACE``), rank 0 exports the round
(``finetune_restarts_in_place``) and the launcher's termination message says how many there were.

The agents agree through the store node rank 0's agent already serves for the rendezvous (the static rendezvous keeps
it for the agent's life): the first agent whose workers fail writes ``round/<r>/failed`` with the cause; every other
agent checks that key at each monitoring tick (0.1 s) and stops its own workers, whatever they are doing (a rank
blocked in a collective with the dead one); each agent then adds itself to ``round/<r>/stopped`` and the round starts
again only when every node has (``JOIN_SECONDS``). A node that does not join (its pod deleted, its node lost, rank 0's
store gone with it) means the pods are not all there: the agents give up, exit with the original failure, and the
operator recreates the gang as before.

Never in place: a failure another round would repeat (a configuration or data error, CUDA out of memory, a full
output volume), a rendezvous timeout (ranks missing: the operator's decision), workers that stopped for a SIGTERM
(the launcher's stop marker, or the ranks' agreed stop), and any failure once the budget is used. The workers of a
new round form their process group under a prefix of their own in the store (``worker.init_process_group``): the
static rendezvous's store outlives the round, and the keys of the round before would otherwise be read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from typing import Any

from finetune_trainer import errors

log = logging.getLogger("finetune_trainer.rounds")

BUDGET_ENV = "FINETUNE_RESTARTS_IN_PLACE"  # restarts left when the operator created the attempt (0: none in place)
ROUNDS_FILE_ENV = "FINETUNE_ROUNDS_FILE"  # where the agent tells its launcher what it did (the termination message)
STOPPING_ENV = "FINETUNE_STOPPING_FILE"  # the launcher's mark that it got SIGTERM: no round after that
CAUSE_ENV = "FINETUNE_RESTART_CAUSE"  # the failure a round started after, for its workers' records
JOIN_SECONDS_ENV = "FINETUNE_IN_PLACE_JOIN_SECONDS"
JOIN_SECONDS = 15.0
# what a rank says when a peer died under it (gloo's TCP pair, NCCL): the peer's own failure is the cause to report
PEER_FAILURE_MARKERS = ("gloo/transport", "Connection closed by peer", "Connection reset by peer", "ncclRemoteError")


def budget(env: dict[str, str] | os._Environ[str] | None = None) -> int:
    """The restarts this attempt may make in place (``FINETUNE_RESTARTS_IN_PLACE``; absent or bad: none)."""
    e = os.environ if env is None else env
    try:
        return max(0, int(e.get(BUDGET_ENV) or 0))
    except ValueError:
        return 0


def join_seconds() -> float:
    try:
        return max(1.0, float(os.environ.get(JOIN_SECONDS_ENV) or JOIN_SECONDS))
    except ValueError:
        return JOIN_SECONDS


def stopping() -> bool:
    """The launcher got SIGTERM, or the ranks agreed to stop: the workers are ending for good."""
    return any(os.path.exists(os.environ.get(name) or "") for name in (STOPPING_ENV, "FINETUNE_STOP_FILE"))


def why_not_in_place(messages: list[str], exitcodes: list[int], *, left: int, stop: bool) -> str | None:
    """Why a failed round may not restart in place (None: it may). ``messages`` are the failed workers' error files,
    ``exitcodes`` their exit codes, ``left`` the restarts left, ``stop`` whether the workers are stopping for good."""
    if left <= 0:
        return "no restart left in place"
    if stop or errors.EXIT_TERMINATED in exitcodes or -signal.SIGTERM in exitcodes:
        return "the workers stopped for a SIGTERM"
    from finetune_trainer.launcher import classify_failure  # the launcher's own reading of the error file

    for m in messages:
        code, _ = classify_failure(m)
        if code == errors.EXIT_RENDEZVOUS_TIMEOUT:
            return "a rendezvous timeout (ranks missing)"
        if code != errors.EXIT_TRAINING_ERROR:
            return "a failure another round would repeat"
    return None


def root_cause(causes: list[str]) -> str:
    """Of the failed nodes' causes, the first that is not a rank seeing its peer die (the peer's is the root)."""
    return next((c for c in causes if not any(m in c for m in PEER_FAILURE_MARKERS)), causes[0] if causes else "")


def failure_message(failure: Any) -> str:
    """The message of torch's ``ProcessFailure``: the worker's error file, or its exit code and signal."""
    message = getattr(failure, "message", "")
    if isinstance(message, dict):
        message = message.get("message", "")
    if message and "To enable traceback" not in str(message):
        return str(message)
    code = getattr(failure, "exitcode", None)
    name = getattr(failure, "signal_name", lambda: "")()
    return f"local rank {getattr(failure, 'local_rank', '?')} exited with code {code}" + (
        f" ({name})" if name and name != "<N/A>" else ""
    )


def record_rounds(restarts: int, cause: str) -> None:
    """What the launcher puts in the termination message: the restarts made in place, the last one's cause."""
    path = os.environ.get(ROUNDS_FILE_ENV)
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"restarts": restarts, "cause": cause[-800:]}, f)
    os.replace(tmp, path)


def read_rounds(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def agent_class() -> type:
    """torch's ``LocalElasticAgent`` with in-place rounds agreed with the other nodes' agents (imports torch)."""
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    class GangAgent(LocalElasticAgent):
        _round = 0
        _stopped_for_restart = False  # _join stopped the workers: torch's restart need not stop them again
        _rounds_store: Any = None  # our own client of node rank 0's store, with a short timeout

        def _key(self, what: str) -> str:
            return f"finetune/round/{self._round}/{what}"

        def _coordination(self, wg: WorkerGroup) -> Any:
            """A client of the rendezvous store of our own, whose every operation gives up after ``JOIN_SECONDS``:
            torch's client waits up to the rendezvous timeout (300 s), which a node lost without a word (its
            packets dropped) would cost the agents that survive it, before the operator could recreate the gang."""
            if self._rounds_store is None:
                from torch._C._distributed_c10d import TCPStore

                self._rounds_store = TCPStore(
                    str(wg.master_addr),
                    int(wg.master_port or 0),
                    is_master=False,
                    timeout=_timedelta(join_seconds()),
                    wait_for_workers=False,
                )
            return self._rounds_store

        def _nnodes(self, wg: WorkerGroup) -> int:
            return int(wg.group_world_size or 1)

        def _monitor_workers(self, wg: WorkerGroup) -> RunResult:
            result: RunResult = super()._monitor_workers(wg)
            if result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
                failures = list((result.failures or {}).values())
                messages = [failure_message(f) for f in failures]
                why = why_not_in_place(
                    messages, [int(f.exitcode) for f in failures], left=self._remaining_restarts, stop=stopping()
                )
                first = failures[0] if failures else None
                where = f"node {wg.group_rank}, local rank {getattr(first, 'local_rank', 0)}: "
                cause = where + (messages[0] if messages else "a worker failed")
                if why is not None:
                    log.info("round %d failed; not restarting in place: %s", self._round, why)
                    self._abandon(wg)
                    return result
                try:
                    store = self._coordination(wg)
                    store.set(self._key(f"cause/{wg.group_rank}"), cause[-2000:])
                    store.set(self._key("failed"), "1")
                except Exception as e:  # rank 0's store unreachable (its node gone, the network cut): not in place
                    log.warning(
                        "round %d failed; not restarting in place: the store is unreachable (%s)", self._round, e
                    )
                    self._remaining_restarts = 0
                    return result
                if not self._join(wg, cause):
                    self._abandon(wg)
                return result
            if result.state == WorkerState.HEALTHY and self._remaining_restarts > 0:
                try:
                    failed = self._coordination(wg).check([self._key("failed")])
                except Exception:  # rank 0's store gone: its node is; the workers' collectives fail on their own
                    return result
                if failed and not stopping():
                    cause = "another node's workers failed"
                    log.info("another node's workers failed in round %d: restarting in place", self._round)
                    if not self._join(wg, cause):
                        raise RuntimeError(
                            "the gang's restart in place was given up (another node's failure would repeat, or a "
                            f"node did not join in {join_seconds():.0f}s: a pod or node gone); the operator recreates "
                            "the gang"
                        )
                    return RunResult(state=WorkerState.FAILED)
            return result

        def _abandon(self, wg: WorkerGroup) -> None:
            """No restart in place after this failure: this node's agent exits with it, and tells the others so that
            they stop waiting for it (best effort: the store may be what failed)."""
            self._remaining_restarts = 0
            with contextlib.suppress(Exception):
                self._coordination(wg).set(self._key("abandoned"), "1")

        def _join(self, wg: WorkerGroup, cause: str) -> bool:
            """Stop this node's workers and wait for every node's agent to have done the same. Whether all did."""
            noticed = time.time()
            self._stop_now(wg)
            store, nnodes = self._coordination(wg), self._nnodes(wg)
            started = time.monotonic()
            deadline = started + join_seconds()
            try:
                if store.add(self._key("stopped"), 1) >= nnodes:
                    store.set(self._key("go"), "1")
                while not store.check([self._key("go")]):
                    if store.check([self._key("abandoned")]):
                        raise RuntimeError("another node's agent gave the restart in place up")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"not every node's agent joined in {join_seconds():.0f}s")
                    time.sleep(0.05)
            except Exception as e:  # a timeout, an abandoned round, or rank 0's store gone
                log.warning("round %d: no restart in place (%s)", self._round, e)
                return False
            try:
                causes = [
                    store.get(self._key(f"cause/{n}")).decode(errors="replace")
                    for n in range(nnodes)
                    if store.check([self._key(f"cause/{n}")])
                ]
            except Exception:
                causes = []
            cause = root_cause(causes) or cause
            self._round += 1
            record_rounds(self._round, cause)
            os.environ[CAUSE_ENV] = cause[-2000:]  # the next round's workers inherit it (their attempt record)
            # the round's start-up is counted from the failure: its time to first step is the recovery's
            os.environ["FINETUNE_LAUNCH_TIME"] = os.environ["FINETUNE_TORCHRUN_TIME"] = repr(noticed)
            log.warning(
                "restarting every rank in place (round %d, %d left), %.1fs to agree: %s",
                self._round,
                self._remaining_restarts - 1,
                time.monotonic() - started,
                cause.splitlines()[-1] if cause else "",
            )
            return True

        def _stop_now(self, wg: WorkerGroup) -> None:
            """SIGKILL: the round is over, and a worker's SIGTERM handler would try to agree on a checkpoint with a
            dead rank."""
            self._stopped_for_restart = True
            self._shutdown(death_sig=signal.SIGKILL, timeout=5)

        def _stop_workers(self, worker_group: WorkerGroup) -> None:
            if self._stopped_for_restart:
                self._stopped_for_restart = False
                return  # stopped already, by _join
            super()._stop_workers(worker_group)

    return GangAgent


def _timedelta(seconds: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=seconds)
