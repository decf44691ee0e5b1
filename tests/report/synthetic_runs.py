"""Synthetic run directories of distinct configurations (config.json, env.json, result.json, steps.csv), as a sweep
of any size would leave them: for the report's scale tests and its timing script.

    python -m tests.report.synthetic_runs 1000 [DIR]   # make the runs, time `build_report` on them
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

from ftprof.config import RunConfig

GIB = 2**30
GRID = {"method": ("lora", "qlora", "full", "gptq-lora"), "batch_size": (1, 2, 4, 8, 16),
        "seq_len": (256, 512, 1024, 2048, 4096), "checkpointing": ("none", "full", "selective"),
        "kernels": ("eager", "liger"), "compile": (False, True), "grad_accum": (1, 2, 4, 8), "lr": (1e-4, 2e-4, 3e-4)}
_METHOD = {"full": (1.0, 60.0), "lora": (1.25, 20.0), "qlora": (0.8, 8.0), "gptq-lora": (0.7, 7.0)}


def cells(n: int) -> list[dict]:
    """The first ``n`` cells of the grid, the later options varying first (every cell distinct)."""
    keys = list(GRID)
    return [dict(zip(keys, values, strict=True)) for values in itertools.islice(itertools.product(*GRID.values()), n)]


def _result(cell: dict, device: str) -> dict:
    speed, weights = _METHOD[cell["method"]]
    tps = speed * 9000 * (cell["batch_size"] ** 0.3) * (0.75 if cell["checkpointing"] == "full" else 1.0) * \
        (1.3 if cell["compile"] else 1.0) * (1.1 if cell["kernels"] == "liger" else 1.0) * (1 + cell["lr"] * 100)
    acts = cell["batch_size"] * cell["seq_len"] / 512 * (0.2 if cell["checkpointing"] == "full" else 1.0) * GIB
    parts = {"weights_frozen": int(weights * GIB), "weights_trainable": int(0.2 * GIB), "gradients": int(0.2 * GIB),
             "optimizer_state": int(0.4 * GIB), "activations_saved": int(acts), "logits_gradients": int(GIB),
             "transients": int(2 * GIB)}
    peak = sum(parts.values())
    parts["training_peak"] = peak
    gpu = device == "cuda"
    return {"status": "ok", "device": device, "world_size": 1, "tokens_per_s": tps,
            "step_time_p50_s": 4096 / tps, "step_time_p90_s": 4096 / tps * 1.05,
            "torch_peak_allocated": peak if gpu else None, "torch_peak_reserved": peak + GIB if gpu else None,
            "nvml_process_used_peak": peak + 2 * GIB if gpu else None, "non_torch_overhead": GIB if gpu else None,
            "host_peak_rss": int(3 * GIB + weights * GIB), "memory_breakdown": parts}


def make_runs(root: Path, n: int, device: str = "cuda") -> Path:
    """``n`` run directories of distinct configurations under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    env = {"torch_threads": 16, "cpu_count": 16, "packages": {"torch": "2.9.0"},
           "gpus": [{"name": "NVIDIA H200", "total_memory": 150_000_000_000, "driver": "570.1"}] if device == "cuda"
           else []}
    for i, cell in enumerate(cells(n)):
        run = root / f"run{i:05d}"
        run.mkdir()
        config = RunConfig.from_flat({**cell, "model": "llama-8b", "device": device, "max_steps": 20})
        (run / "config.json").write_text(json.dumps(config.to_dict(), default=list))
        (run / "env.json").write_text(json.dumps(env))
        result = _result(cell, device)
        (run / "result.json").write_text(json.dumps(result))
        step = result["step_time_p50_s"]
        rows = [f"{s},{step * (1 + 0.01 * (s % 3)):.5f},4096,{s < 2}" for s in range(20)]
        (run / "steps.csv").write_text("step,step_time_s,tokens,warmup\n" + "\n".join(rows) + "\n")
    return root


def main(argv: list[str]) -> None:
    import tempfile

    from ftprof.report.build import build_report

    n = int(argv[0]) if argv else 1000
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(argv[1]) if len(argv) > 1 else Path(tmp) / "runs"
        make_runs(root, n)
        for formats in ("csv", "all"):
            start = time.perf_counter()
            build_report([root], Path(tmp) / f"report-{formats}", formats=formats)
            print(f"{n} runs, --format {formats}: {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
