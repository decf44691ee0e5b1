"""ftprof.plan.accuracy on run directories trained for real here (tiny CPU runs), each given a prediction record with
known numbers (the predictor's record, written by hand), plus copies made CUDA-shaped by hand."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import ftprof
from ftprof.plan import accuracy
from tests.conftest import tiny_config

GIB = 2**30
CPU_PARTS = ("weights_frozen", "weights_trainable", "gradients", "optimizer_state", "activations_saved")


def read_result(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def write_result(run_dir: Path, result: dict) -> None:
    (run_dir / "result.json").write_text(json.dumps(result))


def parts_bytes(run_dir: Path) -> int:
    """What a CPU run measured, in the predictor's terms: the memory breakdown's static parts + saved activations."""
    breakdown = read_result(run_dir)["memory_breakdown"]
    return sum(breakdown[p] for p in CPU_PARTS)


def inject_prediction(run_dir: Path, **fields) -> dict:
    """Give a run the prediction record the predictor would have written (Prediction's fields), with these
    numbers."""
    record = {"peak_bytes": 0, "static_bytes": 0, "activation_bytes": 0, "activation_factor": 1.0,
              "transient_bytes": 0, "tokens_per_s": None, "memory_source": "probe x1.00 (test)",
              "speed_source": "shipped defaults (test)", "device": "cpu", "candidate": {"method": "lora"}}
    record.update(fields)
    result = read_result(run_dir)
    result["prediction"] = record
    write_result(run_dir, result)
    return record


def strip_prediction(run_dir: Path) -> Path:
    """A run as one from before the predictor: ``prediction: {}``."""
    result = read_result(run_dir)
    result["prediction"] = {}
    write_result(run_dir, result)
    return run_dir


def cuda_copy(src: Path, dst: Path, *, allocated: int, training_peak: int | None, tokens_per_s: float,
              batch_size: int) -> Path:
    """A CPU run's directory, made to look like an H200 run: allocator peaks, a training peak (or none, as older
    runs), its own tokens/s and batch size (so that its label differs)."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["data"]["batch_size"] = batch_size
    config["output"]["device"] = "cuda"
    (dst / "config.json").write_text(json.dumps(config))
    result = read_result(dst)
    result.update(device="cuda", device_name="NVIDIA H200", torch_peak_allocated=allocated,
                  torch_peak_reserved=allocated + GIB, tokens_per_s=tokens_per_s, batch_size=batch_size)
    result["memory_breakdown"].pop("training_peak", None)
    if training_peak is not None:
        result["memory_breakdown"]["training_peak"] = training_peak
    write_result(dst, result)
    return dst


