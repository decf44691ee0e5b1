"""Output into a pipe or a file is plain lines: bench's one line per experiment as it finishes (never a live frame
glued to the next line), no third-party progress bars."""

import io
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ftprof.cli.bench_display import LiveBenchDisplay, PlainBenchDisplay, bench_display
from ftprof.console import make_console

REPO = Path(__file__).resolve().parents[2]


def _planned(name, previous=None):
    return SimpleNamespace(experiment=SimpleNamespace(name=name), previous=previous)


def test_plain_display_writes_one_line_per_event_as_it_happens():
    out = io.StringIO()
    display = PlainBenchDisplay(3, out=out)
    display.start()
    display.event("skip", _planned("a", previous="ok"))
    display.event("start", _planned("b"))
    assert out.getvalue().splitlines()[-1] == "started b"  # written at once, not at the end
    display.event("finish", SimpleNamespace(name="b", status="ok", seconds=12.4, result={"tokens_per_s": 1234.5}))
    display.event("finish", SimpleNamespace(name="c", status="oom", seconds=3.0, result={}))
    display.stop()
    assert out.getvalue().splitlines() == ["bench: 3 experiments", "[1/3] a skipped (ok)", "started b",
                                           "[2/3] b ok, 1,234 tok/s, 12 s", "[3/3] c oom, 3 s"]


def test_the_live_display_only_on_a_terminal():
    assert isinstance(bench_display(make_console(), 2), PlainBenchDisplay)  # pytest's stdout is not a terminal
    from rich.console import Console

    terminal = Console(file=io.StringIO(), force_terminal=True)
    assert isinstance(bench_display(terminal, 2), LiveBenchDisplay)


@pytest.mark.slow  # one tiny experiment in a child process: ~25 s on 2 cores
def test_bench_into_a_pipe_prints_plain_lines(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: pipe\nbase: {model: tiny, seq_len: 32, max_steps: 2, warmup_steps: 1}\n"
                     "matrix: {method: [lora]}\ntimeout_s: 300\n")
    done = subprocess.run([sys.executable, "-m", "ftprof", "bench", str(sweep), "--output-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "\r" not in done.stdout and "\x1b" not in done.stdout
    finished = [line for line in lines if line.startswith("[1/1] ")]
    assert len(finished) == 1 and " ok, " in finished[0] and "tok/s" in finished[0], done.stdout
    assert "sweep pipe" in lines  # the table's title on a line of its own, nothing glued to it
    assert lines.index("sweep pipe") > lines.index(finished[0])
    assert done.stderr == ""


def test_third_party_progress_bars_are_off_when_stderr_is_not_a_terminal():
    code = ("import os, sys; import ftprof.runtime as r; "
            "print(os.environ.get('HF_HUB_DISABLE_PROGRESS_BARS'), os.environ.get('TQDM_DISABLE'), "
            "os.environ.get('HF_DATASETS_DISABLE_PROGRESS_BARS'))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TQDM_"))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.stdout.split() == ["1", "1", "1"], done.stderr


def test_a_value_the_user_set_stays(monkeypatch):
    from ftprof.runtime import no_progress_bars_off_terminal

    monkeypatch.setenv("TQDM_DISABLE", "0")
    assert no_progress_bars_off_terminal(io.StringIO()) is True
    assert os.environ["TQDM_DISABLE"] == "0"
    tty = SimpleNamespace(isatty=lambda: True)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    assert no_progress_bars_off_terminal(tty) is False and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ


def test_tokenizing_a_file_writes_no_progress_bar_into_a_pipe(tmp_path):
    """datasets' map/filter bars (carriage-return frames) stay out of stderr that is not a terminal, even with
    the environment's switches for them unset."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"text": "row {i} of some text"}}\n' for i in range(50)))
    code = f"""
from ftprof.config import DataConfig
from ftprof.data.prepare import prepare_dataset
from ftprof.models.tokenizer import build_tokenizer
print(prepare_dataset(DataConfig(dataset={str(rows)!r}, seq_len=16), build_tokenizer()).rows)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_HUB_DISABLE", "HF_DATASETS_DISABLE", "TQDM"))}
    env["HF_DATASETS_CACHE"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "50"
    assert "\r" not in done.stderr and "tokenizing" not in done.stderr, done.stderr


def test_the_bench_table_leaves_out_figures_no_row_has():
    """A CPU sweep has no MFU, allocator or NVML peak: no column of '-' for them; its host RSS peak stands in."""
    from rich.console import Console

    from ftprof.cli.bench import results_table

    cpu = [{"experiment": "a", "status": "ok", "tokens_per_s": "1200", "step_time_p50_s": "0.1",
            "host_peak_rss": str(2 * 2**30)}]
    console = Console(record=True, width=200)
    console.print(results_table(cpu, "cpu", []))
    text = console.export_text()
    assert "MFU" not in text and "NVML" not in text and "torch peak" not in text and "host peak RSS GiB" in text
    gpu = [{**cpu[0], "mfu": "0.5", "torch_peak_allocated": str(2**30)}]
    console.print(results_table(gpu, "gpu", []))
    text = console.export_text()
    assert "MFU" in text and "50.0%" in text and "host peak RSS" not in text


def test_repeats_are_told_apart_in_the_bench_table():
    from rich.console import Console

    from ftprof.cli.bench import results_table, with_repeat_column

    rows = [{"experiment": f"method=lora-abc-r{i}", "method": "lora", "status": "ok", "tokens_per_s": str(t)}
            for i, t in ((1, 1000), (2, 1100))]
    assert with_repeat_column(rows, ["method"], 1) == (rows, ["method"])
    shown, keys = with_repeat_column(rows, ["method"], 2)
    assert keys == ["method", "repeat"] and [r["repeat"] for r in shown] == ["1", "2"]
    console = Console(record=True, width=200)
    console.print(results_table(shown, "t", keys))
    text = console.export_text()
    lines = [line for line in text.splitlines() if "lora" in line]
    assert len(lines) == 2 and lines[0] != lines[1] and "repeat" in text
