"""Generate the chart's Grafana dashboard (charts/finetune-operator/files/dashboard.json).

    python -m hack.helmtools.dashboard          # rewrite the file
    python -m hack.helmtools.dashboard --check  # exit 1 when the committed file differs (drift gate)

The dashboard is written as data here, so every panel's PromQL sits next to its title and the chart test can
parse each expression with promtool and check its metric names (tests/chart/metric_names.py).
Variables: datasource, namespace (finetune_namespace) and job (finetune_job). GPU panels join the NVIDIA DCGM
exporter's DCGM_FI_DEV_GPU_UTIL by (namespace, pod) with the trainer pods' series; they stay empty without it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hack.helmtools import write_or_check

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "charts" / "finetune-operator" / "files" / "dashboard.json"

SEL = 'finetune_namespace=~"$namespace", finetune_job=~"$job"'
BY = "finetune_namespace, finetune_job"
# Trainer pods of the selected jobs, value 1, labelled (namespace, pod, finetune_namespace, finetune_job).
TRAINER_PODS = f"group by (namespace, pod, {BY}) (finetune_attempt{{{SEL}}})"
GPU_PER_POD = "count by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL)"


def _target(expr: str, legend: str, ref: str = "A", instant: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "expr": expr,
        "legendFormat": legend,
        "refId": ref,
    }
    if instant:
        t["instant"] = True
        t["range"] = False
    return t


def _panel(
    title: str,
    targets: list[dict[str, Any]],
    *,
    unit: str,
    desc: str,
    kind: str = "timeseries",
    w: int = 12,
    h: int = 8,
) -> dict[str, Any]:
    return {
        "type": kind,
        "title": title,
        "description": desc,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]}}
        if kind == "timeseries"
        else {},
        "targets": targets,
        "gridPos": {"w": w, "h": h},
    }


def panels() -> list[dict[str, Any]]:
    job = "{{finetune_namespace}}/{{finetune_job}}"
    return [
        _panel(
            "Samples/s per job",
            [_target(f"sum by ({BY}) (rate(finetune_train_samples_total{{{SEL}}}[$__rate_interval]))", job)],
            unit="short",
            desc="Training throughput, all ranks of a job together.",
        ),
        _panel(
            "Tokens/s per job",
            [_target(f"sum by ({BY}) (rate(finetune_train_tokens_total{{{SEL}}}[$__rate_interval]))", job)],
            unit="short",
            desc="Tokens processed per second, all ranks together.",
        ),
        _panel(
            "Step time (p50, p95)",
            [
                _target(
                    f"histogram_quantile(0.5, sum by (le, {BY}) "
                    f"(rate(finetune_train_step_duration_seconds_bucket{{{SEL}}}[$__rate_interval])))",
                    f"p50 {job}",
                    "A",
                ),
                _target(
                    f"histogram_quantile(0.95, sum by (le, {BY}) "
                    f"(rate(finetune_train_step_duration_seconds_bucket{{{SEL}}}[$__rate_interval])))",
                    f"p95 {job}",
                    "B",
                ),
            ],
            unit="s",
            desc="Optimizer step duration across ranks.",
        ),
        _panel(
            "Step time per rank",
            [
                _target(
                    f"sum by ({BY}, node_rank) "
                    f"(rate(finetune_train_step_duration_seconds_sum{{{SEL}}}[$__rate_interval]))"
                    f" / sum by ({BY}, node_rank) (rate(finetune_train_step_duration_seconds_count{{{SEL}}}"
                    f"[$__rate_interval]))",
                    f"{job} rank {{{{node_rank}}}}",
                )
            ],
            unit="s",
            desc="Mean step time of each rank: a slow rank slows the whole gang.",
        ),
        _panel(
            "Loss",
            [
                _target(f"avg by ({BY}) (finetune_train_loss{{{SEL}}})", f"train {job}", "A"),
                _target(f"avg by ({BY}) (finetune_eval_loss{{{SEL}}})", f"eval {job}", "B"),
            ],
            unit="none",
            desc="Training loss (mean over ranks) and the loss on the evaluation split at the last evaluation.",
        ),
        _panel(
            "Preference rewards (dpo)",
            [
                _target(f"max by ({BY}) (finetune_train_reward_accuracy{{{SEL}}})", f"accuracy {job}", "A"),
                _target(f"max by ({BY}) (finetune_train_reward_margin{{{SEL}}})", f"margin {job}", "B"),
            ],
            unit="none",
            desc="Task dpo: the share of logged pairs whose chosen response the policy rewards above the rejected "
            "(0-1), and the mean reward margin chosen minus rejected; empty for the other tasks.",
        ),
        _panel(
            "Rewards (grpo)",
            [
                _target(f"max by ({BY}) (finetune_train_reward_mean{{{SEL}}})", f"sum {job}", "A"),
                _target(
                    f"max by ({BY}, reward) (finetune_train_reward_function_mean{{{SEL}}})",
                    f"{{{{reward}}}} {job}",
                    "B",
                ),
            ],
            unit="none",
            desc="Task grpo: the mean of the weighted sum of the rewards over the last logged completions, and each "
            "reward function's own mean; empty for the other tasks.",
        ),
        _panel(
            "Learning rate",
            [_target(f"max by ({BY}) (finetune_train_learning_rate{{{SEL}}})", job)],
            unit="none",
            desc="Learning rate schedule.",
        ),
        _panel(
            "Progress",
            [
                _target(
                    f"max by ({BY}) (finetune_train_step{{{SEL}}})"
                    f" / max by ({BY}) (finetune_train_total_steps{{{SEL}}})",
                    job,
                )
            ],
            unit="percentunit",
            desc="Optimizer step / total steps.",
        ),
        _panel(
            "ETA",
            [_target(f"max by ({BY}) (finetune_train_eta_seconds{{{SEL}}})", job, instant=True)],
            unit="s",
            desc="Estimated time to finish, as the trainer computes it.",
            kind="stat",
        ),
        _panel(
            "MFU",
            [_target(f"avg by ({BY}) (finetune_train_mfu_ratio{{{SEL}}} or finetune_train_mfu{{{SEL}}})", job)],
            unit="percentunit",
            desc="Model FLOPs utilisation (mean over ranks); empty on CPU.",
        ),
        _panel(
            "Attempt (gang restarts + 1)",
            [_target(f"max by ({BY}) (finetune_attempt{{{SEL}}})", job)],
            unit="none",
            desc="Attempt of the running gang: it grows by one per gang restart.",
        ),
        _panel(
            "Gang restarts by reason",
            [
                _target(
                    "sum by (reason) (increase(finetune_operator_gang_restarts_total"
                    '{finetune_namespace=~"$namespace"}[$__range]))',
                    "{{reason}}",
                    instant=True,
                )
            ],
            unit="none",
            desc="Gang restarts in the selected range, all jobs of the selected namespaces (operator metric).",
            kind="stat",
        ),
        _panel(
            "Time to first step, rendezvous, warm-up",
            [
                _target(f"max by ({BY}) (finetune_time_to_first_step_seconds{{{SEL}}})", f"first step {job}", "A"),
                _target(f"max by ({BY}) (finetune_rendezvous_duration_seconds{{{SEL}}})", f"rendezvous {job}", "B"),
                _target(f"max by ({BY}) (finetune_train_warmup_seconds{{{SEL}}})", f"warm-up {job}", "C"),
            ],
            unit="s",
            desc="Start-up cost of each attempt; warm-up is the first step alone (compilation).",
        ),
        _panel(
            "Checkpoint save time",
            [
                _target(
                    f"sum by ({BY}) (rate(finetune_checkpoint_save_duration_seconds_sum{{{SEL}}}[$__rate_interval]))"
                    f" / sum by ({BY}) "
                    f"(rate(finetune_checkpoint_save_duration_seconds_count{{{SEL}}}[$__rate_interval]))",
                    job,
                )
            ],
            unit="s",
            desc="Mean checkpoint save duration.",
        ),
        _panel(
            "GPU utilisation per job",
            [
                _target(
                    f"avg by ({BY}) (DCGM_FI_DEV_GPU_UTIL * on (namespace, pod) group_left ({BY}) {TRAINER_PODS})", job
                )
            ],
            unit="percent",
            desc="DCGM exporter GPU utilisation of the job's pods (needs dcgm-exporter with pod attribution).",
        ),
        _panel(
            "GPU-seconds per job",
            [
                _target(
                    f"sum by ({BY}) (sum_over_time(({GPU_PER_POD} * on (namespace, pod) group_left ({BY}) "
                    f"{TRAINER_PODS})[$__range:1m])) * 60",
                    job,
                    instant=True,
                )
            ],
            unit="s",
            desc="GPUs attached to the job's pods times time, over the selected range (DCGM exporter).",
            kind="stat",
        ),
        _panel(
            "Operator: jobs by state",
            # max over the replicas per namespace (only the active one reconciles), then the namespaces' sum
            [
                _target(
                    "sum by (state) (max by (finetune_namespace, state) "
                    '(finetune_operator_jobs{finetune_namespace=~"$namespace"}))',
                    "{{state}}",
                )
            ],
            unit="none",
            desc="FineTuneJobs by state, as the active operator replica last reconciled them.",
        ),
        _panel(
            "Operator: reconcile p95 and errors",
            [
                _target(
                    "histogram_quantile(0.95, sum by (le) "
                    "(rate(finetune_operator_reconcile_duration_seconds_bucket[$__rate_interval])))",
                    "p95",
                    "A",
                ),
                _target("sum(rate(finetune_operator_reconcile_errors_total[$__rate_interval]))", "errors/s", "B"),
            ],
            unit="s",
            desc="Reconcile latency and error rate of the operator.",
        ),
        _panel(
            "Operator: pods and status writes",
            [
                _target("sum(rate(finetune_operator_pods_created_total[$__rate_interval]))", "pods created/s", "A"),
                _target("sum(rate(finetune_operator_pods_deleted_total[$__rate_interval]))", "pods deleted/s", "B"),
                _target("sum(rate(finetune_operator_status_writes_total[$__rate_interval]))", "status writes/s", "C"),
            ],
            unit="ops",
            desc="Write traffic of the operator to the API server.",
        ),
    ]


def dashboard() -> dict[str, Any]:
    ps = panels()
    x = y = 0
    for i, p in enumerate(ps, start=1):
        p["id"] = i
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > 24:
            x, y = 0, y + h
        p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        x += w

    def var(name: str, label: str, query: str) -> dict[str, Any]:
        return {
            "name": name,
            "label": label,
            "type": "query",
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {"text": "All", "value": "$__all"},
            "refresh": 2,
            "sort": 1,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "definition": query,
            "query": {"query": query, "refId": "var"},
        }

    return {
        "title": "FineTuneJobs",
        "uid": "finetune-jobs",
        "tags": ["finetune-operator", "training"],
        "description": "Throughput, progress and health of FineTuneJobs (finetune-operator).",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                var("namespace", "Namespace", "label_values(finetune_train_steps_total, finetune_namespace)"),
                var(
                    "job",
                    "FineTuneJob",
                    'label_values(finetune_train_steps_total{finetune_namespace=~"$namespace"}, finetune_job)',
                ),
            ]
        },
        "panels": ps,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    return write_or_check(OUT, render(), module="hack.helmtools.dashboard", argv=argv, root=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
