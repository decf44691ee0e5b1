#!/usr/bin/env bash
# ftprof plan's accuracy on one H200, from the repository root (BENCHMARKS.md "Predicting before training"):
#   SWEEP=benchmarks/sweeps/plan-accuracy-a.yaml benchmarks/plan_accuracy.sh sweep OUT
#       the cells, each recording the prediction it was given (shipped calibration only: FTPROF_CALIBRATION=off),
#       then ftprof report's "Prediction error" section and prediction_error.csv
#   benchmarks/plan_accuracy.sh budgets OUT
#       ftprof plan for QLoRA within 12 GiB and LoRA within 24 GiB, each with --verify 2: the picks, run under
#       the cap, predicted against measured
#   MODEL=llama-8b BUDGETS="24:5 16:3" [BATCH=4 SEQ=2048 TRAIN=1] benchmarks/plan_accuracy.sh top5 OUT
#       issue 38's targets as a user meets them (the machine's own calibration store learning as runs finish):
#       ftprof plan all timed alone the first time (probe included), then each GIB:K, --verify K (with TRAIN=1 the
#       first budget runs the one command from budget to training instead: --train, the top K timed, the full run
#       with the fastest measured); every run records its prediction
# Each phase keeps to BUDGET_S seconds and packs its results into OUT/PHASE.tgz.
set -u
phase=${1:?phase: sweep, budgets or top5}
out=${2:?output folder}
budget=${BUDGET_S:-550}
. "$(dirname "$0")/common.sh"  # left(), scratch in memory, runs/machine.txt
case $phase in
  sweep)
    export FTPROF_CALIBRATION=off
    sweep=${SWEEP:-benchmarks/sweeps/plan-accuracy-a.yaml}; name=$(basename "$sweep" .yaml)
    timeout -s INT $(( $(left) - 25 )) python3 -m ftprof bench "$sweep" --output-dir runs/$name \
      > runs/bench-$name.log 2>&1
    python3 -m ftprof report runs/$name --format md > runs/report-$name.log 2>&1 ;;
  budgets)
    export FTPROF_CALIBRATION=off
    common=(--model llama-8b --batch-size 4 --seq-len 2048 --max-steps 7 --measure-warmup-steps 3 --device cuda)
    /usr/bin/time -f "%e s" timeout $(( $(left) / 2 )) python3 -m ftprof plan qlora "${common[@]}" \
      --memory-limit-gib 12 --verify 2 --plan-dir runs/plan-qlora-12 > runs/plan-qlora-12.log 2>&1
    timeout $(( $(left) - 20 )) python3 -m ftprof plan lora "${common[@]}" --memory-limit-gib 24 --verify 1 \
      --plan-dir runs/plan-lora-24 > runs/plan-lora-24.log 2>&1 ;;
  top5)
    model=${MODEL:-llama-8b}; budgets=(${BUDGETS:-24:5 16:3})
    shape=(--model "$model" --batch-size "${BATCH:-4}" --seq-len "${SEQ:-2048}" --device cuda)
    /usr/bin/time -f "plan wall %e s" python3 -m ftprof plan all "${shape[@]}" --memory-limit-gib "${budgets[0]%%:*}" \
      --plan-dir runs/plan-time > runs/plan-time.log 2>&1
    for budget_k in "${budgets[@]}"; do
      gib=${budget_k%%:*}; k=${budget_k#*:}
      t=$(( $(left) - 25 )); [ "$t" -gt 60 ] || break
      dir=runs/plan-$model-${BATCH:-4}x${SEQ:-2048}-${gib}g
      if [ "${TRAIN:-0}" = 1 ] && [ "$budget_k" = "${budgets[0]}" ]; then
        timeout -s INT "$t" python3 -m ftprof plan all "${shape[@]}" --memory-limit-gib "$gib" --plan-dir "$dir" \
          --train --verify "$k" --trial-steps 7 --max-steps 20 --output-dir "runs/train-$model-${gib}g" > "$dir.log" 2>&1
      else
        timeout -s INT "$t" python3 -m ftprof plan all "${shape[@]}" --memory-limit-gib "$gib" --plan-dir "$dir" \
          --verify "$k" --max-steps ${STEPS:-11} --measure-warmup-steps 4 > "$dir.log" 2>&1
      fi
    done ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
find runs -name '*.pickle' -delete
find runs -path '*/profile/*' -name '*.json*' -delete
tar -czf "$out/$phase.tgz" runs
