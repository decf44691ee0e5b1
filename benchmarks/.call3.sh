t0=$(date +%s); left() { echo $(( ${1:-570} - ($(date +%s) - t0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH TMPDIR=/dev/shm FTPROF_CACHE_DIR=/dev/shm/ftprof-cache
mkdir -p runs; F=tests/gpu/test_gpu_fast_paths.py
timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider -rA "$F::test_fast_path_loss_matches_eager[compile-lora]" "$F::test_fast_path_loss_matches_eager[compile-qlora]" "$F::test_fast_path_loss_matches_eager[compile+liger-lora]" "$F::test_fast_path_loss_matches_eager[compile+liger-qlora]" "$F::test_fast_path_loss_matches_eager[compile+full-lora]" "$F::test_fast_path_loss_matches_eager[compile+full-qlora]" "$F::test_fast_path_loss_matches_eager[cudnn-lora]" "$F::test_fast_path_lora_gradients_match_eager[compile]" "$F::test_fast_path_lora_gradients_match_eager[compile+full]" > runs/pytest-fast.log 2>&1
tail -25 runs/pytest-fast.log; echo "t=$(( $(date +%s) - t0 ))"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/gpu/test_gpu_train.py -k "test_llama_1b_trains_on_gpu or test_quantized_bases_hold_less_weight_memory" > runs/pytest-train.log 2>&1
tail -12 runs/pytest-train.log; echo "t=$(( $(date +%s) - t0 ))"
timeout $(( $(left) - 110 )) python3 -m ftprof profile qlora --model llama-8b --batch-size 4 --seq-len 2048 --compile --prof-record-shapes --output-dir runs/profile --run-name qlora-compile --quiet > runs/profile.log 2>&1
cp runs/profile/*/profile/summary.md runs/profile-summary.md 2>/dev/null; tail -5 runs/profile.log; echo "t=$(( $(date +%s) - t0 ))"
for o in "" "--fsdp-cpu-offload"; do [ $(left) -gt 40 ] || break
  timeout $(( $(left) - 15 )) python3 -m torch.distributed.run --standalone --nproc-per-node 1 -m ftprof train full --model llama-1b --parallel fsdp $o --gradient-checkpointing --max-steps 6 --warmup-steps 2 --batch-size 4 --seq-len 1024 --device cuda --output-dir runs/fsdp --run-name "fsdp$o" --quiet > "runs/fsdp$o.log" 2>&1
  python3 -c "import json,sys;r=json.load(open('runs/fsdp/fsdp$o/result.json'));print('fsdp$o', r['status'], r.get('world_size'), r.get('tokens_per_s'), r.get('torch_peak_allocated'), r.get('error_message'))" 2>&1 | tail -1; done
tar czf $OUT/call3.tgz --exclude='*.pt.trace.json.gz' --exclude='*.pickle' runs; echo "total $(( $(date +%s) - t0 ))"
