"""GRPO's rollouts: TRL's ``GRPOTrainer`` with its generation timed and its tokens counted.

The Trainer's collator never sees GRPO's batches as tensors (TRL's collator passes the rows through and generates
the completions inside the training step), so the rows and tokens each step trains on (prompts and completions) are
counted here, as the completions come back, and the generation's own time gives the rollout rate."""

from __future__ import annotations

import threading
import time
from typing import Any

from finetune_trainer.metrics import BatchCounter


class RolloutMeter:
    """Completion tokens generated and the seconds the generation took, since the last ``take`` (rank-local)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens = 0
        self._seconds = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        with self._lock:
            self._tokens += tokens
            self._seconds += seconds

    def take(self) -> tuple[int, float]:
        with self._lock:
            taken = self._tokens, self._seconds
            self._tokens, self._seconds = 0, 0.0
        return taken


def counted(base: type, counter: BatchCounter, meter: RolloutMeter) -> type:
    """``base`` (TRL's GRPOTrainer, or a subclass) counting each training rollout into ``counter`` (the rows and
    the prompt and completion tokens, spread over the micro-batches they train in) and ``meter``."""

    class Counted(base):  # type: ignore[misc, valid-type]
        def _generate(self, prompts: list[Any]) -> Any:
            started = time.perf_counter()
            out = super()._generate(prompts)
            if self.model.training:
                prompt_ids, completion_ids = out[0], out[1]
                generated = sum(len(ids) for ids in completion_ids)
                meter.add(generated, time.perf_counter() - started)
                batches = int(getattr(self.args, "steps_per_generation", None) or 1)
                counter.record(len(completion_ids), generated + sum(len(ids) for ids in prompt_ids), batches)
            return out

    Counted.__name__ = Counted.__qualname__ = base.__name__
    return Counted
