"""The examples as users run them, through the chart-installed operator, on two real nodes with the trainer image
built from ``trainer-image/Dockerfile.cpu``: ``finetune submit --follow`` until the job ends, ``finetune logs`` and
``kubectl logs`` served by the real kubelets, the model and ``result.json`` on the output claim.

- ``examples/tiny-job.yaml`` and ``examples/tiny-chat-job.yaml``: two ranks on two nodes find each other through
  rank 0's headless-Service name (CoreDNS) and train with DDP; the workspace claim holds the repository's
  ``examples/`` (read-only) and the output claim is shared by both nodes (a pre-bound ``hostPath`` volume standing
  in for NFS: both nodes are this machine);
- ``examples/quickstart.yaml``: nothing from a checkout: the samples the trainer image ships, an output claim created
  from the job's template and bound by the default StorageClass to a local volume of the node the pod lands on.
Nothing is mocked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realnodes.conftest import RealCluster, diagnostics, job_status

pytestmark = pytest.mark.realnodes
ROOT = Path(__file__).resolve().parents[2]


def finetune(rc: RealCluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "finetune_operator.cli", *args, f"--kubeconfig={rc.kubeconfig}"],
        capture_output=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )
    return subprocess.CompletedProcess(
        r.args, r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    )


def submit(rc: RealCluster, namespace: str, manifest: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``finetune submit --follow`` until the job ends; meanwhile ``kubectl get ftj -o wide`` every second (the rows
    seen while it ran)."""
    name = yaml.safe_load(manifest.read_text())["metadata"]["name"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "finetune_operator.cli",
            "submit",
            str(manifest),
            "-n",
            namespace,
            "--follow",
            f"--kubeconfig={rc.kubeconfig}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    wide: list[str] = []
    deadline = time.monotonic() + 900
    while proc.poll() is None and time.monotonic() < deadline:
        out = rc.kubectl("get", "ftj", name, "-n", namespace, "-o", "wide", check=False)
        if "Running" in out:
            wide.append(out)
        time.sleep(1)
    if proc.poll() is None:
        proc.kill()
    stdout, stderr = (s.decode(errors="replace") for s in proc.communicate())
    r = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:], diagnostics(rc, namespace))
    return r, wide


