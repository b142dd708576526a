"""An elastic job's attempts, as the trainer runs them: 2 nodes, then 1 (a node lost), then 2 again (grown back), each
attempt a fixed-size gang resuming from the newest checkpoint of the one before, with the gradient accumulation the
operator adapts so the global batch stays the one asked for. DDP (with LoRA) resumes at another world size; FSDP's
sharded checkpoints (distributed checkpoint) reshard on load, 2 shards to 1 and back. (That the loss goes on where it
was is shown on real nodes, with a model that learns within a few steps: tests/realnodes/test_elastic.py.)

Real: the ``finetune-trainer`` launcher, torchrun, gloo, the Hugging Face Trainer, the tiny GPT-2 from the repo; the
configs are the builder's own for each size (finetune_operator.elastic.sized).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.helpers import Node, free_port, poll, read_json
from tests.trainer.test_llm_outputs import LORA, causal_config
from tests.trainer.test_trainer_runs import RUN_TIMEOUT, complete_steps

pytestmark = pytest.mark.trainer

STEPS, EVERY, BATCH = 40, 5, 2


def sized_config(out: Path, sharding: str, nodes: int) -> dict[str, Any]:
    """The trainer config of a 2-node elastic job at ``nodes`` nodes, as the operator builds it."""
    from finetune_operator.builders import JobRef, trainer_config
    from finetune_operator.elastic import sized
    from finetune_operator.spec import parse_spec

    spec = parse_spec(
        {
            "model": {"path": "/m"},
            "dataset": {"path": "/d.jsonl"},
            "output": {"claimName": "o"},
            "nodes": 2,
            "elastic": {"minNodes": 1},
            "training": {"maxSteps": STEPS, "perDeviceBatchSize": BATCH},
        }
    )
    training = trainer_config(JobRef("elastic", "ns", "uid"), sized(spec, nodes))["training"]
    over: dict[str, Any] = {
        "training": {
            "maxSteps": STEPS,
            "checkpointEverySteps": EVERY,
            "keepCheckpoints": 10,
            "perDeviceBatchSize": BATCH,
            "gradientAccumulationSteps": training["gradientAccumulationSteps"],
            "globalBatchSize": training["globalBatchSize"],
            "extraArgs": {"logging_steps": 1},
            **({"sharding": "fsdp"} if sharding == "fsdp" else {"lora": LORA}),
        }
    }
    return causal_config(out, **over)


def gang(tmp_path: Path, cfg: dict[str, Any], *, nodes: int, attempt: int) -> list[Node]:
    port = free_port()
    return [
        Node(tmp_path / f"a{attempt}", cfg, node_rank=r, nnodes=nodes, master_port=port, attempt=attempt)
        for r in reversed(range(nodes))
    ]


def newer_checkpoint(out: Path, than: int) -> int | None:
    done = complete_steps(out)
    return done[-1] if done and done[-1] > than else None


@pytest.mark.parametrize("sharding", ["none", "fsdp"], ids=["ddp-lora", "fsdp"])
def test_two_nodes_then_one_then_two_keep_the_global_batch_and_the_loss(tmp_path: Path, sharding: str) -> None:
    out = tmp_path / "out"
    # attempt 0: two nodes, lost (SIGKILL) after a checkpoint
    first = gang(tmp_path, sized_config(out, sharding, 2), nodes=2, attempt=0)
    poll(lambda: newer_checkpoint(out, EVERY), timeout=RUN_TIMEOUT, what="two checkpoints", on_fail=first[-1].log)
    for node in first:
        node.kill()
    lost_at = complete_steps(out)[-1]
    # attempt 1: the node left, the accumulation doubled; stopped by SIGTERM (the grow's agreed step)
    (alone,) = gang(tmp_path, sized_config(out, sharding, 1), nodes=1, attempt=1)
    poll(
        lambda: newer_checkpoint(out, lost_at), timeout=RUN_TIMEOUT, what="a checkpoint at one node", on_fail=alone.log
    )
    alone.terminate()
    assert alone.wait(RUN_TIMEOUT) == 143, alone.log()
    grown_from = complete_steps(out)[-1]
    if sharding == "fsdp":  # the one-node checkpoint holds one shard: loaded by two ranks below
        shards = list((out / "checkpoints" / f"checkpoint-{grown_from}" / "pytorch_model_fsdp_0").glob("*.distcp"))
        assert len(shards) == 1, shards
    # attempt 2: both nodes again, to the end
    for node in gang(tmp_path, sized_config(out, sharding, 2), nodes=2, attempt=2):
        assert node.wait(RUN_TIMEOUT) == 0, node.log()

    records = [read_json(out / "attempts" / f"attempt-{a}.json") for a in (0, 1, 2)]
    assert [(r["nodes"], r["gradient_accumulation_steps"]) for r in records] == [(2, 1), (1, 2), (2, 1)]
    assert {r["global_batch_size"] for r in records} == {2 * BATCH} == {r["global_batch_size_asked"] for r in records}
    assert [r["resumed_from_step"] for r in records] == [0, lost_at, grown_from], records
    assert records[1]["stopped_by_signal"] is True and records[1]["last_step"] == grown_from, records[1]
    result = read_json(out / "result.json")
    assert result["steps"] == STEPS and result["resumed_from_step"] == grown_from
    assert (result["global_batch_size"], result["gradient_accumulation_steps"], result["world_size"]) == (4, 1, 2)

    # Each attempt's step count goes on from the checkpoint it resumed: its first logged step is the one after it.
    for attempt, losses in ((1, records[1]["loss_history"]), (2, result["loss_history"])):
        resumed = records[attempt]["resumed_from_step"]
        assert min(step for step, _ in losses if step > resumed) == resumed + 1, (attempt, resumed, losses)
    print(json.dumps({"sharding": sharding, "lost_at": lost_at, "grown_from": grown_from}))
