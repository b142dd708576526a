"""What the real-node fault scenarios share: the tiny example made long enough to act on while it trains, reads of
its checkpoints, status and events, and signals sent to a rank's training worker inside its container."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from tests.examplejobs import tiny_job
from tests.realnodes.conftest import RealCluster, job_status
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600
STEPS, INTERVAL = 400, 50
# Inside the container: the PID of a training worker (forked by the agent, whose cmdline it shares, or torchrun's child,
# started as finetune_trainer.worker), then send it the signal named in argv.
SIGNAL_WORKER = (
    "import os, signal, sys\n"
    "def cmd(pid):\n"
    "    return open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
    "def parent(pid):\n"
    "    return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1]\n"
    "def worker(pid):\n"
    "    try:\n"
    "        c = cmd(pid)\n"
    "        if b'finetune_trainer.worker' in c and b'torch.distributed.run' not in c:\n"
    "            return True\n"
    "        return b'finetune_trainer.agent' in c and b'finetune_trainer.agent' in cmd(parent(pid))\n"
    "    except OSError:\n"
    "        return False\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    if worker(pid):\n"
    "        os.kill(int(pid), getattr(signal, sys.argv[1])); print('signalled', pid); break\n"
    "else:\n"
    "    raise SystemExit('no worker')\n"
)
# The ranks of one job spread over the nodes when they can, and share a node when only one is left.
SPREAD = {
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchExpressions": [{"key": "finetune.dev/job-name", "operator": "Exists"}]},
                },
            }
        ]
    }
}


def long_tiny(
    rc: RealCluster,
    namespace: str,
    name: str,
    *,
    steps: int = STEPS,
    interval: int = INTERVAL,
    pod: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> Path:
    """examples/tiny-job.yaml under ``name``, long enough to act on while it trains (``pod``: more of its
    podTemplate); returns its output directory."""
    rc.shared_claim(namespace, "finetune-workspace", content=ROOT / "examples", read_only=True)
    output = rc.shared_claim(namespace, "finetune-output")
    job = tiny_job(name, **{"training.maxSteps": steps, "training.checkpointEverySteps": interval}, **spec)
    job["metadata"]["namespace"] = namespace
    job["spec"]["podTemplate"].update(pod or {})
    if labels:
        job["spec"]["podTemplate"]["labels"] = labels
    rc.kubectl("apply", "-f", "-", input=json.dumps(job))
    return output / namespace / name


def complete_checkpoints(out: Path) -> list[int]:
    return sorted(
        int(c.name.split("-")[1]) for c in (out / "checkpoints").glob("checkpoint-*") if (c / "COMPLETE").exists()
    )


def wait_terminal(rc: RealCluster, namespace: str, name: str, timeout: float = TIMEOUT) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        st = job_status(rc, namespace, name)
        return st if st.get("state") in ("Succeeded", "Failed") else None

    return dict(wait_for(done, timeout=timeout, what=f"{name} to finish", interval=2))


def training(
    rc: RealCluster, namespace: str, name: str, attempt: int, past_step: int, *, out: Path, round: int = 0
) -> dict[str, Any] | None:
    """The status once ``attempt`` (its ``round`` of restarts in place) trains: rank 0 has written the round's record
    in ``out`` (it does as its training starts) and reports a step beyond ``past_step``. The record matters: the
    status keeps the step the attempt or round before reached until the new one's first scrape, and that is past a
    checkpoint of before already."""
    st = job_status(rc, namespace, name)
    step = (st.get("progress") or {}).get("step") or 0
    record = out / "attempts" / (f"attempt-{attempt}" + (f".{round}" if round else "") + ".json")
    running = st.get("attempt") == attempt and st.get("state") == "Running"
    return st if running and record.exists() and step > past_step else None


def signal_worker(rc: RealCluster, namespace: str, pod: str, signame: str) -> str:
    """Send ``signame`` to the training worker in ``pod``'s container (``kubectl exec``, through the real kubelet)."""
    out = rc.kubectl("exec", "-n", namespace, pod, "--", "python", "-c", SIGNAL_WORKER, signame)
    assert out.startswith("signalled "), out
    return out


def pods(rc: RealCluster, namespace: str) -> list[dict[str, Any]]:
    return list(json.loads(rc.kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"])


def node_of(rc: RealCluster, namespace: str, pod: str) -> str:
    return rc.kubectl("get", "pod", pod, "-n", namespace, "-o", "jsonpath={.spec.nodeName}")


def event_reasons(rc: RealCluster, namespace: str, name: str) -> list[str]:
    """The reasons of the events the operator posted on FineTuneJob ``name``."""
    items = json.loads(
        rc.kubectl(
            "get",
            "events",
            "-n",
            namespace,
            "-o",
            "json",
            f"--field-selector=involvedObject.name={name},involvedObject.kind=FineTuneJob",
        )
    )
    return [e["reason"] for e in items["items"] for _ in range(e.get("count") or 1)]


def sigterm_steps(out: Path, attempt: int) -> set[int]:
    """The steps at which ``attempt``'s ranks said they stopped on SIGTERM after a checkpoint (their log copies on
    the output claim: the pods are gone by then)."""
    logs = "".join(f.read_text(errors="replace") for f in (out / "logs" / f"attempt-{attempt}").glob("node-*.log"))
    return {int(m) for m in re.findall(r"stopped on SIGTERM at step (\d+) after saving a checkpoint", logs)}


def report(name: str, figures: dict[str, Any]) -> None:
    """A scenario's figures: one JSON line on stdout, and ``$FAULTS_REPORT`` with the suffix ``.<name>.json``."""
    print(json.dumps(figures))
    if out := os.environ.get("FAULTS_REPORT"):
        Path(out).with_suffix(f".{name}.json").write_text(json.dumps(figures, indent=2))
