"""The ``finetune`` user commands against the real API server and the real operator: validate (typed spec and a
server dry run, each error with its field), submit, list, status, wait, suspend, resume and delete.

Real: the API server (its CRD schema and CEL rules answer the dry runs), the operator (a subprocess) and the
``finetune`` command (a subprocess with its own kubeconfig). Mocked: the kubelet (FakeKubelet), as everywhere in the
integration tier; pod logs need a real one, so ``finetune logs`` and ``submit --follow`` are tested on real kubelets
(tests/realnodes/test_examples.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.harness import FakeKubelet, Jobs, OperatorProcess, make_job
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def finetune(cluster: Any, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli", *args, f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def manifest(tmp_path: Path, obj: dict[str, Any], name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(obj))
    return str(path)


def test_validate_names_the_field_the_typed_spec_or_the_api_server_refuses(
    cluster,
    api_client,
    namespace,  # type: ignore[no-untyped-def]
    tmp_path,
) -> None:
    ok = make_job("ok").nodes(2).build()
    r = finetune(cluster, "validate", manifest(tmp_path, ok), "-n", namespace)
    assert r.returncode == 0, r.stderr
    assert f"FineTuneJob {namespace}/ok is valid (the typed spec and a server dry run)" in r.stdout
    assert not Jobs(api_client, namespace).exists("ok")  # a dry run stores nothing
    typed = make_job("typed").set("output.path", "a/../../b").build()
    r = finetune(cluster, "validate", manifest(tmp_path, typed), "-n", namespace)
    assert r.returncode == 2 and "spec.output.path" in r.stderr, r.stderr
    # Past the typed spec, refused by the API server: a misspelt field (strict field validation, as kubectl's).
    typo = make_job("typo").set("training.maxStep", 10).build()
    assert jobctl_local_errors(typo) == []
    r = finetune(cluster, "validate", manifest(tmp_path, typo), "-n", namespace)
    assert r.returncode == 2 and ".spec.training.maxStep: field not declared in schema" in r.stderr, r.stderr
    r = finetune(cluster, "submit", manifest(tmp_path, typo), "-n", namespace)
    assert r.returncode == 2 and not Jobs(api_client, namespace).exists("typo")


def test_validate_reports_every_error_of_a_manifest_at_once(cluster, namespace, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A new user's manifest with several mistakes: one run of `finetune validate` names each of them with its field
    (the typed spec's, then the API server's about a field the typed spec does not know), and `submit` refuses it."""
    bad = (
        make_job("bad")
        .set("training.learningRate", "fast")
        .set(
            "training.extraArgs",
            {"warmup_ratios": 0.1, "max_grad_norm": "big", "deepspeed": "/etc/passwd", "report_to": ["wandb"]},
        )
        .set("podTemplate", {"volumes": [{"name": "v", "mountPath": "/data/../usr", "emptyDir": {}}]})
        .set("training.maxStep", 10)
        .build()
    )
    r = finetune(cluster, "validate", manifest(tmp_path, bad), "-n", namespace)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("error ")]
    fields = [
        "spec.training.learningRate",
        "spec.training.extraArgs.warmup_ratios",
        "spec.training.extraArgs.max_grad_norm",
        "spec.training.extraArgs.deepspeed",
        "spec.training.extraArgs.report_to",
        "spec.podTemplate.volumes[0].mountPath",
        "spec.training.maxStep",
    ]
    named = {line.split(": ")[1].lstrip("."): line for line in lines}  # "error FILE: FIELD: message"
    assert sorted(named) == sorted(fields) and len(lines) == len(fields), r.stderr
    assert "must be a number, got 'fast'" in named["spec.training.learningRate"]
    assert "not a TrainingArguments field of the default" in named["spec.training.extraArgs.warmup_ratios"]
    r = finetune(cluster, "validate", "--offline", manifest(tmp_path, bad), "-n", namespace)
    assert r.returncode == 2 and r.stderr.count("error ") == len(fields) - 1, r.stderr  # the typo needs the server


def jobctl_local_errors(obj: dict[str, Any]) -> list[str]:
    from finetune_operator.client import local_errors

    return local_errors({**obj, "metadata": {**obj["metadata"], "namespace": "x"}})


