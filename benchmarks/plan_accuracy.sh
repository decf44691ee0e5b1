#!/usr/bin/env bash
# ftprof plan's accuracy on one H200, from the repository root (BENCHMARKS.md "Predicting before training"):
#   SWEEP=benchmarks/sweeps/plan-accuracy-a.yaml benchmarks/plan_accuracy.sh sweep OUT
#       the cells, each recording the prediction it was given (shipped calibration only: FTPROF_CALIBRATION=off),
#       then ftprof report's "Prediction error" section and prediction_error.csv
#   benchmarks/plan_accuracy.sh budgets OUT
#       ftprof plan for QLoRA within 12 GiB and LoRA within 24 GiB, each with --verify 2: the picks, run under
#       the cap, predicted against measured
# Each phase keeps to BUDGET_S seconds and packs its results into OUT/PHASE.tgz.
set -u
phase=${1:?phase: sweep or budgets}
out=${2:?output folder}
budget=${BUDGET_S:-550}
. "$(dirname "$0")/common.sh"  # left(), scratch in memory, runs/machine.txt
export FTPROF_CALIBRATION=off
case $phase in
  sweep)
    sweep=${SWEEP:-benchmarks/sweeps/plan-accuracy-a.yaml}; name=$(basename "$sweep" .yaml)
    timeout -s INT $(( $(left) - 25 )) python3 -m ftprof bench "$sweep" --output-dir runs/$name \
      > runs/bench-$name.log 2>&1
    python3 -m ftprof report runs/$name --format md > runs/report-$name.log 2>&1 ;;
  budgets)
    common=(--model llama-8b --batch-size 4 --seq-len 2048 --max-steps 7 --measure-warmup-steps 3 --device cuda)
    /usr/bin/time -f "%e s" timeout $(( $(left) / 2 )) python3 -m ftprof plan qlora "${common[@]}" \
      --memory-limit-gib 12 --verify 2 --plan-dir runs/plan-qlora-12 > runs/plan-qlora-12.log 2>&1
    timeout $(( $(left) - 20 )) python3 -m ftprof plan lora "${common[@]}" --memory-limit-gib 24 --verify 1 \
      --plan-dir runs/plan-lora-24 > runs/plan-lora-24.log 2>&1 ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
find runs -name '*.pickle' -delete
find runs -path '*/profile/*' -name '*.json*' -delete
tar -czf "$out/$phase.tgz" runs
