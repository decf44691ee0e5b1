"""Terminal output that survives pipes: plain progress lines, nothing wrapped or cut, --quiet that is quiet; numbers in
one format; CPU runs without GPU-only figures."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftprof.console import (
    FILE_WIDTH,
    GIB,
    SLOW_STEPS_SHOWN,
    fmt_gib,
    fmt_num,
    make_console,
    slow_step_lines,
    summary_table,
)
from ftprof.results.schema import RunResult


def test_one_number_format():
    assert [fmt_num(v) for v in (82.743, 4464.2, 3.14159, 123456.0, None)] == ["82.7", "4,464", "3.14", "123,456",
                                                                              "-"]
    assert fmt_num(0.021734, ".4f") == "0.0217"
    # a few MiB is not nothing: "0.00" would read as no measurement
    assert [fmt_gib(v) for v in (None, 0, 3 * 2**20, 0.006 * GIB, 1.5 * GIB)] == ["-", "0.00", "<0.01", "0.01", "1.50"]


def test_console_into_a_file_neither_wraps_nor_cuts(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    console = make_console()  # pytest captures stdout: not a terminal
    assert not console.is_terminal and console.width == FILE_WIDTH
    path = "/very/long/" + "directory-name/" * 12 + "run"
    buf = io.StringIO()
    console.file = buf
    console.print(f"run dir {path}")
    assert buf.getvalue().strip() == f"run dir {path}"


def _run(**kw):
    """A result from result.json's keys."""
    base = dict(status="ok", run_dir="/r", method="lora", model="tiny", device="cpu", device_name="cpu",
                tokens_per_s=1234.5, tokens_per_s_per_gpu=1234.5, host_peak_rss=2**30)
    return RunResult.from_dict({**base, **kw})


def _text(table) -> str:
    console = make_console()
    console.file = io.StringIO()
    console.print(table)
    return console.file.getvalue()


def test_cpu_run_summary_hides_gpu_only_figures():
    cpu = _text(summary_table(_run()))
    assert "host peak RSS" in cpu and "MFU / HFU" not in cpu and "tokens/s per GPU" not in cpu
    assert "torch peak" not in cpu
    assert "GPU-only figures" in cpu
    gpu = _text(summary_table(_run(device="cuda:0", device_name="NVIDIA H200", mfu=0.4)))
    assert "MFU / HFU" in gpu and "GPU-only figures" not in gpu


def _train(tmp_path, *extra):
    return subprocess.run([sys.executable, "-m", "ftprof", "train", "lora", "--max-steps", "10", "--output-dir",
                           str(tmp_path / "a" / ("deep-" * 20)), *extra], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "COLUMNS": "80"})


@pytest.mark.slow  # a real run in a child process (~20 s on a busy 2-core machine)
def test_piped_output_has_progress_lines_and_whole_paths(tmp_path):
    out = _train(tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    progress = [line for line in lines if line.startswith("ftprof: step ")]
    assert [line.split()[2] for line in progress] == [f"{s}/10" for s in range(1, 11)]  # every tenth of the run
    (run_dir,) = (tmp_path / "a" / ("deep-" * 20)).iterdir()
    assert any(str(run_dir) in line for line in lines)  # the path whole, on one line
    assert "…" not in out.stdout


@pytest.mark.slow
def test_quiet_prints_the_run_dir_and_outcome_only(tmp_path):
    out = _train(tmp_path, "--quiet")
    assert out.returncode == 0, out.stderr[-2000:]
    (run_dir,) = (tmp_path / "a" / ("deep-" * 20)).iterdir()
    assert out.stdout.splitlines() == [f"ftprof: run dir {run_dir}", f"ftprof: lora ok, run dir {run_dir}"]


PROFILE_ONE_MATMUL = """
import sys
if sys.argv[1] == "quiet":
    from ftprof.console import silence_third_party
    silence_third_party()
import torch
from torch.profiler import profile
with profile() as prof:
    torch.ones(4) @ torch.ones(4)
prof.export_chrome_trace(sys.argv[2])
"""


@pytest.mark.slow  # a fresh interpreter imports torch (about 6 s on the 2-core machine)
def test_quiet_silences_the_profilers_own_logging(tmp_path):
    """kineto (torch.profiler's C++ side) writes to fd 2 itself: "gpuGetDeviceCount failed" without a GPU driver."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("KINETO_LOG_LEVEL", None)
    out = subprocess.run([sys.executable, "-c", PROFILE_ONE_MATMUL, "quiet", str(tmp_path / "t.json")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and (tmp_path / "t.json").stat().st_size > 0, out.stderr
    assert out.stderr == ""


def test_slow_steps_read_as_one_line_each_with_their_cause():
    slow = [{"step": 1, "warmup": True, "step_time_s": 3.2, "extra_s": 2.7, "cause": "torch.compile",
             "cause_s": 2.5},
            {"step": 9, "warmup": False, "step_time_s": 1.55, "extra_s": 0.56, "cause": "allocator retries (2)",
             "cause_s": None}]
    lines = slow_step_lines(_run(slow_steps=slow))
    assert lines == ["warm-up step 1 took 3.200 s, 2.700 s over the steady median: torch.compile 2.500 s",
                     "step 9 took 1.550 s, 0.560 s over the steady median: allocator retries (2)"]
    many = slow_step_lines(_run(slow_steps=slow[1:] * (SLOW_STEPS_SHOWN + 2)))
    assert len(many) == SLOW_STEPS_SHOWN + 1 and many[-1] == "2 more in result.json (slow_steps)"
    assert slow_step_lines(_run()) == []
