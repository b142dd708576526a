"""Trainer throughput: eager vs ONNX Runtime (ORTTrainer) vs torch.compile, SDPA vs eager attention, side by side,
plus the overhead of the Prometheus metrics callback.

    python bench/trainer_throughput.py                       # CPU, the default model (BERT h256 x4, seq 128, batch 16)
    python bench/trainer_throughput.py --device cuda --hidden 768 --layers 12 --batch 64
    python bench/trainer_throughput.py --device cuda --model llama --hidden 2048 --layers 16 --seq 512 --batch 16 \
        --paths eager,compile

Every path trains the same randomly initialised model (fixed seed; BERT for sequence classification, or a
Llama-architecture decoder for causal LM) on the same synthetic batches (fixed length, so torch.compile sees one
shape) through the trainer's own acceleration factory (`finetune_trainer.accel`): the Hugging Face Trainer for
eager and compile, Optimum's ORTTrainer for ort. Paths: `eager` (the library's default attention: SDPA on the
current stack), `eager-attention` (eager with the non-SDPA attention), `compile`, `ort`, `eager+metrics`. A step is
forward + backward + AdamW (fused where torch has it for the device, as the trainer uses it; ort keeps
`adamw_torch`); the figure is the median of the measured steps after warm-up (export/compilation happen in warm-up).
On CUDA a throwaway eager run warms the GPU (clocks, cuBLAS autotuning) before the first timed path, which otherwise
runs ~1.3x slower than the same path run second. MFU = 6 x parameters x tokens/s / the device's peak
(`finetune_trainer.metrics.PEAK_FLOPS`). Where Optimum/ONNX Runtime training cannot be imported (e.g. Python 3.12
on a GPU machine) the ort path is skipped with a note.

Metrics overhead is measured two ways: (1) the cost of the callback's per-step work (including the collator's
token counting), timed directly over many calls, as a share of the eager median step; (2) path ``eager+metrics``:
one eager run with the metrics callback active on even steps only, comparing the median of even and odd steps
(an A/B under the same machine noise; still noisy at this scale).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.pop("WORLD_SIZE", None)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def build_model(args: argparse.Namespace, attn: str | None) -> Any:
    import transformers

    kwargs = {"attn_implementation": attn} if attn else {}
    if args.model == "llama":
        cfg = transformers.LlamaConfig(
            vocab_size=args.vocab,
            hidden_size=args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=max(1, args.hidden // 128),
            num_key_value_heads=max(1, args.hidden // 128),
            intermediate_size=args.intermediate or int(2.75 * args.hidden),
            max_position_embeddings=max(2048, args.seq),
        )
        transformers.set_seed(0)
        with _device_context(args):
            return transformers.AutoModelForCausalLM.from_config(cfg, **kwargs)
    cfg = transformers.BertConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        intermediate_size=4 * args.hidden,
        max_position_embeddings=max(512, args.seq),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
    )
    transformers.set_seed(0)
    with _device_context(args):
        return transformers.AutoModelForSequenceClassification.from_config(cfg, **kwargs)


def _device_context(args: argparse.Namespace) -> Any:
    """Build the model on the GPU directly (as the trainer does for initFromConfig): seconds saved per path."""
    import contextlib

    import torch

    return torch.device("cuda") if args.device == "cuda" else contextlib.nullcontext()


class Synthetic:
    """A fixed, map-style dataset of random token ids (same for every path)."""

    def __init__(self, n: int, seq: int, vocab: int, causal: bool = False) -> None:
        import torch

        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(5, vocab, (n, seq), generator=g)
        self.labels = self.ids.clone() if causal else torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


def run_path(name: str, args: argparse.Namespace, *, with_metrics: bool) -> dict[str, Any]:
    import torch
    from finetune_trainer import accel, compat
    from finetune_trainer.metrics import BatchCounter, MetricsCallback, TrainerMetrics, mfu, peak_flops
    from transformers import TrainerCallback, default_data_collator

    kind = {
        "eager": "none",
        "eager-attention": "none",
        "eager+metrics": "none",
        "ort": "ort",
        "compile": "compile",
        "gpu-warmup": "none",
    }[name]
    backend = accel.make_backend(kind)
    trainer_cls, args_cls = backend.classes()
    cuda = args.device == "cuda"
    times: list[float] = []
    metered: list[bool] = []

    class TimerStart(TrainerCallback):  # registered first: its on_step_begin runs before the metrics callback's
        def on_step_begin(self, a: Any, s: Any, c: Any, **k: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            timer_end.t0 = time.perf_counter()

    class TimerEnd(TrainerCallback):  # registered last: its on_step_end runs after the metrics callback's
        t0 = 0.0

        def on_step_end(self, a: Any, s: Any, c: Any, **k: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t0)

    class Alternating(TrainerCallback):
        """The metrics callback on even steps only: an A/B inside one run, under the same machine noise."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.on = True

        def on_train_begin(self, a: Any, s: Any, c: Any, **k: Any) -> None:
            self.inner.on_train_begin(a, s, c, **k)

        def on_step_begin(self, a: Any, s: Any, c: Any, **k: Any) -> None:
            self.on = s.global_step % 2 == 0
            metered.append(self.on)
            if self.on:
                self.inner.on_step_begin(a, s, c, **k)

        def on_step_end(self, a: Any, s: Any, c: Any, **k: Any) -> None:
            if self.on:
                self.inner.on_step_end(a, s, c, **k)

        def on_log(self, a: Any, s: Any, c: Any, **k: Any) -> None:
            self.inner.on_log(a, s, c, **k)

    timer_end = TimerEnd()
    precision = "bf16" if cuda and torch.cuda.is_bf16_supported() else ("fp16" if cuda else "fp32")
    with tempfile.TemporaryDirectory() as out:
        kwargs: dict[str, Any] = {
            "output_dir": out,
            "max_steps": args.warmup + args.steps,
            "per_device_train_batch_size": args.batch,
            "learning_rate": 1e-4,
            "save_strategy": "no",
            "report_to": [],
            "logging_steps": 10_000,
            "disable_tqdm": True,
            "optim": "adamw_torch_fused" if accel.fused_adamw_supported(args.device) else "adamw_torch",
            "bf16": precision == "bf16",
            "fp16": precision == "fp16",
            "use_cpu": not cuda,
            "dataloader_num_workers": 0,
            **backend.extra_args,
        }
        targs = args_cls(**compat.filter_supported(args_cls, kwargs))
        attn = "eager" if name == "eager-attention" else (backend.attn_implementation or args.attn or None)
        model = build_model(args, attn)
        attention = getattr(model.config, "_attn_implementation", None)
        params = sum(p.numel() for p in model.parameters())
        collator: Any = default_data_collator
        callbacks: list[Any] = [TimerStart()]
        if with_metrics:
            collator = BatchCounter(default_data_collator)
            metrics_cb = MetricsCallback(
                TrainerMetrics(namespace="bench", job="bench", node_rank=0), collator, nproc_per_node=1,
                launch_time=time.time(),
                params=params,
                peak_flops_per_device=float("nan"),
            )  # fmt: skip
            callbacks.append(Alternating(metrics_cb))
        callbacks.append(timer_end)
        data = Synthetic(args.batch * (args.warmup + args.steps), args.seq, args.vocab, causal=args.model == "llama")
        trainer = trainer_cls(model=model, args=targs, train_dataset=data, data_collator=collator, callbacks=callbacks)
        started = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - started
    measured = times[args.warmup :]
    step = statistics.median(measured)
    ab: dict[str, float] = {}
    if with_metrics:
        on = [t for t, m in zip(times[args.warmup :], metered[args.warmup :], strict=True) if m]
        off = [t for t, m in zip(times[args.warmup :], metered[args.warmup :], strict=True) if not m]
        ab = {
            "median_step_with_metrics_s": statistics.median(on),
            "median_step_without_metrics_s": statistics.median(off),
        }
    tokens_per_s = args.batch * args.seq / step
    peak = peak_flops(torch.cuda.get_device_name(0) if cuda else None, precision)
    return {
        **ab,
        "path": name,
        "acceleration": kind,
        "attention": attention,
        "optimizer": kwargs["optim"],
        "params": params,
        "mfu": mfu(params, tokens_per_s, peak, 1),
        "precision": precision,
        "median_step_s": step,
        "p90_step_s": sorted(measured)[int(0.9 * (len(measured) - 1))],
        "samples_per_s": args.batch / step,
        "tokens_per_s": tokens_per_s,
        "warmup_s": sum(times[: args.warmup]),
        "wall_s": wall,
    }


