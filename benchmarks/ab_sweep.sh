#!/usr/bin/env bash
# One sweep before and after a change, in one call on one H200, from the repository root, with the GPU machine's
# wheels in .whl:
#   SWEEP=benchmarks/sweeps/NAME.yaml [TESTS=-k-expression|0] benchmarks/ab_sweep.sh OUT [BEFORE]
# First the GPU tests of tests/gpu/test_gpu_fast_paths.py matching TESTS (default the FP8 ones: "fp8 or e4m3 or
# transpos"; 0: none) for at most TESTS_S seconds (default 230), then the sweep;
# with BEFORE (a checkout of the commit before the change), the same cells again from that checkout in the time
# left, in the sweep's order. Packs runs/ into OUT/NAME.tgz.
set -u
out=${1:?output folder}
before=${2:-}
sweep=${SWEEP:?SWEEP=the sweep file}
name=$(basename "$sweep" .yaml)
budget=${BUDGET_S:-570}
. "$(dirname "$0")/common.sh"  # left(), scratch in memory, runs/machine.txt
tests=${TESTS:-fp8 or e4m3 or transpos}
[ "$tests" = 0 ] || timeout "${TESTS_S:-230}" python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/gpu/test_gpu_fast_paths.py -k "$tests" > "runs/pytest-gpu-$name.log" 2>&1
timeout -s INT $(( $(left) - 200 )) python3 -m ftprof bench "$sweep" --output-dir "runs/$name" \
  > "runs/bench-$name.log" 2>&1
if [ -n "$before" ]; then
  sweep=$PWD/$sweep
  (cd "$before" && PYTHONPATH="$before:${PYTHONPATH:-}" timeout -s INT $(( $(left) - 25 )) python3 -m ftprof bench \
    "$sweep" --output-dir "$OLDPWD/runs/before") > runs/bench-before.log 2>&1
fi
python3 -m ftprof report "runs/$name" $([ -d runs/before ] && echo --baseline runs/before) --format md > runs/report.md 2>&1  # (two sides as paths would pool as repeats)
tar czf "$out/$name.tgz" --exclude='*.pt.trace.json.gz' --exclude='*.pickle' --exclude='*.safetensors' runs
echo "done in $(( $(date +%s) - t0 )) s"
