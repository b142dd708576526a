"""What the ``finetune`` user commands print (finetune_operator.render), rendered to text by a recording console;
and the user commands' pure parts (manifest checks, where an earlier attempt's logs are)."""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from finetune_operator import client, jobctl, render
from finetune_operator.status import ts
from rich.console import Console

from tests.unit.factories import NOW, STARTED, job

pytestmark = pytest.mark.unit


def text(renderable: Any) -> str:
    console = Console(record=True, width=160, color_system=None)
    console.print(renderable)
    return console.export_text()


def failed_job() -> dict[str, Any]:
    status = {
        **STARTED,
        "state": "Failed",
        "restarts": 2,
        "attempt": 2,
        "failure": {
            "reason": "CUDAOutOfMemory",
            "message": "CUDA out of memory: lower perDeviceBatchSize",
            "rank": 1,
            "attempt": 2,
            "podName": "ft-node-1",
        },
        "conditions": [
            {
                "type": "Failed",
                "status": "True",
                "reason": "CUDAOutOfMemory",
                "message": "x",
                "lastTransitionTime": ts(NOW - timedelta(seconds=30)),
            }
        ],
    }
    out = job(status, maxRestarts=2)
    out["metadata"]["creationTimestamp"] = ts(NOW - timedelta(minutes=5))
    return out


def test_the_reason_is_the_failures_for_a_failed_job_else_the_condition_that_explains_the_state() -> None:
    assert render.reason(failed_job()["status"])[0] == "CUDAOutOfMemory"
    running = {
        "state": "Running",
        "conditions": [
            {"type": "Restarting", "status": "False", "reason": "AllRanksRunning", "message": ""},
            {"type": "Running", "status": "True", "reason": "AllRanksRunning", "message": "attempt 0: 2/2 running"},
        ],
    }
    assert render.reason(running) == ("AllRanksRunning", "attempt 0: 2/2 running")
    assert render.reason({}) == ("", "")


def test_status_block_names_state_failure_attempts_and_where_the_failed_ranks_log_is() -> None:
    out = text(render.status_block(failed_job(), [], [], now=NOW))
    assert "Failed  CUDAOutOfMemory" in out
    assert "restarts 2/2" in out
    assert "CUDAOutOfMemory on node 1 in attempt 2: CUDA out of memory" in out
    assert "finetune logs ft --rank 1 (pod ft-node-1)" in out
    assert "age 5m0s" in out


def test_progress_line_and_list_table_read_well() -> None:
    prog = {
        "step": 150,
        "totalSteps": 150,
        "samplesPerSecond": 2702.2,
        "loss": 0.123456,
        "eta": "0s",
        "stepOfTotal": "150/150",
    }
    assert render.progress_line(prog) == "step 150/150 (100%), 2702.2 samples/s, loss 0.1235, ETA 0s"
    done = job(
        {
            **STARTED,
            "state": "Succeeded",
            "progress": prog,
            "nodes": "0/2",
            "conditions": [
                {
                    "type": "Succeeded",
                    "status": "True",
                    "reason": "AllRanksSucceeded",
                    "message": "all 2 rank(s) exited 0",
                }
            ],
        }
    )
    done["metadata"]["creationTimestamp"] = ts(NOW - timedelta(hours=3, minutes=4))
    table = text(render.jobs_table([done, failed_job()], all_namespaces=True, now=NOW))
    header, *rows = [line.split() for line in table.strip().splitlines()]
    assert header == ["NAMESPACE", "NAME", "STATE", "REASON", "NODES", "STEP", "RESTARTS", "AGE"]
    assert rows[0][2:4] == ["Succeeded", "AllRanksSucceeded"] and rows[0][5] == "150/150" and rows[0][-1] == "3h4m"
    assert rows[1][2:4] == ["Failed", "CUDAOutOfMemory"]


def ctx(namespace: str | None = None) -> client.FineTuneClient:
    return client.FineTuneClient(namespace, offline=True)


def test_a_manifest_must_hold_one_finetunejob_and_agree_with_the_namespace_flag(tmp_path: Path) -> None:
    two = tmp_path / "two.yaml"
    two.write_text(
        "apiVersion: finetune.dev/v1alpha1\nkind: FineTuneJob\nmetadata: {name: a}\n---\n"
        "apiVersion: finetune.dev/v1alpha1\nkind: FineTuneJob\nmetadata: {name: b}\n"
    )
    with pytest.raises(client.UserError, match="holds 2 FineTuneJob"):
        ctx().load(str(two))
    one = tmp_path / "one.yaml"
    one.write_text("apiVersion: finetune.dev/v1alpha1\nkind: FineTuneJob\nmetadata: {name: a, namespace: team}\n")
    assert ctx().load(str(one))[1]["metadata"]["namespace"] == "team"
    with pytest.raises(client.UserError, match=r"metadata\.namespace is .team. but -n \(namespace=\) says .other."):
        ctx("other").load(str(one))
    old = tmp_path / "old.yaml"
    old.write_text("apiVersion: finetune.dev/v1\nkind: FineTuneJob\nmetadata: {name: a}\n")
    with pytest.raises(client.UserError, match=r"speaks finetune\.dev/v1alpha1"):
        ctx().load(str(old))


