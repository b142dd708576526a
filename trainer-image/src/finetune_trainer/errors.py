"""Exit codes, failure reasons and the termination log: what the operator reads when a pod ends (why it failed, or
on rank 0's success the end of its curves)."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Final

EXIT_OK: Final = 0
EXIT_TRAINING_ERROR: Final = 1
EXIT_OUTPUT_FULL: Final = 73  # EX_CANTCREAT: the output volume is full; the next attempt would hit the same save
EXIT_EXPORT_FAILED: Final = 74  # EX_IOERR: trained, but pushing the model out failed (the model is on the claim)
EXIT_RENDEZVOUS_TIMEOUT: Final = 75  # EX_TEMPFAIL
EXIT_CUDA_OOM: Final = 77  # the GPU ran out of memory: deterministic for the settings, so not retried
EXIT_CONFIG_ERROR: Final = 78  # EX_CONFIG
EXIT_TERMINATED: Final = 143  # 128 + SIGTERM
# what a failure caused by missing ranks says (torch's store and rendezvous errors): exit 75, never restarted in place
RENDEZVOUS_MARKERS = ("DistStoreError", "RendezvousTimeoutError", "waiting for clients", "RendezvousConnectionError")

REASON_CONFIG: Final = "ConfigError"
REASON_RENDEZVOUS: Final = "RendezvousTimeout"
REASON_TRAINING: Final = "TrainingError"
REASON_TERMINATED: Final = "Terminated"
REASON_EXPORT: Final = "ExportFailed"
REASON_CUDA_OOM: Final = "CUDAOutOfMemory"
REASON_OUTPUT_FULL: Final = "OutputFull"
REASON_COMPLETED: Final = "Completed"
# The points of a success's curves in the termination log (kept under MAX_MESSAGE_CHARS with room to spare).
MAX_RESULT_LOSS_POINTS: Final = 64
MAX_RESULT_EVAL_POINTS: Final = 16
MAX_RESULT_CHARS: Final = 2800  # the summary as written (ASCII: other characters escaped), under the 4 KB kept

REASON_BY_EXIT: Final = {
    EXIT_TRAINING_ERROR: REASON_TRAINING,
    EXIT_RENDEZVOUS_TIMEOUT: REASON_RENDEZVOUS,
    EXIT_CONFIG_ERROR: REASON_CONFIG,
    EXIT_TERMINATED: REASON_TERMINATED,
    EXIT_EXPORT_FAILED: REASON_EXPORT,
    EXIT_CUDA_OOM: REASON_CUDA_OOM,
    EXIT_OUTPUT_FULL: REASON_OUTPUT_FULL,
}

DEFAULT_TERMINATION_LOG: Final = "/dev/termination-log"
# Kubernetes keeps at most 4096 bytes of a termination message; stay well under it.
MAX_MESSAGE_CHARS: Final = 3000
# A worker's ConfigError travels through torchelastic's error file with this prefix.
CONFIG_ERROR_PREFIX: Final = "ConfigError: "
CUDA_OOM_PREFIX: Final = "CUDAOutOfMemory: "
OUTPUT_FULL_PREFIX: Final = "OutputFull: "


class ConfigError(Exception):
    """A configuration or data error: the job cannot succeed as specified, so it is never retried (exit 78).

    ``field`` is the config path at fault (``dataset.textField``); the message says what to change.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class CUDAOutOfMemory(Exception):
    """The GPU ran out of memory (exit 77): the message says which settings to change."""


class OutputFull(Exception):
    """The output volume ran out of space (or quota) while writing (exit 73): a gang restart would resume and fail
    at the same save, so the message tells the user to enlarge the claim or keep fewer checkpoints."""


class RendezvousTimeout(Exception):
    """The preflight could not reach rank 0 in time (exit 75)."""


def write_termination_log(
    reason: str,
    message: str,
    path: str | None = None,
    *,
    result: dict[str, Any] | None = None,
    restarts_in_place: int = 0,
) -> None:
    """Write ``{"reason", "message"}`` (and rank 0's ``result`` summary on success: :func:`result_summary`; the
    attempt's restarts in place when there were any, ``restartsInPlace``) for the operator; silently skip when the
    path is not writable."""
    path = path or os.environ.get("FINETUNE_TERMINATION_LOG", DEFAULT_TERMINATION_LOG)
    if len(message) > MAX_MESSAGE_CHARS:
        message = "…" + message[-(MAX_MESSAGE_CHARS - 1) :]
    record: dict[str, Any] = {"reason": reason, "message": message}
    if result is not None:
        record["result"] = result
    if restarts_in_place:
        record["restartsInPlace"] = restarts_in_place
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(record, f, separators=(",", ":"))
    except OSError:
        pass


