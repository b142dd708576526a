#!/usr/bin/env bash
# GPU check in one script: on a machine with one NVIDIA GPU and the default trainer stack's packages (torch,
# transformers, accelerate, datasets, peft, trl, bitsandbytes, prometheus-client, jsonschema, pyyaml), from the
# repository root:
#
#   bash bench/gpu_check.sh                  # ~5-7 minutes on an H100/H200-class GPU (estimate)
#   OUT=/tmp/gpu-check bash bench/gpu_check.sh
#   GPU_CHECK_DEVICE=cpu bash bench/gpu_check.sh   # the same steps at toy sizes on a CPU (checks the script itself)
#   GPU_CHECK_ONLY=startup bash bench/gpu_check.sh # step 1 and the start-up figures only (about 3 minutes on a GPU)
#
# 1. `finetune run-local` of a decoder LLM job (Llama-architecture config, 0.82 B parameters, random init, 512-token
#    rows, batch 16, bf16, acceleration auto) on the GPU; rank 0's Prometheus endpoint is scraped mid-run and the
#    MFU gauge must be a number (not NaN); result.json's steady-state tokens/s is compared with the gauge.
#    Then the same job again on the same machine (a restart on a live node), each run's start-up by phase, and the
#    worker's imports by cumulative time.
# 2. bench/trainer_throughput.py (one process per model, a GPU warm-up before the first timed path): BERT-base
#    seq 128 batch 64 (eager with SDPA, eager attention, compile), batch 256 (eager, compile), and the decoder
#    (eager, compile).
# 3. LLM fine-tuning paths on the same decoder, saved to disk first (QLoRA quantizes pretrained weights): LoRA
#    (all-linear, merged at the end), QLoRA (4-bit base through bitsandbytes; on a CPU it must be refused, exit 78)
#    and FSDP, each through `finetune run-local`: loss, tokens/s and peak GPU memory from result.json, and whether
#    the checkpoint was sharded.
# 4. Liger's kernels against the model's own on the same decoder and settings (kernels: none, then liger; on a CPU
#    liger must be refused, exit 78): tokens/s, MFU and peak GPU memory side by side; and DPO (task dpo, LoRA) on
#    preference pairs built from the same words: loss, rewards, tokens/s and peak memory.
# Everything lands in $OUT (default /tmp/gpu-check): logs, result.json, the scrapes, one JSON per bench and
# summary.log. Exit status: non-zero when a step fails or the MFU gauge is NaN on the GPU.
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

# QLoRA and Liger ask for a GPU in the spec (the operator refuses them without one; run-local then uses the local GPU)
gpu_request=""
if [[ $DEVICE == cuda ]]; then
  gpu_request="  resources: {limits: {nvidia.com/gpu: 1}}"
fi
if [[ $DEVICE == cuda ]]; then
  hidden=2048 layers=16 seq=512 batch=16 steps=150 rows=4000
  bert=(--hidden 768 --layers 12) bert_steps=(--steps 20 --warmup 3) llm=(--hidden 2048 --layers 16 --seq 512)
  big_batch=256 llm_batch=16
else
  hidden=128 layers=2 seq=64 batch=4 steps=300 rows=400
  bert=(--hidden 64 --layers 2) bert_steps=(--steps 3 --warmup 1) llm=(--hidden 128 --layers 2 --seq 64)
  big_batch=8 llm_batch=4
fi

log "versions"
"$PY" - <<'PY' | tee "$OUT/versions.txt"
import platform, torch, transformers, accelerate
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"python {platform.python_version()} torch {torch.__version__} transformers {transformers.__version__} "
      f"accelerate {accelerate.__version__} cuda {torch.version.cuda} device {gpu}")
PY
if [[ $DEVICE == cuda ]]; then
  "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "no CUDA device visible to torch")'
fi

# --- 1. run-local of the decoder job, scraped mid-run ----------------------------------------------------------------
work="$OUT/llm"
rm -rf "$work" && mkdir -p "$work/model" "$work/data"
"$PY" - "$work" "$hidden" "$layers" "$seq" "$rows" <<'PY'
import json, random, shutil, sys
from pathlib import Path
import transformers
work, hidden, layers, seq, rows = Path(sys.argv[1]), *map(int, sys.argv[2:])
tok_dir = Path("examples/tiny/gpt2")
for f in tok_dir.iterdir():
    if f.name != "config.json":
        shutil.copy(f, work / "model" / f.name)
tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
cfg = transformers.LlamaConfig(
    vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=max(1, hidden // 128),
    num_key_value_heads=max(1, hidden // 128), intermediate_size=int(2.75 * hidden), max_position_embeddings=2048,
    bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
cfg.save_pretrained(work / "model")
words = [w for w in tok.get_vocab() if w.isalpha()][:2000] or ["token"]
rng = random.Random(0)
with open(work / "data" / "train.jsonl", "w") as f:
    for _ in range(rows):  # rows longer than maxSeqLength: every row is truncated to a full one
        f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(seq * 2))}) + "\n")
(work / "pairs").mkdir()
with open(work / "pairs" / "train.jsonl", "w") as f:  # DPO: a long prompt, two different responses
    for _ in range(rows):
        prompt = " ".join(rng.choice(words) for _ in range(seq // 2))
        chosen, rejected = (" " + " ".join(rng.choice(words) for _ in range(seq // 4)) for _ in range(2))
        f.write(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected}) + "\n")
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
    learningRate: 0.0003
    maxSeqLength: $seq
    checkpointEverySteps: 100000
    extraArgs: {logging_steps: 10}
  acceleration: auto
  nodes: 1
  output: {claimName: output}
EOF
log "run-local: Llama ${hidden}x${layers}, seq $seq, batch $batch, $steps steps, acceleration auto"
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
  sleep 0.5
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
if device == "cuda" and math.isnan(mfu):
    sys.exit("MFU gauge is NaN on the GPU (device missing from PEAK_FLOPS?)")
PY

# --- 1b. start-up: the same job started again on the same machine (a restart on a live node: warm page cache and
# kernel caches), and where a worker's imports spend their time ------------------------------------------------------
log "run-local again: a restart on the same machine"
"$PY" -m finetune_operator.cli run-local "$work/job.yaml" --workdir "$work/out2" > "$work/run-local-2.log" 2>&1 \
  || { tail -40 "$work/run-local-2.log"; log "second run-local failed"; exit 1; }
"$PY" - "$work" <<'PY' | tee -a "$OUT/summary.log"
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
for name in ("out", "out2"):
    r = json.loads(next((work / name).rglob("result.json")).read_text())
    print(f"start-up ({name}): time to first step {r['time_to_first_step_seconds']:.1f} s = {r['startup']} + first "
          f"step {r['warmup_seconds']:.1f} s; workers {r.get('workers')}; steady {r['tokens_per_second']:,.0f} tokens/s")
PY
"$PY" -X importtime -c "import finetune_trainer.worker, transformers, trl, peft, datasets" 2> "$OUT/importtime.txt" || true
"$PY" - "$OUT/importtime.txt" <<'PY' | tee -a "$OUT/summary.log"
import sys
rows = []
for line in open(sys.argv[1]):
    parts = line.split("|")
    if len(parts) == 3 and parts[1].strip().isdigit():
        rows.append((int(parts[1]), parts[2].rstrip()))
total = max((c for c, _ in rows), default=0)
print(f"imports: {len(rows)} modules; the costliest cumulative (us): " + "; ".join(
    f"{name.strip()} {c / 1e6:.2f}s" for c, name in sorted(rows, reverse=True)[:14] if name.count(".") == 0
    or name.strip().startswith("finetune_trainer")))
PY
if [[ ${GPU_CHECK_ONLY:-} == startup ]]; then
  log "done (GPU_CHECK_ONLY=startup) in $(( $(date +%s) - start ))s"
  exit 0
fi

# --- 2. throughput bench, side by side within each process --------------------------------------------------------------
bench() {
  local name=$1; shift
  log "bench $name: $*"
  "$PY" bench/trainer_throughput.py --device "$DEVICE" --json "$OUT/bench-$name.json" "$@" > "$OUT/bench-$name.log" 2>&1 \
    || { tail -30 "$OUT/bench-$name.log"; exit 1; }
  sed -n '/^device=/,$p' "$OUT/bench-$name.log" | tee -a "$OUT/summary.log"
}
bench bert-b64 "${bert[@]}" "${bert_steps[@]}" --seq 128 --batch 64 --paths eager,eager-attention,compile
bench bert-b256 "${bert[@]}" "${bert_steps[@]}" --seq 128 --batch "$big_batch" --paths eager,compile
bench llama "${llm[@]}" "${bert_steps[@]}" --model llama --batch "$llm_batch" --paths eager,compile
# --- 3. LoRA, QLoRA, FSDP ---------------------------------------------------------------------------------------------
"$PY" - "$work" <<'PY'
import sys
from pathlib import Path
import torch, transformers
work = Path(sys.argv[1])
cfg = transformers.AutoConfig.from_pretrained(work / "model")
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
model.save_pretrained(work / "saved")
transformers.AutoTokenizer.from_pretrained(work / "model").save_pretrained(work / "saved")
PY
llm_job() {  # name, extra training settings (YAML flow style), [task], [dataset]
  local name=$1 extra=$2 task=${3:-causal-lm} dataset=${4:-"{path: /workspace/data, textField: text}"} rc=0
  cat > "$work/job-$name.yaml" <<EOF
apiVersion: finetune.dev/v1alpha1
kind: FineTuneJob
metadata:
  name: gpu-check-$name
  annotations:
    finetune.dev/run-local-mounts: "/workspace=."
spec:
  task: $task
  model: {path: /workspace/saved}
  dataset: $dataset
  training: {maxSteps: $(( steps / 3 )), perDeviceBatchSize: $batch, learningRate: 0.0002, maxSeqLength: $seq,
             checkpointEverySteps: $(( steps / 3 )), extraArgs: {logging_steps: 5}, $extra}
  acceleration: auto
  nodes: 1
  output: {claimName: output}
$gpu_request
EOF
  log "run-local $name: $extra"
  "$PY" -m finetune_operator.cli run-local "$work/job-$name.yaml" --workdir "$work/out-$name" \
    > "$work/run-local-$name.log" 2>&1 || rc=$?
  "$PY" - "$work/out-$name" "$name" "$rc" "$DEVICE" <<'PY' | tee -a "$OUT/summary.log"
import json, sys
from pathlib import Path
out, name, rc, device = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
if name in ("qlora", "liger") and device != "cuda":
    print(f"{name}: exit {rc} on CPU (expected 78: refused before training)")
    sys.exit(0 if rc == 78 else 1)
if rc != 0:
    sys.exit(f"{name}: run-local failed with exit {rc}; see run-local-{name}.log")
r = json.loads(next(out.rglob("result.json")).read_text())
ckpts = sorted(out.rglob("checkpoint-*"))
sharded = bool(ckpts) and (ckpts[-1] / "pytorch_model_fsdp_0").is_dir()
adapter = (r.get("model") or {}).get("adapter") or {}
print(f"{name}: {r['steps']} steps, loss {r['loss_history'][0][1]:.3f} -> {r['final_loss']:.3f}, "
      f"{(r['tokens_per_second'] or 0):,.0f} tokens/s, peak GPU memory {r.get('gpu_memory_peak_gib')} GiB, "
      f"adapter {adapter.get('method')}, merged {r['model']['merged']}, sharded checkpoint {sharded}, "
      f"acceleration {r['acceleration']}, kernels {r.get('kernels')} ({r.get('kernels_reason')})")
if r.get("dpo"):
    print(f"{name}: rewards {r['dpo']['rewards']}")
PY
}
llm_job lora "lora: {r: 16, alpha: 32, targetModules: [all-linear], merge: true}"
llm_job qlora "lora: {r: 16, alpha: 32, targetModules: [all-linear], quantization: 4bit}, activationCheckpointing: true"
llm_job fsdp "sharding: fsdp, activationCheckpointing: true"
# --- 4. Liger against the model's own kernels; DPO ----------------------------------------------------------------------
llm_job kernels-none "kernels: none"
llm_job liger "kernels: liger"
llm_job dpo "lora: {r: 16, alpha: 32, targetModules: [all-linear]}, dpo: {beta: 0.1}" dpo \
  "{path: /workspace/pairs, promptField: prompt, chosenField: chosen, rejectedField: rejected}"
log "done in $(( $(date +%s) - start ))s; summary: $OUT/summary.log"
