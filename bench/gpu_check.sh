#!/usr/bin/env bash
# GPU check in one script: on a machine with one NVIDIA GPU and the default trainer stack's packages (torch,
# transformers, accelerate, datasets, peft, trl, liger-kernel, bitsandbytes, prometheus-client, jsonschema, pyyaml),
# from the repository root:
#
#   bash bench/gpu_check.sh                        # every row, about 8.6 minutes on an H100/H200 (the budgets below)
#   OUT=/tmp/gpu-check bash bench/gpu_check.sh
#   GPU_CHECK_DEVICE=cpu bash bench/gpu_check.sh   # the same rows at toy sizes on a CPU (checks the script itself;
#                                                  # tests/trainer/test_gpu_check.py runs it in CI)
#   GPU_CHECK_ONLY=startup bash bench/gpu_check.sh # row 1 and where the worker's imports spend their time
#
# The rows that matter come first, and each prints its line as it ends:
# 1. `finetune run-local` of a decoder LLM job (Llama-architecture config, 0.82 B parameters, random init, 512-token
#    rows, batch 16, bf16, acceleration and kernels auto) on the GPU: rank 0's Prometheus endpoint scraped mid-run
#    (the MFU gauge must be a number), result.json's steady tokens/s against the gauge, start-up by phase, and what
#    auto picked (on a GPU it must be Liger's kernels for this run: the table's choice for 16 s of eager work).
# 2. In one process that imports the stack once (bench/gpu_rows.py; every row a child forked from it, so a row pays
#    its data, model and training, not the imports): the decoder saved to disk and trained with the model's own
#    kernels, with Liger's, compiled, and compiled with Liger's (the four cells of the auto table's decoder row, in
#    one harness; the pair has no measurement yet); a Llama-3-8B-shaped model (random init, no weights) with LoRA on
#    every linear layer; DPO with LoRA; QLoRA (4-bit base; through run-local, as the only row that needs
#    bitsandbytes; a CPU must refuse it, exit 78, as it must Liger's kernels); FSDP. Each: tokens/s, MFU, peak GPU
#    memory, loss, what auto picked.
# 3. The BERT-base throughput bench, eager against compile, side by side in one process (the table's BERT row).
# Sizes and steps are chosen from the H200 figures of 2026-12-04 (docs/benchmarks.md) so that every row fits its
# budget (BUDGET below, seconds, printed beside each row's time): 8.6 minutes in all, start-up included.
# Everything lands in $OUT (default /tmp/gpu-check): logs, result.json files, the scrapes, one JSON per bench and
# summary.log. Exit status: non-zero when a row fails, or on a GPU when the MFU gauge is NaN or auto did not pick
# what its table says.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD/operator:$PWD/trainer-image/src${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu-check}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
mkdir -p "$OUT"
rm -f "$OUT/summary.log"
start=$(date +%s)
log() { echo "[gpu_check +$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/summary.log"; }

# every row asks for the GPU (the operator refuses QLoRA and Liger's kernels without a request; run-local then uses the
# local GPU); on a CPU the trainer itself must then refuse those two, exit 78, finding no GPU
gpu_request="  resources: {limits: {nvidia.com/gpu: 1}}"
if [[ $DEVICE == cuda ]]; then
  hidden=2048 layers=16 seq=512 batch=16 steps=120 row_steps=40 rows=1200 grpo_steps=10
  big=(--hidden 4096 --layers 32 --heads 32 --kv-heads 8 --intermediate 14336 --vocab 128256) big_seq=1024 big_batch=4
  big_steps=20
  bert=(--hidden 768 --layers 12) bench_steps=(--steps 20 --warmup 3)
else
  hidden=128 layers=2 seq=64 batch=4 steps=300 row_steps=10 rows=200 grpo_steps=4
  big=(--hidden 256 --layers 2 --heads 4 --kv-heads 2 --intermediate 512 --vocab 4096) big_seq=128 big_batch=2
  big_steps=4
  bert=(--hidden 64 --layers 2) bench_steps=(--steps 3 --warmup 1)
fi
# seconds per row on an H100/H200, from the 2026-12-04 figures: start-up (row 1 only: launcher, imports, process
# group), data and model (~7 s a forked row), warm-up (compile 40 s), steps x tokens / the measured tokens/s
# (QLoRA: a run-local of its own, so its start-up too)
declare -A BUDGET=([setup]=30 [auto]=70 [kernels-none]=19 [liger]=21 [compile]=57 [compile-liger]=61 [llama8b-lora]=35
  [dpo]=30 [grpo]=45 [qlora]=70 [fsdp]=35 [bench-bert]=45)
