"""The metric names the chart's alerts and dashboard use (tests/chart/metric_names.py) are exactly the
ones the operator and the trainer really register, with the labels they really carry."""

from __future__ import annotations

import pytest
from finetune_operator.metrics import OperatorMetrics
from prometheus_client import CollectorRegistry

from tests.chart import metric_names as names

pytestmark = pytest.mark.unit


def _families(registry: CollectorRegistry) -> dict[str, tuple[str, set[str]]]:
    out = {}
    for fam in registry.collect():
        labels = {k for s in fam.samples for k in s.labels if k not in ("le",)}
        name = fam.name + ("_total" if fam.type == "counter" else "")
        out[name] = (fam.type, labels)
    return out


def test_operator_metrics_match_the_chart_list() -> None:
    m = OperatorMetrics()
    m.restarts.labels(finetune_namespace="ml", reason="OOMKilled").inc()
    m.jobs.labels(finetune_namespace="ml", state="Running").set(1)
    m.resizes.labels(finetune_namespace="ml", direction="Shrunk").inc()
    m.steps_lost_to_resizes.labels(finetune_namespace="ml").inc(3)
    fams = _families(m.registry)
    assert {n for n, (t, _) in fams.items() if t == "counter"} == names.OPERATOR_COUNTERS
    assert {n for n, (t, _) in fams.items() if t == "gauge"} == names.OPERATOR_GAUGES
    assert {n for n, (t, _) in fams.items() if t == "histogram"} == names.OPERATOR_HISTOGRAMS
    assert set().union(*(labels for _, labels in fams.values())) == names.OPERATOR_LABELS


def test_trainer_metrics_match_the_chart_list() -> None:
    from finetune_trainer.metrics import TrainerMetrics  # the trainer package is part of the test venv

    # every family: rank 0's page of a GRPO run with an evaluation stage
    m = TrainerMetrics(namespace="ns", job="j", node_rank=0, rollouts=True, evaluation=True)
    m.set_choice("none", "liger", "auto: liger")
    m.set_reward_function("format", 0.5)
    m.set_evaluation_score("correct", 0.5)
    fams = _families(m.registry)
    assert {n for n, (t, _) in fams.items() if t == "counter"} == names.TRAINER_COUNTERS
    assert {n for n, (t, _) in fams.items() if t == "gauge"} == names.TRAINER_GAUGES
    assert {n for n, (t, _) in fams.items() if t == "histogram"} == names.TRAINER_HISTOGRAMS
    for name, (_, labels) in fams.items():
        extra = {
            "finetune_train_choice_info": names.TRAINER_CHOICE_LABELS,
            "finetune_train_reward_function_mean": names.TRAINER_REWARD_LABELS,
            "finetune_evaluation_score": names.TRAINER_EVALUATION_LABELS,
        }.get(name, set())
        assert labels == names.TRAINER_LABELS | extra, name


def test_the_exporter_imports_without_transformers() -> None:
    """The trainer's Prometheus exporter (and its callback's module) import without transformers: the unit tier and
    tools that read the metric names do not pay for loading the Hugging Face stack."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from finetune_trainer.metrics import MetricsCallback, TrainerMetrics\n"
        "m = TrainerMetrics(namespace='n', job='j', node_rank=0); m.step.set(3)\n"
        "from prometheus_client import generate_latest\n"
        "assert b'finetune_train_step{' in generate_latest(m.registry), 'no step gauge'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
