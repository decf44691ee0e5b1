"""MLflow: one MLflow run per ftprof run, in the experiment named by MLFLOW_EXPERIMENT_NAME (default 'ftprof').

Where: MLFLOW_TRACKING_URI when set (a server, a database); otherwise a local file store ``<output dir>/mlruns``
beside the run directories (``mlflow ui --backend-store-uri runs/mlruns``). MLflow 3 keeps file stores in
maintenance mode behind MLFLOW_ALLOW_FILE_STORE, which ftprof sets for its default store only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ftprof.exporters.base import flat_config, result_metrics, step_metrics

MAX_PARAM_CHARS = 6000  # MLflow's limit on a parameter value


def tracking_uri(output_dir: Path) -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return (output_dir / "mlruns").resolve().as_uri()


def _client(output_dir: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri(output_dir))


def _experiment(client) -> str:
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "ftprof")
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found else client.create_experiment(name)


def _metric_key(key: str) -> str:
    return key.replace(":", "_")


class Exporter:
    def __init__(self, run_dir: Path, run_name: str, output_dir: Path):
        self.run_dir, self.run_name, self.output_dir = run_dir, run_name, output_dir
        self.client = None
        self.run_id = None
        self.last_step = 0

    def start(self, config: dict[str, Any]) -> None:
        self.client = _client(self.output_dir)
        run = self.client.create_run(_experiment(self.client), run_name=self.run_name,
                                     tags={"ftprof.run_dir": str(self.run_dir.resolve())})
        self.run_id = run.info.run_id
        from mlflow.entities import Param

        params = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in flat_config(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        self.client.log_text(self.run_id, json.dumps(config, indent=2), "config.json")

    def log_step(self, record) -> None:
        from mlflow.entities import Metric

        self.last_step = record.step
        now = int(record.started_unix * 1000)
        metrics = [Metric(_metric_key(k), float(v), now, record.step) for k, v in step_metrics(record).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def log_result(self, result) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_metric_key(k), v, now, self.last_step) for k, v in result_metrics(result).items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])
        self.client.set_tag(self.run_id, "ftprof.status", result.status)
        self.client.log_text(self.run_id, json.dumps(result.to_dict(), indent=2, default=str), "result.json")
        self.status = "FINISHED" if result.status == "ok" else "FAILED"

    def close(self) -> None:
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id, status=getattr(self, "status", "KILLED"))
            self.run_id = None


def send_summary(table, out_dir: Path, name: str) -> str:
    """One MLflow run named after the sweep, holding the summary table as an artifact (summary.json, .csv)."""
    client = _client(out_dir)
    run = client.create_run(_experiment(client), run_name=f"{name} summary", tags={"ftprof.sweep": name})
    client.log_text(run.info.run_id, table.to_csv(index=False), "summary.csv")
    client.log_table(run.info.run_id, data=table, artifact_file="summary.json")
    client.set_terminated(run.info.run_id)
    return tracking_uri(out_dir)
