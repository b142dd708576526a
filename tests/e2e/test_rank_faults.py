"""Fault injection on real training ranks: a rank's worker SIGKILLed at random steps, again and again; a frozen rank
(SIGSTOP); a rank cut off the network. The operator, the node agent and real torchrun/DDP training as in test_e2e.

Mocked: only the kubelet and container runtime (hack/nodeagent: pods run as local processes in namespaces of their
own). Real: the control plane, the operator, the trainer, torch.distributed.

Invariants: attempts never overlap (tests/faults/harness.PodWatch), every injected fault is one counted gang restart
and nothing more, each attempt resumes from a complete checkpoint (a multiple of the interval), no restart throws away
more than one checkpoint interval of steps, the job trains to its last step and succeeds. Figures (time to detect,
restart gap, recovery, steps lost) print as one JSON line per scenario and go to $FAULTS_REPORT when set;
FAULTS_RANK_KILLS sets the number of kills (3 in CI, 20 in ``make soak``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.conftest import E2E, tiny_job
from tests.faults.harness import Observed, PodWatch
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.faults]
KILLS = max(1, int(os.environ.get("FAULTS_RANK_KILLS", "3")))
SEED = int(os.environ.get("FAULTS_SEED", "7"))
INTERVAL = 20  # checkpointEverySteps
TRAIN_TIMEOUT = 420


def _worker(e: E2E, pod: str) -> psutil.Process | None:
    """The pod's training worker (torchrun's child), once it runs."""
    for p in e.agent.processes(e.namespace, pod):
        try:
            cmd = p.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "finetune_trainer.worker" in " ".join(cmd) and "torch.distributed.run" not in cmd:
            return p
    return None


def _training(e: E2E, job: str, attempt: int, past_step: int) -> dict[str, Any] | None:
    """The status once ``attempt`` runs and its rank 0 reports a step beyond ``past_step``."""
    st = e.jobs.status(job)
    step = (st.get("progress") or {}).get("step") or 0
    return st if st.get("attempt") == attempt and st.get("state") == "Running" and step > past_step else None


def _pct(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    return {"p50": round(s[len(s) // 2], 2), "p95": round(s[min(len(s) - 1, int(len(s) * 0.95))], 2),
            "max": round(s[-1], 2)}


def _report(name: str, report: dict[str, Any]) -> None:
    print(json.dumps(report))
    if out := os.environ.get("FAULTS_REPORT"):
        Path(out).with_suffix(f".{name}.json").write_text(json.dumps(report, indent=2))


def _recover(e: E2E, job: str, attempt: int, t0: float) -> tuple[float, float, int, dict[str, Any]]:
    """Seconds from ``t0`` until the operator restarted the gang (the next attempt requested) and until that attempt
    trains past the checkpoint it resumed from; that checkpoint's step; the status then."""
    restarted = wait_for(lambda: (st := e.jobs.status(job)).get("attempt", 0) > attempt and st, timeout=180,
                         what="the gang restart", interval=0.2)
    detect = time.monotonic() - t0
    resume = int((restarted.get("progress") or {}).get("step") or 0)  # the job stands at its newest checkpoint
    st = wait_for(lambda: _training(e, job, attempt + 1, resume), timeout=TRAIN_TIMEOUT,
                  what=f"attempt {attempt + 1} training", interval=0.5)
    return detect, time.monotonic() - t0, resume, st


