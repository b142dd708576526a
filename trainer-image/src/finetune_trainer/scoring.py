"""The evaluation stage (``spec.evaluation``): once training is over and the final model is saved, rank 0 writes one
greedy completion for each of the first ``maxSamples`` prompts of a held-out split and scores it with the matchers
GRPO's rewards use (``finetune_trainer.rewards``); a metric's score is its mean over the samples (for the matchers,
the share of completions that match).

The record goes to result.json (``evaluation``), to the Prometheus gauges of rank 0's page, and, one line per sample,
to ``<output>/evaluation/samples.jsonl`` (the prompt, the completion, the columns the metrics read and each metric's
score), from which every score can be checked by hand. The model is saved before the stage starts, so an evaluation
that fails is recorded (``state: Failed`` with the error) and the job still succeeds with its model.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

from finetune_trainer import data, rewards
from finetune_trainer.callbacks import StopFlag
from finetune_trainer.config import Config, EvaluationConfig, evaluation_schema

log = logging.getLogger("finetune_trainer.scoring")

SAMPLES_FILE = os.path.join("evaluation", "samples.jsonl")


def prompt_text(prompt: Any, tokenizer: Any) -> tuple[str, bool]:
    """A prompt as the model reads it, and whether it is already rendered with the special tokens: a plain string as
    is; a conversation through the tokenizer's chat template, ending where the assistant's turn begins."""
    if isinstance(prompt, list):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True), True
    return str(prompt), False


def prompt_kind(prompts: list[Any]) -> str:
    """'plain' (every prompt a non-empty string) or 'conversational' (every prompt a non-empty list of {role,
    content} messages); anything else is an error naming the row."""
    kinds = set()
    for i, p in enumerate(prompts):
        if isinstance(p, str) and p.strip():
            kinds.add("plain")
        elif isinstance(p, list) and p and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in p):
            kinds.add("conversational")
        else:
            raise ValueError(f"row {i}: the prompt is missing, empty, or neither a string nor a list of messages")
    if len(kinds) > 1:
        raise ValueError("the split mixes plain and conversational prompts; use one kind")
    return kinds.pop() if kinds else "plain"


def _trimmed(ids: list[int], stop_ids: set[int]) -> list[int]:
    """A generated row up to its first end-of-sequence or padding token."""
    for i, t in enumerate(ids):
        if t in stop_ids:
            return ids[:i]
    return ids


def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[Any],
    ev: EvaluationConfig,
    stop: StopFlag,
    *,
    conversational: bool,
    done: Callable[[int], None] = lambda n: None,
) -> tuple[list[str], list[list[int]]]:
    """Greedy completions of ``prompts`` (lists of messages when ``conversational``: :func:`prompt_kind`) in batches
    of ``ev.batch_size``, left-padded, ``done`` told how many after each batch; stops early (fewer completions) when a
    SIGTERM asks the pod to stop."""
    import torch

    saved = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:  # a tokenizer without one pads with end-of-sequence, as TRL's generation does
        tokenizer.pad_token = tokenizer.eos_token
    pad = tokenizer.pad_token_id
    # every end-of-sequence id the model's generation config knows (Llama 3 and Qwen list several) and the padding
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    more = eos if isinstance(eos, list) else [eos]
    stop_ids = {t for t in (tokenizer.eos_token_id, pad, *more) if isinstance(t, int)}
    device = next(model.parameters()).device
    completions: list[str] = []
    ids_out: list[list[int]] = []
    model.eval()
    try:
        for start in range(0, len(prompts), ev.batch_size):
            if stop.requested:
                break
            rendered = [prompt_text(p, tokenizer)[0] for p in prompts[start : start + ev.batch_size]]
            # a rendered conversation holds its special tokens already
            enc = tokenizer(rendered, return_tensors="pt", padding=True, add_special_tokens=not conversational).to(
                device
            )
            with torch.inference_mode():
                out = model.generate(
                    **enc, max_new_tokens=ev.max_new_tokens, do_sample=False, pad_token_id=pad, top_p=None, top_k=None
                )
            for row in out[:, enc["input_ids"].shape[1] :].tolist():
                ids = _trimmed(row, stop_ids)
                ids_out.append(ids)
                completions.append(tokenizer.decode(ids, skip_special_tokens=True))
            done(len(completions))
    finally:
        tokenizer.padding_side, tokenizer.pad_token = saved
    return completions, ids_out


def score(
    functions: list[Callable[..., Any]],
    prompts: list[Any],
    completions: list[Any],
    completion_ids: list[list[int]],
    columns: dict[str, list[Any]],
) -> dict[str, list[float]]:
    """Each metric's score of each completion: the functions called as TRL calls rewards (an async one awaited)."""
    out = {}
    for fn in functions:
        got = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
        if inspect.isawaitable(got):
            got = asyncio.run(_awaited(got))
        values = [float(v) if v is not None else float("nan") for v in got]
        if len(values) != len(completions):
            raise ValueError(f"metric {fn.__name__!r} returned {len(values)} scores for {len(completions)} completions")
        out[fn.__name__] = values
    return out


