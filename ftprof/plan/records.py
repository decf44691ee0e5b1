"""A finished run's record for the calibration store (ftprof/plan/calibration.py): what it ran, on what, how fast,
and its measured peak, read from its run directory (result.json, config.json, env.json and, for a profiled run,
its trace summary)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ftprof.config import declarations
from ftprof.plan.epochs import EPOCH
from ftprof.results import run_dir as files
from ftprof.results.load import config_options, trainer_name
from ftprof.results.parts import auto_chosen
from ftprof.results.status import Status

VERSION_PACKAGES = ("torch", "transformers", "peft", "bitsandbytes", "gptqmodel")  # and any liger package
# Options outside the ClassKey that move a run's speed by a few percent, at today's defaults (the option
# declarations, config/declarations.py). Among the records of the nearest configuration, those matching the
# candidate's options most, then those with the fewest options off these defaults, are used (a knob that does not
# apply to a run is None and never counts).
DEFAULT_KNOBS: dict[str, Any] = declarations.calibration_defaults()


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}



# Fewer steady steps than this are one or two samples of a step's time: a slow one (a page fault, the other
# process on the machine) made a CPU record 15x off its twin's and every plan of that shape with it.
MIN_STEADY_STEPS = 3


def run_record(run_dir: str | Path) -> dict | None:
    """A finished run's record, or None when it has no steady-state figures to calibrate from."""
    run_dir = Path(run_dir).resolve()
    result = _read_json(run_dir / files.RESULT)
    tokens_per_s, flops = result.get("tokens_per_s"), result.get("flops_per_token")
    if result.get("status") != Status.OK.value or not tokens_per_s or not flops or not result.get("finished_at"):
        return None
    if (result.get("steady_steps") or MIN_STEADY_STEPS) < MIN_STEADY_STEPS:  # (older results lack the count)
        return None
    raw_config = _read_json(run_dir / files.CONFIG)
    cfg = config_options(raw_config)
    for option in auto_chosen(result.get("checkpointing_auto")):  # --checkpointing auto chose it: the run ran so
        cfg[option] = True
    if cfg.get("checkpointing") == "auto":  # the layer count auto chose (options such as --selective-rest need it)
        cfg["checkpoint_layers"] = result.get("checkpointed_layers")
    env = _read_json(run_dir / files.ENV)
    compiled = bool((result.get("compile") or {}).get("compiled", cfg.get("compile", False)))
    kernels = cfg.get("kernels") or "eager"
    recompute = result.get("recompute_flops_per_token") or 0.0
    world = result.get("world_size") or 1
    record = {
        "run_key": f"{run_dir}@{result['finished_at']}", "source": "run", "trainer": trainer_name(raw_config),
        "run_dir": str(run_dir), "finished_at": result["finished_at"], "epoch": EPOCH,  # plan/epochs.py
        "device_name": result.get("device_name") or result.get("device"), "versions": _versions(env),
        "model": result.get("model"), "layers": model_layers(str(result.get("model") or "")),
        "method": result.get("method"), "policy": result.get("checkpointing_policy") or "none",
        "checkpointed_layers": result.get("checkpointed_layers"), "kernels": kernels, "compile": compiled,
        "knobs": run_knobs(cfg, result.get("method"), kernels, compiled),
        "seq_len": result.get("seq_len"), "batch_size": result.get("batch_size"),
        "micro_batch_tokens": (result.get("batch_size") or 0) * (result.get("seq_len") or 0),
        "grad_accum": result.get("grad_accum"), "world_size": world, "parallel": result.get("parallel"),
        "flops_per_token": flops, "recompute_flops_per_token": recompute, "tokens_per_s": tokens_per_s,
        "flops_per_s": (flops + recompute) * tokens_per_s / world,  # per GPU, model + recomputed
        "training_peak": _training_peak(result), "prediction": result.get("prediction") or {},
        # NVML's busy fraction over the run: below ~0.85 the host set the pace. Not a profiled run's: its profiled
        # steps' own host work (the profiler's) idles the GPU, though its steady figures leave those steps out
        "gpu_busy": None if cfg.get("profile") else _gpu_busy(result),
    }
    buckets = _bucket_tflops(run_dir, result)
    if buckets:
        record["buckets"] = buckets
    return record


def _gpu_busy(result: dict) -> float | None:
    """The first GPU's mean NVML utilization over the run, as a fraction (None without NVML samples)."""
    util = (result.get("nvml") or {}).get("gpu0_util_mean")
    return round(util / 100, 3) if isinstance(util, (int, float)) else None


def _versions(env: dict) -> dict:
    packages = env.get("packages") or {}
    out = {k: packages[k] for k in VERSION_PACKAGES if packages.get(k)}
    out.update({k: v for k, v in packages.items() if "liger" in k.lower() and v})
    if env.get("ftprof_git_commit"):
        out["ftprof_git_commit"] = env["ftprof_git_commit"]
    return out


def _training_peak(result: dict) -> int | None:
    """The measured training peak on CUDA, as ftprof.plan.accuracy (the one owner of "measured") reads it; None on
    CPU, whose allocator keeps no peak."""
    from ftprof.plan import accuracy

    got = accuracy.measured(accuracy.row_from_records(result))
    return None if got["on_cpu"] or got["memory_bytes"] is None else int(got["memory_bytes"])


def model_layers(model: str) -> int | None:
    """Decoder layers of a preset or of a model directory holding config.json (None for anything else: reading a
    hub model's config would cost more than a record may)."""
    from ftprof.models.presets import PRESETS

    if model in PRESETS:
        return PRESETS[model].shape.get("num_hidden_layers")
    try:
        config = Path(model).expanduser() / "config.json"
        layers = _read_json(config).get("num_hidden_layers") if model and config.is_file() else None
    except OSError:
        return None
    return layers if isinstance(layers, int) else None


def _bucket_tflops(run_dir: Path, result: dict) -> dict[str, float | None]:
    """A profiled run's per-bucket achieved TFLOP/s, as its trace summary (summary.json beside summary.md)
    reports them; {} without one."""
    summary_md = (result.get("artifacts") or {}).get("summary")
    if not summary_md:
        return {}
    summary = _read_json((run_dir / summary_md).with_suffix(".json"))
    buckets = (summary.get("breakdown") or {}).get("buckets") or {}
    return {name: b.get("tflops") for name, b in buckets.items() if isinstance(b, dict)}


def option_values(record: dict) -> dict[str, Any]:
    """A record's option values as the declarations read them (config/declarations.py): its knobs, with its method,
    kernels, compile and checkpointing (policy and layers) under their option names."""
    return {**(record.get("knobs") or {}), "method": record.get("method"), "kernels": record.get("kernels"),
            "compile": bool(record.get("compile")), "checkpointing": record.get("policy"),
            "checkpoint_layers": record.get("checkpointed_layers")}


def run_knobs(cfg: dict, method: str | None, kernels: str, compiled: bool) -> dict[str, Any]:
    """The DEFAULT_KNOBS options of a run from its flat configuration; None where an option does not apply to it
    (keep_dequantized is kept under every policy: ``memory_options_off`` reads it where layers are recomputed)."""
    values = {**cfg, "method": method, "kernels": kernels, "compile": compiled, "checkpointing": "full"}
    return {k: cfg.get(k) if declarations.BY_NAME[k].applies(values) else None for k in DEFAULT_KNOBS}
