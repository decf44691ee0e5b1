"""The integrations' profiler window (``FtprofCallback(profile=...)``, ``measure(..., profile=...)``): ``ftprof
profile``'s files, buckets, TFLOP/s and diagnoses, from ftprof's own profiler and summary code, in a run directory
``ftprof report`` reads as it reads a profiled run; without the option, nothing of it."""

from __future__ import annotations

import csv
import gzip
import json
import math
import statistics

import pytest
import torch

from ftprof.config import ProfilingConfig
from ftprof.profiling import layout
from tests.integrations.test_loop import _loop
from tests.integrations.tiny import tiny_llama, token_rows, training_args

STEPS = 6
SEQ, ROWS = 96, 4  # 384 tokens per micro-batch: not the vocabulary's 256, which the GEMM split would take for it


def _rows(path) -> list[dict]:
    return list(csv.DictReader(path.open()))


def _json(path) -> dict:
    return json.loads(path.read_text())


def _measured(tmp_path, steps: int, checkpointing: bool = False, **kw):
    """A LoRA plain loop (4 x 96 tokens, no gradient accumulation) under ``measure``."""
    from ftprof.integrations import measure

    model = tiny_llama(lora=True)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with measure(model, tmp_path / "run", optimizer=opt, max_steps=steps, **kw) as m:
        _loop(model, opt, m, steps, rows=ROWS, seq=SEQ)
    return tmp_path / "run"


def _trainer_run(tmp):
    import datasets
    from transformers import Trainer, default_data_collator

    from ftprof.integrations import FtprofCallback

    rows = token_rows(64, SEQ)
    rows["labels"] = rows["input_ids"]
    args = training_args(tmp / "hf-out", STEPS, batch_size=ROWS, gradient_checkpointing=True,
                         gradient_checkpointing_kwargs={"use_reentrant": False})
    callback = FtprofCallback(tmp / "run", profile=True)
    Trainer(model=tiny_llama(lora=True), args=args, train_dataset=datasets.Dataset.from_dict(rows),
            data_collator=default_data_collator, callbacks=[callback]).train()
    return tmp / "run"


@pytest.fixture(scope="module", params=["loop", pytest.param("trainer", marks=pytest.mark.slow)])
def run_dir(request, tmp_path_factory):
    """A LoRA run with gradient checkpointing (so the recomputation diagnosis has something to say) under the
    profiler window at ``ftprof profile``'s defaults: a plain loop under ``measure`` (about a second), and the HF
    Trainer with the callback (a few seconds: slow)."""
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "trainer":
        return _trainer_run(tmp)
    return _measured(tmp, STEPS, checkpointing=True, profile=True)


def test_the_window_writes_ftprof_profiles_files(run_dir):
    profile = run_dir / "profile"
    trace = layout.trace_path(profile, 0, 1)
    assert layout.trace_files(profile) == [trace]
    for name in ("key_averages_rank0_cycle1.txt", "summary_rank0_cycle1.json", "summary_rank0_cycle1.md",
                 "summary.json", "summary.md"):
        assert (profile / name).is_file(), name
    assert _json(profile / "summary.json") == _json(profile / "summary_rank0_cycle1.json")  # the last cycle
    result = _json(run_dir / "result.json")
    assert result["status"] == "ok"
    for path in result["artifacts"].values():  # every artifact it names exists, relative to the run directory
        assert (run_dir / path).is_file(), path
    assert {"trace_rank0_cycle1", "key_averages_rank0_cycle1", "summary"} <= set(result["artifacts"])
    events = json.loads(gzip.open(trace).read())
    assert {"ftprof/forward", "ftprof/backward", "ftprof/optimizer_step"} <= {e.get("name") for e in
                                                                            events["traceEvents"]}
    meta = layout.decode_metadata(events["ftprof"])
    assert (meta["method"], meta["lora_r"], meta["seq_len"], meta["batch_size"]) == ("lora", 8, SEQ, ROWS)
    assert meta["flops_per_token"] == result["flops_per_token"]  # the run's one FLOP count
    assert meta["recompute_flops_per_token"] == result["recompute_flops_per_token"] > 0
    config = _json(run_dir / "config.json")
    assert config["profiling"] == {**vars(ProfilingConfig()), "profile": True}


