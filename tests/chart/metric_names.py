"""The metric names the chart's alerts and dashboard may use: one list, read by the chart tests.

Kept in step with the code that exports them (operator/finetune_operator/metrics.py and the trainer's metrics
callback); a test outside the chart tier compares these lists with the real registries.
"""

from __future__ import annotations

# The operator (operator/finetune_operator/metrics.py), label in parentheses where it has one.
OPERATOR_COUNTERS = {
    "finetune_operator_reconcile_errors_total",
    "finetune_operator_pods_created_total",
    "finetune_operator_pods_deleted_total",
    "finetune_operator_gang_restarts_total",  # finetune_namespace, reason
    "finetune_operator_status_writes_total",
    "finetune_operator_resizes_total",  # finetune_namespace, direction
    "finetune_operator_resize_steps_lost_total",  # finetune_namespace
}
OPERATOR_GAUGES = {
    "finetune_operator_jobs",  # finetune_namespace, state
    "finetune_operator_backstop_active",
    "finetune_operator_peering_objects_missing",
    "finetune_operator_backstop_last_tick_timestamp_seconds",
    "finetune_operator_scrapes_slow",
}
OPERATOR_HISTOGRAMS = {"finetune_operator_reconcile_duration_seconds"}

# The trainer pods (port 9400); every series labelled finetune_namespace, finetune_job, node_rank.
TRAINER_COUNTERS = {
    "finetune_train_samples_total",
    "finetune_train_tokens_total",
    "finetune_train_steps_total",
}
TRAINER_HISTOGRAMS = {
    "finetune_train_step_duration_seconds",
    "finetune_checkpoint_save_duration_seconds",
}
TRAINER_GAUGES = {
    "finetune_train_loss",
    "finetune_train_learning_rate",
    "finetune_train_epoch",
    "finetune_train_step",
    "finetune_train_total_steps",
    "finetune_train_eta_seconds",
    "finetune_train_samples_per_second",
    "finetune_train_tokens_per_second",
    "finetune_train_mfu_ratio",
    "finetune_train_mfu",  # deprecated name of finetune_train_mfu_ratio, exported one more release
    "finetune_checkpoint_last_step",
    "finetune_checkpoint_resume_fallbacks",
    "finetune_time_to_first_step_seconds",
    "finetune_train_warmup_seconds",
    "finetune_eval_loss",
    "finetune_eval_perplexity",
    "finetune_eval_accuracy",
    "finetune_eval_f1",
    "finetune_train_reward_accuracy",
    "finetune_train_reward_margin",
    *(
        TRAINER_GRPO_GAUGES := {  # on the pages of GRPO runs only
            "finetune_train_reward_mean",
            "finetune_train_reward_std",
            "finetune_train_reward_function_mean",  # one series per reward function (TRAINER_REWARD_LABELS)
            "finetune_train_completion_length_mean",
            "finetune_train_kl",
            "finetune_train_rollout_tokens_per_second",
        }
    ),
    *(
        TRAINER_EVALUATION_GAUGES := {  # on rank 0's page of runs with spec.evaluation only
            "finetune_evaluation_samples",
            "finetune_evaluation_score",  # one series per metric (TRAINER_EVALUATION_LABELS)
        }
    ),
    "finetune_rendezvous_duration_seconds",
    "finetune_startup_launcher_seconds",
    "finetune_startup_data_seconds",
    "finetune_startup_model_seconds",
    "finetune_attempt",
    "finetune_restarts_in_place",
    "finetune_train_choice_info",  # always 1: what the run trains with, in its labels (TRAINER_CHOICE_LABELS)
}
TRAINER_LABELS = {"finetune_namespace", "finetune_job", "node_rank"}
TRAINER_CHOICE_LABELS = {"acceleration", "kernels", "reason"}
TRAINER_REWARD_LABELS = {"reward"}
TRAINER_EVALUATION_LABELS = {"metric"}
OPERATOR_LABELS = {"finetune_namespace", "state", "reason", "direction"}

# Series from other exporters the bundle joins with (documented as optional dependencies).
EXTERNAL = {
    "DCGM_FI_DEV_GPU_UTIL",  # NVIDIA dcgm-exporter, with pod attribution (labels namespace, pod)
    "kube_pod_status_phase",  # kube-state-metrics
    "kube_pod_owner",  # kube-state-metrics
}

HISTOGRAMS = OPERATOR_HISTOGRAMS | TRAINER_HISTOGRAMS
OURS = OPERATOR_COUNTERS | OPERATOR_GAUGES | TRAINER_COUNTERS | TRAINER_GAUGES | HISTOGRAMS


def series_names() -> set[str]:
    """Every series name a query may select: histograms expand to _bucket, _sum and _count."""
    names = set(OPERATOR_COUNTERS | OPERATOR_GAUGES | TRAINER_COUNTERS | TRAINER_GAUGES | EXTERNAL)
    for h in HISTOGRAMS:
        names |= {f"{h}_bucket", f"{h}_sum", f"{h}_count"}
    return names
