"""Prometheus metrics, updated by a ``TrainerCallback`` and served by the local-rank-0 worker of each node.

Labels are exactly ``finetune_namespace``, ``finetune_job`` and ``node_rank`` (never ``job``/``namespace``, which
collide with Prometheus' target labels; never the step, which would explode cardinality).

Samples and tokens are what this node processed: rank-local counts (rows and non-padding tokens of the batches
the data collator built for each optimizer step) times the processes per node.

MFU (model FLOPs utilisation) = achieved FLOPs / peak FLOPs, with achieved FLOPs per second estimated as
``6 * trainable_and_frozen_params * tokens_per_second`` (forward 2·N·T plus backward 4·N·T, attention FLOPs
ignored) and peak = :func:`peak_flops` per device x devices on this node. On CPU, or a GPU missing from
:data:`PEAK_FLOPS`, there is no trustworthy peak and the gauge is NaN.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

try:
    from transformers import TrainerCallback
except ModuleNotFoundError:  # without transformers there is no Trainer to register the callback with; the exporter
    # (TrainerMetrics: what the operator's tests and tools read) still imports, in a fraction of the time
    TrainerCallback = object  # type: ignore[misc,assignment]

from finetune_trainer.evaluation import summarize

log = logging.getLogger(__name__)

LABELS = ("finetune_namespace", "finetune_job", "node_rank")
CHOICE_REASON_CHARS = 400  # what the operator keeps of auto's reason in status.progress

# Dense peak tensor-core throughput per device in FLOP/s, by (device-name substring, dtype). From the vendors'
# data sheets, without sparsity. The first matching substring wins, so longer names come first.
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "fp32": 51e12}),
    ("H100", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("A100", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    ("L40S", {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12}),
    ("L4", {"bf16": 121e12, "fp16": 121e12, "fp32": 30.3e12}),
    ("A10G", {"bf16": 70e12, "fp16": 70e12, "fp32": 31.2e12}),
    ("A10", {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12}),
    ("V100", {"fp16": 125e12, "fp32": 15.7e12}),
    ("T4", {"fp16": 65e12, "fp32": 8.1e12}),
]


def peak_flops(device_name: str | None, dtype: str) -> float:
    """Peak FLOP/s of one device for ``dtype`` ('bf16', 'fp16', 'fp32'); NaN when unknown (and on CPU)."""
    if not device_name:
        return math.nan
    for key, table in PEAK_FLOPS:
        if key.lower() in device_name.lower():
            return table.get(dtype, math.nan)
    return math.nan


def training_flops(params: int, tokens: float) -> float:
    """FLOPs of one training pass over ``tokens`` tokens: 6 · params · tokens."""
    return 6.0 * params * tokens


def mfu(params: int, tokens_per_second: float, peak_per_device: float, devices: int) -> float:
    """Model FLOPs utilisation in [0, 1]; NaN when the peak is unknown."""
    if not (peak_per_device > 0) or devices <= 0 or math.isnan(peak_per_device):
        return math.nan
    return training_flops(params, tokens_per_second) / (peak_per_device * devices)


# TRL's DPOTrainer logs these each logging step (mean over the logged batches); named as result.json keeps them
REWARD_LOGS = {
    "rewards/accuracies": "accuracy",
    "rewards/margins": "margin",
    "rewards/chosen": "chosen",
    "rewards/rejected": "rejected",
}
# TRL's GRPOTrainer logs these each logging step; named as result.json's grpo history keeps them
GRPO_LOGS = {
    "reward": "reward",
    "reward_std": "reward_std",
    "completions/mean_length": "completion_length",
    "kl": "kl",
    "entropy": "entropy",
}


class TrainerMetrics:
    """The metric objects, on their own registry, with this node's label values bound."""

    def __init__(
        self,
        *,
        namespace: str,
        job: str,
        node_rank: int,
        registry: CollectorRegistry | None = None,
        rollouts: bool = False,
        evaluation: bool = False,
    ):
        self.registry = registry or CollectorRegistry()
        values = (namespace, job, str(node_rank))
        r = self.registry

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, LABELS, registry=r).labels(*values)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, LABELS, registry=r).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, LABELS, registry=r, buckets=buckets).labels(*values)

        step_buckets = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, float("inf"))
        self.samples = counter("finetune_train_samples", "Training samples processed by this node")
        self.tokens = counter("finetune_train_tokens", "Training tokens (non-padding) processed by this node")
        self.steps = counter("finetune_train_steps", "Optimizer steps completed")
        self.step_duration = histogram(
            "finetune_train_step_duration_seconds", "Wall time of one optimizer step", step_buckets
        )
        self.loss = gauge("finetune_train_loss", "Last logged training loss (mean over ranks)")
        self.learning_rate = gauge("finetune_train_learning_rate", "Last logged learning rate")
        self.epoch = gauge("finetune_train_epoch", "Current epoch (fractional)")
        self.step = gauge("finetune_train_step", "Current global optimizer step")
        self.total_steps = gauge("finetune_train_total_steps", "Optimizer steps the run will take")
        self.eta = gauge("finetune_train_eta_seconds", "Estimated seconds until training ends")
        self.samples_per_second = gauge(
            "finetune_train_samples_per_second", "Recent training samples per second on this node"
        )
        self.tokens_per_second = gauge(
            "finetune_train_tokens_per_second", "Recent training tokens per second on this node"
        )
        self.mfu = gauge("finetune_train_mfu_ratio", "Model FLOPs utilisation, 0-1 (NaN on CPU or unknown GPUs)")
        # The name before Prometheus' unit-suffix convention, exported for one more release so that dashboards and
        # alerts can move to finetune_train_mfu_ratio.
        self.mfu_deprecated = gauge(
            "finetune_train_mfu", "Deprecated: finetune_train_mfu_ratio (same value; removed in the next release)"
        )
        self.checkpoint_last_step = gauge("finetune_checkpoint_last_step", "Step of the newest complete checkpoint")
        self.checkpoint_resume_fallbacks = gauge(
            "finetune_checkpoint_resume_fallbacks",
            "Newer complete checkpoints this attempt found unloadable and skipped before resuming",
        )
        self.checkpoint_save_duration = histogram(
            "finetune_checkpoint_save_duration_seconds",
            "Wall time of one checkpoint save, including the completion barrier",
            (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, float("inf")),
        )
        self.time_to_first_step = gauge(
            "finetune_time_to_first_step_seconds", "Seconds from launcher start to the end of the first optimizer step"
        )
        self.warmup = gauge(
            "finetune_train_warmup_seconds",
            "Wall time of the first optimizer step (compilation or ONNX export happen there), kept out of the rates",
        )
        self.rendezvous_duration = gauge(
            "finetune_rendezvous_duration_seconds", "Seconds from launcher start until the process group was formed"
        )
        # result.json's startup parts: the launcher's own work (validation, cache, preflight; with the agent, the wait
        # for its imports), building the datasets, building or loading the model
        self.startup_launcher = gauge(
            "finetune_startup_launcher_seconds", "Seconds from launcher start until it started the training workers"
        )
        self.startup_data = gauge("finetune_startup_data_seconds", "Seconds spent building the datasets at start-up")
        self.startup_model = gauge("finetune_startup_model_seconds", "Seconds spent building or loading the model")
        self.attempt = gauge("finetune_attempt", "Attempt number of this run (FINETUNE_ATTEMPT)")
        self.restarts_in_place = gauge(
            "finetune_restarts_in_place", "Restarts of every rank in place in this attempt (the agent's rounds)"
        )
        self.eval_loss = gauge("finetune_eval_loss", "Loss on the evaluation split at the last evaluation")
        self.eval_perplexity = gauge("finetune_eval_perplexity", "exp(eval loss) at the last evaluation (causal-lm)")
        self.eval_accuracy = gauge(
            "finetune_eval_accuracy", "Accuracy on the evaluation split at the last evaluation (classification)"
        )
        self.eval_f1 = gauge("finetune_eval_f1", "Macro F1 on the evaluation split at the last evaluation")
        self.reward_accuracy = gauge(
            "finetune_train_reward_accuracy",
            "dpo: share of the last logged pairs whose chosen response the policy rewards above the rejected, 0-1",
        )
        self.reward_margin = gauge(
            "finetune_train_reward_margin", "dpo: mean reward of chosen minus rejected over the last logged pairs"
        )
        # GRPO's series, on the pages of GRPO runs only (rollouts=True): the other tasks' pages stay as small
        grpo_registry = r if rollouts else None

        def grpo(name: str, doc: str) -> Any:
            return Gauge(name, doc, LABELS, registry=grpo_registry).labels(*values)

        self.reward_mean = grpo(
            "finetune_train_reward_mean", "grpo: mean weighted sum of the rewards over the last logged completions"
        )
        self.reward_std = grpo("finetune_train_reward_std", "grpo: standard deviation of that sum")
        self._reward_function = Gauge(
            "finetune_train_reward_function_mean",
            "grpo: mean of one reward function (unweighted) over the last logged completions",
            (*LABELS, "reward"),
            registry=grpo_registry,
        )
        self.completion_length = grpo(
            "finetune_train_completion_length_mean", "grpo: mean length of the last logged completions, in tokens"
        )
        self.kl = grpo("finetune_train_kl", "grpo with beta > 0: mean KL of the policy to the reference model")
        self.rollout_tokens_per_second = grpo(
            "finetune_train_rollout_tokens_per_second",
            "grpo: recent completion tokens generated per second of generation on this node",
        )
        # The evaluation stage's series (spec.evaluation), on rank 0's page of the runs that have one, once it runs
        evaluation_registry = r if evaluation else None
        self.evaluation_samples = Gauge(
            "finetune_evaluation_samples",
            "The evaluation stage: prompts generated for so far",
            LABELS,
            registry=evaluation_registry,
        ).labels(*values)
        self._evaluation_score = Gauge(
            "finetune_evaluation_score",
            "The evaluation stage: one metric's mean score over the samples scored (0-1 for the matchers)",
            (*LABELS, "metric"),
            registry=evaluation_registry,
        )
        # What the run trains with (acceleration: auto and kernels: auto settled), and why: 1 with those labels
        self._values = values
        self._choice = Gauge(
            "finetune_train_choice_info",
            "What the run trains with (acceleration, kernels) and why, once the model is loaded; always 1",
            (*LABELS, "acceleration", "kernels", "reason"),
            registry=r,
        )
        nan_until_known = (
            self.loss,
            self.learning_rate,
            self.mfu,
            self.mfu_deprecated,
            self.eval_loss,
            self.eval_perplexity,
            self.eval_accuracy,
            self.eval_f1,
            self.reward_accuracy,
            self.reward_margin,
            self.reward_mean,
            self.reward_std,
            self.completion_length,
            self.kl,
            self.rollout_tokens_per_second,
        )
        for unset in nan_until_known:
            unset.set(math.nan)  # NaN until known: a 0 would read as a perfect loss or a useless model

    def set_choice(self, acceleration: str, kernels: str, reason: str) -> None:
        """Export what the run trains with and why (the reason cut to CHOICE_REASON_CHARS)."""
        self._choice.clear()
        self._choice.labels(*self._values, acceleration, kernels, reason[:CHOICE_REASON_CHARS]).set(1)

    def set_reward_function(self, name: str, value: float) -> None:
        self._reward_function.labels(*self._values, name).set(value)

    def set_evaluation_score(self, metric: str, value: float) -> None:
        self._evaluation_score.labels(*self._values, metric).set(value)

    def serve(self, port: int, addr: str = "0.0.0.0") -> bool:
        """Start the HTTP endpoint; a port in use is logged, not fatal (metrics must never stop training)."""
        if port <= 0:
            return False
        try:
            self._server: Any = start_http_server(port, addr=addr, registry=self.registry)[0]
        except OSError as e:
            log.warning("metrics: cannot listen on %s:%s: %s; continuing without a metrics endpoint", addr, port, e)
            return False
        return True

    def close(self) -> None:
        """Stop the HTTP endpoint (a process that serves metrics again later, such as a test session)."""
        server = getattr(self, "_server", None)
        if server is not None:
            server.shutdown()
            server.server_close()
            self._server = None


