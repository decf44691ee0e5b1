#!/usr/bin/env bash
# Issue 39, round 24 on one H200, from the repository root, with the GPU machine's wheels in .whl:
#   benchmarks/traced_backward.sh OUT [BEFORE]
# First the GPU tests of the FP8 paths (TESTS=0: none), then benchmarks/sweeps/traced-backward.yaml (FP8's backward
# traced into compiled code); with BEFORE (a checkout of the commit before it), the same cells again from that
# checkout in the time left. Packs runs/ into OUT/traced-backward.tgz.
set -u
out=${1:?output folder}
before=${2:-}
budget=${BUDGET_S:-570}
. "$(dirname "$0")/common.sh"  # left(), scratch in memory, runs/machine.txt
[ "${TESTS:-1}" = 0 ] || timeout 230 python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/gpu/test_gpu_fast_paths.py -k "fp8" > runs/pytest-gpu-traced-backward.log 2>&1
timeout -s INT $(( $(left) - 200 )) python3 -m ftprof bench benchmarks/sweeps/traced-backward.yaml \
  --output-dir runs/traced-backward > runs/bench-traced-backward.log 2>&1
if [ -n "$before" ]; then  # in the sweep's order: the most host-bound cells first
  sweep=$PWD/benchmarks/sweeps/traced-backward.yaml
  (cd "$before" && PYTHONPATH="$before:${PYTHONPATH:-}" timeout -s INT $(( $(left) - 25 )) python3 -m ftprof bench \
    "$sweep" --output-dir "$OLDPWD/runs/before") > runs/bench-before.log 2>&1
fi
python3 -m ftprof report runs/traced-backward runs/before --format md > runs/report.md 2>&1
tar czf "$out/traced-backward.tgz" --exclude='*.pt.trace.json.gz' --exclude='*.pickle' --exclude='*.safetensors' runs
echo "done in $(( $(date +%s) - t0 )) s"
