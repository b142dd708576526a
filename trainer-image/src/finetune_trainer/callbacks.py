"""Checkpoint completion, retention and collective SIGTERM handling, as a ``TrainerCallback``."""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

from transformers import TrainerCallback

from finetune_trainer import checkpoints
from finetune_trainer.metrics import TrainerMetrics

log = logging.getLogger(__name__)


class StopFlag:
    """Set by SIGTERM (preemption, gang restart). Only a flag: the decision to stop is taken collectively."""

    def __init__(self) -> None:
        self.requested = False
        self.agreed = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.requested:
            log.warning("SIGTERM received: saving a checkpoint at the next step boundary, then stopping")
        self.requested = True


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


class RunComplete(Exception):
    """Raised by every rank at the same step when the run resumed at its last step: nothing is left to train."""

    def __init__(self, step: int) -> None:
        super().__init__(f"the run already reached its last step ({step})")
        self.step = step


class CheckpointCallback(TrainerCallback):
    """* At every step end, all ranks agree on "someone got SIGTERM" (an all-reduce MAX of one integer on a
      CPU/gloo group, so it never synchronises the GPU); when agreed, every rank saves and stops together. If a peer
      has died the all-reduce fails and nothing is saved.
    * Before each save, rank 0 makes room on a nearly full volume (:func:`checkpoints.make_room`).
    * After each save, every rank fsyncs the checkpoint directory, a barrier, then rank 0 writes the completion
      marker and applies retention.
    """

    def __init__(
        self, stop: StopFlag, *, root: str, keep: int, metrics: TrainerMetrics | None, control_group: Any
    ) -> None:
        self.stop = stop
        self.root = root
        self.keep = keep
        self.metrics = metrics
        self.group = control_group
        self._save_started: float | None = None

    def _agree(self) -> bool:
        dist = _dist()
        if dist is None:
            return self.stop.requested
        import torch

        flag = torch.tensor([1 if self.stop.requested else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The Trainer resumed at (or past) its last step trains one step more before it checks max_steps (whenever
        # the updates per epoch do not divide it): the run is over, and not one more row is trained.
        if state.max_steps and state.global_step >= state.max_steps:
            raise RunComplete(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.stop.agreed and self._agree():
            if state.max_steps and state.global_step >= state.max_steps:
                # A SIGTERM at the last step: the run is over; it ends as a run does (the final model and result.json,
                # exit 0) within the grace period, instead of a checkpoint that the next attempt resumes to do nothing.
                log.warning("stop requested at the last step (%d): finishing the run", state.global_step)
            else:
                self.stop.agreed = True
                log.warning("stop agreed by all ranks at step %d: saving and exiting", state.global_step)
                control.should_save = True
                control.should_training_stop = True
        if control.should_save:
            self._save_started = time.perf_counter()
            if state.is_world_process_zero:
                for c in checkpoints.make_room(self.root):
                    log.warning("the output volume is nearly full: removed %s to make room for the next save", c.path)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        path = os.path.join(self.root, f"checkpoint-{state.global_step}")
        checkpoints.sync_tree(path)  # this rank's files are on disk before rank 0 may vouch for them
        dist = _dist()
        if dist is not None:
            dist.barrier(group=self.group)
        if state.is_world_process_zero:
            checkpoints.mark_complete(path, state.global_step)
            removed = checkpoints.apply_retention(self.root, self.keep)
            for c in removed:
                log.info("retention: removed %s", c.path)
        if self.metrics is not None:
            self.metrics.checkpoint_last_step.set(state.global_step)
            if self._save_started is not None:
                self.metrics.checkpoint_save_duration.observe(time.perf_counter() - self._save_started)
        self._save_started = None
