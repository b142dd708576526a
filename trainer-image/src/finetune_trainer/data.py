"""Datasets: a cheap column check for the launcher (before torchrun), and loading + tokenization for workers."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
from typing import Any

from finetune_trainer.config import Config, DatasetConfig, grpo_schema
from finetune_trainer.errors import ConfigError

log = logging.getLogger("finetune_trainer.data")


def local_columns(ds: DatasetConfig, split: str) -> list[str]:
    """Column names of a local split, read from the first record / header / schema (no full load)."""
    fmt = ds.resolved_format()
    path = ds.split_file(split)
    if not os.path.isfile(path):
        raise ConfigError(
            "dataset.path", f"file {path!r} does not exist; check spec.dataset.path and the output volume"
        )
    try:
        if fmt == "jsonl":
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        record = json.loads(line)
                        if not isinstance(record, dict):
                            raise ConfigError("dataset.path", f"{path!r}: each line must be a JSON object")
                        return list(record)
            raise ConfigError("dataset.path", f"{path!r} is empty")
        if fmt == "csv":
            with open(path, encoding="utf-8", newline="") as f:
                header = next(csv.reader(f), None)
            if not header:
                raise ConfigError("dataset.path", f"{path!r} is empty (no CSV header)")
            return header
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError("dataset.path", f"{path!r} is not valid {fmt}: {e}") from None
    except OSError as e:
        raise ConfigError("dataset.path", f"cannot read {path!r} as {fmt}: {e}") from None


# A pair's columns: the spec's field, the DatasetConfig attribute naming the column, TRL's name for it
PREFERENCE = (
    ("promptField", "prompt_field", "prompt"),
    ("chosenField", "chosen_field", "chosen"),
    ("rejectedField", "rejected_field", "rejected"),
)


def check_columns(config: Config, columns: list[str]) -> None:
    """Every configured field must be a column; the message names the field and the columns that exist."""
    ds = config.dataset
    if config.task == "dpo":
        wanted = [(key, getattr(ds, attr)) for key, attr, _ in PREFERENCE]
    elif config.task == "grpo":
        wanted = [("promptField", ds.prompt_field)]
        wanted += [
            (f"training.grpo.rewards[{i}].column", r.column)
            for i, r in enumerate(config.training.grpo.rewards)
            if r.column
        ]
    elif ds.sft_format == "chat":
        wanted = [("messagesField", ds.messages_field)]
    elif ds.sft_format == "prompt-completion":
        wanted = [("promptField", ds.prompt_field), ("completionField", ds.completion_field)]
    else:
        wanted = [("textField", ds.text_field), ("textPairField", ds.text_pair_field)]
    if config.task == "sequence-classification":
        wanted.append(("labelField", ds.label_field))
    for key, column in wanted:
        if column and column not in columns:
            field = key if key.startswith("training.") else f"dataset.{key}"
            raise ConfigError(field, f"column {column!r} not in dataset columns {columns}; set spec.{field}")


def validate_local_dataset(config: Config) -> None:
    """Launcher-side check of a local dataset (Hub datasets are checked by the workers once loaded)."""
    ds = config.dataset
    if not ds.path:
        return
    if not os.path.exists(ds.path):
        raise ConfigError("dataset.path", f"{ds.path!r} does not exist; check spec.dataset.path and the mounted volume")
    if ds.eval_split and not os.path.isdir(ds.path):
        raise ConfigError(
            "dataset.evalSplit",
            "an evaluation split needs spec.dataset.path to be a directory holding <split>.<ext> files",
        )
    check_columns(config, local_columns(ds, ds.split))
    if ds.eval_split:
        check_columns(config, local_columns(ds, ds.eval_split))
    if config.evaluation is not None:
        ev = config.evaluation
        if not os.path.isdir(ds.path):
            raise ConfigError(
                "evaluation.split",
                "the evaluation stage needs spec.dataset.path to be a directory holding <split>.<ext> files",
            )
        try:
            columns = local_columns(ds, ev.split)
        except ConfigError as e:  # the split's file: named by the field that asked for it
            raise ConfigError("evaluation.split", e.message) from None
        check_evaluation_columns(config, columns)


def check_evaluation_columns(config: Config, columns: list[str]) -> None:
    """The evaluation split holds the prompt column and every column a metric reads."""
    ev = config.evaluation
    assert ev is not None
    wanted = [("evaluation.promptField", ev.prompt_field)]
    wanted += [(f"evaluation.metrics[{i}].column", r.column) for i, r in enumerate(ev.metrics) if r.column]
    for field, column in wanted:
        if column not in columns:
            raise ConfigError(
                field, f"column {column!r} not in split {ev.split!r}'s columns {columns}; set spec.{field}"
            )


def load_split(config: Config, split: str) -> Any:
    """Load one split as a ``datasets.Dataset`` (local file or Hub id)."""
    import datasets

    ds = config.dataset
    if ds.path:
        fmt = ds.resolved_format()
        builder = {"jsonl": "json", "csv": "csv", "parquet": "parquet"}[fmt]
        return datasets.load_dataset(builder, data_files={split: ds.split_file(split)}, split=split)
    token = os.environ.get("HF_TOKEN") or None
    return datasets.load_dataset(ds.name, ds.config, split=split, token=token)


def label_mapping(values: list[Any]) -> tuple[dict[Any, int], list[str]]:
    """Map label values to ids: integers keep their value (0..max), anything else is sorted and numbered."""
    unique = sorted({v for v in values if v is not None}, key=lambda v: (str(type(v)), v))
    if unique and all(isinstance(v, (int, bool)) for v in unique):
        if min(unique) < 0:
            raise ConfigError("dataset.labelField", f"integer labels must be >= 0, found {min(unique)}")
        n = int(max(unique)) + 1
        return {int(v): int(v) for v in unique}, [str(i) for i in range(n)]
    names = [str(v) for v in unique]
    return {v: i for i, v in enumerate(unique)}, names


def tokenize(config: Config, dataset: Any, tokenizer: Any, label_ids: dict[Any, int] | None) -> Any:
    """Tokenize (truncate to ``maxSeqLength``; padding happens per batch in the collator)."""
    ds = config.dataset
    max_len = config.training.max_seq_length

    if config.task == "sequence-classification":
        assert label_ids is not None and ds.label_field is not None
        label_field = ds.label_field

        def fn(batch: dict[str, list[Any]]) -> dict[str, Any]:
            pair = batch[ds.text_pair_field] if ds.text_pair_field else None
            out: dict[str, Any] = tokenizer(batch[ds.text_field], pair, truncation=True, max_length=max_len)
            out["labels"] = [label_ids[v] for v in batch[label_field]]
            return out

    else:  # causal-lm

        def fn(batch: dict[str, list[Any]]) -> dict[str, Any]:
            encoded: dict[str, Any] = tokenizer(batch[ds.text_field], truncation=True, max_length=max_len)
            return encoded

    tokenized = dataset.map(fn, batched=True, remove_columns=dataset.column_names, desc="tokenize")
    return tokenized.filter(lambda ex: len(ex["input_ids"]) > 0)


# --- chat and prompt/completion data (TRL's SFTTrainer) ---------------------------------------------------------------


def uses_sft(config: Config) -> bool:
    """causal-lm with chat or prompt/completion data, or with packing, trains with TRL's SFTTrainer."""
    return config.task == "causal-lm" and bool(config.dataset.sft_format or config.training.packing)


