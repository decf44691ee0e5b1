#!/usr/bin/env bash
# The GPU runs behind BENCHMARKS.md, as run on the GPU machine (two H200s), from the repository root:
#   benchmarks/h200.sh targets OUT   # benchmarks/sweeps/h200-targets.yaml, then the HF Trainer + PEFT baselines
#   benchmarks/h200.sh classic OUT   # benchmarks/sweeps/mistral-7b-classic.yaml (1 and 2 GPUs)
# Each phase keeps to BUDGET_S seconds (the time limit of one run on the device) and always ends by packing its
# results, logs and profile summaries (not the traces) into OUT/PHASE.tgz; a rerun resumes the sweep where it stopped.
set -u
phase=${1:?phase: targets or classic}
out=${2:?output folder}
budget=${BUDGET_S:-540}
model=${BASELINE_MODEL:-llama-8b}
. "$(dirname "$0")/common.sh"  # left(), scratch in memory, runs/machine.txt

baseline_lane() {  # GPU, then methods: one HF Trainer baseline after another on that GPU
  local gpu=$1; shift
  for method in "$@"; do
    local t=$(( $(left) - 15 )); [ "$t" -gt 30 ] || return 0
    CUDA_VISIBLE_DEVICES=$gpu timeout "$t" python3 benchmarks/hf_baseline.py --method "$method" --model "$model" \
      --batch-size 4 --seq-len 2048 --max-steps 12 --measure-warmup-steps 4 --gradient-checkpointing \
      > "runs/hf_baseline_$method.out" 2> "runs/hf_baseline_$method.err"
    tail -1 "runs/hf_baseline_$method.out" | grep '^{' >> runs/hf_baseline.jsonl
  done
}

case $phase in
  targets)
    # Leave ~150 s for the four baselines (two lanes of two); the sweep resumes on a later run if cut short.
    timeout -s INT $(( $(left) - ${BASELINE_S:-150} )) python3 -m ftprof bench "${TARGETS:-benchmarks/sweeps/h200-targets.yaml}" \
      --output-dir runs/h200-targets > runs/bench-targets.log 2>&1
    baseline_lane 0 full qlora & baseline_lane 1 lora gptq-lora & wait ;;
  classic)
    timeout -s INT $(( $(left) - ${AFTER_S:-20} )) python3 -m ftprof bench "${CLASSIC:-benchmarks/sweeps/mistral-7b-classic.yaml}" \
      --output-dir runs/mistral-7b-classic > runs/bench-classic.log 2>&1
    # With the time left: finish an interrupted targets sweep (carried back in runs/), then the GPU tests that
    # check correctness on the device (bf16 GPTQ-LoRA gradients, the QLoRA profile artifacts, FSDP offload).
    if [ -f runs/h200-targets/sweep.json ] && [ "$(left)" -gt 80 ]; then
      timeout -s INT $(( $(left) - 20 )) python3 -m ftprof bench "${TARGETS:-benchmarks/sweeps/h200-targets.yaml}" \
        --output-dir runs/h200-targets > runs/bench-targets-resume.log 2>&1
    fi
    if [ "$(left)" -gt 80 ]; then
      tests=(tests/models tests/gpu/test_gpu_profile.py tests/gpu/test_gpu_distributed.py
             -k "bf16 or qlora_profile_on_gpu or offload")
      timeout $(( $(left) - 20 )) python3 -m pytest -m gpu -q -p no:cacheprovider "${tests[@]}" \
        > runs/pytest-gpu.log 2>&1
    fi ;;
  *) echo "unknown phase '$phase' (targets or classic)" >&2; exit 2 ;;
esac
for d in runs/*/; do [ -d "$d" ] && python3 -m ftprof report "$d" > "runs/report-$(basename "$d").log" 2>&1; done
tar czf "$out/$phase.tgz" --exclude='*.pt.trace.json.gz' --exclude='*.pickle' --exclude='*memory_timeline*' runs
echo "phase $phase done in $(( $(date +%s) - t0 )) s"