def callback_cost_us(calls: int = 20_000) -> float:
    """Mean wall time of the metrics callback's per-step work (on_step_begin + on_step_end + collator counting)."""
    import torch
    from finetune_trainer.metrics import BatchCounter, MetricsCallback, TrainerMetrics
    from transformers import TrainerControl, TrainerState

    batch = {
        "input_ids": torch.ones(16, 128, dtype=torch.long),
        "attention_mask": torch.ones(16, 128, dtype=torch.long),
    }
    counter = BatchCounter(lambda features: batch)
    cb = MetricsCallback(
        TrainerMetrics(namespace="b", job="b", node_rank=0), counter, nproc_per_node=1, launch_time=time.time(),
        params=10_000_000, peak_flops_per_device=312e12,
    )  # fmt: skip
    state, control = TrainerState(), TrainerControl()
    state.max_steps = calls + 1
    features = [{}] * 16
    start = time.perf_counter()
    for i in range(calls):
        counter(features)
        cb.on_step_begin(None, state, control)
        state.global_step = i + 1
        cb.on_step_end(None, state, control)
    return (time.perf_counter() - start) / calls * 1e6


def ort_available() -> str | None:
    """None when the ort path can run, else why not."""
    try:
        import onnxruntime.training  # noqa: F401
        import optimum.onnxruntime  # noqa: F401
    except Exception as e:
        return (
            f"ONNX Runtime training is not importable here ({type(e).__name__}: {e}); needs Python <= 3.11, torch 2.6"
        )
    from finetune_trainer.accel import ort_extensions_built

    if not ort_extensions_built():
        return "ORTModule's extensions are not built (see trainer-image/install.sh)"
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--paths", default="eager,eager-attention,eager+metrics,ort,compile")
    p.add_argument("--model", choices=["bert", "llama"], default="bert")
    p.add_argument("--intermediate", type=int, default=0, help="MLP width (llama; default 2.75 x hidden)")
    p.add_argument(
        "--gpu-warmup-steps", type=int, default=30, help="CUDA: steps of an untimed eager run before the first path"
    )
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--steps", type=int, default=15, help="measured steps per path")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured first steps (ORT export, compilation)")
    p.add_argument(
        "--attn", default="", help="attention for eager/compile paths (default: the library's, SDPA; ORT: eager)"
    )
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device visible", file=sys.stderr)
        return 2
    notes: list[str] = []
    results: list[dict[str, Any]] = []
    if args.device == "cuda" and args.gpu_warmup_steps > 0:
        warm = argparse.Namespace(**{**vars(args), "steps": args.gpu_warmup_steps, "warmup": 1})
        print(f"== GPU warm-up: {args.gpu_warmup_steps} untimed eager steps", flush=True)
        run_path("gpu-warmup", warm, with_metrics=False)
    for name in [x.strip() for x in args.paths.split(",") if x.strip()]:
        if name == "ort":
            why = ort_available()
            if why:
                notes.append(f"ort skipped: {why}")
                print(f"== ort: SKIPPED: {why}", flush=True)
                continue
        print(f"== {name} ...", flush=True)
        r = run_path(name, args, with_metrics=name == "eager+metrics")
        print(
            f"   median step {r['median_step_s']:.4f}s  {r['samples_per_s']:.1f} samples/s"
            f"  warm-up {r['warmup_s']:.1f}s",
            flush=True,
        )
        results.append(r)

    eager = next((r for r in results if r["path"] == "eager"), None)
    cost_us = callback_cost_us()
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else (platform.processor() or platform.machine())
    header = (
        f"device={args.device} ({device}, {os.cpu_count()} CPUs), torch {torch.__version__}, "
        f"Python {platform.python_version()}, "
        f"{'Llama' if args.model == 'llama' else 'BERT'} hidden {args.hidden} x {args.layers} layers, "
        f"seq {args.seq}, batch {args.batch}, "
        f"median of {args.steps} steps after {args.warmup} warm-up"
    )
    print("\n" + header)
    print("| path | attention | median step (s) | samples/s | tokens/s | MFU | vs eager | warm-up (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        ratio = eager["median_step_s"] / r["median_step_s"] if eager else float("nan")
        r["speed_vs_eager"] = ratio
        print(
            f"| {r['path']} | {r['attention']} | {r['median_step_s']:.4f} | {r['samples_per_s']:.1f} | "
            f"{r['tokens_per_s']:.0f} | {r['mfu']:.2f} | {ratio:.2f} | {r['warmup_s']:.1f} |"
        )
    overhead = {"callback_us_per_step": cost_us}
    if eager:
        overhead["callback_share_of_eager_step"] = cost_us * 1e-6 / eager["median_step_s"]
    with_m = next((r for r in results if r["path"] == "eager+metrics"), None)
    if with_m:
        overhead["with_vs_without_metrics"] = (
            with_m["median_step_with_metrics_s"] / with_m["median_step_without_metrics_s"] - 1
        )
    print(f"\nmetrics callback: {cost_us:.1f} us per step", end="")
    if "callback_share_of_eager_step" in overhead:
        print(f" = {100 * overhead['callback_share_of_eager_step']:.4f}% of the eager step", end="")
    if "with_vs_without_metrics" in overhead:
        print(
            f"; A/B in one run (metrics on even steps): {100 * overhead['with_vs_without_metrics']:+.2f}% median step",
            end="",
        )
    print()
    for n in notes:
        print(f"note: {n}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"setup": header, "results": results, "metrics_overhead": overhead, "notes": notes}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
