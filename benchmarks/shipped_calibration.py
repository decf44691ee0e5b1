"""Derive ftprof/plan/shipped_calibration.json, the planner's calibration where a machine's own store has nothing,
from the H200 measurements under docs/measurements: the fast-paths rounds and the h200x2 targets sweep.

    python benchmarks/shipped_calibration.py     # rewrites the JSON, prints one line per speed row

``speed``: one row per configuration measured (the newest measurement of it), shaped like a local store record
(ftprof.plan.calibration): device, class key, model, micro-batch tokens, FLOPs per token, the rate in FLOP/s per
GPU (model + recomputed FLOPs), tokens/s, the options off today's defaults, and the CSV and date it came from.
``memory``: activation factors by class key (``memory_factors``): the planner's probe against what the runs' peaks
say the activations were; it probes llama-8b on this machine's CPU (about a minute per method, cached).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ftprof.plan import calibration, epochs  # noqa: E402
from ftprof.results.load import OWN_TRAINER  # noqa: E402

MEASUREMENTS = ROOT / "docs" / "measurements"
SOURCES = ("*-fast-paths*-raw_summary.csv", "*-h200x2-targets-raw_summary.csv", "*-h200-methods-1b-raw_summary.csv",
           "*-h200x2-mistral-7b-classic-raw_summary.csv", "*-h200-plan-accuracy-*-raw_summary.csv",
           "*-h200-graphs-accumulation-raw_summary.csv", "*-h200-peers-budgets-raw_summary.csv",
           "*-h200-peers-rest-raw_summary.csv", "*-h200-compiled-checkpoint-raw_summary.csv",
           "*-h200-traced-fp8-raw_summary.csv", "*-h200-fp8-budgets-raw_summary.csv",
           "*-h200-fp8-partial-raw_summary.csv", "*-h200-traced-backward-raw_summary.csv",
           "*-h200-fp8-tiles-raw_summary.csv", "*-h200-selective-compiled-raw_summary.csv",
           "*-h200-lean-kernels-raw_summary.csv", "*-h200-micro-batch-prefetch-raw_summary.csv",
           "*-h200-budget-cells-raw_summary.csv")
# Not sources: the same-call "before" rows (the code before a change), round 30's lean rows from before a fix
# (...-lean-kernels-broken-trace-..., and ...-lean-all-layers-...: the option then on every layer), and round 23's
# hold-out plan at 24 GiB
# (...-plan-holdout-r23-...), whose call ran slow: its two cells run again in the next call went 6% and 22% faster,
# with steady steps (docs/measurements/HISTORY.md).
# Runs of a few tokens per micro-batch (benchmarks/sweeps/host-floor.yaml): the host floor, not speed rows.
HOST_SOURCES = ("*-h200-host-floor-raw_summary.csv", "*-h200-host-floor-fp8-raw_summary.csv")
MEMORY_MODELS = ("llama-8b",)  # probed here on the CPU (a 2-layer copy): about a minute per method
DEVICE = "H200"  # only this GPU's measurements are shipped
OUT = calibration.SHIPPED

# What an option was before its column existed (the CSVs of earlier rounds lack it): how those runs really ran.
BEFORE_THE_OPTION = {"prefetch": False, "lora_fused_a": False, "lora_addmm": False, "compile_loss": False,
                     "compile_dequant": False, "compile_tuning": False, "compile_mode": "default",
                     "keep_dequantized": False, "dequant_kernel": "bitsandbytes", "sdpa_backend": "auto",
                     "kbit_prepare": False, "kernels": "eager", "compile": False, "fp8_base": False,
                     "offload_checkpoints": False, "offload_embeddings": False}
# The configuration a row measured, apart from its options (DEFAULT_KNOBS): rows equal in all of these and in their
# options are one configuration, measured again.
CONFIGURATION = ("device_name", "model", "method", "policy", "checkpointed_layers", "kernels", "compile", "seq_len",
                 "batch_size", "grad_accum", "world_size", "parallel")


def _value(text: str | None):
    """A CSV cell as the JSON value it was: "" -> None, True/False, ints, floats, else the text."""
    if text is None or text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _config(row: dict[str, str]) -> dict:
    """A row's flat configuration, with the options its CSV predates filled in as they ran then."""
    cfg = {k: _value(v) for k, v in row.items()}
    for key, before in BEFORE_THE_OPTION.items():
        if key not in row or cfg[key] is None and key in ("sdpa_backend", "kbit_prepare"):
            cfg[key] = before
    # bench CSVs flatten config.json's compile_dequant (a bool) and the compile outcome's dequant (a count of
    # dequantized linears) into one column: either way, a truthy value means dequantized by compiled torch ops.
    cfg["compile_dequant"] = bool(cfg.get("compile_dequant"))
    return cfg


