# Sourced by the GPU scripts (fast_paths.sh, h200.sh): the time budget of one device run (left), scratch space in
# memory when it is roomy (16-bit checkpoints, GPTQ's cache), and machine.txt (GPU, driver, package
# versions) beside the results.
# Expects $budget (seconds) and $out; writes runs/.
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
mkdir -p runs "$out"
if [ "$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)" -gt 60000000 ] 2>/dev/null; then
  export TMPDIR=/dev/shm FTPROF_CACHE_DIR=${FTPROF_CACHE_DIR:-/dev/shm/ftprof-cache}
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 - <<'PY'
import importlib.metadata as meta
import importlib.util as util

packages = ("torch", "transformers", "peft", "bitsandbytes", "gptqmodel", "liger-kernel")
print(", ".join(f"{p} {meta.version(p)}" for p in packages if util.find_spec(p.replace("-", "_"))))
PY
  df -h /dev/shm /tmp | tail -2; } > runs/machine.txt 2>&1
