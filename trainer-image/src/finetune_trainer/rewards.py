"""GRPO's reward functions: the built-in kinds a job names in ``spec.training.grpo.rewards`` (no code from the spec)
and functions the image itself holds.

Each reward is called by TRL's ``GRPOTrainer`` with the prompts, the completions and every other dataset column (a
list per column, one value per completion) and returns one score per completion; the trainer sums them with their
weights. The kinds:

- ``exactMatch``: 1 when the completion, stripped (and case-folded unless ``caseSensitive``), is the reference
  column's value, else 0;
- ``numericMatch``: 1 when the completion's last number equals the reference column's number within ``tolerance``
  (commas in numbers ignored), else 0 (also 0 when either has no number);
- ``regex``: 1 when ``pattern`` is found in the completion (``re.search``, with ``re.DOTALL``: anchor with ``^`` and
  ``$`` for a whole-completion format check), else 0;
- ``length``: 0 up to ``maxTokens`` completion tokens, then minus the share over it (-1 at twice the length);
- ``python``: ``package.module:function``, a function with TRL's reward signature in a module installed in the
  image (its site-packages or this package): a module found anywhere else (a volume, a path set in the
  environment) is refused, so a job's spec can never bring code;
- ``rewardModel``: the score (its one logit) a sequence-classification model gives the prompt followed by the
  completion (a conversation through its tokenizer's chat template when it has one). Weights only: safetensors, and
  ``trust_remote_code`` off, so a model directory on a volume is data, never code. Loaded on first use, on the
  rank's device, in inference mode.

A conversational completion (a list of messages) is scored on its last message's content.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import math
import os
import re
import sys
import sysconfig
from collections.abc import Callable, Iterator
from typing import Any

from finetune_trainer.config import Config, Reward
from finetune_trainer.errors import ConfigError

# A number: a minus sign only where it cannot be a range's or a word's hyphen ("2023-2024" ends with 2024), commas
# only as thousands separators ("1,204" is 1204; "1,2,3" ends with 3), never starting inside another number
NUMBER = re.compile(r"(?:(?<![\w.])-)?(?<![\d.])(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")


def completion_text(completion: Any) -> str:
    """A plain completion as is; a conversational one (a list of {role, content}) its last message's content."""
    if isinstance(completion, list):
        return str(completion[-1].get("content", "")) if completion else ""
    return str(completion)


def last_number(text: str) -> float | None:
    found = NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def _references(r: Reward, kwargs: dict[str, Any], n: int) -> list[Any]:
    values = kwargs.get(str(r.column))
    if values is None or len(values) != n:
        raise KeyError(f"reward {r.name!r}: column {r.column!r} did not reach the reward function")
    return list(values)


