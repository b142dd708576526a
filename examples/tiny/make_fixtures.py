"""Regenerate the tiny offline fixtures in this directory (deterministic; no network, no weights).

    python examples/tiny/make_fixtures.py

Writes:
  data/train.jsonl, data/eval.jsonl  - a synthetic sentiment task: {"text": ..., "label": 0|1}
  bert/  - a 2-layer BERT config (hidden 64) + a WordLevel tokenizer, for sequence-classification
  gpt2/  - a 2-layer GPT-2 config (n_embd 64) + a WordLevel tokenizer, for causal-lm
Models are built from config.json with `initFromConfig: true`: no weights are committed.
"""

from __future__ import annotations

import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
POSITIVE = ["good", "great", "excellent", "lovely", "wonderful", "happy", "superb", "fine", "pleasant", "brilliant"]
NEGATIVE = ["bad", "awful", "terrible", "poor", "horrible", "sad", "dreadful", "nasty", "unpleasant", "boring"]
NEUTRAL = [
    "the",
    "a",
    "movie",
    "film",
    "story",
    "plot",
    "actor",
    "scene",
    "music",
    "ending",
    "was",
    "is",
    "very",
    "quite",
    "really",
    "and",
    "but",
    "this",
    "that",
    "it",
]
TRAIN_ROWS, EVAL_ROWS = 400, 80


def sentence(rng: random.Random, label: int) -> str:
    words = [rng.choice(NEUTRAL) for _ in range(rng.randint(3, 8))]
    cues = POSITIVE if label else NEGATIVE
    for _ in range(rng.randint(2, 4)):
        words.insert(rng.randrange(len(words) + 1), rng.choice(cues))
    return " ".join(words)


def write_data() -> None:
    rng = random.Random(1234)
    os.makedirs(os.path.join(HERE, "data"), exist_ok=True)
    for split, n in (("train", TRAIN_ROWS), ("eval", EVAL_ROWS)):
        with open(os.path.join(HERE, "data", f"{split}.jsonl"), "w", encoding="utf-8") as f:
            for i in range(n):
                label = i % 2
                f.write(json.dumps({"text": sentence(rng, label), "label": label}) + "\n")


def vocab(specials: list[str]) -> dict[str, int]:
    words = sorted(set(POSITIVE + NEGATIVE + NEUTRAL))
    return {tok: i for i, tok in enumerate(specials + words)}


def save_tokenizer(
    directory: str, tokenizer: object, special: dict[str, str], model_max_length: int, input_names: list[str]
) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=model_max_length, model_input_names=input_names, **special
    )
    fast.save_pretrained(directory)


def write_bert() -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    v = vocab(specials)
    tok = Tokenizer(models.WordLevel(v, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", v["[CLS]"]), ("[SEP]", v["[SEP]"])],
    )
    d = os.path.join(HERE, "bert")
    os.makedirs(d, exist_ok=True)
    save_tokenizer(
        d, tok,
        {
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "mask_token": "[MASK]",
        },
        128,
        ["input_ids", "token_type_ids", "attention_mask"],
    )  # fmt: skip
    config = {
        "architectures": ["BertForSequenceClassification"],
        "model_type": "bert",
        "vocab_size": len(v),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": 128,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": v["[PAD]"],
    }
    with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def write_gpt2() -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    specials = ["<|endoftext|>", "<unk>"]
    v = vocab(specials)
    tok = Tokenizer(models.WordLevel(v, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    d = os.path.join(HERE, "gpt2")
    os.makedirs(d, exist_ok=True)
    save_tokenizer(
        d,
        tok,
        {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "unk_token": "<unk>"},
        128,
        ["input_ids", "attention_mask"],
    )
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": len(v),
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 2,
        "n_positions": 128,
        "n_inner": 128,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "bos_token_id": v["<|endoftext|>"],
        "eos_token_id": v["<|endoftext|>"],
    }
    with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    write_data()
    write_bert()
    write_gpt2()
