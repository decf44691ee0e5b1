"""ftprof plan's accuracy on configurations it was not calibrated with: each H200 configuration in the shipped
calibration predicted from the others (leave one configuration out), on this machine's CPU, no GPU needed.

    python benchmarks/plan_holdout.py [--by configuration|sweep] [--csv OUT.csv] [--model llama-8b] [--only-fp8]

The split: for each one-GPU speed row of ftprof/plan/shipped_calibration.json, every measurement of that
configuration (its speed row, its memory row and any host-floor row of the same configuration) is removed from the
shipped calibration, and the planner predicts it from what is left, with no local store (FTPROF_CALIBRATION=off),
as a user's first plan would. Other shapes, micro-batches and policies of the same class stay: they are what the
planner scales from. With ``--by sweep`` every row of the measurement file the row came from is held out too (the
sweep or plan check that measured it: its neighbours at that shape, on that machine, with that day's code): the
stricter split, a configuration as a new sweep meets it. Errors are signed, (predicted - measured) / measured: +
predicted above measured. Memory is the training peak of torch's allocator (the memory rows' ``training_peak``),
where the shipped memory row of the configuration exists.

Prints a Markdown table per row and the medians and worst errors overall and by model and FP8; probes each model
once per method family on the CPU (about a minute each, cached like ftprof plan's).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.shipped_calibration import CONFIGURATION  # noqa: E402 - what makes rows one configuration
from ftprof.config import declarations  # noqa: E402
from ftprof.plan import calibration  # noqa: E402

# The options ftprof plan varies: a row with others off their defaults is a configuration plan never proposes
PLANNED = {d.name for d in declarations.DECLARED if d.planner_values}
# a memory row names no sequence or batch, only the micro-batch's tokens
MEMORY_CONFIGURATION = ("device_name", "model", "method", "policy", "checkpointed_layers", "kernels", "compile",
                        "micro_batch_tokens")


def speed_identity(row: dict) -> str:
    """A speed (or host) row's configuration, as benchmarks/shipped_calibration.py tells repeats apart."""
    return json.dumps([row.get(k) for k in CONFIGURATION] + [sorted(row["knobs"].items())])


def memory_identity(row: dict) -> str:
    return json.dumps([row.get(k) for k in MEMORY_CONFIGURATION] + [sorted(row["knobs"].items())])


def without(data: dict, held: dict, by: str = "configuration") -> dict:
    """The shipped calibration less every row of ``held``'s configuration, or (``by="sweep"``) less every row of
    the measurement file it came from as well (the sweep or plan check that measured it: its other shapes,
    policies and options on the same machine, the day's code)."""
    speed_id, memory_id = speed_identity(held), memory_identity(held)

    def kept(r: dict, same: bool) -> bool:
        return not same and not (by == "sweep" and r.get("csv") == held.get("csv"))

    return {**data,
            "speed": [r for r in data["speed"] if kept(r, speed_identity(r) == speed_id)],
            "host": [r for r in data.get("host", []) if kept(r, speed_identity(r) == speed_id)],
            "memory": [r for r in data["memory"] if kept(r, memory_identity(r) == memory_id)]}


def flat_config(row: dict) -> dict:
    """The run configuration a calibration row measured, as RunConfig.from_flat reads it."""
    flat = {"model": row["model"], "method": row["method"], "seq_len": row["seq_len"], "batch_size": row["batch_size"],
            "grad_accum": row["grad_accum"], "checkpointing": row["policy"], "kernels": row["kernels"],
            "compile": bool(row["compile"]), "device": "cuda", "max_steps": 10}
    if row["policy"] == "full" and row.get("checkpointed_layers"):
        flat["checkpoint_layers"] = row["checkpointed_layers"]
    flat.update({k: v for k, v in row["knobs"].items() if v is not None})
    return flat


class Predictor:
    """One planner per model: its probe is measured once per method family; each row sets the configuration."""

    def __init__(self) -> None:
        from ftprof.gpus import gpu_named

        self.gpu = gpu_named("h200")
        self.planners: dict = {}

    def predict(self, row: dict):
        import dataclasses

        from ftprof.config import RunConfig
        from ftprof.plan.candidates import of_config

        cfg = RunConfig.from_flat(flat_config(row))
        p = self._planner(cfg)
        p.cfg = dataclasses.replace(cfg, method=cfg.method.for_method(cfg.method.method, p.dtype,
                                                                      preset=p.source.kind == "preset"))
        return p.predict(of_config(cfg))

    def _planner(self, cfg):
        import torch

        from ftprof.models.source import resolve_model_source
        from ftprof.plan.predict import Target, planner
        from ftprof.runtime import resolve_dtype_name

        name = cfg.model.model
        if name not in self.planners:
            source = resolve_model_source(name)
            dtype = resolve_dtype_name(cfg.model.dtype, torch.device("cuda"))
            target = Target(self.gpu.name, 1, False, self.gpu.capability)
            self.planners[name] = planner(cfg, source, dtype, target, [])
        return self.planners[name]


