"""Fault injection on real training ranks, on real nodes, through the chart-installed operator: a rank's training
worker SIGKILLed at random steps, again and again; a frozen rank (SIGSTOP); the two nodes' pod networks cut apart
mid-training. The signals go to the worker inside its container through ``kubectl exec`` (the real kubelet); the
cut is a firewall rule between the node bridges (``NodeCluster.partition``). Nothing is mocked.

Invariants: attempts never overlap (tests/faults/harness.PodWatch), every injected fault is one counted gang restart
(in place while both pods are there) and nothing more, each attempt or round resumes from a complete checkpoint (a
multiple of the interval), no restart throws away more than one checkpoint interval of steps, the job trains to its
last step and succeeds. Figures (time to detect, restart gap, recovery, steps lost) print as one JSON line per
scenario and go to $FAULTS_REPORT when set; FAULTS_RANK_KILLS sets the number of kills (2 in CI, 20 in ``make soak``).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.faults.harness import Observed, PodWatch
from tests.realnodes.conftest import RealCluster, diagnostics, job_status
from tests.realnodes.jobs import (
    SPREAD,
    event_reasons,
    long_tiny,
    node_of,
    report,
    signal_worker,
    training,
    wait_terminal,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.realnodes, pytest.mark.faults]
KILLS = max(1, int(os.environ.get("FAULTS_RANK_KILLS", "2")))
SEED = int(os.environ.get("FAULTS_SEED", "7"))
INTERVAL = 20  # checkpointEverySteps
TIMEOUT = 600


def _pct(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    return {
        "p50": round(s[len(s) // 2], 2),
        "p95": round(s[min(len(s) - 1, int(len(s) * 0.95))], 2),
        "max": round(s[-1], 2),
    }


def _recover_in_place(
    rc: RealCluster, ns: str, job: str, restarts: int, t0: float, *, out: Path
) -> tuple[float, float, int, dict]:
    """Seconds from ``t0`` until the operator counted the restart the trainer made in place (``restarts`` in all)
    and until the round trains past the newest checkpoint the operator knew of then (the one it resumed from, or a
    newer one); that checkpoint's step; the status then."""
    counted = wait_for(
        lambda: (st := job_status(rc, ns, job)).get("restarts", 0) >= restarts and st,
        timeout=240,
        what="the restart in place",
        interval=0.25,
    )
    detect = time.monotonic() - t0
    attempt = int(counted.get("attempt") or 0)
    resume = int((counted.get("progress") or {}).get("lastCheckpointStep") or 0)
    round_ = int((counted.get("progress") or {}).get("restartsInPlace") or 0)  # this attempt's, counted so far
    st = wait_for(
        lambda: training(rc, ns, job, attempt, resume, out=out, round=round_),
        timeout=TIMEOUT,
        what=f"the round of attempt {attempt} training",
        interval=0.25,
    )
    return detect, time.monotonic() - t0, resume, st


def _on_two_nodes(rc: RealCluster, ns: str, job: str) -> None:
    where = {node_of(rc, ns, f"{job}-node-{r}") for r in (0, 1)}
    assert len(where) == 2, f"both ranks of {job} landed on {where}: the fault would not cross nodes"


def test_rank_sigkill_at_random_steps(
    real_cluster: RealCluster, chart_operator: str, namespace: str, api_client: client.ApiClient
) -> None:
    """A rank's worker SIGKILLed at random steps while both pods stay: every kill is one restart in place (the
    trainer's agents fork every rank again in its pod), counted against maxRestarts like the operator's own, and no
    pod is created again."""
    rc, rng = real_cluster, random.Random(SEED)
    # Each round adds at most two intervals before its kill, so the job outlives them; the spare steps keep the
    # last round training for a while after the last kill.
    max_steps = 40 * KILLS + 120
    out = long_tiny(
        rc, namespace, "kills", steps=max_steps, interval=INTERVAL, maxRestarts=KILLS, terminationGracePeriodSeconds=5
    )
    seen = Observed()
    podwatch = PodWatch(api_client, namespace, seen)
    podwatch.start()
    detect, recover, lost = [], [], []
    try:
        resume = 0
        for kill in range(KILLS):
            target = resume + rng.randint(1, INTERVAL + 5)  # a random step of this round, before or after a save
            wait_for(
                lambda t=target, k=kill: training(rc, namespace, "kills", 0, t, out=out, round=k),
                timeout=TIMEOUT,
                what=f"round {kill} past step {target}",
                interval=0.25,
            )
            rank = rng.randrange(2)
            lost_before = (job_status(rc, namespace, "kills").get("progress") or {}).get("stepsLostToRestarts") or 0
            t0 = time.monotonic()
            signal_worker(rc, namespace, f"kills-node-{rank}", "SIGKILL")
            d, r, resume, st = _recover_in_place(rc, namespace, "kills", kill + 1, t0, out=out)
            detect.append(d)
            recover.append(r)
            lost.append(((st.get("progress") or {}).get("stepsLostToRestarts") or 0) - lost_before)
        st = wait_terminal(rc, namespace, "kills")
    finally:
        podwatch.stop.set()
    assert st["state"] == "Succeeded", (st, diagnostics(rc, namespace))
    result = json.loads((out / "result.json").read_text())
    rounds = [a for a in result["attempts"] if a.get("round")]
    resumed = [a["resumed_from_step"] for a in rounds]  # the trainer's own word
    figures = {
        "scenario": "rank SIGKILL at random steps, restarted in place (real nodes)",
        "seed": SEED,
        "kills": KILLS,
        "max_steps": max_steps,
        "checkpoint_interval": INTERVAL,
        "violations": len(seen.overlaps)
        + (st.get("restarts") != KILLS)
        + sum(s > INTERVAL for s in lost)
        + sum(r % INTERVAL != 0 for r in resumed)
        + (len(resumed) != KILLS),
        "time_to_detect_s": _pct(detect),
        "recovery_s": _pct(recover),
        # the last round's own time from the failure to its first step (its end record; the killed rounds have none)
        "round_first_step_s": rounds[-1].get("time_to_first_step_seconds") if rounds else None,
        "resumed_from": resumed,
        "steps_lost_per_restart": {"max": max(lost), "total": sum(lost)},
        "pods_created": seen.pods_created["kills"],
    }
    report("rank-kills", figures)
    assert seen.overlaps == [], seen.overlaps
    assert (st["restarts"], st.get("restartsInPlace"), st["attempt"]) == (KILLS, KILLS, 0), st
    assert seen.pods_created["kills"] == 2  # the pods stayed: each rank created once
    assert result["steps"] == max_steps, result
    assert [a["round"] for a in rounds] == list(range(1, KILLS + 1)), result["attempts"]
    # the trainer's own word: each round resumed from a complete checkpoint (a multiple of the interval)
    assert all(r % INTERVAL == 0 for r in resumed), rounds
    assert all("SIGKILL" in a["restart_cause"] for a in rounds), rounds
    assert max(lost) <= INTERVAL, lost  # a restart throws away at most one checkpoint interval
    assert "RestartedInPlace" in event_reasons(rc, namespace, "kills")


