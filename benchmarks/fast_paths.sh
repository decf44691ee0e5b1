#!/usr/bin/env bash
# The GPU runs behind BENCHMARKS.md's fast-paths table, on one H200, from the repository root:
#   benchmarks/fast_paths.sh tests OUT    # GPU tests: every fast path against eager (loss, gradients)
#   benchmarks/fast_paths.sh sweep OUT    # examples/fast-paths.yaml (resumes), then the HF + Liger baseline
#                                         # (SWEEP=benchmarks/sweeps/fast-paths-round2.yaml for another sweep)
#   benchmarks/fast_paths.sh numerics OUT # llama-1b LoRA loss per step: eager, compiled blocks, and compiled
#                                         # blocks with inductor emulating eager's bf16 rounding
#   benchmarks/fast_paths.sh profile OUT  # the fastest QLoRA configuration (llama-8b, compiled blocks, no
#                                         # checkpointing) profiled with shapes: where the time goes
#   benchmarks/fast_paths.sh ab OUT       # PROFILING.md's A/B example: llama-1b QLoRA with checkpointing,
#                                         # eager against --kernels liger, profiled with shapes, then diffed
# Each phase keeps to BUDGET_S seconds (the time limit of one run on the device) and always ends by packing its
# results into OUT/PHASE.tgz (no traces).
set -u
phase=${1:?phase: tests, sweep, numerics, profile or ab}
out=${2:?output folder}
budget=${BUDGET_S:-550}
. "$(dirname "$0")/common.sh"  # left(), scratch in memory, runs/machine.txt
case $phase in
  tests)
    timeout $(( $(left) - 20 )) python3 -m pytest -m gpu -q -p no:cacheprovider ${TESTS:-tests/gpu/test_gpu_fast_paths.py} \
      > runs/pytest-gpu-fast.log 2>&1 ;;
  sweep)
    sweep=${SWEEP:-examples/fast-paths.yaml}; name=$(basename "$sweep" .yaml)
    timeout -s INT $(( $(left) - ${BASELINE_S:-0} - 15 )) python3 -m ftprof bench "$sweep" \
      --output-dir runs/$name > runs/bench-$name.log 2>&1
    if [ "${BASELINE_S:-0}" -gt 0 ] && [ "$(left)" -gt 60 ]; then
      timeout $(( $(left) - 15 )) python3 benchmarks/hf_baseline.py --method qlora --model llama-8b --batch-size 4 \
        --seq-len 2048 --max-steps 12 --warmup-steps 4 --gradient-checkpointing --liger \
        > runs/hf_baseline_qlora_liger.out 2> runs/hf_baseline_qlora_liger.err
    fi
    python3 -m ftprof report runs/$name > runs/report-$name.log 2>&1 ;;
  numerics)
    common=(lora --model llama-1b --seq-len 512 --batch-size 2 --max-steps ${STEPS:-8} --warmup-steps 2 --lr 1e-4
            --device cuda --output-dir runs/numerics --quiet)
    timeout 120 python3 -m ftprof train "${common[@]}" --run-name eager > runs/numerics-eager.log 2>&1
    timeout 150 python3 -m ftprof train "${common[@]}" --run-name compile --compile > runs/numerics-compile.log 2>&1
    TORCHINDUCTOR_EMULATE_PRECISION_CASTS=1 timeout 150 python3 -m ftprof train "${common[@]}" --run-name compile-emulate \
      --compile > runs/numerics-compile-emulate.log 2>&1
    for r in eager compile compile-emulate; do echo "$r $(cut -d, -f2 runs/numerics/$r/steps.csv | tail -n +2 | tr '\n' ' ')"; done \
      > runs/numerics.txt ;;
  profile)
    timeout $(( $(left) - 30 )) python3 -m ftprof profile qlora --model llama-8b --batch-size 4 --seq-len 2048 \
      --compile ${PROFILE_ARGS:-} --prof-record-shapes --output-dir runs/profile --run-name qlora-compile --quiet \
      > runs/profile.log 2>&1
    cp runs/profile/*/profile/*summary*.md runs/ 2>/dev/null ;;
  ab)
    for k in eager liger; do
      timeout 150 python3 -m ftprof profile qlora --model llama-1b --batch-size 4 --seq-len 1024 --checkpointing full \
        --kernels $k --prof-record-shapes --output-dir runs/ab --run-name $k --quiet > runs/ab-$k.log 2>&1
    done
    timeout 120 python3 -m ftprof profile --summarize "$(ls -d runs/ab/liger/profile/cycle* | tail -1)" --baseline "$(ls -d runs/ab/eager/profile/cycle* | tail -1)" \
      > runs/ab-diff.txt 2>&1
    cp runs/ab/*/profile/*summary*.md runs/ 2>/dev/null ;;
  *) echo "unknown phase '$phase' (tests, sweep, numerics, profile or ab)" >&2; exit 2 ;;
esac
tar czf "$out/$phase.tgz" --exclude='*.pt.trace.json.gz' --exclude='*.pickle' runs
echo "phase $phase done in $(( $(date +%s) - t0 )) s"
