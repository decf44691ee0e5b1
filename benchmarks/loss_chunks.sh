#!/usr/bin/env bash
# Liger's fused loss with ftprof's chunks (models/kernels.py: up to LOSS_CHUNK_TOKENS tokens) against Liger's own
# (64 tokens at micro-batch 1 x 2048 for llama-8b), on one GPU, from the repository root with the GPU machine's
# wheels in .whl:
#   benchmarks/loss_chunks.sh OUT
# 1. benchmarks/liger_loss_chunks.py: the loss alone, forward and backward, for each chunk budget;
# 2. llama-8b QLoRA r=16, 4 x 2048 tokens a step, Liger, CUDA graphs, no checkpointing: the 12 GiB cell (1 x 4, both
#    lean options, the host's embedding table) and 4 x 1, each with CHUNKS (default "2048 0": ftprof's, Liger's);
# 3. the GPU tests of Liger's loss and norms beside eager, with what is left.
# Packs runs/ into OUT/loss-chunks.tgz.
set -u
out=${1:?output folder}
budget=${BUDGET_S:-560}
. "$(dirname "$0")/common.sh"  # left(), scratch in memory, runs/machine.txt
python3 benchmarks/liger_loss_chunks.py > runs/liger-loss-chunks.txt 2>&1
cell=(qlora --model llama-8b --seq-len 2048 --max-steps 12 --measure-warmup-steps 4 --lora-r 16 --kernels liger
      --compile --compile-mode reduce-overhead --checkpointing none --device cuda --memory-logging all --quiet)
for shape in "1 4 --lean-activations --lean-norms --offload-embeddings" "4 1"; do
  set -- $shape
  for chunks in ${CHUNKS:-2048 0}; do
    [ "$(left)" -gt 100 ] || break
    FTPROF_LOSS_CHUNK_TOKENS=$chunks timeout -s INT $(( $(left) - 20 )) python3 -m ftprof train "${cell[@]}" \
      --batch-size "$1" --grad-accum "$2" "${@:3}" --output-dir "runs/loss-chunks-$chunks" \
      >> runs/train-loss-chunks.log 2>&1
  done
done
for chunks in ${CHUNKS:-2048 0}; do
  python3 -m ftprof report "runs/loss-chunks-$chunks" --format md > "runs/report-$chunks.md" 2>&1
done
[ "$(left)" -gt 60 ] && timeout $(( $(left) - 15 )) python3 -m pytest -m gpu -v -p no:cacheprovider -rA \
  tests/gpu/test_gpu_memory_levers.py tests/gpu/test_gpu_fast_paths.py -k "liger" > runs/pytest-gpu-liger.log 2>&1
tar czf "$out/loss-chunks.tgz" --exclude='*.pt.trace.json.gz' --exclude='*.pickle' --exclude='*.safetensors' runs
echo "done in $(( $(date +%s) - t0 )) s"