def exact_match(r: Reward) -> Callable[..., list[float]]:
    def fold(s: str) -> str:
        s = s.strip()
        return s if r.case_sensitive else s.casefold()

    def score(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        refs = _references(r, kwargs, len(completions))
        return [float(fold(completion_text(c)) == fold(str(ref))) for c, ref in zip(completions, refs, strict=True)]

    return score


def numeric_match(r: Reward) -> Callable[..., list[float]]:
    def score(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        refs = _references(r, kwargs, len(completions))
        out = []
        for c, ref in zip(completions, refs, strict=True):
            got = last_number(completion_text(c))
            want = float(ref) if isinstance(ref, int | float) else last_number(str(ref))
            out.append(float(got is not None and want is not None and math.isclose(got, want, abs_tol=r.tolerance)))
        return out

    return score


def regex(r: Reward) -> Callable[..., list[float]]:
    pattern = re.compile(str(r.pattern), re.DOTALL)

    def score(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        return [float(pattern.search(completion_text(c)) is not None) for c in completions]

    return score


def length(r: Reward) -> Callable[..., list[float]]:
    limit = int(r.max_tokens or 1)

    def score(prompts: list[Any], completions: list[Any], completion_ids: list[Any], **kwargs: Any) -> list[float]:
        return [-max(0, len(ids) - limit) / limit for ids in completion_ids]

    return score


REWARD_MODEL_MAX_TOKENS = (
    4096  # a scored prompt and completion, truncated on the left beyond this (or the model's bound)
)


def check_reward_model(path: str, field: str) -> None:
    """The directory holds a model config and safetensors weights (a pickled checkpoint could run code on load)."""
    if not os.path.isdir(path):
        raise ConfigError(field, f"{path!r} is not a directory; mount the reward model's directory and name it")
    names = os.listdir(path)
    if "config.json" not in names:
        raise ConfigError(field, f"{path!r} has no config.json: it is not a saved Hugging Face model")
    if "adapter_config.json" in names:
        raise ConfigError(
            field,
            f"{path!r} holds an adapter, which would load its base model from elsewhere; merge it into the model "
            "(lora.merge) and name the merged model's directory",
        )
    if not any(n.endswith(".safetensors") or n == "model.safetensors.index.json" for n in names):
        raise ConfigError(
            field,
            f"{path!r} holds no safetensors weights; only safetensors are loaded (a pickled checkpoint can run code): "
            "save it with save_pretrained(safe_serialization=True)",
        )


def _scored_text(prompt: Any, completion: Any, tokenizer: Any) -> str:
    """What the reward model reads: the conversation through its chat template when it has one, else the prompt's
    and the completion's text one after the other."""
    if isinstance(prompt, list) and getattr(tokenizer, "chat_template", None):
        reply = completion if isinstance(completion, list) else [{"role": "assistant", "content": str(completion)}]
        return str(tokenizer.apply_chat_template([*prompt, *reply], tokenize=False))
    said = " ".join(str(m.get("content", "")) for m in prompt) if isinstance(prompt, list) else str(prompt)
    return said + completion_text(completion)


def reward_model(r: Reward) -> Callable[..., list[float]]:
    loaded: dict[str, Any] = {}

    def load() -> dict[str, Any]:
        if not loaded:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            path = str(r.model)
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
            model = AutoModelForSequenceClassification.from_pretrained(
                path, num_labels=1, use_safetensors=True, trust_remote_code=False
            )
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
            if model.config.pad_token_id is None:  # the last token of each row is found through the padding
                model.config.pad_token_id = tokenizer.pad_token_id
            tokenizer.padding_side, tokenizer.truncation_side = "right", "left"
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
            # the model's own bound where it has one (a BERT- or GPT-2-based reward model reads 512 or 1024 positions)
            positions = getattr(model.config, "max_position_embeddings", None) or REWARD_MODEL_MAX_TOKENS
            limit = min(REWARD_MODEL_MAX_TOKENS, int(tokenizer.model_max_length or REWARD_MODEL_MAX_TOKENS), positions)
            loaded.update(
                tokenizer=tokenizer, model=model.to(device).eval(), device=device, torch=torch, max_tokens=limit
            )
        return loaded

    def score(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        m = load()
        texts = [_scored_text(p, c, m["tokenizer"]) for p, c in zip(prompts, completions, strict=True)]
        enc = m["tokenizer"](texts, return_tensors="pt", padding=True, truncation=True, max_length=m["max_tokens"]).to(
            m["device"]
        )
        with m["torch"].inference_mode():
            logits = m["model"](**enc).logits
        return [float(v) for v in logits[:, 0].float().tolist()]

    return score


def image_roots() -> list[str]:
    """Where a reward function's module may live: the interpreter's own libraries (the image's venv) and this
    package's directory."""
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("purelib", "platlib", "stdlib", "platstdlib") if paths.get(k)}
    roots.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return sorted(os.path.realpath(p) for p in roots)


def _inside(path: str, roots: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root + os.sep) for root in roots)


@contextlib.contextmanager
def _image_path_only() -> Iterator[None]:
    """While the block runs, imports search only the image's own directories: not the working directory (the first
    entry of ``sys.path`` under ``python -m``, a writable emptyDir in the pod) nor anything else a job could write to,
    so finding a reward's module (which imports its parent packages) runs no code from outside the image."""
    saved, roots = sys.path[:], image_roots()
    sys.path[:] = [p for p in saved if p and _inside(p, roots)]
    try:
        yield
    finally:
        sys.path[:] = saved


def _module_in_image(module: str, field: str) -> None:
    missing = (
        f"module {module!r} is not installed in this image (only the image's own packages are searched: not a volume, "
        "PYTHONPATH or the working directory); build an image that installs it"
    )
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        raise ConfigError(field, missing) from None
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        raise ConfigError(field, missing)
    origin = os.path.realpath(spec.origin)
    if not _inside(origin, image_roots()):
        raise ConfigError(
            field,
            f"module {module!r} is loaded from {origin}, outside the image's installed packages; reward functions "
            "run only from modules installed in the image (build an image that installs it)",
        )


def python_function(r: Reward, field: str) -> Callable[..., list[float]]:
    module, _, attr = str(r.function).partition(":")
    with _image_path_only():
        _module_in_image(module, field)
        try:
            loaded = importlib.import_module(module)
        except Exception as e:  # the module's own import failed: a broken image
            raise ConfigError(field, f"importing {module!r} failed: {type(e).__name__}: {e}") from None
    fn = getattr(loaded, attr, None)
    if not callable(fn):
        raise ConfigError(field, f"{module!r} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


BUILT_IN = {"exactMatch": exact_match, "numericMatch": numeric_match, "regex": regex, "length": length}


def functions(config: Config) -> list[Callable[..., list[float]]]:
    """The job's reward functions in its order, each named as its metrics are (``rewards/<name>/mean``)."""
    return scorers(config.training.grpo.rewards, "training.grpo.rewards")


def scorers(rewards: tuple[Reward, ...], field: str) -> list[Callable[..., list[float]]]:
    """Rewards (or the evaluation stage's metrics, ``field`` naming where they were set) as functions with TRL's
    reward signature, in their order, each carrying its name."""
    out = []
    for i, r in enumerate(rewards):
        if r.type == "python":
            fn = _named(python_function(r, f"{field}[{i}].function"))
        elif r.type == "rewardModel":
            check_reward_model(str(r.model), f"{field}[{i}].model")
            fn = reward_model(r)
        else:
            fn = BUILT_IN[r.type](r)
        fn.__name__ = r.name
        out.append(fn)
    return out


def _named(found: Callable[..., Any]) -> Callable[..., Any]:
    """A wrapper the job's name can be given (the image's function keeps its own), async where the function is (TRL
    awaits those)."""
    if inspect.iscoroutinefunction(found):

        async def call_async(*args: Any, **kwargs: Any) -> Any:
            return await found(*args, **kwargs)

        return call_async

    def call(*args: Any, **kwargs: Any) -> Any:
        return found(*args, **kwargs)

    return call


def check(config: Config, *, world_size: int) -> None:
    """Before any worker: every reward can be built (a python one's module is in the image) and the batch holds
    whole groups of generations."""
    functions(config)
    t = config.training
    per_step = t.per_device_batch_size * world_size * t.gradient_accumulation_steps
    g = t.grpo.num_generations
    if per_step % g:
        raise ConfigError(
            "training.grpo.numGenerations",
            f"each step generates perDeviceBatchSize * ranks * gradientAccumulationSteps = "
            f"{t.per_device_batch_size} * {world_size} * {t.gradient_accumulation_steps} = {per_step} completions, "
            f"which is not a whole number of groups of {g}; make it a multiple of numGenerations",
        )
