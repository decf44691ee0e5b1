"""--report-to: the exporters' own readers read back what a CPU run sent (TensorBoard's EventAccumulator, MLflow's
client), a missing package is one line before anything runs, and a sweep's summary table goes out too."""

import importlib
import os

import pytest

import ftprof
from ftprof.config import OutputConfig
from ftprof.errors import ConfigError
from ftprof.exporters import base, check_exporters, send_summary
from tests.conftest import tiny_config


def needs(module: str):
    """A tracker's own reader, or skip with the reason: trackers are optional extras (ftprof[tensorboard|mlflow|
    wandb]), so a machine without one skips its tests instead of failing them."""
    return pytest.importorskip(module, reason=f"the optional tracker package '{module}' is not installed")


def test_report_to_spellings():
    assert OutputConfig().report_to is None
    assert OutputConfig(report_to="none").report_to is None
    assert OutputConfig(report_to="tensorboard,mlflow").report_to == ("tensorboard", "mlflow")
    assert OutputConfig(report_to=["wandb"]).report_to == ("wandb",)
    assert OutputConfig(report_to="all").report_to == ("tensorboard", "wandb", "mlflow")
    with pytest.raises(ConfigError, match="--report-to: 'tensorbord' .*did you mean 'tensorboard'"):
        OutputConfig(report_to="tensorbord")


def test_missing_package_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(base.EXPORTERS, "mlflow", ("ftprof.exporters.mlflow", "no_such_mlflow_pkg", "mlflow-skinny"))
    # tensorboard's check finds a module every Python has, so the one missing package is the one named
    monkeypatch.setitem(base.EXPORTERS, "tensorboard", ("ftprof.exporters.tensorboard", "json", "tensorboard"))
    with pytest.raises(ConfigError, match="--report-to mlflow needs the 'no_such_mlflow_pkg' package: pip install"):
        check_exporters(("tensorboard", "mlflow"))
    with pytest.raises(ConfigError, match="no_such_mlflow_pkg"):
        ftprof.train(tiny_config(tmp_path, "lora", report_to="mlflow"))
    assert not any(tmp_path.iterdir())  # refused in preflight: no run directory


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """One run sent to every installed tracker of the two read back here."""
    installed = [t for t in ("tensorboard", "mlflow") if _importable(t)]
    if not installed:
        pytest.skip("neither optional tracker package (tensorboard, mlflow) is installed")
    out = tmp_path_factory.mktemp("tracked")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    result = ftprof.train(tiny_config(out, "lora", max_steps=3, measure_warmup_steps=1, run_name="tracked",
                                      report_to=",".join(installed)))
    assert result.status == "ok", result.failure.error_tail
    return out, result


def test_tensorboard_events_read_back(tracked_run):
    needs("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, result = tracked_run
    acc = EventAccumulator(str(out / "tracked" / "tensorboard"))
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3]
    assert loss[-1].value == pytest.approx(result.throughput.loss_last, rel=1e-6)
    assert {"train/step_time_s", "train/tokens_per_s", "memory/peak_allocated_gib", "host/gc_s",
            "host/compile_s"} <= set(scalars)
    assert acc.Scalars("host/data_s")[0].value > 0  # step 1 made its own batch
    assert acc.Scalars("result/tokens_per_s")[0].value == pytest.approx(result.throughput.tokens_per_s, rel=1e-6)
    assert "config" in " ".join(acc.Tags()["tensors"])


def test_mlflow_run_reads_back(tracked_run):
    needs("mlflow")
    from mlflow.tracking import MlflowClient

    out, result = tracked_run
    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("ftprof").experiment_id])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    assert run.data.tags["ftprof.status"] == "ok"
    assert run.data.params["method.method"] == "lora" and run.data.params["data.seq_len"] == "32"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in history] == [1, 2, 3]
    assert history[-1].value == pytest.approx(result.throughput.loss_last, rel=1e-6)
    assert run.data.metrics["result/tokens_per_s"] == pytest.approx(result.throughput.tokens_per_s, rel=1e-6)
    assert run.data.metrics["result/host_peak_rss"] > 0
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "result.json"} <= artifacts


def test_sweep_summary_goes_to_tensorboard_and_mlflow(tmp_path):
    needs("tensorboard")
    needs("mlflow")
    import pandas as pd
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    table = pd.DataFrame({"run": ["a", "b"], "method": ["lora", "qlora"], "tokens_per_s": [1000.0, 800.0]})
    written = send_summary(table, ["tensorboard", "mlflow"], tmp_path, "sweep1")
    assert len(written) == 2
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert any("sweep1/summary" in tag for tag in acc.Tags()["tensors"])
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("ftprof").experiment_id])
    assert run.info.run_name == "sweep1 summary"
    csv = client.download_artifacts(run.info.run_id, "summary.csv", str(tmp_path / "dl"))
    assert pd.read_csv(csv).equals(table)


@pytest.mark.slow  # wandb starts its service process (~10 s)
def test_wandb_runs_offline_without_login(tmp_path, monkeypatch):
    needs("wandb")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    result = ftprof.train(tiny_config(tmp_path, "lora", max_steps=2, measure_warmup_steps=1, run_name="w",
                                      report_to="wandb"))
    assert result.status == "ok"
    offline = list((tmp_path / "w" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(offline) == 1 and offline[0].stat().st_size > 0