def sft_dataset(config: Config, dataset: Any) -> Any:
    """The split with only the columns TRL's SFTTrainer reads, renamed to its names: messages (chat); prompt and
    completion; or text (plain text with packing)."""
    ds = config.dataset
    fmt = ds.sft_format
    if fmt == "chat":
        pairs = [(ds.messages_field, "messages")]
    elif fmt == "prompt-completion":
        pairs = [(ds.prompt_field, "prompt"), (ds.completion_field, "completion")]
    else:
        pairs = [(ds.text_field, "text")]
    keep = dataset.select_columns([s for s, _ in pairs])
    renames = {s: t for s, t in pairs if s != t}
    return keep.rename_columns(renames) if renames else keep


def check_sft_rows(config: Config, dataset: Any, tokenizer: Any, split: str) -> float:
    """Every row of an SFT split must be usable; returns the mean tokenized row length (before padding).

    A missing or empty field, a conversation that is not a list of {role, content}, a chat template the tokenizer
    lacks, a role the template rejects, or (with lossOn: completion) a template that does not mark assistant turns
    is a :class:`ConfigError` naming the field and the row: caught here, before the model loads, rather than as a
    stack trace out of TRL's tokenization."""
    ds = config.dataset
    fmt = ds.sft_format
    if fmt == "chat" and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            "dataset.messagesField",
            f"the tokenizer of {config.model.source!r} has no chat template, so conversations cannot be rendered; "
            "use a chat model's tokenizer, or prompt/completion data (spec.dataset.promptField/completionField)",
        )
    total = 0
    for i, row in enumerate(dataset):
        if fmt == "chat":
            total += _chat_row_tokens(config, tokenizer, row.get("messages"), i, split)
        elif fmt is None:
            text = row.get("text")
            if not isinstance(text, str) or not text.strip():
                raise ConfigError(
                    "dataset.textField", f"row {i} of split {split!r}: column {ds.text_field!r} is missing or empty"
                )
            total += len(tokenizer(text)["input_ids"])
        else:
            for key, column in (("promptField", "prompt"), ("completionField", "completion")):
                value = row.get(column)
                if not isinstance(value, str) or not value.strip():
                    name = ds.prompt_field if column == "prompt" else ds.completion_field
                    raise ConfigError(
                        f"dataset.{key}", f"row {i} of split {split!r}: column {name!r} is missing or empty"
                    )
            total += len(tokenizer(row["prompt"] + row["completion"])["input_ids"])
    if fmt == "chat" and config.training.loss_on == "completion":
        _check_assistant_markers(tokenizer, dataset[0]["messages"])
    return total / max(1, len(dataset))