total_budget=0; for v in "${BUDGET[@]}"; do total_budget=$(( total_budget + v )); done

log "versions"
"$PY" - <<'PY' | tee "$OUT/versions.txt"
import platform, torch
from importlib.metadata import PackageNotFoundError, version
def v(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"python {platform.python_version()} torch {torch.__version__} cuda {torch.version.cuda} device {gpu}; "
      + ", ".join(f"{n} {v(n)}" for n in ("transformers", "accelerate", "peft", "trl", "datasets", "liger-kernel",
                                           "bitsandbytes", "triton")))
PY
if [[ $DEVICE == cuda ]]; then
  "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "no CUDA device visible to torch")'
fi

# --- 1. run-local of the decoder job, scraped mid-run ----------------------------------------------------------------
work="$OUT/llm"
rm -rf "$work" && mkdir -p "$work/model" "$work/data"
log "setup: the decoder's and the 8 B model's configs, the data"
"$PY" - "$work" "$hidden" "$layers" "$seq" "$rows" "${big[@]}" <<'PY'
import argparse, json, random, shutil, sys
from pathlib import Path
import transformers
work, hidden, layers, seq, rows = Path(sys.argv[1]), *map(int, sys.argv[2:6])
p = argparse.ArgumentParser()
for name in ("hidden", "layers", "heads", "kv-heads", "intermediate", "vocab"):
    p.add_argument(f"--{name}", type=int)
big = p.parse_args(sys.argv[6:])
tok_dir = Path("examples/tiny/gpt2")
tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
for name, cfg in [
    ("model", transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=max(1, hidden // 128),
        num_key_value_heads=max(1, hidden // 128), intermediate_size=int(2.75 * hidden), max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)),
    # Llama-3-8B's shape (its vocabulary too: the embedding and the head are 1 B of its 8 B parameters); the rows'
    # tokens come from the small tokenizer, every id of which lies inside the larger vocabulary
    ("big", transformers.LlamaConfig(
        vocab_size=big.vocab, hidden_size=big.hidden, num_hidden_layers=big.layers, num_attention_heads=big.heads,
        num_key_value_heads=big.kv_heads, intermediate_size=big.intermediate, max_position_embeddings=8192,
        rope_theta=500000.0, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)),
]:
    (work / name).mkdir(exist_ok=True)
    for f in tok_dir.iterdir():
        if f.name != "config.json":
            shutil.copy(f, work / name / f.name)
    cfg.save_pretrained(work / name)
words = [w for w in tok.get_vocab() if w.isalpha()][:2000] or ["token"]
rng = random.Random(0)
with open(work / "data" / "train.jsonl", "w") as f:
    for _ in range(rows):  # rows longer than maxSeqLength (the 8 B row's too): every row is truncated to a full one
        f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(seq * 4))}) + "\n")
