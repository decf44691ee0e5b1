#!/usr/bin/env bash
# Issue 39, round 22 on one H200, from the repository root, with the GPU machine's wheels in .whl:
#   benchmarks/compiled_checkpoint.sh OUT [BEFORE]
# benchmarks/sweeps/compiled-checkpoint.yaml (full checkpointing with each layer compiled inside its checkpoint,
# FP8's quantization traced into compiled code); with BEFORE (a checkout of the commit before them), its 16-bit and
# FP8 full-checkpointing cells again from that checkout in the same call; then, in the time left (TESTS=0: none),
# the GPU tests of the compiled and FP8 paths. Packs runs/ into OUT/compiled-checkpoint.tgz.
set -u
out=${1:?output folder}
before=${2:-}
budget=${BUDGET_S:-570}
. "$(dirname "$0")/common.sh"  # left(), scratch in memory, runs/machine.txt
sweep=benchmarks/sweeps/compiled-checkpoint.yaml
timeout -s INT $(( $(left) - 60 )) python3 -m ftprof bench $sweep --output-dir runs/compiled-checkpoint \
  > runs/bench-compiled-checkpoint.log 2>&1
if [ -n "$before" ]; then
  cell=(qlora --model llama-8b --batch-size 4 --seq-len 2048 --max-steps 12 --measure-warmup-steps 4 --lora-r 16
        --lora-alpha 32 --lr 2e-4 --lr-scheduler-type constant --checkpointing full --kernels liger --compile --device cuda --quiet)
  for fp8 in "" --fp8-base; do
    (cd "$before" && PYTHONPATH="$before:${PYTHONPATH:-}" timeout -s INT 150 python3 -m ftprof train "${cell[@]}" $fp8 \
      --output-dir "$OLDPWD/runs/before") >> runs/train-before.log 2>&1
  done
fi
[ "${TESTS:-1}" = 0 ] || timeout $(( $(left) - 10 )) python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/gpu/test_gpu_fast_paths.py -k "compile+full or compile+partial or fp8" > runs/pytest-gpu-compiled-checkpoint.log 2>&1
python3 -m ftprof report runs/compiled-checkpoint runs/before --format md > runs/report.md 2>&1
tar czf "$out/compiled-checkpoint.tgz" --exclude='*.pt.trace.json.gz' --exclude='*.pickle' --exclude='*.safetensors' runs
echo "done in $(( $(date +%s) - t0 )) s"