def test_profiled_steps_are_flagged_and_left_out_of_the_steady_figures(run_dir):
    from ftprof.profiling.torch_profiler import TorchProfiler

    steps = _rows(run_dir / "steps.csv")
    schedule = TorchProfiler(ProfilingConfig(profile=True), run_dir / "unused", torch.device("cpu"))
    assert [s["profiler_phase"] for s in steps] == [schedule.phase(i) for i in range(1, STEPS + 1)]
    result = _json(run_dir / "result.json")
    plain = [s for s in steps if s["warmup"] == "False" and s["profiler_phase"] in ("", "wait")]
    assert result["steady_steps"] == len(plain) == 2
    assert result["step_time_p50_s"] == pytest.approx(statistics.median(float(s["step_time_s"]) for s in plain))
    assert "steady-state figures from 2 unprofiled steps (2 profiled steps left out)" in result["notes"]
    prof = result["profiling"]
    assert prof["activities"] == ["cpu"] and prof["record_shapes"] is True
    active = [float(s["step_time_s"]) for s in steps if s["profiler_phase"] == "active"]
    assert prof["active_step_p50_s"] == pytest.approx(statistics.median(active))
    assert math.isfinite(prof["profiler_overhead"]) and prof["measure_overhead"] is not None


def test_buckets_add_up_and_flops_match_the_runs_count(run_dir):
    summary = _json(run_dir / "profile" / "summary.json")
    bd = summary["breakdown"]
    assert bd["steps"] == 2 and len(bd["step_ms"]) == 2
    buckets = bd["buckets"]
    assert {"base_gemm", "lora_gemm", "recompute", "attention", "loss", "optimizer"} <= set(buckets)
    for i, step_ms in enumerate(bd["step_ms"]):  # every step's time is in exactly one bucket
        assert sum(b["per_step_ms"][i] for b in buckets.values()) == pytest.approx(step_ms, rel=1e-6)
    assert sum(b["share"] for b in buckets.values()) == pytest.approx(1.0, rel=1e-6)
    for b in buckets.values():
        if b["tflops"] is not None:
            assert b["tflops"] == pytest.approx(b["flops_per_step"] / (b["ms_per_step"] / 1e3) / 1e12)
    # the FLOPs counted from the recorded shapes against the run's HFU count (result.json's, per step)
    result = _json(run_dir / "result.json")
    per_step = (result["flops_per_token"] + result["recompute_flops_per_token"]) * ROWS * SEQ
    assert bd["hfu_flops_per_step"] == pytest.approx(per_step)
    assert bd["flops_ratio"] == pytest.approx(1.0, abs=0.1)
    assert bd["split"]["lora_r"] == 8 and bd["split"]["tokens_per_micro_batch"] == ROWS * SEQ


def test_the_diagnoses_are_ftprof_profiles(run_dir):
    """The summary on disk is what ftprof's summarizer makes of the trace with the run's config, and its
    recomputation diagnosis carries the run's own FLOP share."""
    from ftprof.analysis.pipeline import summarize

    stored = _json(run_dir / "profile" / "summary.json")
    fresh = summarize(layout.trace_path(run_dir / "profile", 0, 1), run_config=_json(run_dir / "config.json"))
    assert stored["verdict"] == fresh.verdict
    assert [d["code"] for d in stored["diagnoses"]] == [d.code for d in fresh.diagnoses]
    assert {k: b["flops_per_step"] for k, b in stored["breakdown"]["buckets"].items()} == \
        {k: b["flops_per_step"] for k, b in fresh.breakdown["buckets"].items()}
    recompute = next(d for d in stored["diagnoses"] if d["code"] == "recomputation")
    result = _json(run_dir / "result.json")
    share = result["recompute_flops_per_token"] / (result["flops_per_token"] + result["recompute_flops_per_token"])
    assert recompute["evidence"]["flops_share"] == pytest.approx(share)
    assert recompute["evidence"]["measured_share"] == stored["breakdown"]["buckets"]["recompute"]["share"]
    assert set(stored["stages_us"]) == {"ftprof/forward", "ftprof/backward", "ftprof/optimizer_step"}
    assert stored["profiler_overhead"] == result["profiling"]["profiler_overhead"]


