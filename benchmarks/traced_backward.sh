#!/usr/bin/env bash
# Issue 39, round 24 on one H200 (benchmarks/ab_sweep.sh with the FP8 GPU tests and
# benchmarks/sweeps/traced-backward.yaml, FP8's backward traced into compiled code):
#   benchmarks/traced_backward.sh OUT [BEFORE]
SWEEP=benchmarks/sweeps/traced-backward.yaml exec "$(dirname "$0")/ab_sweep.sh" "$@"
