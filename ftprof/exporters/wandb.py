"""Weights & Biases: one W&B run per ftprof run, files under <run dir>/wandb. Offline mode unless logged in (an
API key in WANDB_API_KEY or ~/.netrc) or WANDB_MODE says otherwise; ``wandb sync`` uploads an offline run later.
Project: WANDB_PROJECT (default 'ftprof')."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ftprof.exporters.base import result_metrics, step_metrics


def _mode() -> str:
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        logged_in = "api.wandb.ai" in netrc.read_text()
    except OSError:
        logged_in = False
    return "online" if logged_in else "offline"


def _init(directory: Path, name: str, config: dict[str, Any] | None):
    import wandb

    directory.mkdir(parents=True, exist_ok=True)
    return wandb.init(project=os.environ.get("WANDB_PROJECT", "ftprof"), name=name, config=config,
                      dir=str(directory), mode=_mode(), reinit="create_new")


class Exporter:
    def __init__(self, run_dir: Path, run_name: str, output_dir: Path):
        self.run_dir, self.run_name = run_dir, run_name
        self.run = None

    def start(self, config: dict[str, Any]) -> None:
        self.run = _init(self.run_dir, self.run_name, config)

    def log_step(self, record) -> None:
        self.run.log(step_metrics(record), step=record.step)

    def log_result(self, result) -> None:
        self.run.summary.update({**result_metrics(result), "status": result.status})

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def send_summary(table, out_dir: Path, name: str) -> str:
    import wandb

    run = _init(out_dir, f"{name} summary", None)
    run.log({"summary": wandb.Table(dataframe=table)})
    run.finish()
    return str(out_dir / "wandb")
