#!/usr/bin/env bash
# Issue 39, round 23 on one H200, from the repository root, with the GPU machine's wheels in .whl:
#   benchmarks/traced_fp8.sh OUT [BEFORE]
# benchmarks/sweeps/traced-fp8.yaml (FP8's ops traced into compiled code); with BEFORE (a checkout of the commit
# before them), its two checkpointed cells again from that checkout in the same call; then, in the time left
# (TESTS=0: none), the GPU tests of the FP8 paths. Packs runs/ into OUT/traced-fp8.tgz.
set -u
out=${1:?output folder}
before=${2:-}
budget=${BUDGET_S:-570}
. "$(dirname "$0")/common.sh"  # left(), scratch in memory, runs/machine.txt
timeout -s INT $(( $(left) - 60 )) python3 -m ftprof bench benchmarks/sweeps/traced-fp8.yaml \
  --output-dir runs/traced-fp8 > runs/bench-traced-fp8.log 2>&1
if [ -n "$before" ]; then
  cell=(qlora --model llama-8b --batch-size 4 --seq-len 2048 --max-steps 12 --measure-warmup-steps 4 --lora-r 16
        --lora-alpha 32 --lr 2e-4 --lr-scheduler-type constant --checkpointing full --kernels liger --compile
        --fp8-base --device cuda --quiet)
  for levers in "" "--offload-checkpoints --offload-embeddings"; do
    (cd "$before" && PYTHONPATH="$before:${PYTHONPATH:-}" timeout -s INT 150 python3 -m ftprof train "${cell[@]}" \
      $levers --output-dir "$OLDPWD/runs/before") >> runs/train-before.log 2>&1
  done
fi
[ "${TESTS:-1}" = 0 ] || timeout $(( $(left) - 10 )) python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/gpu/test_gpu_fast_paths.py -k "fp8" > runs/pytest-gpu-traced-fp8.log 2>&1
python3 -m ftprof report runs/traced-fp8 runs/before --format md > runs/report.md 2>&1
tar czf "$out/traced-fp8.tgz" --exclude='*.pt.trace.json.gz' --exclude='*.pickle' --exclude='*.safetensors' runs
echo "done in $(( $(date +%s) - t0 )) s"
