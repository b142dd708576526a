"""Alerts and dashboard queries: parsed by promtool, alert logic unit-tested with `promtool test rules`, and every
metric name checked against tests/chart/metric_names.py."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.helmtools import Tools
from tests.chart import metric_names
from tests.chart.conftest import CHART, VALUE_SETS, Helm, one

pytestmark = pytest.mark.unit

HERE = Path(__file__).resolve().parent
ALERTS = [
    "FineTuneJobFailed",
    "FineTuneJobRestartLoop",
    "FineTuneJobThroughputDropped",
    "FineTuneJobProgressStalled",
    "FineTuneJobPodsPending",
    "FineTuneOperatorBackstopInactive",
    "FineTuneOperatorPeeringMissing",
]
# Grafana's variables, replaced by values promtool can parse.
GRAFANA_VARS = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m", "$namespace": ".*", "$job": ".*"}
# Label names queries may group or join by: ours, and the target labels Prometheus/kube-state-metrics add.
ALLOWED_LABELS = (
    metric_names.TRAINER_LABELS
    | metric_names.TRAINER_REWARD_LABELS
    | metric_names.TRAINER_EVALUATION_LABELS
    | metric_names.OPERATOR_LABELS
    | {"namespace", "pod", "le"}  # Prometheus target labels, histogram buckets
    | {"phase", "owner_kind", "owner_name"}  # kube-state-metrics
)


def _rules(helm: Helm) -> dict[str, Any]:
    return one(helm.render(VALUE_SETS["monitoring-ha"]), "PrometheusRule")["spec"]


def _promtool(tools: Tools, *args: str, cwd: Path) -> str:
    proc = subprocess.run([tools.promtool, *args], capture_output=True, text=True, cwd=cwd, timeout=120)
    assert proc.returncode == 0, f"promtool {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads((CHART / "files" / "dashboard.json").read_text())
    out = [(f"panel {p['id']} {p['title']} {t['refId']}", t["expr"]) for p in dash["panels"] for t in p["targets"]]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", v["query"]["query"])
            assert m, v["query"]
            out.append((f"variable {v['name']}", m.group(1)))
    return out


def _substitute(expr: str) -> str:
    for k in sorted(GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(k, GRAFANA_VARS[k])
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def test_rules_pass_promtool_check(helm: Helm, tools: Tools, tmp_path: Path) -> None:
    spec = _rules(helm)
    assert [r["alert"] for g in spec["groups"] for r in g["rules"]] == ALERTS
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    out = _promtool(tools, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert f"SUCCESS: {len(ALERTS)} rules found" in out


def test_alerts_unit_tests(helm: Helm, tools: Tools, tmp_path: Path) -> None:
    """promtool test rules (tests/chart/alerts_test.yaml) on the rendered rules, annotations left out."""
    spec = _rules(helm)
    for g in spec["groups"]:
        for r in g["rules"]:
            r.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    test = (HERE / "alerts_test.yaml").read_text().replace("rule_files: [RULES]", "rule_files: [rules.yaml]")
    (tmp_path / "alerts_test.yaml").write_text(test)
    out = _promtool(tools, "test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert "SUCCESS" in out
    tested = set(re.findall(r"alertname: (\w+)", test))
    assert tested == set(ALERTS), f"alerts without a promtool test: {set(ALERTS) - tested}"


def test_dashboard_queries_pass_promtool(tools: Tools, tmp_path: Path) -> None:
    """Each dashboard query (Grafana variables substituted) as a recording rule: promtool parses them all."""
    exprs = _dashboard_exprs()
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:query_{i}", "expr": _substitute(e)} for i, (_, e) in enumerate(exprs)],
            }
        ]
    }
    (tmp_path / "dashboard-rules.yaml").write_text(yaml.safe_dump(rules))
    out = _promtool(tools, "check", "rules", "dashboard-rules.yaml", cwd=tmp_path)
    assert f"SUCCESS: {len(exprs)} rules found" in out


def _names_and_labels(expr: str) -> tuple[set[str], set[str]]:
    """Metric names and grouping/join labels of a PromQL expression (ours and the exporters' we join with)."""
    expr = re.sub(r"\{\{.*?\}\}", "", expr)  # Go/Grafana templates
    labels: set[str] = set()
    for m in re.finditer(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        labels |= {x.strip() for x in m.group(1).split(",") if x.strip()}
    stripped = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    matchers = re.findall(r"\{([^}]*)\}", stripped)
    for m in matchers:
        labels |= set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", m))
    stripped = re.sub(r"\{[^}]*\}", " ", stripped)
    stripped = re.sub(r'"[^"]*"', " ", stripped)
    names = set(re.findall(r"\b((?:finetune|DCGM|kube)_\w+)\b", stripped))
    return names, labels


def _all_queries(helm: Helm) -> list[tuple[str, str]]:
    rules = [(r["alert"], r["expr"]) for g in _rules(helm)["groups"] for r in g["rules"]]
    return rules + _dashboard_exprs()


def test_queries_use_only_known_metric_names(helm: Helm) -> None:
    known = metric_names.series_names()
    problems = []
    for where, expr in _all_queries(helm):
        names, labels = _names_and_labels(expr)
        if not names:
            problems.append(f"{where}: no metric found in {expr!r}")
        for n in sorted(names - known):
            problems.append(f"{where}: unknown metric {n}")
        for lbl in sorted(labels - ALLOWED_LABELS):
            problems.append(f"{where}: unexpected label {lbl} (series carry finetune_job/finetune_namespace)")
    assert not problems, "\n".join(problems)


def test_dashboard_covers_the_promised_panels(helm: Helm) -> None:
    used: set[str] = set()
    for _, expr in _dashboard_exprs():
        used |= _names_and_labels(expr)[0]
    for needed in (
        "finetune_train_samples_total",
        "finetune_train_tokens_total",
        "finetune_train_step_duration_seconds_bucket",
        "finetune_train_loss",
        "finetune_train_eta_seconds",
        "finetune_train_mfu_ratio",
        "finetune_attempt",
        "finetune_operator_gang_restarts_total",
        "DCGM_FI_DEV_GPU_UTIL",
    ):
        assert needed in used, f"the dashboard has no panel using {needed}"


def test_name_extraction_sees_through_labels() -> None:
    names, labels = _names_and_labels(
        'sum by (finetune_namespace, finetune_job) (rate(finetune_train_samples_total{finetune_job=~"$job"}[5m]))'
    )
    assert names == {"finetune_train_samples_total"}
    assert labels == {"finetune_namespace", "finetune_job"}
