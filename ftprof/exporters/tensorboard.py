"""TensorBoard: event files in <run dir>/tensorboard (``tensorboard --logdir runs``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftprof.exporters.base import flat_config, result_metrics, step_metrics


def _writer(log_dir: Path):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(log_dir))


def _config_markdown(config: dict[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in flat_config(config).items())
    return "| option | value |\n|---|---|\n" + rows


class Exporter:
    def __init__(self, run_dir: Path, run_name: str, output_dir: Path):
        self.log_dir = run_dir / "tensorboard"
        self.writer = None
        self.last_step = 0

    def start(self, config: dict[str, Any]) -> None:
        self.writer = _writer(self.log_dir)
        self.writer.add_text("config", _config_markdown(config), 0)

    def log_step(self, record) -> None:
        self.last_step = record.step
        for key, value in step_metrics(record).items():
            self.writer.add_scalar(key, value, record.step)

    def log_result(self, result) -> None:
        for key, value in result_metrics(result).items():
            self.writer.add_scalar(key, value, self.last_step)
        self.writer.add_text("status", result.status, self.last_step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def send_summary(table, out_dir: Path, name: str) -> str:
    log_dir = out_dir / "tensorboard"
    writer = _writer(log_dir)
    writer.add_text(f"{name}/summary", table.to_markdown(index=False) if _has_tabulate() else table.to_string(), 0)
    writer.close()
    return str(log_dir)


def _has_tabulate() -> bool:
    import importlib.util

    return importlib.util.find_spec("tabulate") is not None