def test_the_typed_spec_names_the_field_of_each_error() -> None:
    bad = job(None, output={"claimName": "o", "path": "../other"})
    assert any(e.startswith("spec.output.path") for e in client.local_errors(bad))
    bad_name = job(None, name="Has_Capitals")
    assert any("metadata.name" in e for e in client.local_errors(bad_name))
    assert client.local_errors(job(None)) == []


def test_validate_offline_needs_no_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: finetune.dev/v1alpha1\nkind: FineTuneJob\nmetadata: {name: a}\n"
        "spec: {model: {path: /m}, dataset: {path: /d}, output: {claimName: o, path: /abs}}\n"
    )
    args = argparse.Namespace(command="validate", file=str(bad), offline=True, namespace=None)
    assert jobctl.run(args) == jobctl.EXIT_USAGE
    assert "spec.output.path" in capsys.readouterr().err


def test_the_command_line_parser_does_not_import_the_kubernetes_client() -> None:
    """`finetune operator --kubeconfig K` sets $KUBECONFIG before the client is imported (it reads it at import, and
    kopf's re-login later loads that default); building the parser of every command must not import it first."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom finetune_operator import cli\ntry:\n    cli.main(['status', '--help'])\n"
        "except SystemExit:\n    pass\nprint('kubernetes' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_an_earlier_attempts_log_is_found_on_the_output_claim() -> None:
    restarted = job(
        {**STARTED, "attempt": 2},
        output={
            "volumeClaimTemplate": {
                "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}
            }
        },
    )
    said = client.no_pod(restarted, 0, [1], 2)
    assert "output claim ft-output, at ns/ft/logs/attempt-0/node-<rank>.log" in said
    assert "has not started" in client.no_pod(restarted, 3, [0], 2)


def test_the_reason_column_is_derived_in_the_wire_status() -> None:
    from finetune_operator.failures import Failure
    from finetune_operator.status import Status

    st = Status()
    assert "reason" not in st.to_wire()  # no state yet
    st.set_state("Running", now=NOW, reason="AllRanksRunning", message="attempt 0: 2/2 trainer pods running")
    assert st.to_wire()["reason"] == "AllRanksRunning"
    st.failure = Failure("OOMKilled", "the kernel killed rank 1")
    st.set_state("Failed", now=NOW, reason="RestartsExhausted", message="x")
    assert st.to_wire()["reason"] == "OOMKilled"  # the failure's own reason, as finetune list shows it
    assert render.reason(st.to_wire())[0] == "OOMKilled"


def test_the_samples_the_trainer_image_ships_are_the_tiny_examples() -> None:
    """examples/quickstart.yaml trains on finetune_trainer/samples (the images link it at /opt/finetune/samples):
    copies of examples/tiny, kept equal here."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    samples = root / "trainer-image" / "src" / "finetune_trainer" / "samples"
    for copy_dir, source_dir in (("tiny-bert", "bert"), ("tiny-data", "data")):
        files = sorted(p.name for p in (samples / copy_dir).iterdir())
        assert files, copy_dir
        for name in files:
            source = root / "examples" / "tiny" / source_dir / name
            assert (samples / copy_dir / name).read_bytes() == source.read_bytes(), name
    quickstart = (root / "examples" / "quickstart.yaml").read_text()
    assert "/opt/finetune/samples/tiny-bert" in quickstart and "/opt/finetune/samples/tiny-data" in quickstart


def test_status_block_shows_an_elastic_jobs_size_and_batch() -> None:
    status = {
        **STARTED,
        "nodes": "1/2",
        "elastic": {
            "currentNodes": 1,
            "desiredNodes": 2,
            "minNodes": 1,
            "gradientAccumulationSteps": 3,
            "globalBatchSize": 48,
            "askedGlobalBatchSize": 40,
            "resizes": 1,
            "lastResize": "Shrunk",
            "placeholdersRunning": 0,
        },
    }
    out = job(status, nodes=2, elastic={"minNodes": 1})
    out["metadata"]["creationTimestamp"] = ts(NOW - timedelta(minutes=5))
    shown = text(render.status_block(out, [], [], now=NOW))
    assert "1 of 2 node(s) (min 1), accumulation 3, global batch 48 (asked 40); 1 resize(s) (last Shrunk)" in shown
    assert "Elastic" not in text(render.status_block(failed_job(), [], [], now=NOW))


HOSTILE = "bad row [/INST] [bold]x \x1b]0;pwned\x07 \x1b[2J\r\x9b1m end"