def held_out(rows: list[dict], data: dict, predictor: Predictor, by: str = "configuration") -> list[dict]:
    memory_by_id = {memory_identity(r): r for r in data["memory"]}
    out = []
    for row in rows:
        rest = without(data, row, by)
        calibration.shipped = lambda rest=rest: rest  # what every look-up reads, for this row alone
        try:
            pred = predictor.predict(row)
        finally:
            calibration.shipped = ORIGINAL
        mem = memory_by_id.get(memory_identity(row))
        out.append(_result(row, pred, mem))
    return out


ORIGINAL = calibration.shipped


def _result(row: dict, pred, mem: dict | None) -> dict:
    speed = None if not pred.tokens_per_s else pred.tokens_per_s / row["tokens_per_s"] - 1
    peak = None if not mem else pred.peak_bytes / mem["training_peak"] - 1
    off = calibration.off_default(row)
    options = [f"{k}={v}" for k, v in sorted(off.items())]
    layers = f" {row['checkpointed_layers']}" if row.get("checkpointed_layers") else ""
    return {"model": row["model"], "method": row["method"], "policy": f"{row['policy']}{layers}",
            "kernels": row["kernels"], "compile": row["compile"], "fp8": bool(row["knobs"].get("fp8_base")),
            "candidate": _proposed(row, off),
            "options": " ".join(options), "shape": f"{row['batch_size']} x {row['seq_len']} x {row['grad_accum']}",
            "measured": round(row["tokens_per_s"]), "predicted": round(pred.tokens_per_s or 0) or None,
            "speed_error": speed, "peak_error": peak, "confidence": pred.confidence, "csv": row["csv"],
            "speed_source": pred.speed_source}


def _proposed(row: dict, off: dict) -> bool:
    """Whether ftprof plan proposes this configuration: its options off their defaults are ones the plan varies
    (--keep-dequantized resolves off where it does not apply: beside --fp8-base, or without full checkpointing)."""
    void = bool(row["knobs"].get("fp8_base")) or row["policy"] != "full"
    return all(k in PLANNED or (k == "keep_dequantized" and void) for k in off)


def summary(results: list[dict], label: str) -> str:
    speed = [r["speed_error"] for r in results if r["speed_error"] is not None]
    peak = [r["peak_error"] for r in results if r["peak_error"] is not None]
    unpriced = sum(r["predicted"] is None for r in results)
    if not speed:
        return f"| {label} | 0 | {unpriced} | | | | | | |"
    worst = max(speed, key=abs)
    within = sum(abs(e) <= 0.15 for e in speed) / len(speed)
    mem = (f"{statistics.median(peak):+.1%} | {min(peak):+.1%}" if peak else " | ")
    return (f"| {label} | {len(speed)} | {unpriced} | {statistics.median(abs(e) for e in speed):.1%} | {worst:+.1%} | "
            f"{within:.0%} | {len(peak)} | {mem} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, help="write every row's prediction and error here")
    ap.add_argument("--model", help="only this model's rows")
    ap.add_argument("--only-fp8", action="store_true", help="only --fp8-base rows")
    ap.add_argument("--by", choices=("configuration", "sweep"), default="configuration",
                    help="hold out the row's configuration (default), or every row of its measurement file too")
    args = ap.parse_args(argv)
    os.environ["FTPROF_CALIBRATION"] = "off"  # no local store: the shipped calibration alone, less the held out
    data = ORIGINAL()
    rows = [r for r in data["speed"] if (r.get("world_size") or 1) == 1 and "H200" in r["device_name"]
            and (args.model is None or r["model"] == args.model)
            and (not args.only_fp8 or r["knobs"].get("fp8_base"))]
    results = held_out(rows, data, Predictor(), args.by)
    print("| model | method | policy | kernels | compiled | options | batch x seq x accum | measured | predicted | "
          "error | peak error |")
    print("| --- | --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in results:
        speed = "" if r["speed_error"] is None else f"{r['speed_error']:+.1%}"
        peak = "" if r["peak_error"] is None else f"{r['peak_error']:+.1%}"
        print(f"| {r['model']} | {r['method']} | {r['policy']} | {r['kernels']} | {r['compile']} | {r['options']} | "
              f"{r['shape']} | {r['measured']:,} | {r['predicted'] or 0:,} | {speed} | {peak} |")
    print("\n| rows | priced | no price | median abs error | worst | within 15% | peaks | peak median | peak lowest |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(summary(results, "all"))
    print(summary([r for r in results if r["candidate"]], "configurations ftprof plan proposes"))
    for model in sorted({r["model"] for r in results}):
        for fp8 in (False, True):
            part = [r for r in results if r["model"] == model and r["fp8"] == fp8]
            if part:
                print(summary(part, f"{model}{' fp8' if fp8 else ''}"))
    if args.csv:
        with args.csv.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(results[0]))
            writer.writeheader()
            writer.writerows(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
