#!/usr/bin/env bash
# --lean-activations and --lean-norms (models/lean_mlp.py, lean_norm.py) on one GPU, from the repository root with
# the GPU machine's wheels in .whl:
#   benchmarks/lean_activations.sh OUT
# 1. their GPU tests (tests/gpu: their Triton kernels against eager's ops; the losses against eager for LoRA and
#    QLoRA, eager, Liger, compiled, CUDA graphs, partial checkpointing and FP8; the LoRA gradients; what a layer
#    keeps less, Liger and compiled), verbose so
#    that a run cut off by its time keeps the lines of the tests that finished,
# 2. benchmarks/sweeps/lean-activations.yaml (llama-8b QLoRA 4 x 2048, no checkpointing, CUDA graphs: with and
#    without it, 2 x 2 with the host's table, FP8) with what is left.
# SWEEP names another sweep (benchmarks/sweeps/lean-activations-eager.yaml: beside compiled HF MLPs), TESTS_K
# another test selection. Packs runs/ into OUT/lean-activations.tgz.
set -u
out=${1:?output folder}
budget=${BUDGET_S:-570}
. "$(dirname "$0")/common.sh"  # left(), scratch in memory, runs/machine.txt
export FTPROF_LEAN_KERNELS=${FTPROF_LEAN_KERNELS:-1}  # the lean ops' Triton kernels (models/lean_kernels.py); 0: torch ops
timeout "${TESTS_S:-200}" python3 -m pytest -m gpu -v -p no:cacheprovider -rA tests/gpu/test_gpu_lean_kernels.py \
  tests/gpu/test_gpu_fast_paths.py tests/gpu/test_gpu_memory_levers.py \
  -k "${TESTS_K:-kernels or lean-act or lean-norms or lean_activations}" \
  > runs/pytest-gpu-lean-act.log 2>&1
timeout -s INT $(( $(left) - 25 )) python3 -m ftprof bench "${SWEEP:-benchmarks/sweeps/lean-activations.yaml}" \
  --output-dir runs/lean-activations > runs/bench-lean-activations.log 2>&1
python3 -m ftprof report runs/lean-activations --format md > runs/report.md 2>&1
tar czf "$out/lean-activations.tgz" --exclude='*.pt.trace.json.gz' --exclude='*.pickle' --exclude='*.safetensors' runs
echo "done in $(( $(date +%s) - t0 )) s"