class BatchCounter:
    """Wraps a data collator to count rows and non-padding tokens of the batches it builds (rank-local).

    Batches are queued in the order they are built and taken per optimizer step (``gradient_accumulation_steps``
    at a time): the dataloader builds one batch ahead (Accelerate looks ahead to find the end of an epoch), so
    "what was built since the last step" would count a batch that has not been trained on yet and, at the start of
    every epoch, two batches in one step."""

    def __init__(self, collator: Any) -> None:
        self.collator = collator
        self._lock = threading.Lock()
        self._built: deque[tuple[int, int]] = deque()

    def __call__(self, features: list[dict[str, Any]]) -> Any:
        batch = self.collator(features)
        mask = batch.get("attention_mask")
        tokens = int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())
        with self._lock:
            self._built.append((len(features), tokens))
        return batch

    def record(self, rows: int, tokens: int, batches: int = 1) -> None:
        """Count rows and tokens that did not go through the collator (GRPO's rollouts: the prompts and the
        completions generated for them), spread over the ``batches`` micro-batches they are trained in."""
        with self._lock:
            for i in range(batches):
                self._built.append((rows // batches + (i < rows % batches), tokens // batches + (i < tokens % batches)))

    def take(self, batches: int | None = None) -> tuple[int, int]:
        """Rows and tokens of the next ``batches`` batches in training order (all queued ones when None)."""
        with self._lock:
            n = len(self._built) if batches is None else min(batches, len(self._built))
            taken = [self._built.popleft() for _ in range(n)]
        return sum(t[0] for t in taken), sum(t[1] for t in taken)


class MetricsCallback(TrainerCallback):
    """Updates :class:`TrainerMetrics` from the Trainer's events. Cheap: a few clock reads and Python arithmetic
    per step, no device synchronisation and no communication."""

    def __init__(
        self,
        metrics: TrainerMetrics,
        counter: BatchCounter,
        *,
        nproc_per_node: int,
        launch_time: float,
        params: int,
        peak_flops_per_device: float,
        task: str = "",
        ema: float = 0.2,
    ) -> None:
        self.m = metrics
        self.counter = counter
        self.nproc = nproc_per_node
        self.launch_time = launch_time
        self.params = params
        self.peak = peak_flops_per_device
        self.ema = ema
        self._step_start: float | None = None
        self._first_step_seen = False
        self._avg_step: float | None = None
        self._avg_samples_per_s: float | None = None
        self._avg_tokens_per_s: float | None = None
        self.total_samples = 0
        self.total_tokens = 0
        # Steady state: every step after the first (which carries compilation / export warm-up).
        self.steady_samples = 0
        self.steady_tokens = 0
        self.steady_seconds = 0.0
        self.first_step_seconds: float | None = None
        self.time_to_first_step: float | None = None
        self.task = task
        self.eval_history: list[dict[str, float]] = []
        # dpo: {"step", "accuracy", "margin", "chosen", "rejected"} at every log (TRL's rewards/*)
        self.reward_history: list[dict[str, float]] = []
        # grpo: {"step", "reward", "reward_std", "completion_length", "kl", "entropy", "rewards": {name: mean}}
        self.grpo_history: list[dict[str, Any]] = []
        self.rollout: Any = None  # grpo: the RolloutMeter its trainer fills
        self.rollout_tokens = 0
        self.rollout_seconds = 0.0
        self._avg_rollout_tps: float | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.m.total_steps.set(state.max_steps)
        self.m.step.set(state.global_step)
        self.counter.take()  # drop anything counted while resuming (skipped batches)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The Trainer fetches a step's batches before this event and saves checkpoints after on_step_end, so the
        # measured step is forward + backward + optimizer (+ gradient sync), without data loading or saving.
        self._step_start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        duration = now - (self._step_start if self._step_start is not None else now)
        samples, tokens = self.counter.take(getattr(args, "gradient_accumulation_steps", 1) or 1)
        samples *= self.nproc
        tokens *= self.nproc
        m = self.m
        self.total_samples += samples
        self.total_tokens += tokens
        m.steps.inc()
        m.samples.inc(samples)
        m.tokens.inc(tokens)
        m.step.set(state.global_step)
        m.epoch.set(state.epoch or 0.0)
        if not self._first_step_seen:
            self._first_step_seen = True
            self.first_step_seconds = duration
            self.time_to_first_step = time.time() - self.launch_time
            m.time_to_first_step.set(self.time_to_first_step)
            m.warmup.set(duration)
            return  # the first step includes warm-up (compilation, ORT export): keep it out of the rates
        self._take_rollout()
        m.step_duration.observe(duration)
        if duration <= 0:
            return
        self.steady_samples += samples
        self.steady_tokens += tokens
        self.steady_seconds += duration
        a = self.ema
        self._avg_step = duration if self._avg_step is None else (1 - a) * self._avg_step + a * duration
        sps, tps = samples / duration, tokens / duration
        self._avg_samples_per_s = (
            sps if self._avg_samples_per_s is None else (1 - a) * self._avg_samples_per_s + a * sps
        )
        self._avg_tokens_per_s = tps if self._avg_tokens_per_s is None else (1 - a) * self._avg_tokens_per_s + a * tps
        m.samples_per_second.set(self._avg_samples_per_s)
        m.tokens_per_second.set(self._avg_tokens_per_s)
        m.eta.set(max(0, state.max_steps - state.global_step) * self._avg_step)
        utilisation = mfu(self.params, self._avg_tokens_per_s, self.peak, self.nproc)
        m.mfu.set(utilisation)
        m.mfu_deprecated.set(utilisation)

    def _take_rollout(self) -> None:
        """GRPO: the step's generation, as completion tokens per second of generating (first step included: its
        generation has no compilation of its own)."""
        if self.rollout is None:
            return
        tokens, seconds = self.rollout.take()
        tokens *= self.nproc
        self.rollout_tokens += tokens
        self.rollout_seconds += seconds
        if seconds > 0:
            rate, a, avg = tokens / seconds, self.ema, self._avg_rollout_tps
            self._avg_rollout_tps = rate if avg is None else (1 - a) * avg + a * rate
            self.m.rollout_tokens_per_second.set(self._avg_rollout_tps)

    def rollout_rate(self) -> float | None:
        """Completion tokens generated per second of generation over the attempt (this node), or None."""
        return self.rollout_tokens / self.rollout_seconds if self.rollout_seconds > 0 else None

    def steady_rates(self) -> tuple[float | None, float | None]:
        """(samples/s, tokens/s) of this node over every step after the first: the figure the gauges track, without
        start-up, compilation, data loading between steps or checkpoint saves."""
        if self.steady_seconds <= 0:
            return None, None
        return self.steady_samples / self.steady_seconds, self.steady_tokens / self.steady_seconds

    def steady_mfu(self) -> float | None:
        """The model FLOPs utilisation of this node's steady rate (what the gauge tracks); None where unknown."""
        _, tokens = self.steady_rates()
        utilisation = mfu(self.params, tokens or 0.0, self.peak, self.nproc)
        return None if math.isnan(utilisation) or not tokens else round(utilisation, 4)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs:
            return
        if "loss" in logs:
            self.m.loss.set(logs["loss"])
        if "learning_rate" in logs:
            self.m.learning_rate.set(logs["learning_rate"])
        if "rewards/accuracies" in logs:
            entry = {"step": state.global_step}
            for key, name in REWARD_LOGS.items():
                if isinstance(logs.get(key), int | float):
                    entry[name] = float(logs[key])
            self.reward_history.append(entry)
            self.m.reward_accuracy.set(entry.get("accuracy", math.nan))
            self.m.reward_margin.set(entry.get("margin", math.nan))
        if "reward" in logs and "reward_std" in logs:
            self._log_grpo(state.global_step, logs)

    def _log_grpo(self, step: int, logs: dict[str, Any]) -> None:
        entry: dict[str, Any] = {"step": step}
        for key, name in GRPO_LOGS.items():
            if isinstance(logs.get(key), int | float):
                entry[name] = float(logs[key])
        per = {
            key[len("rewards/") : -len("/mean")]: float(v)
            for key, v in logs.items()
            if key.startswith("rewards/") and key.endswith("/mean") and isinstance(v, int | float)
        }
        entry["rewards"] = per
        self.grpo_history.append(entry)
        m = self.m
        m.reward_mean.set(entry.get("reward", math.nan))
        m.reward_std.set(entry.get("reward_std", math.nan))
        m.completion_length.set(entry.get("completion_length", math.nan))
        m.kl.set(entry.get("kl", math.nan))
        for name, value in per.items():
            m.set_reward_function(name, value)

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None, **kwargs: Any
    ) -> None:
        if not metrics:
            return
        entry = summarize(self.task, state.global_step, metrics)
        self.eval_history.append(entry)
        for key, gauge in (
            ("loss", self.m.eval_loss),
            ("perplexity", self.m.eval_perplexity),
            ("accuracy", self.m.eval_accuracy),
            ("f1", self.m.eval_f1),
        ):
            if key in entry:
                gauge.set(entry[key])

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.m.eta.set(0)
