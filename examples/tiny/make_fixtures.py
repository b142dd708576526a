"""Regenerate the tiny offline fixtures in this directory (deterministic; no network, no weights).

    python examples/tiny/make_fixtures.py

Writes:
  data/train.jsonl, data/eval.jsonl  - a synthetic sentiment task: {"text": ..., "label": 0|1}
  bert/  - a 2-layer BERT config (hidden 64) + a WordLevel tokenizer, for sequence-classification
  gpt2/  - a 2-layer GPT-2 config (n_embd 64) + a WordLevel tokenizer, for causal-lm
  gpt2-chat/  - the same model with role tokens and a chat template that marks assistant turns ({% generation %})
  chat/train.jsonl, chat/eval.jsonl  - the sentiment task as conversations: {"messages": [user, assistant]}
  prompt-completion/train.jsonl, .../eval.jsonl  - the same as {"prompt": ..., "completion": ...}
  preference/train.jsonl, .../eval.jsonl  - the same as DPO pairs in conversations: {"prompt": [user],
      "chosen": [assistant: the right answer], "rejected": [assistant: the wrong one]}
  preference-plain/train.jsonl, .../eval.jsonl  - the same pairs as plain strings (" positive": TRL appends each
      response to its prompt as text)
  prompts/train.jsonl, .../eval.jsonl  - the same as GRPO prompts: {"prompt": [user], "answer": the right answer}
  llama-chat/  - a 2-layer Llama config (hidden 64, grouped-query attention) with gpt2-chat's tokenizer and template
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
    for d in ("data", "chat", "prompt-completion", "preference", "preference-plain", "prompts"):
        os.makedirs(os.path.join(HERE, d), exist_ok=True)
    for split, n in (("train", TRAIN_ROWS), ("eval", EVAL_ROWS)):
        rows = [(sentence(rng, i % 2), i % 2) for i in range(n)]
        _write_jsonl(os.path.join(HERE, "data", f"{split}.jsonl"), [{"text": s, "label": y} for s, y in rows])
        _write_jsonl(
            os.path.join(HERE, "chat", f"{split}.jsonl"),
            [{"messages": [{"role": "user", "content": s}, {"role": "assistant", "content": ANSWERS[y]}]}
             for s, y in rows],
        )  # fmt: skip
        _write_jsonl(
            os.path.join(HERE, "prompt-completion", f"{split}.jsonl"),
            [{"prompt": s, "completion": ANSWERS[y]} for s, y in rows],
        )
        _write_jsonl(
            os.path.join(HERE, "preference", f"{split}.jsonl"),
            [{"prompt": [{"role": "user", "content": s}],
              "chosen": [{"role": "assistant", "content": ANSWERS[y]}],
              "rejected": [{"role": "assistant", "content": ANSWERS[1 - y]}]} for s, y in rows],
        )  # fmt: skip
        _write_jsonl(
            os.path.join(HERE, "preference-plain", f"{split}.jsonl"),
            # a completion that follows the prompt as text starts with its separator (TRL concatenates the two)
            [{"prompt": s, "chosen": " " + ANSWERS[y], "rejected": " " + ANSWERS[1 - y]} for s, y in rows],
        )
        _write_jsonl(
            os.path.join(HERE, "prompts", f"{split}.jsonl"),
            [{"prompt": [{"role": "user", "content": s}], "answer": ANSWERS[y]} for s, y in rows],
        )


def _write_jsonl(path: str, rows: list[dict[str, object]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def vocab(specials: list[str], extra: list[str] | None = None) -> dict[str, int]:
    words = sorted(set(POSITIVE + NEGATIVE + NEUTRAL + (extra or [])))
    return {tok: i for i, tok in enumerate(specials + words)}


def save_tokenizer(
    directory: str,
    tokenizer: object,
    special: dict[str, str],
    model_max_length: int,
    input_names: list[str],
    *,
    chat_template: str | None = None,
) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=model_max_length, model_input_names=input_names, **special
    )
    if chat_template:
        fast.chat_template = chat_template
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


ROLES = ["<|system|>", "<|user|>", "<|assistant|>"]
ANSWERS = {0: "negative", 1: "positive"}
# Roles other than these are rejected by the template (raise_exception), as real templates do; assistant turns are
# wrapped in {% generation %} so the trainer can compute the loss on them only.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unsupported role ' + message['role']) }}{% endif %}"
    "{{ '<|' + message['role'] + '|> ' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + ' ' + eos_token }}"
    "{% endgeneration %}{% else %}{{ message['content'] + ' ' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}"
)


def write_gpt2(name: str = "gpt2", chat: bool = False) -> None:
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

    specials = ["<|endoftext|>", "<unk>"] + (ROLES if chat else [])
    v = vocab(specials, extra=list(ANSWERS.values()) if chat else [])
    tok = Tokenizer(models.WordLevel(v, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if chat:  # matched before pre-tokenization, so "<|user|>" stays one token
        tok.add_special_tokens([AddedToken(r, normalized=False) for r in ROLES])
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    save_tokenizer(
        d,
        tok,
        {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "unk_token": "<unk>"},
        128,
        ["input_ids", "attention_mask"],
        chat_template=CHAT_TEMPLATE if chat else None,
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


def write_llama(name: str = "llama-chat") -> None:
    """A Llama-architecture model (RMSNorm, rotary positions, SwiGLU, grouped-query attention) with gpt2-chat's
    tokenizer and template: the architecture the LLM paths (DPO, LoRA) are built for."""
    import shutil

    src, d = os.path.join(HERE, "gpt2-chat"), os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(os.path.join(src, f), os.path.join(d, f))
    with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
        gpt2 = json.load(f)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": gpt2["vocab_size"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "bos_token_id": gpt2["bos_token_id"],
        "eos_token_id": gpt2["eos_token_id"],
        "pad_token_id": gpt2["eos_token_id"],
    }
    with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    write_data()
    write_bert()
    write_gpt2()
    write_gpt2("gpt2-chat", chat=True)
    write_llama()