def preference_dataset(config: Config, dataset: Any) -> Any:
    """The split with only the columns TRL's DPOTrainer reads, renamed to its names: prompt, chosen, rejected."""
    ds = config.dataset
    pairs = [(getattr(ds, attr), name) for _, attr, name in PREFERENCE]
    keep = dataset.select_columns([s for s, _ in pairs])
    renames = {s: t for s, t in pairs if s != t}
    return keep.rename_columns(renames) if renames else keep


def _value_kind(value: Any, key: str, column: str | None, where: str) -> str:
    """'plain' for a non-empty string, 'conversational' for a non-empty list of {role, content} messages; anything
    else is a :class:`ConfigError` naming the field, the column and the row."""
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(f"dataset.{key}", f"{where}: column {column!r} is empty")
        return "plain"
    if isinstance(value, list) and value:
        for j, m in enumerate(value):
            if not isinstance(m, dict) or not all(isinstance(m.get(k), str) for k in ("role", "content")):
                raise ConfigError(
                    f"dataset.{key}",
                    f"{where}: column {column!r}, message {j} must be an object with string 'role' and 'content'",
                )
        return "conversational"
    raise ConfigError(
        f"dataset.{key}",
        f"{where}: column {column!r} is missing or empty (a string, or a list of {{role, content}} messages)",
    )


def _rendered_kind(config: Config, tokenizer: Any, kind: str | None, rows: str) -> str:
    """The split's kind; conversational rows need the tokenizer's chat template."""
    if kind == "conversational" and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            "dataset.promptField",
            f"the tokenizer of {config.model.source!r} has no chat template, so conversational {rows} cannot be "
            f"rendered; use a chat model's tokenizer, or plain string {rows}",
        )
    return kind or "plain"


def prompt_dataset(config: Config, dataset: Any) -> Any:
    """GRPO's prompts: the prompt column as TRL names it (prompt), and every other column, which TRL passes to each
    reward by its name, but those named as TRL's own reward arguments (a column ``prompt`` beside another prompt
    column, ``completions``, ...: dropped, and logged)."""
    reserved = set(grpo_schema()["properties"]["rewards"]["items"]["properties"]["column"]["x-reserved"])
    prompt = str(config.dataset.prompt_field)
    dropped = [c for c in dataset.column_names if c in reserved and c != prompt]
    if dropped:
        log.info("dataset columns %s are names TRL gives its own reward arguments: not passed to the rewards", dropped)
        dataset = dataset.remove_columns(dropped)
    return dataset.rename_column(prompt, "prompt") if prompt != "prompt" else dataset