def _policy(cfg: dict) -> str:
    if cfg.get("checkpointing_policy"):
        return cfg["checkpointing_policy"]
    return "full" if cfg.get("gradient_checkpointing") else "none"  # before policies: HF's full checkpointing


def speed_row(row: dict[str, str], csv_name: str) -> dict | None:
    """A CSV row as a shipped speed row; None unless it is an ok H200 run with steady throughput and FLOPs."""
    cfg = _config(row)
    tokens_per_s, flops = cfg.get("tokens_per_s"), cfg.get("flops_per_token")
    if cfg.get("status") != "ok" or DEVICE not in str(cfg.get("device_name")) or not tokens_per_s or not flops:
        return None
    if (cfg.get("trainer") or OWN_TRAINER) != OWN_TRAINER:  # a peer's run (Unsloth, the HF recipe) beside ftprof's
        return None
    compiled = bool(cfg["compile_compiled"] if cfg.get("compile_compiled") is not None else cfg.get("compile"))
    recompute, world = cfg.get("recompute_flops_per_token") or 0.0, cfg.get("world_size") or 1
    kernels = cfg.get("kernels") or "eager"
    # percent; none for a profiled run (the profiler's host work idles the GPU in its profiled steps: 28% busy for
    # llama-8b LoRA at 8,192 tokens per micro-batch, a GPU-bound cell, H200 2026-12-01), as plan/records.py
    busy = None if cfg.get("profile") else _value(row.get("nvml_gpu0_util_mean"))
    return {
        "source": "shipped", "device_name": cfg["device_name"], "model": cfg["model"], "method": cfg["method"],
        "policy": _policy(cfg), "checkpointed_layers": cfg.get("checkpointed_layers"), "kernels": kernels,
        "compile": compiled, "knobs": calibration.run_knobs(cfg, cfg["method"], kernels, compiled),
        "seq_len": cfg["seq_len"], "batch_size": cfg["batch_size"],
        "micro_batch_tokens": cfg["seq_len"] * cfg["batch_size"], "grad_accum": cfg.get("grad_accum") or 1,
        "world_size": world, "parallel": cfg.get("parallel"),
        "flops_per_token": flops, "recompute_flops_per_token": recompute, "tokens_per_s": tokens_per_s,
        "flops_per_s": (flops + recompute) * tokens_per_s / world,  # per GPU, model + recomputed
        "csv": csv_name, "date": csv_name[:10], "finished_at": cfg.get("finished_at"),
        "experiment": cfg.get("experiment"),
        "gpu_busy": None if busy is None else round(busy / 100, 3),  # (epochs.stale reads it)
    }


def read_rows(sources: tuple[str, ...] = SOURCES) -> list[tuple[dict[str, str], str]]:
    paths = sorted({p for pattern in sources for p in MEASUREMENTS.glob(pattern)})
    out = []
    for path in paths:
        with path.open(newline="") as fh:
            out.extend((row, path.name) for row in csv.DictReader(fh))
    return out


def speed_rows(rows: list[tuple[dict[str, str], str]]) -> list[dict]:
    """One row per configuration (its options included): the newest measurement of it."""
    newest: dict[str, dict] = {}
    for row, name in rows:
        entry = speed_row(row, name)
        if entry is None or epochs.stale(entry):
            continue
        identity = json.dumps([entry[k] for k in CONFIGURATION] + [sorted(entry["knobs"].items())])
        if identity not in newest or str(entry["finished_at"]) > str(newest[identity]["finished_at"]):
            newest[identity] = entry
    return sorted(newest.values(), key=lambda e: (e["model"], e["method"], e["policy"], e["kernels"], e["compile"],
                                                  len(calibration.off_default(e)), e["finished_at"]))


