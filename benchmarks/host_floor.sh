#!/usr/bin/env bash
# The runs behind the planner's host side (ftprof/plan/host.py) and the micro-batch comparison, on one H200, from
# the repository root:
#   benchmarks/host_floor.sh OUT     # benchmarks/sweeps/host-floor.yaml, then benchmarks/sweeps/micro-batch.yaml
# Keeps to BUDGET_S seconds (one device run) and always ends by packing runs/ into OUT/host-floor.tgz (no traces);
# a rerun resumes each sweep where it stopped.
set -u
out=${1:?output folder}
budget=${BUDGET_S:-560}
phase=host-floor
. "$(dirname "$0")/common.sh"  # left(), scratch in memory, runs/machine.txt
timeout -s INT $(( $(left) - ${MICRO_S:-250} )) python3 -m ftprof bench benchmarks/sweeps/host-floor.yaml \
  --output-dir runs/host-floor > runs/bench-host-floor.log 2>&1
timeout -s INT $(( $(left) - 25 )) python3 -m ftprof bench benchmarks/sweeps/micro-batch.yaml \
  --output-dir runs/micro-batch > runs/bench-micro-batch.log 2>&1
for d in runs/host-floor runs/micro-batch; do
  python3 -m ftprof report "$d" > "runs/report-$(basename "$d").log" 2>&1
done
tar czf "$out/$phase.tgz" --exclude='*.pt.trace.json.gz' --exclude='*.pickle' runs