def _evenly(points: list[Any], limit: int) -> list[Any]:
    """At most ``limit`` of ``points``, evenly spread, the first and the last always kept."""
    if len(points) <= limit:
        return points
    picks = sorted({round(i * (len(points) - 1) / (limit - 1)) for i in range(limit)})
    return [points[i] for i in picks]


def _num(v: Any) -> float | None:
    return float(f"{v:.6g}") if isinstance(v, int | float) and math.isfinite(v) else None


def result_summary(result: dict[str, Any]) -> dict[str, Any]:
    """What the operator adds to ``status.history`` when the job succeeds, from ``result.json``: the final step and
    attempt, the job's steady samples/s, the logged losses ``[step, loss]`` (at most :data:`MAX_RESULT_LOSS_POINTS`,
    evenly spread, the last one kept), the evaluations ``[step, loss]`` (at most :data:`MAX_RESULT_EVAL_POINTS`) and
    the model's scores (:func:`evaluation_summary`). Fitted under :data:`MAX_RESULT_CHARS` as the termination log
    writes it (Kubernetes keeps 4 KB of it: a cut message would not parse at all): the curves thin first."""
    start = result.get("resumed_from_step") or 0  # the curves before it are earlier attempts': the status has them
    losses = [
        [int(s), v] for s, loss in result.get("loss_history") or [] if (v := _num(loss)) is not None and s > start
    ]
    evals = [
        [int(e["step"]), v]
        for e in result.get("eval_history") or []
        if e.get("step") is not None and (v := _num(e.get("loss"))) is not None and e["step"] > start
    ]
    loss, evals = _evenly(losses, MAX_RESULT_LOSS_POINTS), _evenly(evals, MAX_RESULT_EVAL_POINTS)
    scores = evaluation_summary(result)

    def summary() -> dict[str, Any]:
        return {
            "steps": result.get("steps"),
            "attempt": result.get("attempt"),
            "resumedFromStep": result.get("resumed_from_step"),  # the losses up to it are earlier attempts'
            "samplesPerSecond": _num(result.get("samples_per_second")),
            "loss": loss,
            "eval": evals,
            "evaluation": scores,
        }

    while len(json.dumps(summary(), separators=(",", ":"))) > MAX_RESULT_CHARS:
        if len(loss) > 8 or len(evals) > 4:
            loss, evals = _evenly(loss, max(2, len(loss) // 2)), _evenly(evals, max(2, len(evals) // 2))
        elif scores is not None and scores.get("message"):
            cut = scores["message"][:40]
            scores = (
                {**scores, "message": cut}
                if len(scores["message"]) > 40
                else {k: v for k, v in scores.items() if k != "message"}
            )
        elif scores is not None:  # long score names: result.json keeps them in full
            scores = None
        else:
            break
    return summary()


# The final evaluation's metrics (finetune_trainer.evaluation.summarize) as status.evaluation names them
FINAL_EVAL_KEYS: Final = {
    "loss": "loss",
    "perplexity": "perplexity",
    "accuracy": "accuracy",
    "f1": "f1",
    "reward_accuracy": "rewardAccuracy",
    "reward_margin": "rewardMargin",
}


def evaluation_summary(result: dict[str, Any]) -> dict[str, Any] | None:
    """The model's scores for ``status.evaluation``: the evaluation stage's (spec.evaluation: its state, split,
    samples and each metric's mean) and the final evaluation on the evaluation split (held-out loss, perplexity,
    accuracy, DPO's reward accuracy); None when the run had neither. At most about 1.5 KB."""
    stage = result.get("evaluation") if isinstance(result.get("evaluation"), dict) else None
    final = result.get("final_eval") if isinstance(result.get("final_eval"), dict) else None
    if stage is None and final is None:
        return None
    out: dict[str, Any] = {}
    if final is not None:
        out["step"] = final.get("step")
        out.update({name: v for key, name in FINAL_EVAL_KEYS.items() if (v := _num(final.get(key))) is not None})
    if stage is not None:
        out["state"] = stage.get("state")
        out["split"] = stage.get("split")
        if stage.get("message"):
            out["message"] = str(stage["message"])[:200]
        if isinstance(stage.get("samples"), int):
            out["samples"] = stage["samples"]
        scores = stage.get("scores") if isinstance(stage.get("scores"), dict) else {}
        kept = {str(k)[:40]: _num(v) for k, v in list(scores.items())[:16]}
        out["scores"] = {k: v for k, v in kept.items() if v is not None} or None
        out["completionLength"] = _num(stage.get("completion_length_mean"))
        out["seconds"] = _num(stage.get("seconds"))
    return {k: v for k, v in out.items() if v is not None}
