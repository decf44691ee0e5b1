#!/usr/bin/env bash
# Issue 39's levers on one H200, from the repository root, with the GPU machine's wheels in .whl:
#   benchmarks/memory_levers.sh graphs OUT     CUDA graphs with accumulation and --offload-embeddings: their GPU
#                                              tests, then
#                                              benchmarks/sweeps/graphs-accumulation.yaml (1 x 4 against 4 x 1)
#   benchmarks/memory_levers.sh snapshot OUT   what is live at the peak of the offloaded-checkpoint QLoRA run
#                                              (llama-8b 4 x 2048, Liger, compiled, EXTRA options, default
#                                              --offload-embeddings): benchmarks/snapshot_peak.py
#   benchmarks/memory_levers.sh fp8offload OUT where the time goes in the FP8 cell under full checkpointing with
#                                              the layer inputs and the table in host memory (9,740 tokens/s
#                                              against 11,037 in 16 bits, round 20), against FP8 without them:
#                                              ftprof profile of each
#   benchmarks/memory_levers.sh fp8partial OUT mistral-7b QLoRA 4 x 1536, FP8, partial checkpointing (16 and 12 of
#                                              32 layers, round 23's hold-out plan measured 13,620 and 17,523
#                                              tokens/s, NVML 70% and 87% busy) again, then ftprof profile of the
#                                              16-layer cell: where its time goes
#   benchmarks/memory_levers.sh auto OUT       the GPU test of --offload-embeddings, then --checkpointing auto
#                                              within 8 GiB (llama-8b QLoRA 4 x 2048, Liger, compiled): what it
#                                              chose (result.json's checkpointing_auto) and what it measured
#   benchmarks/memory_levers.sh microbatch OUT where micro-batch 1 x 4 loses to 4 x 1 at the same policy (FP8, CUDA
#                                              graphs: 16,240 against 21,211 tokens/s in round 25, issue 39 asks
#                                              for 90%): ftprof profile of each (kernel names survive graph replays);
#                                              MB_FLAGS replaces "--kernels liger --fp8-base --offload-embeddings"
# Each phase keeps to BUDGET_S seconds and packs runs/ into OUT/PHASE.tgz (no traces, no snapshots).
set -u
phase=${1:?phase: graphs, snapshot, fp8offload, fp8partial, microbatch or auto}
out=${2:?output folder}
budget=${BUDGET_S:-550}
. "$(dirname "$0")/common.sh"  # left(), scratch in memory, runs/machine.txt
case $phase in
  graphs)
    timeout $(( $(left) / 3 )) python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gpu_memory_levers.py \
      tests/gpu/test_gpu_fast_paths.py -k "accumulat or memory_levers" > runs/pytest-gpu-graphs.log 2>&1
    timeout -s INT $(( $(left) - 25 )) python3 -m ftprof bench benchmarks/sweeps/graphs-accumulation.yaml \
      --output-dir runs/graphs-accumulation > runs/bench-graphs-accumulation.log 2>&1
    python3 -m ftprof report runs/graphs-accumulation --format md > runs/report-graphs-accumulation.log 2>&1 ;;
  snapshot)
    timeout -s INT $(( $(left) - 30 )) python3 -m ftprof profile qlora --model llama-8b --batch-size 4 \
      --seq-len 2048 --max-steps 5 --checkpointing full --kernels liger --compile --offload-checkpoints \
      ${EXTRA:---offload-embeddings} --prof-wait-steps 2 --prof-warmup-steps 0 --prof-active-steps 1 --prof-memory-snapshot \
      --device cuda --output-dir runs/snapshot > runs/profile-snapshot.log 2>&1
    for s in $(find runs/snapshot -name 'memory_snapshot*.pickle'); do
      python3 benchmarks/snapshot_peak.py "$s" --top 40 > "runs/peak-$(basename "$s" .pickle).txt" 2>&1
      python3 benchmarks/snapshot_peak.py "$s" --top 40 --depth 6 > "runs/peak6-$(basename "$s" .pickle).txt" 2>&1
    done ;;
  fp8offload)
    cell=(qlora --model llama-8b --batch-size 4 --seq-len 2048 --max-steps 7 --checkpointing full --kernels liger
          --compile --fp8-base --prof-wait-steps 3 --prof-warmup-steps 1 --prof-active-steps 2 --device cuda)
    timeout -s INT 150 python3 -m ftprof profile "${cell[@]}" --offload-checkpoints --offload-embeddings \
      --output-dir runs/profile-fp8-offload > runs/profile-fp8-offload.log 2>&1
    timeout -s INT 150 python3 -m ftprof profile "${cell[@]}" --output-dir runs/profile-fp8 > runs/profile-fp8.log 2>&1
    ;;
  fp8partial)
    cell=(qlora --model mistral-7b --batch-size 4 --seq-len 1536 --checkpointing full --kernels liger --compile
          --fp8-base --device cuda)
    for layers in 16 12; do
      timeout -s INT 120 python3 -m ftprof train "${cell[@]}" --checkpoint-layers $layers --max-steps 11 \
        --measure-warmup-steps 4 --output-dir runs/fp8partial --quiet >> runs/train-fp8partial.log 2>&1
    done
    timeout -s INT $(( $(left) - 20 )) python3 -m ftprof profile "${cell[@]}" --checkpoint-layers 16 --max-steps 7 \
      --prof-wait-steps 3 --prof-warmup-steps 1 --prof-active-steps 2 --output-dir runs/profile-fp8partial \
      > runs/profile-fp8partial.log 2>&1 ;;
  microbatch)
    cell=(qlora --model llama-8b --seq-len 2048 --max-steps 7 --compile --compile-mode reduce-overhead
          ${MB_FLAGS:---kernels liger --fp8-base --offload-embeddings} --prof-wait-steps 3 --prof-warmup-steps 1
          --prof-active-steps 2 --device cuda)
    for shape in "1 4" "4 1"; do
      set -- $shape
      timeout -s INT $(( $(left) / 2 - 10 )) python3 -m ftprof profile "${cell[@]}" --batch-size "$1" --grad-accum "$2" \
        --output-dir "runs/profile-microbatch-$1x$2" > "runs/profile-microbatch-$1x$2.log" 2>&1
    done ;;
  auto)
    timeout $(( $(left) / 3 )) python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gpu_memory_levers.py \
      > runs/pytest-gpu-memory-levers.log 2>&1
    timeout -s INT $(( $(left) - 15 )) python3 -m ftprof train qlora --model llama-8b --batch-size 4 --seq-len 2048 \
      --max-steps 9 --measure-warmup-steps 3 --checkpointing auto --kernels liger --compile --memory-limit-gib 8 \
      --device cuda --output-dir runs/auto-8gib > runs/train-auto-8gib.log 2>&1 ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
tar czf "$out/$phase.tgz" --exclude='*.pt.trace.json.gz' --exclude='*.pickle' --exclude='*.safetensors' runs
echo "phase $phase done in $(( $(date +%s) - t0 )) s"