def test_rank_sigkill_at_random_steps(e2e: E2E) -> None:
    rng = random.Random(SEED)
    # Each attempt adds at most two intervals before its kill, so the job outlives them; the 240 spare steps keep
    # every attempt training for a while (tens of seconds on 2 cores) so the operator's 1 s scrape of rank 0 sees it
    # train even when a loaded machine makes most scrapes miss (a short attempt could finish unseen, unkilled).
    max_steps = 40 * KILLS + 240
    e2e.jobs.create(tiny_job("kills", maxRestarts=KILLS, terminationGracePeriodSeconds=15,
                             **{"training.maxSteps": max_steps, "training.checkpointEverySteps": INTERVAL}))
    seen = Observed()
    podwatch = PodWatch(e2e.jobs.core.api_client, e2e.namespace, seen)
    podwatch.start()
    detect, recover, gaps, lost, resumed, events_before = [], [], [], [], [], 0
    try:
        resume = 0
        for attempt in range(KILLS):
            target = resume + rng.randint(1, INTERVAL + 5)  # a random step of this attempt, before or after a save
            wait_for(lambda a=attempt, t=target: _training(e2e, "kills", a, t), timeout=TRAIN_TIMEOUT,
                     what=f"attempt {attempt} past step {target}", interval=0.2)
            rank = rng.randrange(2)
            victim = wait_for(lambda r=rank: _worker(e2e, f"kills-node-{r}"), timeout=60, what="the worker")
            lost_before = (e2e.jobs.status("kills").get("progress") or {}).get("stepsLostToRestarts") or 0
            events_before = len(e2e.jobs.events("kills"))
            t0 = time.monotonic()
            victim.send_signal(signal.SIGKILL)
            d, r, resume, st = _recover(e2e, "kills", attempt, t0)
            detect.append(d)
            recover.append(r)
            gaps.append(st.get("lastRestartGapSeconds") or 0.0)
            lost.append(((st.get("progress") or {}).get("stepsLostToRestarts") or 0) - lost_before)
            resumed.append(resume)
        st = wait_for(lambda: (s := e2e.jobs.status("kills")).get("state") in ("Succeeded", "Failed") and s,
                      timeout=TRAIN_TIMEOUT, what="kills to finish", interval=1.0)
    finally:
        podwatch.stop.set()
    result = e2e.result("kills")
    events = len(e2e.jobs.events("kills"))
    report = {"scenario": "rank SIGKILL at random steps", "seed": SEED, "kills": KILLS, "max_steps": max_steps,
              "checkpoint_interval": INTERVAL,
              "violations": len(seen.overlaps) + (st["state"] != "Succeeded") + (st.get("restarts") != KILLS)
              + sum(s > INTERVAL for s in lost) + sum(r % INTERVAL != 0 for r in resumed),
              "time_to_detect_s": _pct(detect), "restart_gap_s": _pct(gaps), "recovery_s": _pct(recover),
              "steps_lost_per_restart": {"max": max(lost), "total": sum(lost)},
              "gpu_seconds_lost": st.get("gpuSecondsLost", 0), "events_per_restart": round(events / KILLS, 1),
              "pods_created": seen.pods_created["kills"]}
    _report("rank-kills", report)
    assert seen.overlaps == [], seen.overlaps
    assert st["state"] == "Succeeded" and st["restarts"] == KILLS, st
    assert result["steps"] == max_steps, result
    assert all(r % INTERVAL == 0 for r in resumed), resumed  # every attempt resumed from a complete checkpoint
    # the trainer's own word on the last attempt: it resumed from a checkpoint at least as new as the operator saw
    assert result["resumed_from_step"] % INTERVAL == 0 and result["resumed_from_step"] >= resumed[-1], result
    assert max(lost) <= INTERVAL, lost  # a restart throws away at most one checkpoint interval
    assert seen.pods_created["kills"] == 2 * (KILLS + 1)  # each rank once per attempt
    assert events_before < events <= 3 * (KILLS + 1)  # per attempt at most: created, running, restart/end


def test_frozen_rank_and_partitioned_rank(e2e: E2E) -> None:
    """Rank 1's worker frozen (SIGSTOP), then, in the next attempt, rank 1 cut off the network: rank 0 blocks in a
    collective until spec.training.extraArgs.ddp_timeout, fails, and the operator restarts the gang (the frozen or
    cut-off pod is stopped with the short failure grace, then killed); the job resumes from its newest checkpoint."""
    e2e.jobs.create(tiny_job("frozen", maxRestarts=2, terminationGracePeriodSeconds=30, **{
        "training.maxSteps": 400, "training.checkpointEverySteps": INTERVAL,
        "training.extraArgs": {"ddp_timeout": 20}}))
    seen = Observed()
    podwatch = PodWatch(e2e.jobs.core.api_client, e2e.namespace, seen)
    podwatch.start()
    figures: dict[str, Any] = {}
    try:
        wait_for(lambda: _training(e2e, "frozen", 0, INTERVAL), timeout=TRAIN_TIMEOUT, what="attempt 0 training",
                 interval=0.2)
        victim = wait_for(lambda: _worker(e2e, "frozen-node-1"), timeout=60, what="rank 1's worker")
        t0 = time.monotonic()
        victim.send_signal(signal.SIGSTOP)
        d, r, _, st = _recover(e2e, "frozen", 0, t0)
        figures["frozen"] = {"time_to_detect_s": round(d, 2), "recovery_s": round(r, 2),
                             "reason": st["failure"]["reason"]}
        t0 = time.monotonic()
        e2e.agent.partition(e2e.namespace, "frozen-node-1")
        d, r, _, st = _recover(e2e, "frozen", 1, t0)
        figures["partitioned"] = {"time_to_detect_s": round(d, 2), "recovery_s": round(r, 2),
                                  "reason": st["failure"]["reason"]}
        st = wait_for(lambda: (s := e2e.jobs.status("frozen")).get("state") in ("Succeeded", "Failed") and s,
                      timeout=TRAIN_TIMEOUT, what="frozen to finish", interval=1.0)
    finally:
        podwatch.stop.set()
    result = e2e.result("frozen")
    _report("frozen-partitioned", {"scenario": "frozen rank (SIGSTOP), partitioned rank", "ddp_timeout_s": 20,
                                   **figures, "violations": len(seen.overlaps) + (st["state"] != "Succeeded")})
    assert seen.overlaps == [], seen.overlaps
    assert st["state"] == "Succeeded" and st["restarts"] == 2, st
    # rank 0 trained past the checkpoint at step 20 before the first fault: the last attempt resumed, not restarted
    assert result["steps"] == 400 and result["resumed_from_step"] % INTERVAL == 0, result
    assert result["resumed_from_step"] >= INTERVAL, result