(work / "pairs").mkdir()
with open(work / "pairs" / "train.jsonl", "w") as f:  # DPO: a long prompt, two different responses
    for _ in range(rows):
        prompt = " ".join(rng.choice(words) for _ in range(seq // 2))
        chosen, rejected = (" " + " ".join(rng.choice(words) for _ in range(seq // 4)) for _ in range(2))
        f.write(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected}) + "\n")
(work / "prompts").mkdir()
with open(work / "prompts" / "train.jsonl", "w") as f:  # GRPO: a prompt and a number its rewards check
    for i in range(rows):
        prompt = " ".join(rng.choice(words) for _ in range(seq // 4))
        f.write(json.dumps({"prompt": prompt, "answer": str(i % 10)}) + "\n")
PY
cat > "$work/job.yaml" <<EOF
apiVersion: finetune.dev/v1alpha1
kind: FineTuneJob
metadata:
  name: gpu-check
  annotations:
    finetune.dev/run-local-mounts: "/workspace=."
spec:
  task: causal-lm
  model: {path: /workspace/model, initFromConfig: true}
  dataset: {path: /workspace/data, textField: text}
  training:
    maxSteps: $steps
    perDeviceBatchSize: $batch
    kernels: auto
    learningRate: 0.0003
    maxSeqLength: $seq
    checkpointEverySteps: 100000
    extraArgs: {logging_steps: 10}
  acceleration: auto
  nodes: 1
  output: {claimName: output}
EOF
log "row auto: run-local, Llama ${hidden}x${layers}, seq $seq, batch $batch, $steps steps, acceleration and kernels auto (budget ${BUDGET[auto]} s)"
"$PY" -m finetune_operator.cli run-local "$work/job.yaml" --workdir "$work/out" > "$work/run-local.log" 2>&1 &
runner=$!
scrape() { "$PY" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("http://127.0.0.1:9400/metrics", timeout=2).read().decode())' 2>/dev/null; }
value() { awk -v n="$1" '$1 ~ "^"n"\\{" {print $2}' "$2" | head -n1; }
mid=""
for _ in $(seq 1 600); do
  if ! kill -0 "$runner" 2>/dev/null; then break; fi
  if scrape > "$work/scrape.txt" && [[ "$(value finetune_train_steps_total "$work/scrape.txt")" =~ ^[0-9.]+$ ]] \
     && awk -v s="$(value finetune_train_steps_total "$work/scrape.txt")" -v t="$steps" 'BEGIN {exit !(s >= t / 2)}'; then
    cp "$work/scrape.txt" "$work/scrape-mid.txt"; mid=yes; break
  fi
  sleep 0.2
done
rc=0; wait "$runner" || rc=$?
[[ $rc == 0 ]] || { tail -40 "$work/run-local.log"; log "run-local failed (exit $rc)"; exit 1; }
[[ -n $mid ]] || { log "no mid-run scrape of 127.0.0.1:9400"; exit 1; }
"$PY" - "$work" "$DEVICE" <<'PY' | tee -a "$OUT/summary.log"
import json, math, sys
from pathlib import Path
from prometheus_client.parser import text_string_to_metric_families
work, device = Path(sys.argv[1]), sys.argv[2]
g = {s.name: s.value for f in text_string_to_metric_families((work / "scrape-mid.txt").read_text()) for s in f.samples}
r = json.loads(next((work / "out").rglob("result.json")).read_text())  # <workdir>/output/<namespace>/<job>/
mfu, gauge_tps = g["finetune_train_mfu_ratio"], g["finetune_train_tokens_per_second"]
print(f"run-local: acceleration {r['acceleration']} ({r['acceleration_reason']}), attention {r['attention']}, "
      f"optimizer {r['optimizer']}, precision {r['precision']}, params {r['params'] / 1e9:.2f} B")
print(f"run-local: mid-run gauges: MFU {mfu:.3f}, {gauge_tps:,.0f} tokens/s; result.json {r['tokens_per_second']:,.0f} "
      f"tokens/s (ratio {r['tokens_per_second'] / gauge_tps:.2f}); time to first step "
      f"{r['time_to_first_step_seconds']:.1f} s (warm-up step {r['warmup_seconds']:.1f} s, start-up {r['startup']})")
print(f"run-local: kernels {r['kernels']}; MFU at the steady rate {r.get('mfu')}; peak GPU memory "
      f"{r.get('gpu_memory_peak_gib')} GiB; workers {r.get('workers')}")
if device == "cuda" and math.isnan(mfu):
    sys.exit("MFU gauge is NaN on the GPU (device missing from PEAK_FLOPS?)")
if device == "cuda" and (r["acceleration"], r["kernels"]) != ("none", "liger"):
    sys.exit(f"auto picked {r['acceleration']} with kernels {r['kernels']}, not the table's Liger for this run")
PY

# where a worker's imports spend their time: what every start of a pod pays once (a restart in place pays none)
if [[ ${GPU_CHECK_ONLY:-} == startup ]]; then
  "$PY" -X importtime -c "import finetune_trainer.worker, transformers, trl, peft, datasets" 2> "$OUT/importtime.txt" || true
  "$PY" - "$OUT/importtime.txt" <<'PY' | tee -a "$OUT/summary.log"
import sys
rows = []
for line in open(sys.argv[1]):
    parts = line.split("|")
    if len(parts) == 3 and parts[1].strip().isdigit():
        rows.append((int(parts[1]), parts[2].rstrip()))
print(f"imports: {len(rows)} modules; the costliest cumulative (us): " + "; ".join(
    f"{name.strip()} {c / 1e6:.2f}s" for c, name in sorted(rows, reverse=True)[:14] if name.count(".") == 0
    or name.strip().startswith("finetune_trainer")))
PY
  log "done (GPU_CHECK_ONLY=startup) in $(( $(date +%s) - start ))s"
  exit 0
fi

# --- 2. the rows that share one process --------------------------------------------------------------------------------
"$PY" - "$work" "$DEVICE" <<'PY'
import sys
from pathlib import Path
import torch, transformers
work, device = Path(sys.argv[1]), sys.argv[2]
cfg = transformers.AutoConfig.from_pretrained(work / "model")
torch.manual_seed(0)
with torch.device(device):  # a GPU initialises the 0.82 B decoder at once; the CPU would take tens of seconds
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
model.save_pretrained(work / "saved")
transformers.AutoTokenizer.from_pretrained(work / "model").save_pretrained(work / "saved")
PY
mkdir -p "$work/rows"
row() {  # name, acceleration, extra training settings (YAML flow style), [task], [dataset], [model], [steps, batch, seq]
  local name=$1 accel=$2 extra=$3 task=${4:-causal-lm} dataset=${5:-"{path: /workspace/data, textField: text}"}
  local model=${6:-"{path: /workspace/saved}"} n=${7:-$row_steps} b=${8:-$batch} len=${9:-$seq}
  cat > "$work/rows/job-$name.yaml" <<EOF
apiVersion: finetune.dev/v1alpha1
kind: FineTuneJob
metadata:
  name: gpu-check-$name
  annotations:
    finetune.dev/run-local-mounts: "/workspace=.."
spec:
  task: $task
  model: $model
  dataset: $dataset
  training: {maxSteps: $n, perDeviceBatchSize: $b, learningRate: 0.0002, maxSeqLength: $len,
             checkpointEverySteps: $n, extraArgs: {logging_steps: 5}, $extra}
  acceleration: $accel
  nodes: 1
  output: {claimName: output}
$gpu_request
EOF
}
names=(kernels-none liger)
row kernels-none auto "kernels: none"
row liger auto "kernels: liger"
if [[ $DEVICE == cuda ]]; then  # compile alone and the pair (on a CPU, compile is the BERT bench's to check)
  row compile compile "kernels: none"
  row compile-liger compile "kernels: liger"
  names+=(compile compile-liger)
fi
row llama8b-lora auto "lora: {r: 16, alpha: 32, targetModules: [all-linear]}" causal-lm "" \
  "{path: /workspace/big, initFromConfig: true}" "$big_steps" "$big_batch" "$big_seq"
row dpo auto "lora: {r: 16, alpha: 32, targetModules: [all-linear]}, dpo: {beta: 0.1}" dpo \
  "{path: /workspace/pairs, promptField: prompt, chosenField: chosen, rejectedField: rejected}"
# GRPO: generation (transformers' generate, 64 tokens, 4 completions a prompt) and training, rollout and training
# tokens/s; a random model earns no reward to speak of: the row measures speed
row grpo auto "lora: {r: 16, alpha: 32, targetModules: [all-linear]}, grpo: {numGenerations: 4, maxCompletionLength: \
64, rewards: [{type: numericMatch, column: answer}, {type: length, maxTokens: 32}]}" grpo \
  "{path: /workspace/prompts, promptField: prompt}" "" "$grpo_steps"
row qlora auto "lora: {r: 16, alpha: 32, targetModules: [all-linear], quantization: 4bit}, activationCheckpointing: true"
row fsdp auto "sharding: fsdp, activationCheckpointing: true"
names+=(llama8b-lora dpo grpo qlora fsdp)
budgets=() manifests=()
for name in "${names[@]}"; do budgets+=(--budget "$name=${BUDGET[$name]}"); done
for name in "${names[@]}"; do manifests+=("$work/rows/job-$name.yaml"); done
log "rows in one process: ${names[*]}"
rc=0
"$PY" bench/gpu_rows.py --out "$work" --device "$DEVICE" --separate qlora "${budgets[@]}" "${manifests[@]}" \
  | tee -a "$OUT/summary.log" \
  || rc=$?
[[ $rc == 0 ]] || { log "a row failed (exit $rc)"; exit 1; }

# --- 3. the BERT-base throughput bench, side by side in one process ------------------------------------------------------
bench() {
  local name=$1; shift
  log "bench $name (budget ${BUDGET[bench-$name]} s): $*"
  "$PY" bench/trainer_throughput.py --device "$DEVICE" --json "$OUT/bench-$name.json" "$@" > "$OUT/bench-$name.log" 2>&1 \
    || { tail -30 "$OUT/bench-$name.log"; exit 1; }
  sed -n '/^device=/,$p' "$OUT/bench-$name.log" | tee -a "$OUT/summary.log"
}
bench bert "${bert[@]}" "${bench_steps[@]}" --seq 128 --batch 64 --paths eager,compile
log "done in $(( $(date +%s) - start ))s (budget on a GPU: $total_budget s); summary: $OUT/summary.log"
