#!/usr/bin/env bash
# The GPU runs behind BENCHMARKS.md's fast-paths table, on one H200, from the repository root:
#   benchmarks/fast_paths_session.sh tests OUT    # GPU tests: every fast path against eager (loss, gradients)
#   benchmarks/fast_paths_session.sh sweep OUT    # examples/fast-paths.yaml (resumes), then the HF + Liger baseline
#   benchmarks/fast_paths_session.sh ab OUT       # PROFILING.md's A/B example: llama-1b QLoRA with checkpointing,
#                                                 # eager against --kernels liger, profiled with shapes, then diffed
# Each phase keeps to BUDGET_S seconds (a device call's limit) and always ends by packing its results into
# OUT/PHASE.tgz (no traces).
set -u
phase=${1:?phase: tests or sweep}
out=${2:?output folder}
budget=${BUDGET_S:-550}
. "$(dirname "$0")/session_common.sh"  # left(), scratch in memory, runs/machine.txt
case $phase in
  tests)
    timeout $(( $(left) - 20 )) python3 -m pytest -m gpu -q -p no:cacheprovider ${TESTS:-tests/gpu/test_gpu_fast_paths.py} \
      > runs/pytest-gpu-fast.log 2>&1 ;;
  sweep)
    timeout -s INT $(( $(left) - ${BASELINE_S:-0} - 15 )) python3 -m ftprof bench examples/fast-paths.yaml \
      --output-dir runs/fast-paths > runs/bench-fast-paths.log 2>&1
    if [ "${BASELINE_S:-0}" -gt 0 ] && [ "$(left)" -gt 60 ]; then
      timeout $(( $(left) - 15 )) python3 benchmarks/hf_baseline.py --method qlora --model llama-8b --batch-size 4 \
        --seq-len 2048 --max-steps 12 --warmup-steps 4 --gradient-checkpointing --liger \
        > runs/hf_baseline_qlora_liger.out 2> runs/hf_baseline_qlora_liger.err
    fi
    python3 -m ftprof report runs/fast-paths > runs/report-fast-paths.log 2>&1 ;;
  ab)
    for k in eager liger; do
      timeout 150 python3 -m ftprof profile qlora --model llama-1b --batch-size 4 --seq-len 1024 --checkpointing full \
        --kernels $k --prof-record-shapes --output-dir runs/ab --run-name $k --quiet > runs/ab-$k.log 2>&1
    done
    timeout 120 python3 -m ftprof profile --summarize "$(ls -d runs/ab/liger/profile/cycle* | tail -1)" --baseline "$(ls -d runs/ab/eager/profile/cycle* | tail -1)" \
      > runs/ab-diff.txt 2>&1
    cp runs/ab/*/profile/*summary*.md runs/ 2>/dev/null ;;
  *) echo "unknown phase '$phase' (tests, sweep or ab)" >&2; exit 2 ;;
esac
tar czf "$out/$phase.tgz" --exclude='*.pt.trace.json.gz' --exclude='*.pickle' runs
echo "phase $phase done in $(( $(date +%s) - t0 )) s"