async def _awaited(got: Any) -> Any:
    return await got


def mean(values: list[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def run(config: Config, model: Any, tokenizer: Any, stop: StopFlag, metrics: Any) -> dict[str, Any]:
    """The stage itself: load the split, generate, score, write the samples; the record result.json keeps."""
    ev = config.evaluation
    assert ev is not None
    started = time.perf_counter()
    functions = rewards.scorers(ev.metrics, "evaluation.metrics")
    rows = data.load_split(config, ev.split)
    data.check_evaluation_columns(config, list(rows.column_names))
    if len(rows) == 0:
        raise ValueError(f"split {ev.split!r} has no rows")
    rows = rows.select(range(min(ev.max_samples, len(rows))))
    prompts = list(rows[ev.prompt_field])
    # every other column reaches the metrics by its name, but those named as the metrics' own arguments
    reserved = {ev.prompt_field, *evaluation_schema()["properties"]["metrics"]["x-reserved"]}
    columns = {c: list(rows[c]) for c in rows.column_names if c not in reserved}
    conversational = prompt_kind(prompts) == "conversational"
    completions, ids = generate(
        model, tokenizer, prompts, ev, stop, conversational=conversational, done=metrics.evaluation_samples.set
    )
    n = len(completions)
    columns = {c: v[:n] for c, v in columns.items()}
    # a conversation's completion reaches the metrics as TRL gives it to rewards: one assistant message
    said: list[Any] = completions
    if conversational:
        said = [[{"role": "assistant", "content": c}] for c in completions]
    scores = score(functions, prompts[:n], said, ids, columns)
    means = {name: mean(values) for name, values in scores.items()}
    for name, value in means.items():
        metrics.set_evaluation_score(name, value if value is not None else float("nan"))
    read = sorted({r.column for r in ev.metrics if r.column})
    path = os.path.join(config.output_path, SAMPLES_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for i in range(n):
            record = {
                "prompt": prompts[i],
                "completion": completions[i],
                "completion_tokens": len(ids[i]),
                "references": {c: columns[c][i] for c in read},
                "scores": {name: values[i] if math.isfinite(values[i]) else None for name, values in scores.items()},
            }
            f.write(json.dumps(record, default=str) + "\n")
    os.replace(path + ".tmp", path)
    stopped = n < len(prompts)
    return {
        "state": "Stopped" if stopped else "Succeeded",
        "message": f"stopped by SIGTERM after {n} of {len(prompts)} samples" if stopped else None,
        "split": ev.split,
        "samples": n,
        "max_new_tokens": ev.max_new_tokens,
        "scores": means,
        "completion_length_mean": mean([float(len(i)) for i in ids]),
        "seconds": round(time.perf_counter() - started, 3),
        "samples_file": SAMPLES_FILE,
    }


def run_safely(config: Config, model: Any, tokenizer: Any, stop: StopFlag, metrics: Any) -> dict[str, Any]:
    """:func:`run`, with any failure recorded instead of raised: the trained model is already saved."""
    try:
        return run(config, model, tokenizer, stop, metrics)
    except Exception as e:  # the model is saved; a broken metric or split must not fail the job
        log.exception("the evaluation stage failed; the trained model is saved")
        assert config.evaluation is not None
        return {"state": "Failed", "message": f"{type(e).__name__}: {e}"[:600], "split": config.evaluation.split}
