"""The tracker protocol, what each step and result sends, the fan-out, and the checks."""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ftprof.errors import ConfigError
from ftprof.metrics import GIB

# tracker name -> (module of its exporter, package it imports, pip name)
EXPORTERS = {
    "tensorboard": ("ftprof.exporters.tensorboard", "tensorboard", "tensorboard"),
    "wandb": ("ftprof.exporters.wandb", "wandb", "wandb"),
    "mlflow": ("ftprof.exporters.mlflow", "mlflow", "mlflow-skinny"),
}


class Tracker(Protocol):
    def start(self, config: dict[str, Any]) -> None: ...
    def log_step(self, record) -> None: ...
    def log_result(self, result) -> None: ...
    def close(self) -> None: ...


def check_exporters(names) -> None:
    """Every asked-for tracker's package is installed (no import): one line naming the missing one."""
    for name in names or ():
        _, module, pip = EXPORTERS[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"--report-to {name} needs the '{module}' package: pip install {pip}")


def step_metrics(record) -> dict[str, float]:
    """What a tracker plots per step: loss, learning rate, step time, throughput, eval loss where an evaluation ran,
    host time by cause, memory (GiB)."""
    seconds = record.step_time_s
    out = {"train/loss": record.loss, "train/step_time_s": seconds, "train/lr": record.lr,
           "train/tokens_per_s": record.tokens / seconds if seconds > 0 else 0.0,
           "train/real_tokens_per_s": record.real_tokens / seconds if seconds > 0 else 0.0}
    if getattr(record, "eval_loss", None) is not None:  # an evaluation followed this step
        out["eval/loss"] = record.eval_loss
        out["eval/time_s"] = record.eval_s
    for name in ("data_s", "gc_s", "compile_s"):  # a spike in step time beside one of these says why
        out[f"host/{name}"] = getattr(record, name)
    for name in ("mem_allocated", "mem_peak_allocated", "mem_reserved", "mem_peak_reserved"):
        value = getattr(record, name, None)
        if value is not None:
            out[f"memory/{name[4:]}_gib"] = value / GIB
    return out


RESULT_SKIP = {"schema_version", "world_size", "seq_len", "batch_size", "grad_accum", "steps_completed"}


def result_metrics(result) -> dict[str, float]:
    """The result's numeric figures (MFU, throughput, peaks, energy, step-time statistics, dataset stats), flat."""
    flat: dict[str, Any] = {}
    for key, value in result.to_dict().items():  # nested dicts one level down: memory_stages.x -> memory_stages_x
        if isinstance(value, dict):
            flat.update({f"{key}_{sub}": v for sub, v in value.items()})
        else:
            flat[key] = value
    out = {}
    for key, value in flat.items():
        if key in RESULT_SKIP or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        out[f"result/{key}"] = float(value)
    return out


def flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """The resolved config, one level: section.option -> value (lists as comma-joined strings)."""
    out = {}
    for section, values in config.items():
        if not isinstance(values, dict):
            out[section] = values
            continue
        for key, value in values.items():
            out[f"{section}.{key}"] = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
    return out


class Exporters:
    """The run's trackers: built from ``--report-to`` on the main rank; empty (every call a no-op) otherwise."""

    def __init__(self, names, enabled: bool = True):
        self.names = tuple(names or ()) if enabled else ()
        self.active: list[Tracker] = []

    def start(self, config: dict[str, Any], run_dir: Path, output_dir: Path) -> None:
        """Open every exporter (imports its package now) and send the resolved config."""
        for name in self.names:
            module = importlib.import_module(EXPORTERS[name][0])
            tracker = module.Exporter(run_dir=Path(run_dir), run_name=Path(run_dir).name,
                                      output_dir=Path(output_dir))
            tracker.start(config)
            self.active.append(tracker)

    def log_step(self, record) -> None:
        for tracker in self.active:
            tracker.log_step(record)

    def chain(self, callback: Callable | None) -> Callable:
        """An on_step callback that runs ``callback`` and then sends the step to the trackers."""
        def on_step(record) -> None:
            if callback is not None:
                callback(record)
            self.log_step(record)
        return on_step

    def finish(self, result) -> None:
        """Send the final result and close; safe to call when nothing was started."""
        for tracker in self.active:
            tracker.log_result(result)
        self.close()

    def close(self) -> None:
        while self.active:
            self.active.pop().close()


def send_summary(table, report_to, out_dir, name: str) -> list[str]:
    """Send a finished sweep's summary table (a pandas DataFrame, one row per run) to each tracker; returns where
    each one wrote. ``out_dir`` is the sweep directory: TensorBoard logs and the MLflow store go under it."""
    names = tuple(report_to or ())
    check_exporters(names)
    written = []
    for tracker_name in names:
        module = importlib.import_module(EXPORTERS[tracker_name][0])
        written.append(module.send_summary(table, Path(out_dir), name))
    return written
