"""The report's "Prediction error" section on runs trained for real here, given prediction records by hand: in
summary.md and report.html, prediction_error.csv beside them, and no section at all when no run has a prediction."""

import csv
import shutil

import pytest

from ftprof.plan import accuracy
from ftprof.report.build import build_report
from ftprof.report.prediction import CSV_NAME
from tests.plan.test_accuracy import (
    GIB,
    cuda_copy,
    inject_prediction,
    parts_bytes,
    read_result,
    strip_prediction,
    train_tiny,
)

HEADING = "## Prediction error"


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """(runs with predictions, the same runs without any): a full run predicted on the CPU, a CUDA-shaped lora run
    under-predicted by 20%, a lora run without a prediction."""
    plain = tmp_path_factory.mktemp("no-prediction")
    full, lora = train_tiny(plain, "full", "full-p"), train_tiny(plain, "lora", "lora-n")
    strip_prediction(full), strip_prediction(lora)  # the predictor's own records are replaced by known ones
    predicted = tmp_path_factory.mktemp("predicted")
    shutil.copytree(full, predicted / "full-p")
    shutil.copytree(lora, predicted / "lora-n")
    gpu = cuda_copy(lora, predicted / "lora-gpu", allocated=12 * GIB, training_peak=10 * GIB, tokens_per_s=900.0,
                    batch_size=8)
    inject_prediction(gpu, peak_bytes=8 * GIB, tokens_per_s=990.0, device="NVIDIA H200")
    measured = parts_bytes(predicted / "full-p")
    inject_prediction(predicted / "full-p", static_bytes=measured, activation_bytes=measured // 2,
                      tokens_per_s=read_result(predicted / "full-p")["tokens_per_s"] * 2)
    return predicted, plain


@pytest.fixture(scope="module")
def report(roots, tmp_path_factory):
    return build_report([roots[0]], tmp_path_factory.mktemp("report"))


def test_summary_md_has_the_section(report):
    text = (report.out_dir / "summary.md").read_text()
    section = text.split(HEADING, 1)[1]
    assert "| quantity | method | runs | median abs error | worst error | worst run | under-predicted >5% |" in section
    assert f"| {accuracy.GPU_MEMORY} | lora | 1 | 20.0% | **-20.0%** |" in section
    assert f"| {accuracy.CPU_MEMORY} | full | 1 | 50.0% | +50.0% |" in section
    assert "| tokens/s | all methods | 2 | 55.0% | +100.0% |" in section
    assert f"Worst: {accuracy.GPU_MEMORY} **-20.0%** (under-predicted) for lora b8" in section
    assert accuracy.CPU_PARTS_WORDS in section
    assert "1 ok run(s) recorded no prediction" in section and CSV_NAME in section


def test_report_html_has_the_section(report):
    page = (report.out_dir / "report.html").read_text()
    assert "<h2>Prediction error</h2>" in page
    assert "<td><b class='bad'>-20.0%</b></td>" in page  # the under-prediction, marked
    assert page.index("Prediction error") < page.index("</body>")


def test_prediction_error_csv(report):
    with open(report.out_dir / CSV_NAME, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == list(accuracy.COMPARISON_COLUMNS) + list(accuracy.BYTES_COLUMNS)
    by_run = {r["run_name"]: r for r in rows}
    assert sorted(by_run) == ["full-p", "lora-gpu"]  # the run without a prediction is not compared
    gpu = by_run["lora-gpu"]
    assert (gpu["predicted_memory_bytes"], gpu["measured_memory_bytes"]) == (str(8 * GIB), str(10 * GIB))
    assert float(gpu["memory_error_pct"]) == pytest.approx(-20.0) and gpu["memory_under_predicted"] == "True"
    assert float(gpu["tokens_per_s_error_pct"]) == pytest.approx(10.0)
    assert gpu["memory_compared"] == accuracy.TRAINING_PEAK and gpu["device_name"] == "NVIDIA H200"
    assert by_run["full-p"]["memory_compared"] == accuracy.CPU_PARTS_COMPARED
    assert report.files[CSV_NAME] == report.out_dir / CSV_NAME


def test_no_section_without_predictions(roots, tmp_path):
    rep = build_report([roots[1]], tmp_path / "rep")
    assert "Prediction error" not in (rep.out_dir / "summary.md").read_text()
    assert "Prediction error" not in (rep.out_dir / "report.html").read_text()
    assert not (rep.out_dir / CSV_NAME).exists() and CSV_NAME not in rep.files


def test_markdown_only_writes_no_csv(roots, tmp_path):
    rep = build_report([roots[0]], tmp_path / "md", formats="md")
    text = (rep.out_dir / "summary.md").read_text()
    assert HEADING in text and CSV_NAME not in text
    assert not (rep.out_dir / CSV_NAME).exists()
