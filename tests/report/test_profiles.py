"""Profiled runs in the report: bucket columns, and the buckets that explain a regression against a profiled
baseline (a real CPU profile of the tiny preset, with a slowdown planted in a copy)."""

import csv
import json
import shutil

import pytest

import ftprof
from ftprof.cli.main import main
from ftprof.report import profiles
from ftprof.report.compare import compare
from ftprof.report.tables import load_results
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    root = tmp_path_factory.mktemp("profiled")
    result = ftprof.profile(tiny_config(root / "base", "lora", max_steps=8, run_name="run"))
    assert result.status == "ok"
    return root


def _plant_slowdown(run_dir, bucket_ms: float, factor: float) -> str:
    """Slow the copy down: every step's time, the throughput, and one bucket of its profile by ``bucket_ms``."""
    path = run_dir / "profile" / "summary.json"
    summary = json.loads(path.read_text())
    bd = summary["breakdown"]
    key = max(bd["buckets"], key=lambda k: bd["buckets"][k]["ms_per_step"])
    bucket = bd["buckets"][key]
    bucket["per_step_ms"] = [ms + bucket_ms for ms in bucket["per_step_ms"]]
    bucket["ms_per_step"] += bucket_ms
    bd["step_ms"] = [ms + bucket_ms for ms in bd["step_ms"]]
    path.write_text(json.dumps(summary))
    with open(run_dir / "steps.csv") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        row["step_time_s"] = str(float(row["step_time_s"]) * factor)
    with open(run_dir / "steps.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    result = json.loads((run_dir / "result.json").read_text())
    result["tokens_per_s"] /= factor
    (run_dir / "result.json").write_text(json.dumps(result))
    return bucket["label"]


def test_profiled_runs_get_bucket_columns(profiled):
    df = profiles.with_bucket_columns(load_results([profiled / "base"]))
    assert df["bucket_step_ms"].iloc[0] > 0
    assert any(c.startswith("bucket_") and c.endswith("_ms") and c != "bucket_step_ms" for c in df.columns)


def test_a_regression_names_the_bucket_that_explains_it(profiled, tmp_path, capsys):
    shutil.copytree(profiled / "base", tmp_path / "base")
    shutil.copytree(profiled / "base", tmp_path / "cur")
    label = _plant_slowdown(tmp_path / "cur" / "run", bucket_ms=2000.0, factor=3.0)
    cmp = compare(load_results([tmp_path / "cur"]), load_results([tmp_path / "base"]), threshold_pct=5.0)
    (config,) = cmp.configs
    assert config.verdict != "ok" and config.cause and label in config.cause and config.cause.startswith("+")
    code = main(["report", str(tmp_path / "cur"), "--baseline", str(tmp_path / "base"), "--format", "md",
                 "--output-dir", str(tmp_path / "out")])
    assert code == (1 if config.verdict == "regression" else 0)
    assert label in (tmp_path / "out" / "summary.md").read_text()


def test_unprofiled_baselines_give_no_cause(profiled, tmp_path):
    assert profiles.cause([str(tmp_path)], [str(profiled / "base" / "run")]) is None