def test_frozen_rank_and_partitioned_nodes(
    real_cluster: RealCluster, chart_operator: str, namespace: str, api_client: client.ApiClient
) -> None:
    """Rank 1's worker frozen (SIGSTOP): rank 0 blocks in a collective until spec.training.extraArgs.ddp_timeout and
    fails; both pods are there, so the agents restart every rank in place (the frozen worker is killed). Then the
    nodes' pod networks are cut apart: rank 0 fails the same way, but rank 1's agent cannot be reached, so the restart
    in place is abandoned and the operator recreates the gang (the cut-off pod is stopped with the short failure
    grace, then killed). Each time the job resumes from its newest checkpoint. The cut heals once the operator has
    asked for the next attempt."""
    rc = real_cluster
    out = long_tiny(
        rc,
        namespace,
        "frozen",
        steps=240,
        interval=INTERVAL,
        maxRestarts=2,
        terminationGracePeriodSeconds=10,
        pod={"affinity": SPREAD},
        **{"training.extraArgs": {"ddp_timeout": 20, "logging_steps": 5}},
    )
    seen = Observed()
    podwatch = PodWatch(api_client, namespace, seen)
    podwatch.start()
    figures: dict[str, Any] = {}
    try:
        wait_for(
            lambda: training(rc, namespace, "frozen", 0, INTERVAL, out=out),
            timeout=TIMEOUT,
            what="attempt 0 training",
            interval=0.25,
        )
        t0 = time.monotonic()
        signal_worker(rc, namespace, "frozen-node-1", "SIGSTOP")
        d, r, _, st = _recover_in_place(rc, namespace, "frozen", 1, t0, out=out)
        assert (st["attempt"], st.get("restartsInPlace")) == (0, 1), st
        figures["frozen"] = {
            "time_to_detect_s": round(d, 2),
            "recovery_s": round(r, 2),
            "reason": st["failure"]["reason"],
        }
        _on_two_nodes(rc, namespace, "frozen")
        t0 = time.monotonic()
        with rc.nodes.partition(0, 1):
            restarted = wait_for(
                lambda: (s := job_status(rc, namespace, "frozen")).get("attempt") == 1 and s,
                timeout=240,
                what="the gang restart of the partitioned attempt",
                interval=0.25,
            )
        d = time.monotonic() - t0
        resume = int((restarted.get("progress") or {}).get("step") or 0)
        st = wait_for(
            lambda: training(rc, namespace, "frozen", 1, resume, out=out),
            timeout=TIMEOUT,
            what="attempt 1 training",
            interval=0.5,
        )
        figures["partitioned"] = {
            "time_to_detect_s": round(d, 2),
            "recovery_s": round(time.monotonic() - t0, 2),
            "reason": st["failure"]["reason"],
        }
        st = wait_terminal(rc, namespace, "frozen")
    finally:
        podwatch.stop.set()
    report(
        "frozen-partitioned",
        {
            "scenario": "frozen rank (SIGSTOP), partitioned nodes (real nodes)",
            "ddp_timeout_s": 20,
            **figures,
            "violations": len(seen.overlaps) + (st["state"] != "Succeeded"),
        },
    )
    assert seen.overlaps == [], seen.overlaps
    assert st["state"] == "Succeeded" and (st["restarts"], st.get("restartsInPlace")) == (2, 1), (
        st,
        diagnostics(rc, namespace),
    )
    assert figures["frozen"]["reason"] == figures["partitioned"]["reason"] == "TrainingError", figures
    result = json.loads((out / "result.json").read_text())
    # rank 0 trained past the checkpoint at step 20 before the first fault: the last attempt resumed, not restarted
    assert result["steps"] == 240 and result["resumed_from_step"] % INTERVAL == 0, result
    assert result["resumed_from_step"] >= INTERVAL, result
