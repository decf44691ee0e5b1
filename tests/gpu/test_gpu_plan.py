"""The planner on a real GPU: each run's recorded prediction (made before its model loaded) against the peak the
allocator measured, per checkpointing policy, on llama-1b (BENCHMARKS.md holds the llama-8b accuracy table:
benchmarks/plan_accuracy.sh); and `ftprof plan` for this GPU in one process.

Run on the GPU machine with ``pytest -m gpu``; skipped cleanly on CPU.
"""

import json

import pytest

import ftprof
from ftprof.cli.main import main
from ftprof.plan import accuracy
from tests.gpu.test_gpu_train import gpu_config
from tests.requires import requires_run

pytestmark = pytest.mark.gpu

MEMORY = 0.05  # the bound: |error| <= 5% median, no cell under-predicted by more than 5%


@pytest.mark.parametrize("method, policy", [pytest.param(m, p, marks=requires_run(m))
                                            for m, p in [("lora", "none"), ("qlora", "selective"), ("qlora", "full")]])
def test_the_recorded_prediction_is_within_5_percent_of_the_measured_peak(tmp_path, method, policy):
    result = ftprof.train(gpu_config(tmp_path, method, checkpointing=policy, run_name="r"))
    assert result.status == "ok", result.failure.error_message
    row = accuracy.row_from_run_dir(tmp_path / "r")
    error = accuracy.errors(row)["memory_error"]
    print(f"{method} {policy}: predicted {result.prediction.peak_bytes / 2**30:.2f} GiB, error {error:+.1%}; "
          f"tokens/s error {accuracy.errors(row)['tokens_per_s_error']}")
    assert error is not None and -MEMORY <= error <= 2 * MEMORY, (error, result.prediction.memory_source)


@requires_run("qlora")  # the planner probes both methods' models
def test_plan_for_this_gpu_ranks_and_writes(tmp_path, capsys):
    code = main(["plan", "qlora,lora", "--model", "llama-1b", "--batch-size", "4", "--seq-len", "1024",
                 "--memory-limit-gib", "12", "--plan-dir", str(tmp_path)])
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "plan.json").read_text())
    assert code == 0 and data["target"].startswith("NVIDIA"), out
    assert data["rows"][0]["fits"] and data["rows"][0]["tokens_per_s"] > 0
    print(out)