def test_text_a_job_wrote_is_printed_as_text_never_markup_or_terminal_control() -> None:
    """Failure, condition and event messages come from what a job's own code wrote: a chat-template token such as
    ``[/INST]`` is not rich markup (it raised MarkupError), and escape sequences never reach the terminal."""
    j = failed_job()
    j["status"]["failure"]["message"] = HOSTILE
    j["status"]["conditions"][0]["message"] = HOSTILE
    j["status"]["conditions"][0]["reason"] = "[red]Reason"
    events = [{"type": "Warning", "reason": "TrainingError", "message": HOSTILE, "lastTimestamp": ts(NOW)}]
    out = text(render.status_block(j, [], events, now=NOW))
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out and "\r" not in out
    assert out.count("bad row [/INST] [bold]x") == 3 and "[red]Reason" in out
    j["status"] = {"state": "Failed", "failure": {"reason": "TrainingError", "message": HOSTILE}}
    line = render.final_line(j)
    assert "[/INST]" in line and not any(c in line for c in "\x1b\x07\x9b\r")
    j["status"]["failure"]["reason"] = "Bad[/INST]\x1b[2J"
    listed = text(render.jobs_table([j], all_namespaces=True, now=NOW))
    assert "Bad[/INST]" in listed and "\x1b" not in listed


def test_the_commands_print_cluster_text_without_markup(capsys: pytest.CaptureFixture[str]) -> None:
    """``finetune wait`` and ``submit --follow`` end with the job's final line, printed by the CLI's own consoles."""
    j = failed_job()
    j["status"] = {"state": "Failed", "failure": {"reason": "TrainingError", "message": HOSTILE}}

    class Client:
        def wait(self, name: str, *, for_: str, timeout: float) -> client.Job:
            return client.Job(j)

    console = Console(soft_wrap=True, markup=False, color_system=None)
    ctx = jobctl.Context(Client(), console, console)  # type: ignore[arg-type]
    code = jobctl.cmd_wait(ctx, argparse.Namespace(name="ft", for_="finished", timeout=1.0))
    out = capsys.readouterr().out
    assert code == jobctl.EXIT_FAILED
    assert "bad row [/INST] [bold]x" in out and "\x1b" not in out


def test_the_status_says_where_the_start_up_went() -> None:
    """The start-up's parts from status.progress (the trainer's result.json startup, through its metrics)."""
    j = failed_job()
    j["status"]["progress"] = {
        "timeToFirstStepSeconds": 9.504,
        "rendezvousSeconds": 8.937,
        "launcherSeconds": 7.671,
        "dataSeconds": 0.117,
        "modelSeconds": 0.029,
        "warmupSeconds": 0.0676,
    }
    out = text(render.status_block(j, [], [], now=NOW))
    assert (
        "Start-up  9.5s to the first step: launcher 7.67s, process group 1.27s, data 0.117s, model 0.029s, "
        "first step 0.0676s" in out
    )
    assert render.startup_line({}) == "" and render.startup_line({"timeToFirstStepSeconds": 3.0}) == (
        "3s to the first step"
    )


def test_the_status_says_what_the_run_trains_with_and_why() -> None:
    """auto settled by the trainer (its choice series, scraped into status.progress), printed as text."""
    j = failed_job()
    j["status"]["progress"] = {
        "acceleration": "none",
        "kernels": "liger",
        "accelerationReason": "auto: liger, estimated 15.2 s for 6e+15 FLOPs against eager 20.4 s, compile 53.5 s",
    }
    out = text(render.status_block(j, [], [], now=NOW))
    assert "Trains with  none, kernels liger (auto: liger, estimated 15.2 s for 6e+15 FLOPs" in out, out
    assert render.choice_line({}) == ""


def test_a_succeeded_jobs_scores_read_in_its_status_and_final_line() -> None:
    """status.evaluation as ``finetune status`` and ``finetune wait`` print it: the held-out metrics with their step,
    then the stage's state, samples and each metric's score; a failed stage says why."""
    j = job({"state": "Succeeded"})
    j["status"]["evaluation"] = {"step": 60, "loss": 0.75, "rewardAccuracy": 0.875, "state": "Succeeded",
                                 "split": "test", "samples": 40, "scores": {"correct": 0.5, "format": 1.0}}  # fmt: skip
    line = "held-out loss 0.75, reward accuracy 0.875 (step 60); stage Succeeded on 40 sample(s) of split test: " + (
        "correct 0.5, format 1"
    )
    assert render.evaluation_line(j["status"]["evaluation"]) == line
    assert f"Evaluation  {line}" in text(render.status_block(j, [], [], now=NOW))
    assert render.final_line(j).endswith(f"; evaluation: {line}")
    failed = {"state": "Failed", "split": "test", "message": "TypeError: bad metric"}
    assert render.evaluation_line(failed) == "stage Failed (TypeError: bad metric)"
    assert render.evaluation_line(None) == ""
