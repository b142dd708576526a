"""Recovery on the real nodes: for each fault, the time from the fault until every rank steps again, and the steps lost.

The faults are the real-node scenarios of the test suite, each on a fresh job of the tiny example through the
chart-installed operator (the images built from the Dockerfiles, real kubelets on containerd):

- a rank's process killed (``kill -9`` of one worker inside its container): restarted in place, the pods kept;
- a pod evicted (the Eviction API, as ``kubectl drain`` does): SIGTERM, an agreed checkpoint, the gang recreated;
- a node lost (its kubelet and containers killed): the node controller marks it, the pod is force-deleted, the gang
  recreated on the node left;
- an elastic job's node lost and back: it shrinks to one node, then grows back to two;
- a rank frozen (SIGSTOP), then the nodes' network cut: the peers' collectives time out (``ddp_timeout``); in place
  the first time, the gang recreated the second (rank 0's store cannot be reached).

Each scenario writes its figures (``$FAULTS_REPORT``); this script runs them in one pytest session (one cluster, one
operator) and prints one table. "Recovered" is read from the job's status as the operator reports it (a rank 0 scrape
after the new attempt, or round, has stepped past the checkpoint it resumed from), so it includes the scrape's delay;
a round restarted in place also reports its own time from the failure to its first step (``result.json``).

    sudo -E python bench/recovery.py --kills 3     # from the repository root, in the development venv (root: kubelets)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {
    "rank-kills": "tests/realnodes/test_rank_faults.py::test_rank_sigkill_at_random_steps",
    "eviction-real": (
        "tests/realnodes/test_faults.py::"
        "test_an_eviction_stops_the_gang_on_sigterm_at_an_agreed_checkpoint_and_resumes_from_it"
    ),
    "frozen-partitioned": "tests/realnodes/test_rank_faults.py::test_frozen_rank_and_partitioned_nodes",
    "node-lost-real": "tests/realnodes/test_node_loss.py",
    "elastic-real-ddp-lora": (
        "tests/realnodes/test_elastic.py::"
        "test_a_lost_node_shrinks_the_gang_and_its_return_grows_it_back_with_the_global_batch_kept"
    ),
}


def rows(figures: dict[str, dict]) -> list[tuple[str, str, str, str]]:
    """(fault, how it recovers, fault → stepping again, steps lost) per scenario that reported."""
    out = []
    if k := figures.get("rank-kills"):
        first = k.get("round_first_step_s")
        own = f" (the round's own: {first} s from the failure to its first step)" if first is not None else ""
        out.append(
            (
                f"a rank's process killed ({k['kills']}x)",
                "in place, the pods kept",
                f"p50 {k['recovery_s']['p50']} s, max {k['recovery_s']['max']} s{own}",
                f"max {k['steps_lost_per_restart']['max']}, total {k['steps_lost_per_restart']['total']} "
                f"(interval {k['checkpoint_interval']})",
            )
        )
    if f := figures.get("frozen-partitioned"):
        timeout = f["ddp_timeout_s"]
        for key, fault, how in (
            ("frozen", "a rank frozen (SIGSTOP)", f"peers time out ({timeout} s), in place"),
            ("partitioned", "the nodes' network cut", f"peers time out ({timeout} s), gang recreated"),
        ):
            if key in f:
                out.append(
                    (fault, how, f"{f[key]['recovery_s']} s (detected {f[key]['time_to_detect_s']} s)", "≤ interval")
                )
    if e := figures.get("eviction-real"):
        out.append(
            (
                "a pod evicted (drain)",
                "SIGTERM, agreed checkpoint, gang recreated",
                f"{e['recovered_after_s']} s",
                str(e["steps_lost"]),
            )
        )
    if n := figures.get("node-lost-real"):
        out.append(
            (
                "a node lost",
                "node marked down, pod force-deleted, gang recreated",
                f"{n['recovered_after_s']} s (detected {n['time_to_detect_s']} s)",
                f"{n.get('steps_lost', '≤ interval')}",
            )
        )
    if el := figures.get("elastic-real-ddp-lora"):
        out.append(
            (
                "elastic: a node lost, then back",
                "shrink to 1 node, grow back to 2",
                f"shrink {el['node_lost_to_training_smaller_s']} s, "
                f"grow {el['capacity_back_to_training_full_size_s']} s (from the node's return)",
                # the shrink's lower bound is rank 0's last scraped step past the checkpoint, when a scrape saw one
                (
                    f"shrink ≥ {el['steps_lost_shrink_at_least']}"
                    if el["steps_lost_shrink_at_least"] > 0
                    else "shrink ≤ interval"
                )
                + f", grow {el['steps_lost_grow']}",
            )
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=3, help="rank kills in the in-place scenario")
    ap.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), help="run these scenarios only")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    chosen = args.only or list(SCENARIOS)
    with tempfile.TemporaryDirectory(prefix="recovery-") as tmp:
        base = Path(tmp) / "recovery.json"
        env = {
            **os.environ,
            "FAULTS_REPORT": str(base),
            "FAULTS_RANK_KILLS": str(args.kills),
            "PYTHONPATH": os.pathsep.join(["operator", "trainer-image/src", "."]),
        }
        tests = [SCENARIOS[name] for name in chosen]
        rc = subprocess.call([sys.executable, "-m", "pytest", "-m", "realnodes", "-q", *tests], cwd=ROOT, env=env)
        figures = {}
        for name in chosen:
            path = base.with_suffix(f".{name}.json")
            if path.exists():
                figures[name] = json.loads(path.read_text())
    print("\n| fault | recovery | fault → every rank stepping again | steps lost |\n|---|---|---|---|")
    for row in rows(figures):
        print("| " + " | ".join(row) + " |")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return rc


if __name__ == "__main__":
    sys.exit(main())