def test_submit_list_status_wait_suspend_resume_delete(cluster, api_client, namespace, tmp_path) -> None:  # type: ignore[no-untyped-def]
    jobs, kubelet = Jobs(api_client, namespace), FakeKubelet(api_client, namespace)
    op = OperatorProcess(cluster.kubeconfig, namespace).start()
    try:
        path = manifest(tmp_path, make_job("cli").nodes(2).max_restarts(1).build())
        r = finetune(cluster, "submit", path, "-n", namespace)
        assert r.returncode == 0 and "finetunejob.finetune.dev/cli created" in r.stdout, r.stderr
        r = finetune(cluster, "submit", path, "-n", namespace)
        assert r.returncode == 0 and "finetunejob.finetune.dev/cli unchanged" in r.stdout, r.stderr
        pods = jobs.wait_pods("cli", 2)
        r = finetune(cluster, "wait", "cli", "--for", "Running", "--timeout", "2", "-n", namespace)
        assert r.returncode == 124 and "still Created after 2s" in r.stderr, (r.stdout, r.stderr)
        for p in pods:
            kubelet.run(p.metadata.name)
        r = finetune(cluster, "wait", "cli", "--for", "Running", "--timeout", "30", "-n", namespace)
        assert r.returncode == 0 and "cli: Running — AllRanksRunning" in r.stdout, (r.stdout, r.stderr)

        r = finetune(cluster, "list", "-n", namespace)
        header, row = r.stdout.strip().splitlines()
        assert header.split() == ["NAME", "STATE", "REASON", "NODES", "STEP", "RESTARTS", "AGE"]
        assert row.split()[:6] == ["cli", "Running", "AllRanksRunning", "2/2", "-", "0"]
        r = finetune(cluster, "list", "-A")
        assert any(line.split()[:3] == [namespace, "cli", "Running"] for line in r.stdout.splitlines()), r.stdout
        r = finetune(cluster, "status", "cli", "-n", namespace)
        assert r.returncode == 0, r.stderr
        for shown in (
            "Running  AllRanksRunning",
            "restarts 0/1",
            "2/2 running",
            "cli-node-0",
            "cli-node-1",
            "PodsCreated",
            "Conditions",
        ):
            assert shown in r.stdout, (shown, r.stdout)

        r = finetune(cluster, "suspend", "cli", "-n", namespace)
        assert r.returncode == 0 and "suspended" in r.stdout, r.stderr
        r = finetune(cluster, "wait", "cli", "--for", "Suspended", "--timeout", "30", "-n", namespace)
        assert r.returncode == 0, r.stderr
        wait_for(lambda: not jobs.pods("cli"), timeout=30, what="the suspended job's pods to go")
        r = finetune(cluster, "resume", "cli", "-n", namespace)
        assert r.returncode == 0 and "resumed" in r.stdout, r.stderr
        pods = jobs.wait_pods("cli", 2, attempt=1)
        for p in pods:
            kubelet.run(p.metadata.name)
        for p in pods:
            kubelet.exit(p.metadata.name, 0)
        r = finetune(cluster, "wait", "cli", "--timeout", "30", "-n", namespace)  # default: until it finishes
        assert r.returncode == 0 and "cli: Succeeded — AllRanksSucceeded" in r.stdout, (r.stdout, r.stderr)
        r = finetune(cluster, "suspend", "cli", "-n", namespace)
        assert r.returncode == 2 and "has finished (Succeeded)" in r.stderr
        r = finetune(cluster, "submit", path, "-n", namespace)  # re-applying a finished job is allowed, and said
        assert r.returncode == 0 and "already finished" in r.stderr, r.stderr

        r = finetune(cluster, "delete", "cli", "--wait", "--timeout", "60", "-n", namespace)
        assert r.returncode == 0 and "deleted" in r.stdout, r.stderr
        assert not jobs.exists("cli") and not jobs.pods("cli")
        for cmd in (["status", "cli"], ["delete", "cli"], ["wait", "cli"], ["logs", "cli"]):
            r = finetune(cluster, *cmd, "-n", namespace)
            assert r.returncode == 2 and f"FineTuneJob {namespace}/cli not found" in r.stderr, (cmd, r.stderr)
    finally:
        op.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _operator_metrics(port: int) -> dict[str, float]:
    """The operator's finetune_operator_jobs and gang-restart series, as Prometheus would scrape them."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        page = r.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith(("finetune_operator_jobs{", "finetune_operator_gang_restarts_total{"))
    }


def test_a_failed_job_in_status_wait_and_the_operators_per_namespace_metrics(
    cluster,
    api_client,
    namespace,  # type: ignore[no-untyped-def]
    tmp_path,
) -> None:
    jobs, kubelet = Jobs(api_client, namespace), FakeKubelet(api_client, namespace)
    port = _free_port()
    op = OperatorProcess(cluster.kubeconfig, namespace, FINETUNE_METRICS_PORT=str(port)).start()
    try:
        r = finetune(cluster, "submit", manifest(tmp_path, make_job("doomed").max_restarts(1).build()), "-n", namespace)
        assert r.returncode == 0, r.stderr
        for attempt in (0, 1):  # rank 0 fails in both attempts: one gang restart, then the job fails
            (p,) = jobs.wait_pods("doomed", 1, attempt=attempt)
            kubelet.run(p.metadata.name)
            kubelet.exit(p.metadata.name, 1, message="RuntimeError: injected")
        r = finetune(cluster, "wait", "doomed", "--for", "Succeeded", "--timeout", "30", "-n", namespace)
        assert r.returncode == 1 and "doomed: Failed — TrainingError" in r.stderr, (r.stdout, r.stderr)
        r = finetune(cluster, "status", "doomed", "-n", namespace)
        assert "TrainingError on node 0 in attempt 1: exit code 1: RuntimeError: injected" in r.stdout, r.stdout
        assert "finetune logs doomed --rank 0 (pod doomed-node-0)" in r.stdout and "restarts 1/1" in r.stdout

        ns = f'finetune_namespace="{namespace}"'
        seen = wait_for(
            lambda: (m := _operator_metrics(port)).get(f'finetune_operator_jobs{{{ns},state="Failed"}}') == 1.0 and m,
            timeout=30,
            what="the failed job in the operator's metrics",
        )
        assert seen[f'finetune_operator_jobs{{{ns},state="Running"}}'] == 0.0  # every state, zeros too
        assert seen[f'finetune_operator_gang_restarts_total{{{ns},reason="TrainingError"}}'] == 1.0
        jobs.delete("doomed")  # the namespace's last job: its state series go
        try:
            wait_for(
                lambda: not any(k.startswith(f"finetune_operator_jobs{{{ns}") for k in _operator_metrics(port)),
                timeout=30,
                what="the namespace's job series to go with its last job",
            )
        except AssertionError:
            print(_operator_metrics(port), op.output()[-5000:])
            raise
    finally:
        op.stop()