def memory_factors(rows: list[tuple[dict[str, str], str]]) -> list[dict]:
    """Shipped activation factors, one row per configuration measured (the newest): the class key, the options,
    and activation_ratio = (the run's training peak - the planner's static bytes and transients) / the probe's
    activations, from the planner's own uncalibrated prediction of that configuration. Runs on one GPU only, of
    the models in MEMORY_MODELS."""
    newest: dict[str, dict] = {}
    for entry, peak in _memory_rows(rows):
        identity = json.dumps([entry[k] for k in CONFIGURATION] + [sorted(entry["knobs"].items())])
        if identity not in newest or str(entry["finished_at"]) > str(newest[identity]["finished_at"]):
            newest[identity] = {**entry, "training_peak": peak}
    planners: dict[str, object] = {}
    out = []
    for entry in newest.values():
        ratio = _ratio(entry, planners)
        far = ratio is not None and not 0.5 < ratio < 2.0
        if far and (not calibration.memory_options_off(entry) or not 0.3 < ratio < 3.0):
            # a factor this far from 1 says the probe missed what the run did (selective + fused projections at
            # 2 x 2 on the H200: 0.39): one class-wide factor from it would move every run of its class, so it is
            # not shipped; the probe's own figure (here on the safe side) stands for that configuration. Runs with
            # options off the defaults are kept within 0.3-3 (a run with its layer inputs offloaded measured 0.03:
            # its activations wait on the host, the ratio says nothing of the probe)
            print(f"not shipped: activation ratio {ratio:.2f} for {entry['method']} {entry['policy']} "
                  f"{entry['kernels']} {entry['micro_batch_tokens']} tokens ({entry['csv']})", file=sys.stderr)
            continue
        if ratio is not None:
            keep = ("device_name", "model", "method", "policy", "checkpointed_layers", "kernels", "compile", "knobs",
                    "micro_batch_tokens", "training_peak", "csv", "date", "finished_at")
            out.append({**{k: entry[k] for k in keep}, "activation_ratio": round(ratio, 4)})
    return sorted(out, key=lambda e: (e["method"], e["policy"], e["kernels"], e["compile"], e["finished_at"]))


def _memory_rows(rows):
    for row, name in rows:
        entry = speed_row(row, name)
        peak = _value(row.get("memory_breakdown_training_peak")) or _value(row.get("torch_peak_allocated"))
        if entry is not None and entry["model"] in MEMORY_MODELS and entry["world_size"] == 1 and peak:
            yield entry, peak


def _ratio(entry: dict, planners: dict) -> float | None:
    import dataclasses

    from ftprof.config import RunConfig
    from ftprof.models.source import resolve_model_source
    from ftprof.plan.candidates import Candidate
    from ftprof.plan.predict import Planner, Target

    model, seq = entry["model"], entry["seq_len"]
    if (model, seq) not in planners:
        cfg = RunConfig.from_flat(dict(method="lora", model=model, seq_len=seq, device="cpu"))
        cfg = dataclasses.replace(cfg, method=cfg.method.resolved("bfloat16", preset=True))
        planners[(model, seq)] = Planner(cfg, resolve_model_source(model), "bfloat16", Target(entry["device_name"]),
                                         [], calibrate_memory=False)
    layers = entry["checkpointed_layers"]
    cand = Candidate(entry["method"], entry["policy"], int(layers) if layers else None, entry["kernels"],
                     entry["compile"], entry["batch_size"], entry["grad_accum"])
    pred = planners[(model, seq)].predict(cand)
    return calibration.activation_ratio({"device_name": entry["device_name"], "training_peak": entry["training_peak"],
                                         "prediction": pred.to_dict()})


def host_rows(rows: list[tuple[dict[str, str], str]], host_bound_only: bool = False) -> list[dict]:
    """Host floors (ftprof/plan/host.py): each ok run of a few tokens per micro-batch, its seconds per micro-batch,
    the model's layers and how busy NVML saw the GPU. ``host_bound_only``: of any runs, those whose GPU waited on
    the host (NVML busy below host.HOST_BOUND_BUSY, as the local store takes them): FP8 under full checkpointing at
    1,024 tokens per sequence ran at 70-81% busy (H200, mistral-7b, 2026-12-04)."""
    from ftprof.plan import host

    out = []
    for row, name in rows:
        entry = speed_row(row, name)
        if entry is None or epochs.stale(entry):
            continue
        if host_bound_only and not host.host_bound(entry):
            continue
        out.append({**entry, "layers": calibration.model_layers(entry["model"]),
                    "host_floor_s": round(host.micro_batch_seconds(entry), 5)})
    return sorted(out, key=lambda e: (e["method"], e["policy"], e["kernels"], e["compile"], e["finished_at"]))


def main() -> int:
    rows = read_rows()
    data = {"about": "ftprof plan's shipped calibration, derived by benchmarks/shipped_calibration.py from "
                     "docs/measurements (do not edit by hand)",
            "speed": speed_rows(rows), "memory": memory_factors(rows),
            "host": host_rows(read_rows(HOST_SOURCES)) + host_rows(rows, host_bound_only=True)}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    for e in data["speed"]:
        key = calibration.class_key(e)
        off = " ".join(f"{k}={v}" for k, v in sorted(calibration.off_default(e).items()))
        print(f"{e['model']:10} {key.describe():32} {e['micro_batch_tokens']:>6} tok x{e['world_size']} "
              f"{e['flops_per_s'] / 1e12:6.1f} TFLOP/s/GPU {e['tokens_per_s']:9.0f} tok/s  {e['csv'][11:-16]:22} {off}")
    print(f"{len(data['speed'])} speed rows from {len({n for _, n in rows})} CSVs -> {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
