"""The HF Trainer baseline script runs and reports the figures BENCHMARKS.md compares against."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "hf_baseline.py"


def test_baseline_script_reports_throughput():
    out = subprocess.run([sys.executable, str(SCRIPT), "--method", "lora", "--model", "tiny", "--batch-size", "2",
                          "--seq-len", "32", "--max-steps", "5", "--warmup-steps", "2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["recipe"] == "hf-trainer" and row["method"] == "lora" and row["steps"] == 3
    assert row["tokens_per_s"] > 0 and row["step_time_p50_s"] > 0