def check_prompt_rows(config: Config, dataset: Any, tokenizer: Any, split: str) -> str:
    """Every prompt a non-empty string (plain) or a non-empty list of {role, content} messages (conversational,
    rendered with the tokenizer's chat template), one kind per split, and every reference a reward reads present.
    Returns 'plain' or 'conversational'; a bad row is a :class:`ConfigError` naming the field and the row."""
    column = config.dataset.prompt_field
    references = [(i, r.column) for i, r in enumerate(config.training.grpo.rewards) if r.column]
    kind = None
    for n, row in enumerate(dataset):
        where = f"row {n} of split {split!r}"
        row_kind = _value_kind(row.get("prompt"), "promptField", column, where)
        if kind is not None and row_kind != kind:
            raise ConfigError(
                "dataset.promptField",
                f"{where}: is {row_kind} but the rows before it are {kind}; use one kind per split",
            )
        kind = row_kind
        for i, ref in references:
            if row.get(ref) is None or (isinstance(row.get(ref), str) and not row[ref].strip()):
                raise ConfigError(
                    f"training.grpo.rewards[{i}].column", f"{where}: the reference column {ref!r} is empty"
                )
    return _rendered_kind(config, tokenizer, kind, "prompts")


def check_preference_rows(config: Config, dataset: Any, tokenizer: Any, split: str) -> str:
    """Every preference pair must be usable: a prompt, a chosen and a rejected response, either all strings
    (plain) or all lists of {role, content} messages (conversational, rendered with the tokenizer's chat template),
    one kind for the whole split, and the two responses different. Returns 'plain' or 'conversational'; a bad row is
    a :class:`ConfigError` naming the field and the row, before the model loads."""
    ds = config.dataset
    kind = None
    for i, row in enumerate(dataset):
        where = f"row {i} of split {split!r}"
        kinds = {key: _value_kind(row.get(name), key, getattr(ds, attr), where) for key, attr, name in PREFERENCE}
        if len(set(kinds.values())) > 1:
            raise ConfigError(
                "dataset.promptField",
                f"{where}: mixes plain strings and message lists ({', '.join(f'{k}: {v}' for k, v in kinds.items())}); "
                "a pair is either all strings or all conversations",
            )
        row_kind = kinds["promptField"]
        if kind is None:
            kind = row_kind
        elif row_kind != kind:
            raise ConfigError(
                "dataset.promptField",
                f"{where}: is {row_kind} but the rows before it are {kind}; use one kind per split",
            )
        if row["chosen"] == row["rejected"]:
            raise ConfigError(
                "dataset.rejectedField", f"{where}: the chosen and rejected responses are the same: nothing to prefer"
            )
    return _rendered_kind(config, tokenizer, kind, "pairs")


def _chat_row_tokens(config: Config, tokenizer: Any, messages: Any, i: int, split: str) -> int:
    where = f"row {i} of split {split!r}"
    column = config.dataset.messages_field
    if not isinstance(messages, list) or not messages:
        raise ConfigError("dataset.messagesField", f"{where}: column {column!r} must be a non-empty list of messages")
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ConfigError(
                "dataset.messagesField", f"{where}: message {j} must be an object with string 'role' and 'content'"
            )
    try:
        return len(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    except Exception as e:  # jinja2 TemplateError from raise_exception(), or the template's own failure
        raise ConfigError(
            "dataset.messagesField", f"{where}: the chat template rejected the conversation ({type(e).__name__}: {e})"
        ) from None


def _check_assistant_markers(tokenizer: Any, messages: Any) -> None:
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    marked = re.search(r"{%-?\s*generation\s*-?%}", template) is not None
    if marked:
        out = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        marked = any(out.get("assistant_masks") or [])
    if not marked:
        raise ConfigError(
            "training.lossOn",
            "the tokenizer's chat template does not mark assistant turns ({% generation %}), so the loss cannot be "
            "restricted to them; set spec.training.lossOn: all, or use a template with generation markers",
        )