def test_the_report_reads_it_as_a_profiled_run(run_dir, tmp_path):
    import ftprof
    from ftprof.analysis.buckets import columns

    ftprof.build_report([run_dir], tmp_path / "report", plot=False)
    row = _rows(tmp_path / "report" / "raw_summary.csv")[0]
    assert row["profile"] == "True"
    summary = _json(run_dir / "profile" / "summary.json")
    for key, value in columns(summary["breakdown"]).items():
        if value is not None:
            assert float(row[f"bucket_{key}"]) == pytest.approx(value)


def test_measure_takes_the_window_as_prof_options(tmp_path):
    """Two cycles of one active step each, from a mapping of ProfilingConfig's fields: a trace and a summary per
    cycle; summary.json is the last."""
    run = _measured(tmp_path, 5, profile={"prof_wait_steps": 0, "prof_active_steps": 1, "prof_repeat": 2})
    profile = run / "profile"
    assert layout.trace_files(profile) == [layout.trace_path(profile, 0, 1), layout.trace_path(profile, 0, 2)]
    assert [s["profiler_phase"] for s in _rows(run / "steps.csv")] == ["warmup", "active"] * 2 + [""]
    assert _json(profile / "summary.json") == _json(profile / "summary_rank0_cycle2.json")
    summary = _json(profile / "summary_rank0_cycle1.json")
    assert summary["breakdown"]["steps"] == 1 and summary["breakdown"]["buckets"]["lora_gemm"]["tflops"] > 0
    # the first cycle collected from the first step on, before the run's shape was seen: its trace still carries
    # the run's FLOP count (added after the first step)
    result = _json(run / "result.json")
    assert summary["breakdown"]["hfu_flops_per_step"] == pytest.approx(result["flops_per_token"] * 4 * SEQ)
    assert _json(run / "config.json")["profiling"]["prof_repeat"] == 2


def test_a_window_longer_than_the_run_is_said_not_hidden(tmp_path):
    run = _measured(tmp_path, 3, profile=ProfilingConfig(prof_active_steps=4))
    result = _json(run / "result.json")
    assert result["status"] == "ok" and not layout.trace_files(run / "profile")
    assert any("profiler window needs 6 steps" in n and "no trace" in n for n in result["notes"])
    assert "summary" not in result["artifacts"]


def test_a_rank_outside_prof_ranks_records_no_window(tmp_path):
    run = _measured(tmp_path, 3, profile={"prof_ranks": "1"})
    assert not (run / "profile").exists()
    assert {s["profiler_phase"] for s in _rows(run / "steps.csv")} == {""}
    assert _json(run / "config.json")["profiling"]["prof_ranks"] == "1"


def test_without_the_option_nothing_changes(tmp_path):
    run = _measured(tmp_path, 3)
    assert not (run / "profile").exists()
    assert {s["profiler_phase"] for s in _rows(run / "steps.csv")} == {""}
    result = _json(run / "result.json")
    assert set(result["profiling"]) == {"measure_s_per_step", "measure_overhead"}
    assert not any("profiled" in n or "profiler" in n for n in result["notes"])
    assert set(result["artifacts"]) == {"config", "env", "steps"}
    assert _json(run / "config.json")["profiling"] == vars(ProfilingConfig())


def test_a_bad_window_is_refused_before_training():
    from ftprof.errors import ConfigError
    from ftprof.integrations import FtprofCallback

    with pytest.raises(ConfigError, match="--prof-active-steps"):
        FtprofCallback("unused", profile={"prof_active_steps": 0})
    with pytest.raises(TypeError, match="profile"):
        FtprofCallback("unused", profile=3)