def train_tiny(root: Path, method: str, name: str, batch_size: int = 4) -> Path:
    res = ftprof.train(tiny_config(root, method, batch_size=batch_size, max_steps=4, run_name=name))
    assert res.status == "ok"
    return root / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Trained runs with predictions of known error; expected errors as fractions, by run name."""
    root = tmp_path_factory.mktemp("accuracy")
    full, lora_a, lora_b = train_tiny(root, "full", "full-a"), train_tiny(root, "lora", "lora-a"), \
        train_tiny(root, "lora", "lora-b", batch_size=2)
    strip_prediction(shutil.copytree(lora_a, root / "lora-none"))  # an ok run from before the predictor
    old = root / "lora-old"  # older still: no prediction key at all
    shutil.copytree(lora_a, old)
    result = read_result(old)
    del result["prediction"]
    write_result(old, result)
    expected = {}
    for run_dir, memory_factor, speed_factor in ((full, 0.90, 1.2), (lora_a, 1.02, None), (lora_b, 0.96, 0.5)):
        measured_parts = parts_bytes(run_dir)
        predicted_parts = round(measured_parts * memory_factor)
        tokens = read_result(run_dir)["tokens_per_s"]
        inject_prediction(run_dir, static_bytes=predicted_parts // 3,
                          activation_bytes=predicted_parts - predicted_parts // 3, peak_bytes=50 * GIB,
                          tokens_per_s=None if speed_factor is None else tokens * speed_factor)
        expected[run_dir.name] = ((predicted_parts - measured_parts) / measured_parts,
                                  None if speed_factor is None else (tokens * speed_factor - tokens) / tokens)
    peak = cuda_copy(lora_a, root / "cuda-peak", allocated=12 * GIB, training_peak=10 * GIB, tokens_per_s=1000.0,
                     batch_size=8)
    inject_prediction(peak, peak_bytes=9 * GIB, static_bytes=1, activation_bytes=1, tokens_per_s=1100.0,
                      device="NVIDIA H200")
    expected["cuda-peak"] = (-0.1, 0.1)  # against training_peak (against the allocated peak it would be -25%)
    alloc = cuda_copy(lora_a, root / "cuda-alloc", allocated=8 * GIB, training_peak=None, tokens_per_s=500.0,
                      batch_size=16)
    inject_prediction(alloc, peak_bytes=int(8.8 * GIB), tokens_per_s=None, device="NVIDIA H200")
    expected["cuda-alloc"] = ((int(8.8 * GIB) - 8 * GIB) / (8 * GIB), None)
    failed = root / "oom"  # a failed run with a prediction: never compared
    shutil.copytree(full, failed)
    result = read_result(failed)
    result.update(status="oom_device", tokens_per_s=None)
    write_result(failed, result)
    rows = {d.name: accuracy.row_from_run_dir(d) for d in sorted(root.iterdir())}
    return rows, expected


def test_exact_signed_errors(runs):
    rows, expected = runs
    for name, (memory_error, speed_error) in expected.items():
        got = accuracy.errors(rows[name])
        assert got["memory_error"] == pytest.approx(memory_error, rel=1e-12), name
        assert got["tokens_per_s_error"] == (None if speed_error is None else pytest.approx(speed_error, rel=1e-9))
    assert accuracy.errors(rows["full-a"])["memory_error"] == pytest.approx(-0.10, abs=1e-5)
    assert [n for n in expected if accuracy.errors(rows[n])["memory_under_predicted"]] == ["full-a", "cuda-peak"]


def test_what_measured_means_per_device(runs):
    rows, _ = runs
    cpu = accuracy.measured(rows["lora-a"])
    assert cpu["on_cpu"] and cpu["memory_compared"] == accuracy.CPU_PARTS_COMPARED
    assert cpu["memory_bytes"] == parts_bytes(Path(rows["lora-a"]["run_dir"]))  # logits gradients left out
    assert accuracy.predicted(rows["lora-a"])["memory_bytes"] != 50 * GIB  # CPU: static + activations, not the peak
    peak = accuracy.measured(rows["cuda-peak"])
    assert (peak["memory_bytes"], peak["memory_compared"]) == (10 * GIB, accuracy.TRAINING_PEAK)
    assert accuracy.predicted(rows["cuda-peak"])["memory_bytes"] == 9 * GIB  # GPU: the peak, not the parts
    alloc = accuracy.measured(rows["cuda-alloc"])
    assert (alloc["memory_bytes"], alloc["memory_compared"]) == (8 * GIB, accuracy.ALLOCATED_PEAK)
    assert accuracy.errors(rows["cuda-peak"])["memory_quantity"] == accuracy.GPU_MEMORY


def test_hand_written_rows_need_no_run_dir():
    row = {"status": "ok", "device": "cuda:0", "tokens_per_s": 200.0, "memory_breakdown_training_peak": None,
           "torch_peak_allocated": 4 * GIB, "prediction_peak_bytes": 3 * GIB, "prediction_tokens_per_s": float("nan")}
    assert accuracy.errors(row)["memory_error"] == -0.25 and accuracy.errors(row)["tokens_per_s_error"] is None
    assert accuracy.errors({**row, "status": "timeout"})["memory_error"] is None
    assert not accuracy.has_prediction({"status": "ok", "prediction_peak_bytes": float("nan")})


def test_runs_without_prediction_or_not_ok_are_not_compared(runs):
    rows, expected = runs
    for name in ("lora-none", "lora-old", "oom"):
        assert accuracy.errors(rows[name])["memory_error"] is None
    table = accuracy.comparison(list(rows.values()))
    assert sorted(table["run_name"]) == sorted(expected)
    assert accuracy.coverage(list(rows.values())) == {"compared": 5, "no_prediction": 2, "not_ok": 1}


def test_summary_median_worst_and_under_count(runs):
    rows, expected = runs
    frame = pd.DataFrame(list(rows.values()))
    summary = accuracy.summarize(frame).set_index(["quantity", "method"])
    names = accuracy.comparison(frame).set_index("run_name")["run"]
    pct = {n: (100 * m, None if s is None else 100 * s) for n, (m, s) in expected.items()}

    def line(quantity, method):
        return summary.loc[(quantity, method)]

    cpu_lora = line(accuracy.CPU_MEMORY, "lora")
    assert cpu_lora["runs"] == 2 and cpu_lora["median_abs_error_pct"] == pytest.approx(
        (abs(pct["lora-a"][0]) + abs(pct["lora-b"][0])) / 2)
    assert cpu_lora["worst_error_pct"] == pytest.approx(pct["lora-b"][0]) and cpu_lora["worst_run"] == names["lora-b"]
    assert cpu_lora["under_predicted"] == 0  # -4% is under the flag
    cpu_all = line(accuracy.CPU_MEMORY, accuracy.ALL_METHODS)
    assert cpu_all["runs"] == 3 and cpu_all["median_abs_error_pct"] == pytest.approx(abs(pct["lora-b"][0]))
    assert cpu_all["worst_run"] == names["full-a"] and cpu_all["under_predicted"] == 1
    gpu = line(accuracy.GPU_MEMORY, "lora")  # -10% and +10%: the under-prediction is the worst
    assert gpu["runs"] == 2 and gpu["median_abs_error_pct"] == pytest.approx(10.0)
    assert gpu["worst_error_pct"] == pytest.approx(-10.0) and gpu["worst_run"] == names["cuda-peak"]
    assert gpu["under_predicted"] == 1
    speed = line(accuracy.SPEED, "lora")  # lora-b -50%, cuda-peak +10%; lora-a and cuda-alloc had no speed figure
    assert speed["runs"] == 2 and speed["median_abs_error_pct"] == pytest.approx(30.0)
    assert speed["worst_error_pct"] == pytest.approx(-50.0) and speed["under_predicted"] is None
    assert line(accuracy.SPEED, "full")["worst_error_pct"] == pytest.approx(20.0)
    assert line(accuracy.SPEED, accuracy.ALL_METHODS)["runs"] == 3
    assert list(summary.index.get_level_values(0).unique()) == [accuracy.GPU_MEMORY, accuracy.CPU_MEMORY,
                                                                 accuracy.SPEED]


def test_comparison_columns_and_units(runs):
    rows, _ = runs
    table = accuracy.comparison(list(rows.values()), with_bytes=True)
    assert list(table.columns) == list(accuracy.COMPARISON_COLUMNS) + list(accuracy.BYTES_COLUMNS)
    table = table.set_index("run_name")
    peak = table.loc["cuda-peak"]
    assert (peak["predicted_memory_gib"], peak["measured_memory_gib"]) == (9.0, 10.0)
    assert (peak["predicted_memory_bytes"], peak["measured_memory_bytes"]) == (9 * GIB, 10 * GIB)
    assert peak["memory_under_predicted"] is True and peak["predicted_for"] == "NVIDIA H200"
    assert peak["memory_source"] == "probe x1.00 (test)" and peak["speed_source"] == "shipped defaults (test)"
    assert table.loc["lora-a", "memory_under_predicted"] is False
    assert pd.isna(table.loc["lora-a", "tokens_per_s_error_pct"])
    assert table["run"].is_unique


def test_row_from_records_matches_the_run_dir(runs):
    rows, _ = runs
    run_dir = Path(rows["cuda-peak"]["run_dir"])
    row = accuracy.row_from_records(read_result(run_dir), json.loads((run_dir / "config.json").read_text()))
    assert accuracy.errors(row) == accuracy.errors(rows["cuda-peak"])
    assert row["batch_size"] == 8 and row["prediction_candidate_method"] == "lora"


def test_accuracy_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, ftprof.plan.accuracy; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