@pytest.mark.parametrize("example", ["tiny-job.yaml", "tiny-chat-job.yaml", "tiny-dpo-job.yaml", "tiny-grpo-job.yaml"])
def test_a_two_node_example_trains_to_success_across_real_nodes(
    real_cluster: RealCluster, chart_operator: str, namespace: str, example: str
) -> None:
    rc = real_cluster
    rc.shared_claim(namespace, "finetune-workspace", content=ROOT / "examples", read_only=True)
    output = rc.shared_claim(namespace, "finetune-output")
    manifest = ROOT / "examples" / example
    name = yaml.safe_load(manifest.read_text())["metadata"]["name"]
    r, wide = submit(rc, namespace, manifest)
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith(f"{name}: Succeeded — AllRanksSucceeded: all 2 rank(s) exited 0"), last
    assert f"--- {name}-node-0 (attempt 0, rank 0) ---" in r.stdout
    st = job_status(rc, namespace, name)
    assert st["state"] == "Succeeded" and st.get("restarts", 0) == 0, st

    # One rank per node, on both real nodes.
    pods = json.loads(rc.kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]
    nodes = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
    assert sorted(nodes.values()) == ["ftn-node-0", "ftn-node-1"], nodes
    # kubectl logs from the real kubelet of rank 1's node; finetune logs --all reads both.
    rank1 = rc.kubectl("logs", "-n", namespace, f"{name}-node-1")
    assert "launcher INFO starting the workers:" in rank1
    both = finetune(rc, "logs", name, "--all", "-n", namespace)
    assert both.returncode == 0, both.stderr
    assert {line[:8] for line in both.stdout.rstrip("\n").split("\n")} == {"[node 0]", "[node 1]"}

    out = output / namespace / name
    result = json.loads((out / "result.json").read_text())
    want_steps = yaml.safe_load(manifest.read_text())["spec"]["training"]["maxSteps"]
    assert result["steps"] == want_steps, result
    assert result["world_size"] == 2 and len(list((out / "ranks").glob("rank-*.json"))) == 2, result
    assert (out / "model" / "config.json").exists()
    # Progress from rank 0's metrics in the wide columns while it trained (the chart's progress interval is 2 s here).
    with_progress = [w for w in wide if f"/{want_steps}" in w]
    assert with_progress, f"no step progress in `kubectl get ftj -o wide` while it ran: {wide[-3:]}"
    header = with_progress[-1].splitlines()[0]
    assert all(col in header for col in ("STEP", "SAMPLES/S", "ETA")), header
    # The copy on the output claim, which outlives the pods: each pod's log from the launcher's start on.
    ns = ["-n", namespace]
    logs = {}
    for rank in (0, 1):
        text = finetune(rc, "logs", name, "--rank", str(rank), *ns)
        assert text.returncode == 0 and "launcher INFO starting the workers:" in text.stdout, text.stderr
        copy = (out / "logs" / "attempt-0" / f"node-{rank}.log").read_bytes().decode(errors="replace")
        assert "launcher INFO starting the workers:" in copy
        assert text.stdout.rstrip().endswith(copy.rstrip()), (rank, copy[-500:], text.stdout[-500:])
        logs[rank] = text.stdout
    # The web view's page of the job (finetune ui, through the Python client): the loss curve the operator recorded
    # from the trainer's metrics while it ran, and the tail of rank 0's log from the real kubelet.
    from finetune_operator.client import FineTuneClient
    from finetune_operator.webui import LOG_TAIL_LINES, Views

    page = Views(FineTuneClient(namespace, kubeconfig=rc.kubeconfig)).job(namespace, name)
    assert page["state"] == "Succeeded" and len(page["curves"]["loss"]) >= 2, page["curves"]
    assert page["log"]["lines"] == logs[0].rstrip("\n").split("\n")[-LOG_TAIL_LINES:], page["log"]["note"]
    tail = finetune(rc, "logs", name, "--tail", "3", *ns)
    assert tail.returncode == 0 and len(tail.stdout.rstrip("\n").split("\n")) == 3
    missing = finetune(rc, "logs", name, "--attempt", "3", *ns)
    assert missing.returncode == 2 and "attempt 3 has not started" in missing.stderr

    if example == "tiny-chat-job.yaml":  # chat template, TRL's SFTTrainer, evaluation every 20 steps
        assert [e["step"] for e in result["eval_history"]] == [20, 40, 60]
        assert result["eval_history"][-1]["loss"] < result["eval_history"][0]["loss"], result["eval_history"]
        assert (out / "model" / "chat_template.jinja").exists()
    if example == "tiny-dpo-job.yaml":  # TRL's DPOTrainer: the policy learns to reward the chosen answers
        rewards = result["dpo"]["reward_history"][-5:]
        assert result["dpo"]["pairs"] == "conversational" and rewards, result["dpo"]
        assert sum(r["margin"] for r in rewards) > 0, rewards
        assert st["progress"].get("rewardAccuracy") is not None, st["progress"]  # scraped from rank 0's page
        # the final evaluation on the held-out pairs, from rank 0's summary
        final = result["final_eval"]
        assert final["step"] == 40 and st["evaluation"]["step"] == 40, (final, st.get("evaluation"))
        assert st["evaluation"]["rewardAccuracy"] == pytest.approx(final["reward_accuracy"], rel=1e-5), st["evaluation"]
    if example == "tiny-grpo-job.yaml":  # TRL's GRPOTrainer: the mean reward rises from a random policy's
        history = result["grpo"]["history"]
        assert len(history) >= 6 and set(history[0]["rewards"]) == {"format", "correct"}, result["grpo"]
        assert sum(h["reward"] for h in history[-3:]) / 3 > history[0]["reward"] + 0.5, history
        assert result["grpo"]["rollout_tokens_per_second"] > 0, result["grpo"]
        progress = st["progress"]  # scraped from rank 0's page: the sum and each reward by its name
        assert progress.get("rewardMean") is not None and set(progress.get("rewardMeans") or {}) == {
            "format",
            "correct",
        }, progress
        assert page["curves"]["reward"], page["curves"]  # the web view's reward chart has points
        # the evaluation stage after training: the 80 held-out prompts, scored by hand from the samples it wrote
        stage = result["evaluation"]
        assert stage["state"] == "Succeeded" and stage["samples"] == 80, stage
        samples = [json.loads(line) for line in (out / "evaluation" / "samples.jsonl").read_text().splitlines()]
        right = sum(s["completion"].strip() == s["references"]["answer"] for s in samples)
        assert len(samples) == 80 and stage["scores"]["correct"] == right / 80, stage
        scores = st["evaluation"]
        assert (scores["state"], scores["samples"], scores["split"]) == ("Succeeded", 80, "eval"), scores
        assert scores["scores"] == pytest.approx(stage["scores"], rel=1e-5), (scores, stage)
        assert "; evaluation: stage Succeeded on 80 sample(s) of split eval: " in last, last


def test_the_quickstart_runs_on_what_the_image_ships_with_a_claim_from_its_template(
    real_cluster: RealCluster, chart_operator: str, namespace: str
) -> None:
    rc = real_cluster
    r, _ = submit(rc, namespace, ROOT / "examples" / "quickstart.yaml")
    assert r.stdout.strip().splitlines()[-1].startswith("quickstart: Succeeded — AllRanksSucceeded"), r.stdout[-2000:]
    claim: dict[str, Any] = json.loads(rc.kubectl("get", "pvc", "quickstart-output", "-n", namespace, "-o", "json"))
    assert claim["metadata"]["ownerReferences"][0]["name"] == "quickstart"
    assert claim["status"]["phase"] == "Bound" and claim["spec"]["storageClassName"] == "standard"
    pv = json.loads(rc.kubectl("get", "pv", claim["spec"]["volumeName"], "-o", "json"))
    pod = json.loads(rc.kubectl("get", "pod", "quickstart-node-0", "-n", namespace, "-o", "json"))
    # The local volume is on the node the pod ran on.
    assert pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [
        pod["spec"]["nodeName"]
    ]
    out = Path(pv["spec"]["local"]["path"]) / namespace / "quickstart"
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 60, result
    assert (out / "model" / "config.json").exists() and (out / "logs" / "attempt-0" / "node-0.log").exists()
