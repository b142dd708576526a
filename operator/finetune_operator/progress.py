"""Pure: rank 0's Prometheus text → the typed ``status.progress`` fields, and the restart accounting.

Per-node rates are scaled by the number of nodes: every DDP rank processes the same number of samples
per step, so the job's throughput is rank 0's node throughput times the number of nodes.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from finetune_operator import grpo
from finetune_operator.status import Progress

GAUGES = {
    "finetune_train_step": "step",
    "finetune_train_total_steps": "total_steps",
    "finetune_train_epoch": "epoch",
    "finetune_train_loss": "loss",
    "finetune_train_learning_rate": "learning_rate",
    "finetune_train_samples_per_second": "samples_per_second",
    "finetune_train_tokens_per_second": "tokens_per_second",
    "finetune_train_eta_seconds": "eta_seconds",
    "finetune_checkpoint_last_step": "last_checkpoint_step",
    "finetune_train_mfu_ratio": "mfu",
    "finetune_train_mfu": "mfu",  # trainer images before the _ratio name
    "finetune_time_to_first_step_seconds": "time_to_first_step_seconds",
    "finetune_train_warmup_seconds": "warmup_seconds",
    "finetune_rendezvous_duration_seconds": "rendezvous_seconds",
    "finetune_startup_launcher_seconds": "launcher_seconds",
    "finetune_startup_data_seconds": "data_seconds",
    "finetune_startup_model_seconds": "model_seconds",
    "finetune_restarts_in_place": "restarts_in_place",
    "finetune_eval_loss": "eval_loss",
    "finetune_eval_perplexity": "eval_perplexity",
    "finetune_eval_accuracy": "eval_accuracy",
    "finetune_eval_f1": "eval_f1",
    "finetune_train_reward_accuracy": "reward_accuracy",
    "finetune_train_reward_margin": "reward_margin",
    "finetune_train_reward_mean": "reward_mean",
    "finetune_train_completion_length_mean": "completion_length",
    "finetune_train_kl": "kl",
    "finetune_train_rollout_tokens_per_second": "rollout_tokens_per_second",
}
# GRPO: one series per reward function, its name in the reward label (as many as a job may name, names as it may)
REWARD_FUNCTIONS = "finetune_train_reward_function_mean"
MAX_REWARD_FUNCTIONS = grpo.MAX_REWARDS
# What the run trains with, from the labels of this always-1 series (the trainer's auto settled): the values each
# label may hold (the fields of the same names), and the reason (acceleration_reason)
CHOICE_INFO = "finetune_train_choice_info"
CHOICE_VALUES = {"acceleration": ("none", "compile", "ort"), "kernels": ("none", "liger")}
CHOICE_REASON_CHARS = 400
# 0 until the trainer knows them: left out until then (restarts in place: 0 is the status's absent field)
SET_ONCE = {
    "restarts_in_place",
    "time_to_first_step_seconds",
    "warmup_seconds",
    "rendezvous_seconds",
    "launcher_seconds",
    "data_seconds",
    "model_seconds",
}
INTEGER_FIELDS = {"step", "total_steps", "eta_seconds", "last_checkpoint_step", "restarts_in_place"}
PER_NODE_RATES = {"samples_per_second", "tokens_per_second", "rollout_tokens_per_second"}


def human_duration(seconds: float) -> str:
    s = int(max(0, round(seconds)))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h}h"
    if h:
        return f"{h}h{m}m"
    if m:
        return f"{m}m{s}s"
    return f"{s}s"


# What the status can hold: integers exact in JSON (and in the CRD's int64), floats far beyond any real gauge. A value
# outside (a tenant's page can say anything) is left out instead of failing every status write with a 422.
MAX_INTEGER = 2**53 - 1
MAX_FLOAT = 1e15


def _ours(text: str) -> str:
    """Only the lines of the gauges read here: a page padded with other series costs no parsing."""
    keep = []
    for line in text.splitlines():
        name = line[7:] if line.startswith(("# HELP ", "# TYPE ")) else line
        if name.startswith("finetune_") and name.split("{", 1)[0].split(" ", 1)[0] in (
            *GAUGES,
            CHOICE_INFO,
            REWARD_FUNCTIONS,
        ):
            keep.append(line)
    return "\n".join(keep) + "\n"


def _choice(labels: dict[str, str]) -> dict[str, str]:
    """What the run trains with: known values only, the reason as printable text of bounded length (a tenant's page
    can say anything)."""
    out = {k: labels[k] for k, allowed in CHOICE_VALUES.items() if labels.get(k) in allowed}
    reason = "".join(c for c in labels.get("reason", "") if c.isprintable())[:CHOICE_REASON_CHARS]
    if reason and out:
        out["acceleration_reason"] = reason
    return out


def _reward_means(samples: list[Any], into: dict[str, float]) -> None:
    """Each reward function's mean by its name: well-formed names and finite values only, as many as a job may
    name (a page may split the family: ``into`` gathers every part)."""
    for sample in samples:
        name, value = sample.labels.get("reward", ""), float(sample.value)
        well_formed = grpo.NAME_RE.match(name) and math.isfinite(value) and abs(value) <= MAX_FLOAT
        if well_formed and len(into) < MAX_REWARD_FUNCTIONS:
            into[name] = round(value, 4)


def parse_metrics(text: str, *, nodes: int) -> Progress | None:
    """The progress fields found in a trainer's /metrics page (missing, NaN or out-of-range values are left out); None
    before the trainer's training loop has started."""
    out: dict[str, Any] = {}
    means: dict[str, float] = {}
    for family in text_string_to_metric_families(_ours(text)):
        if family.name == CHOICE_INFO and family.samples:
            out.update(_choice(family.samples[0].labels))
            continue
        if family.name == REWARD_FUNCTIONS:
            _reward_means(family.samples, means)
            continue
        field = GAUGES.get(family.name)
        if field is None or not family.samples:
            continue
        value = float(family.samples[0].value)
        if math.isnan(value) or math.isinf(value) or (field in SET_ONCE and value <= 0):
            continue
        if abs(value) > (MAX_INTEGER if field in INTEGER_FIELDS else MAX_FLOAT / max(1, nodes)) or (
            field in INTEGER_FIELDS and value < 0
        ):
            continue
        if field in PER_NODE_RATES:  # whole-job rates; from 10/s on to a tenth: a column reads 2702.2, not 2702.2199
            value *= nodes
            out[field] = round(value, 1 if value >= 10 else 4)
            continue
        if field == "learning_rate":  # 2e-05: four significant digits, not four decimals
            out[field] = float(f"{value:.4g}")
            continue
        out[field] = int(value) if field in INTEGER_FIELDS else round(value, 4)
    if means:
        out["reward_means"] = dict(sorted(means.items()))
    if not out.get("total_steps"):
        # The trainer has not started its training loop yet: no progress to report, but the checkpoint it resumes
        # from (saved as the attempt before it stopped, which no scrape of that attempt saw).
        early = {k: out[k] for k in ("last_checkpoint_step", "restarts_in_place") if out.get(k)}
        return Progress(**early) if early else None
    if "step" in out:
        out["step_of_total"] = f"{out['step']}/{out['total_steps']}"
    if "eta_seconds" in out:
        out["eta"] = human_duration(out["eta_seconds"])
    return Progress(**out)


def steps_lost(progress: Progress) -> int:
    """Steps that a restart now throws away: trained since the newest complete checkpoint."""
    return max(0, (progress.step or 0) - (progress.last_checkpoint_step or 0))


def attempt_gpu_seconds(*, seconds: float, gpus_per_node: int, nodes: int) -> float:
    return round(max(0.0, seconds) * gpus_per_node * nodes, 3)
