#!/usr/bin/env bash
# The lean halves (--lean-recompute with --offload-checkpoints: models/split_layer.py) on one GPU, short of time,
# from the repository root with the GPU machine's wheels in .whl and BEFORE a checkout of the commit before them:
#   benchmarks/split_halves.sh OUT BEFORE
# 1. their GPU tests (tests/gpu/test_gpu_fast_paths.py -k "offload and lean": losses against eager, LoRA gradients),
# 2. the 8 GiB cell of benchmarks/sweeps/split-halves.yaml with the halves, then whole layers from BEFORE (each
#    bench gets SWEEP_S seconds: the second cell, the 12 GiB row, runs where they leave it time),
# 3. with what is left, issue 38's top 5 at 40 GiB for llama-8b (benchmarks/plan_accuracy.sh top5, K=PLAN_K).
# Packs runs/ into OUT/split-halves.tgz (and OUT/top5.tgz).
set -u
out=${1:?output folder}
before=${2:?a checkout of the commit before the halves}
budget=${BUDGET_S:-570}
. "$(dirname "$0")/common.sh"  # left(), scratch in memory, runs/machine.txt
sweep=$PWD/benchmarks/sweeps/split-halves.yaml
timeout "${TESTS_S:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gpu_fast_paths.py \
  -k "offload and lean" > runs/pytest-gpu-split.log 2>&1
timeout -s INT "${SWEEP_S:-110}" python3 -m ftprof bench "$sweep" --output-dir runs/split-halves > runs/bench-split.log 2>&1
(cd "$before" && PYTHONPATH="$before:${PYTHONPATH:-}" timeout -s INT "${SWEEP_S:-110}" python3 -m ftprof bench "$sweep" \
  --output-dir "$OLDPWD/runs/before") > runs/bench-before.log 2>&1
python3 -m ftprof report runs/split-halves --baseline runs/before --format md > runs/report.md 2>&1
tar czf "$out/split-halves.tgz" --exclude='*.pt.trace.json.gz' --exclude='*.pickle' --exclude='*.safetensors' runs
if [ "$(left)" -gt 200 ]; then
  BUDGET_S=$(( $(left) - 10 )) MODEL=llama-8b BUDGETS="40:${PLAN_K:-2}" bash "$(dirname "$0")/plan_accuracy.sh" top5 "$out"
fi
echo "done in $(( $(date +%s) - t0 )) s"
