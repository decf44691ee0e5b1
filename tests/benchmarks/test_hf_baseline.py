"""The HF Trainer baseline script runs and reports the figures BENCHMARKS.md compares against."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.requires import requires_run

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "hf_baseline.py"


@pytest.mark.slow  # > 4 s on the 2-core machine: `pytest -m 'not slow'` is the fast subset
def test_baseline_script_reports_throughput(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--method", "lora", "--model", "tiny", "--batch-size", "2",
                          "--seq-len", "32", "--max-steps", "5", "--warmup-steps", "2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["recipe"] == "hf-trainer" and row["method"] == "lora" and row["steps"] == 3
    assert row["tokens_per_s"] > 0 and row["step_time_p50_s"] > 0
    assert row["mfu"] is None  # no peak FLOPs for a CPU

    # the same FLOP count ftprof puts in result.json for the same preset, method and sequence length
    import ftprof
    from tests.conftest import tiny_config

    result = ftprof.train(tiny_config(tmp_path, "lora", batch_size=2, seq_len=32, max_steps=2))
    assert row["flops_per_token"] == result.flops.flops_per_token


@pytest.mark.slow  # > 4 s on the 2-core machine: `pytest -m 'not slow'` is the fast subset
@requires_run("gptq-lora")
def test_gptq_baseline_reuses_ftprofs_quantized_checkpoint(tmp_path, monkeypatch, capsys):
    """The baseline trains the very GPTQ checkpoint `ftprof train gptq-lora` quantized: one cache entry, not two.
    (``ftprof train`` runs in this process, which has torch and peft imported already: its quantization still runs
    in a child process of its own; the baseline script is a process of its own.)"""
    import os

    from ftprof.cli.main import main

    monkeypatch.setenv("FTPROF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GPTQMODEL_CPU_WORKERS", "2")
    common = ["--model", "tiny", "--batch-size", "2", "--seq-len", "32", "--max-steps", "4", "--warmup-steps", "2"]
    code = main(["train", "gptq-lora", *common, "--quiet", "--output-dir", str(tmp_path / "runs")])
    assert code == 0, capsys.readouterr().err[-2000:]
    entries = sorted(p.name for p in (tmp_path / "cache" / "gptq").iterdir() if p.is_dir())
    assert len(entries) == 1 and entries[0].startswith("tiny-")
    stamp = (tmp_path / "cache" / "gptq" / entries[0] / "quantize_config.json").stat().st_mtime_ns
    out = subprocess.run([sys.executable, str(SCRIPT), "--method", "gptq-lora", *common], capture_output=True,
                         text=True, env=dict(os.environ), timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["method"] == "gptq-lora" and row["tokens_per_s"] > 0
    assert sorted(p.name for p in (tmp_path / "cache" / "gptq").iterdir() if p.is_dir()) == entries
    assert (tmp_path / "cache" / "gptq" / entries[0] / "quantize_config.json").stat().st_mtime_ns == stamp
