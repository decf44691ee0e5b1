"""How long the planner's read of the calibration store takes as the store grows (issue 41: a 300 MB store took
``ftprof plan`` from ~7 s to ~117 s).

Writes a synthetic store of believable records (runs of CONFIGS configurations, each run as calibration.run_record
writes it, ~1.2 KB a line) to --mb MB, then times, in this process:
- before: every line parsed and returned (the reader before compaction), and the planner's speed look-ups
  (calibration.speed_rate for --lookups candidates) over all of them;
- the first calibration.load_records (checks every record, keeps the newest store.KEEP per configuration, rewrites
  the store without the rest), the second (reads the compacted store), and the same look-ups over what it returns.

    python benchmarks/store_scale.py [--mb 300] [--configs 200] [--lookups 60] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ftprof.plan import calibration, store  # noqa: E402

H200 = "NVIDIA H200"


def line(i: int, config: int) -> bytes:
    flops, tps = 7.8e9 * (1 + config % 5), 30_000.0 + (i * 7919) % 5000
    r = {"run_key": f"/scratch/runs/sweep-{config}/run-{i}@2026-01-01T00:00:00+00:00", "source": "run",
         "run_dir": f"/scratch/runs/sweep-{config}/run-{i}", "finished_at": "2026-01-01T00:00:00+00:00",
         "device_name": H200, "versions": {"torch": "2.9.0+cu128", "transformers": "4.57.1", "peft": "0.17.1",
                                           "bitsandbytes": "0.48.1", "ftprof_git_commit": "ca3d9b8" * 5},
         "model": f"llama-{1 + config % 5}b", "layers": 16, "method": "lora", "policy": "none",
         "checkpointed_layers": None, "kernels": "eager", "compile": True, "knobs": dict(calibration.DEFAULT_KNOBS),
         "seq_len": 1024 * (1 + config // 40 % 5), "batch_size": 1 + config // 5 % 8,
         "micro_batch_tokens": 2048 * (1 + config // 5 % 8),
         "grad_accum": 1, "world_size": 1, "parallel": None, "flops_per_token": flops,
         "recompute_flops_per_token": 0.0, "tokens_per_s": tps / (1 + config % 5), "flops_per_s": flops * tps /
         (1 + config % 5), "training_peak": (20 + i % 11) * 2**30,
         "prediction": {"peak_bytes": 28 * 2**30, "static_bytes": 10 * 2**30, "gradient_bytes": 2**30,
                        "activation_bytes": 16 * 2**30, "activation_factor": 1.0, "transient_bytes": 3 * 2**30,
                        "tokens_per_s": 31000.0, "device": H200, "memory_source": "2-layer probe of lora " * 4,
                        "speed_source": "local store: 20 runs on NVIDIA H200 (llama-1b lora none eager compiled)",
                        "candidate": {"grad_accum": 1, "batch_size": 4, "method": "lora", "checkpointing": "none"}},
         "gpu_busy": 0.97}
    return json.dumps(r, separators=(",", ":")).encode() + b"\n"


def lookups(records: list[dict], n: int) -> float:
    key = calibration.ClassKey("lora", "none", "eager", True)
    started = time.perf_counter()
    for i in range(n):
        calibration.speed_rate(H200, key, 7.8e9 * (1 + i % 5), 2048 * (1 + i % 8), records=records)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=300)
    parser.add_argument("--configs", type=int, default=200)
    parser.add_argument("--lookups", type=int, default=60, help="speed look-ups, as a plan makes one a candidate")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    path = Path(args.dir) / f"store-scale-{os.getpid()}.jsonl"
    try:
        with path.open("wb") as f:
            written, i = 0, 0
            while written < args.mb * 1e6:
                written += f.write(line(i, i % args.configs))
                i += 1
        print(f"store: {path}, {written / 1e6:.0f} MB, {i:,} records of {args.configs} configurations")

        started = time.perf_counter()
        raw = [json.loads(x) for x in path.read_bytes().splitlines() if x.strip()]
        before_read = time.perf_counter() - started
        before_look = lookups(raw, args.lookups)
        del raw
        print(f"before: read {before_read:.1f} s (every line), {args.lookups} speed look-ups {before_look:.1f} s")

        started = time.perf_counter()
        first = calibration.load_records(path)
        first_s = time.perf_counter() - started
        print(f"first load_records: {first_s:.1f} s ({len(first):,} records kept, store rewritten to "
              f"{path.stat().st_size / 1e6:.1f} MB)")
        started = time.perf_counter()
        second = calibration.load_records(path)
        second_s = time.perf_counter() - started
        after_look = lookups(second, args.lookups)
        assert second == first
        print(f"second load_records: {second_s:.2f} s; {args.lookups} speed look-ups {after_look:.2f} s "
              f"(KEEP={store.KEEP} per configuration)")
    finally:
        path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
