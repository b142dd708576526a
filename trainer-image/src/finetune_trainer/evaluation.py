"""Evaluation metrics the trainer reports (result.json, Prometheus, the job's status), without extra packages.

- every task: ``eval_loss`` (the Trainer's);
- ``causal-lm``: ``perplexity`` = exp(eval_loss), derived (no logits are kept: a vocabulary-wide logit tensor per
  evaluated token would not fit in memory for real models);
- ``dpo``: ``reward_accuracy`` and ``reward_margin`` on the evaluation pairs (TRL's ``rewards/*``);
- ``sequence-classification``: ``accuracy`` and macro-averaged ``f1``, from predictions reduced to class ids on the
  device batch by batch (``preprocess_logits_for_metrics``), so only one integer per row is gathered.
"""

from __future__ import annotations

import math
from typing import Any

# What the report keeps of the Trainer's evaluation metrics, by task (the Trainer prefixes them with "eval_").
REPORTED = {
    "sequence-classification": ("eval_loss", "eval_accuracy", "eval_f1"),
    "causal-lm": ("eval_loss",),
    # TRL's DPOTrainer: the rewards on the evaluation pairs
    "dpo": ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins"),
}
# Reported names where the Trainer's own are not plain words
RENAMED = {"rewards/accuracies": "reward_accuracy", "rewards/margins": "reward_margin"}


def argmax_logits(logits: Any, labels: Any) -> Any:
    """``preprocess_logits_for_metrics``: class ids instead of logits (some models return a tuple)."""
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)


def classification_metrics(eval_pred: Any) -> dict[str, float]:
    """``compute_metrics`` for sequence classification: accuracy and macro F1 over the classes that occur."""
    import numpy as np

    preds = np.asarray(eval_pred.predictions).reshape(-1)
    labels = np.asarray(eval_pred.label_ids).reshape(-1)
    if labels.size == 0:
        return {}
    f1s = []
    for c in np.union1d(preds, labels):
        tp = int(np.sum((preds == c) & (labels == c)))
        fp = int(np.sum((preds == c) & (labels != c)))
        fn = int(np.sum((preds != c) & (labels == c)))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return {"accuracy": float(np.mean(preds == labels)), "f1": float(np.mean(f1s))}


def summarize(task: str, step: int, metrics: dict[str, float]) -> dict[str, float]:
    """One evaluation as reported: step, the task's metrics without the "eval_" prefix, and perplexity."""
    out: dict[str, float] = {"step": step}
    for key in REPORTED.get(task, ("eval_loss",)):
        if key in metrics:
            name = key.removeprefix("eval_")
            out[RENAMED.get(name, name)] = float(metrics[key])
    if task == "causal-lm" and "loss" in out:
        out["perplexity"] = math.exp(out["loss"]) if out["loss"] < 700 else math.inf
    return out
