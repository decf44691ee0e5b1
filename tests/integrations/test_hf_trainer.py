"""FtprofCallback on transformers' Trainer: a complete run directory that ftprof's report and --baseline read, and
throughput that agrees with the Trainer's own timing."""

from __future__ import annotations

import csv
import json
import math

import pytest

from tests.integrations.tiny import StepClock, run_trainer

pytestmark = pytest.mark.slow  # each Trainer run takes a few seconds on the 2-core machine

STEPS = 6
SEQ = 512  # steps of ~0.15 s on one CPU thread: the Trainer's fixed costs (~5 ms) stay well under 2%


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One LoRA and one full fine-tune, 6 steps each, through the Trainer with the callback."""
    tmp = tmp_path_factory.mktemp("hf")
    out = {}
    for name, lora in (("lora", True), ("full", False)):
        output, callback = run_trainer(tmp / name, tmp / "runs" / name, lora, seq_len=SEQ, steps=STEPS)
        out[name] = (tmp / "runs" / name, output, callback)
    return out


@pytest.mark.parametrize("name", ["lora", "full"])
def test_the_run_directory_is_complete(runs, name):
    run_dir, _, _ = runs[name]
    for f in ("config.json", "steps.csv", "result.json", "env.json", "memory_stages.csv"):
        assert (run_dir / f).is_file(), f
    rows = list(csv.DictReader((run_dir / "steps.csv").open()))
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))  # one row per optimizer step
    assert all(int(r["tokens"]) == 8 * SEQ and int(r["real_tokens"]) == 8 * (SEQ - 1) for r in rows)
    assert all(math.isfinite(float(r["loss"])) and float(r["step_time_s"]) > 0 for r in rows)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok"
    assert result["training_proof"]["passed"] is True
    assert result["training_proof"]["frozen_changed"] == 0
    assert result["steady_steps"] == STEPS - 2 and len(result["warmup_step_times_s"]) == 2
    assert result["tokens_per_s"] > 0 and result["real_tokens_per_s"] < result["tokens_per_s"]
    assert result["tokens_per_s_per_gpu"] == result["tokens_per_s"]  # one process
    assert result["flops_per_token"] > 0 and result["mfu"] is None  # CPU: no peak, MFU left empty (as ftprof's)
    assert set(result["memory_stages"]) >= {"mem_first_forward_peak", "mem_first_backward_peak",
                                            "mem_first_optimizer_step_peak", "mem_steady_state_peak"}
    assert {"weights_frozen", "gradients", "optimizer_state", "activations_saved"} <= set(result["memory_breakdown"])
    env = json.loads((run_dir / "env.json").read_text())
    assert env["packages"]["torch"]


def test_the_method_and_training_arguments_are_recognised(runs):
    lora = json.loads((runs["lora"][0] / "config.json").read_text())
    assert lora["method"]["method"] == "lora"
    assert (lora["method"]["lora_r"], lora["method"]["lora_alpha"]) == (8, 16.0)
    assert sorted(lora["method"]["lora_targets"]) == ["q_proj", "v_proj"]
    assert lora["data"]["seq_len"] == SEQ and lora["data"]["batch_size"] == 8
    assert lora["train"]["max_steps"] == STEPS and lora["train"]["lr"] == 1e-3 and lora["train"]["grad_accum"] == 1
    assert lora["trainer"]["name"] == "hf-trainer"
    assert lora["trainer"]["training_args"]["per_device_train_batch_size"] == 8
    full = json.loads((runs["full"][0] / "config.json").read_text())
    assert full["method"]["method"] == "full" and full["method"]["lora_r"] is None
    lora_res = json.loads((runs["lora"][0] / "result.json").read_text())
    full_res = json.loads((runs["full"][0] / "result.json").read_text())
    assert lora_res["params_trainable"] < full_res["params_trainable"]
    assert lora_res["params_total"] == full_res["params_total"] + lora_res["params_trainable"]


def test_load_results_report_and_baseline_read_it(runs, tmp_path):
    import ftprof

    frame = ftprof.load_results(runs["lora"][0])
    assert len(frame) == 1
    row = frame.iloc[0]
    assert row["status"] == "ok" and row["tokens_per_s"] > 0 and "mfu" in frame.columns
    report = ftprof.build_report([runs["lora"][0], runs["full"][0]], tmp_path / "report", plot=False)
    assert report is not None and (tmp_path / "report").is_dir()
    compared = ftprof.build_report([runs["lora"][0]], tmp_path / "compare", baseline=runs["full"][0], plot=False)
    assert compared is not None


def test_tokens_per_s_agrees_with_the_trainers_own_timing(runs):
    """Like with like. The Trainer's figure (samples/s x sequence length) is over its whole runtime: every step,
    warm-up included, and what runs between steps (fetching and collating batches, its bookkeeping). So: the
    callback's tokens over the wall time from the first step's start to the last step's end agree within 2%; its
    step-time figure (the steps alone, as ftprof's own runs time them) is higher by the between-step share."""
    for name in ("lora", "full"):
        run_dir, output, _ = runs[name]
        rows = list(csv.DictReader((run_dir / "steps.csv").open()))
        tokens = sum(int(r["tokens"]) for r in rows)
        wall = float(rows[-1]["started_unix"]) + float(rows[-1]["step_time_s"]) - float(rows[0]["started_unix"])
        theirs = output.metrics["train_samples_per_second"] * SEQ
        assert tokens / wall == pytest.approx(theirs, rel=0.02), name
        steps_only = tokens / sum(float(r["step_time_s"]) for r in rows)
        assert theirs <= steps_only <= 1.15 * theirs, name


def test_the_callbacks_own_cost_is_small(runs, tmp_path):
    """Measured two ways: the recorder's own time inside the steps (result.json), and the fastest step time a bare
    callback sees with and without ftprof's (a ratio with a wide margin: the 2-core machine is noisy)."""
    result = json.loads((runs["lora"][0] / "result.json").read_text())
    assert result["profiling"]["measure_overhead"] < 0.05
    bare, with_ftprof = StepClock(), StepClock()
    run_trainer(tmp_path / "a", None, True, steps=8, extra_callbacks=[bare])
    run_trainer(tmp_path / "b", tmp_path / "run", True, steps=8, extra_callbacks=[with_ftprof])
    # the fastest steady step of each: what the step costs, with the least of the machine's other load in it
    assert min(with_ftprof.times[2:]) / min(bare.times[2:]) < 1.5
