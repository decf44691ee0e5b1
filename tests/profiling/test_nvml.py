"""NVML summary from a sampler CSV (the sampler itself needs a GPU: tests/bench/test_runner.py, marked gpu)."""

import csv

import pytest

from ftprof.profiling.nvml import COLUMNS, summarize_csv


def test_summary_peaks_energy_window(tmp_path):
    path = tmp_path / "nvml.csv"
    rows = []
    for i in range(11):  # two GPUs, 0.5 s apart, energy rising 100 J/s on gpu0 and 50 J/s on gpu1
        t = 1000.0 + 0.5 * i
        rows.append([t, 0, "H200", (10 + i) * 2**30, (9 + i) * 2**30, 90, 500.0, 100_000 * 0.5 * i, 1980])
        rows.append([t, 1, "H200", 5 * 2**30, 0, 10, 100.0, 50_000 * 0.5 * i, 1980])
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        w.writerows(rows)
    whole = summarize_csv(path)
    assert whole["device_used_peak"] == 20 * 2**30 and whole["process_used_peak"] == 19 * 2**30
    assert whole["gpu1_used_peak"] == 5 * 2**30 and whole["samples"] == 22
    assert whole["energy_j"] == pytest.approx(500 + 250)
    window = summarize_csv(path, (1001.0, 1003.0))  # 2 s of the run
    assert window["gpu0_energy_j"] == pytest.approx(200) and window["energy_j"] == pytest.approx(300)
    assert window["energy_window_s"] == 2.0


def test_missing_or_empty_csv(tmp_path):
    assert summarize_csv(tmp_path / "none.csv") == {}
    (tmp_path / "e.csv").write_text(",".join(COLUMNS) + "\n")
    assert summarize_csv(tmp_path / "e.csv") == {}


def test_memory_logging_nvml_on_cpu_is_skipped_with_a_note(tmp_path):
    import ftprof
    from tests.conftest import tiny_config

    result = ftprof.train(tiny_config(tmp_path, "full", max_steps=3, memory_logging="nvidia"))
    assert result.status == "ok" and result.nvml.summary == {}
    assert any("NVML sampler skipped" in n for n in result.notes)
