"""Start-up to the first optimizer step, the agent's forked workers against torchrun's, side by side.

Each round runs the tiny example (a 4-layer BERT, sequence classification) on two local "nodes" (two launchers, the
env contract as the operator sets it on pods, real torch.distributed rendezvous) once with the default start
(``finetune_trainer.agent``: the stack imported once per node, beside the launcher's validation, workers forked) and
once with ``FINETUNE_WORKER_START=torchrun`` (torchrun's interpreter, then each worker's own imports), alternating
which goes first. It reports each variant's median of rank 0's ``time_to_first_step_seconds`` (from the launcher's
first instruction) and its parts from ``result.json``.

    python bench/startup.py --rounds 3          # from the repository root, in the development venv
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.trainer.helpers import Node, free_port, read_json, tiny_config

VARIANTS = {"agent (fork)": {}, "torchrun": {"FINETUNE_WORKER_START": "torchrun"}}


def one_run(workdir: Path, env: dict[str, str], steps: int) -> dict:
    out = workdir / "out"
    cfg = tiny_config(out, training={"maxSteps": steps, "checkpointEverySteps": steps})
    port = free_port()
    started = time.time()
    nodes = [Node(workdir, cfg, node_rank=r, nnodes=2, master_port=port, extra_env=env) for r in (0, 1)]
    for node in nodes:
        if node.wait(600) != 0:
            raise SystemExit(f"run failed:\n{node.log()[-3000:]}")
    result = read_json(out / "result.json")
    return {
        "time_to_first_step_seconds": result["time_to_first_step_seconds"],
        **result["startup"],
        **result.get("workers", {}),
        "wall_seconds": round(time.time() - started, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for i in range(args.rounds):
            order = list(VARIANTS) if i % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                run = one_run(Path(tmp) / f"{i}-{name.split()[0]}", VARIANTS[name], args.steps)
                runs[name].append(run)
                print(json.dumps({"round": i, "variant": name, **run}), flush=True)
    print("\n| variant | time to first step (median) | launcher | rendezvous | data | model | wall, both nodes |")
    print("|---|---|---|---|---|---|---|")
    for name, rs in runs.items():

        def med(key: str, rs: list[dict] = rs) -> float:
            return round(statistics.median(r[key] for r in rs), 2)

        print(
            f"| {name} | {med('time_to_first_step_seconds')} s | {med('launcher_seconds')} s | "
            f"{med('rendezvous_seconds')} s | {med('data_seconds')} s | {med('model_seconds')} s | "
            f"{med('wall_seconds')} s |"
        )


if __name__ == "__main__":
    main()
