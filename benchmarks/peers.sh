#!/usr/bin/env bash
# Issue 40's peer table on one H200, from the repository root, with the GPU machine's wheels beside it
# (../shared/tools/gpu-wheels.sh bnb hf fast peers: .whl and .whl-peers):
#   benchmarks/peers.sh OUT     (SWEEP=benchmarks/peers-budgets.yaml: issue 39's budgets instead of peers.yaml;
#                               PEER_TEST=0: without the GPU test of a peer cell)
# Installs ftprof's GPU packages and TRL into /tmp/site (bench's interpreter), Unsloth's stack into /tmp/peers with
# an interpreter wrapper (PEERS_PYTHON) that sees only it, runs benchmarks/peers.yaml, then the GPU test of a peer
# cell, and always ends by packing runs/ into OUT/peers.tgz. Keeps to BUDGET_S seconds; a rerun resumes the sweep.
set -u
out=${1:?output folder}
budget=${BUDGET_S:-560}
phase=peers
repo=$(pwd)
. "$(dirname "$0")/common.sh"  # left(), scratch in memory, runs/machine.txt
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$@"; }
pipi /tmp/site .whl/*.whl .whl-peers/{trl,datasets,multiprocess,dill}-*.whl > runs/pip-site.log 2>&1
pipi /tmp/peers .whl-peers/*.whl .whl/bitsandbytes-*.whl .whl/peft-*.whl .whl/ijson-*.whl > runs/pip-peers.log 2>&1
mkdir -p /tmp/peers-bin
printf '#!/bin/sh\nPYTHONPATH=/tmp/peers:%s exec python3 "$@"\n' "$repo" > /tmp/peers-bin/python
chmod +x /tmp/peers-bin/python
export PEERS_PYTHON=/tmp/peers-bin/python PYTHONPATH=/tmp/site:$repo UNSLOTH_DISABLE_STATISTICS=1 HF_HUB_OFFLINE=1
python3 -c 'import transformers, trl, peft, bitsandbytes; print("site:", transformers.__version__, trl.__version__)' \
  >> runs/machine.txt 2>&1
$PEERS_PYTHON -c 'import unsloth, transformers; print("peers: unsloth", unsloth.__version__, transformers.__version__)' \
  >> runs/machine.txt 2>&1
sweep=${SWEEP:-benchmarks/peers.yaml}; name=$(basename "$sweep" .yaml)
timeout -s INT $(( $(left) - ${TEST_S:-75} )) python3 -m ftprof bench "$sweep" --output-dir "runs/$name" \
  > "runs/bench-$name.log" 2>&1
python3 -m ftprof report "runs/$name" --format md > "runs/report-$name.log" 2>&1
if [ "${PEER_TEST:-1}" = 1 ] && [ "$(left)" -gt 50 ]; then
  timeout $(( $(left) - 15 )) python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gpu_peers.py \
    > runs/pytest-gpu-peers.log 2>&1
fi
tar czf "$out/$phase.tgz" --exclude='*.pt.trace.json.gz' --exclude='*.pickle' --exclude='*.safetensors' runs
echo "phase $phase done in $(( $(date +%s) - t0 )) s"
