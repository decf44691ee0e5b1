"""Profile folder layout and trace metadata: what trace readers (HTA, TensorBoard, Perfetto) are pointed at."""

import gzip
import json

import pytest
import torch

from ftprof.analysis.pipeline import summarize
from ftprof.config import ProfilingConfig
from ftprof.profiling import layout
from ftprof.profiling.torch_profiler import TorchProfiler


def _profile_a_tiny_loop(out_dir, repeat=1):
    """TorchProfiler itself (no training run): a linear layer's steps on CPU, as ftprof's loop drives it."""
    cfg = ProfilingConfig(profile=True, prof_wait_steps=0, prof_warmup_steps=1, prof_active_steps=1,
                          prof_repeat=repeat, prof_record_shapes=True)
    model = torch.nn.Linear(32, 32)
    meta = {"method": "full", "model": "it's a \"test\"", "checkpointing": False, "flops_per_token": 1.5}
    with TorchProfiler(cfg, out_dir, torch.device("cpu"), rank=0, log=lambda _: None, metadata=meta) as prof:
        for _ in range(cfg.total_steps):
            with torch.profiler.record_function("ftprof/forward"):
                loss = model(torch.randn(8, 32)).sum()
            loss.backward()
            prof.step()
    return prof


def test_one_folder_per_cycle_with_only_its_traces(tmp_path):
    _profile_a_tiny_loop(tmp_path, repeat=2)
    traces = layout.trace_files(tmp_path)
    assert [str(p.relative_to(tmp_path)) for p in traces] == [
        "cycle1/trace_rank0_cycle1.pt.trace.json.gz", "cycle2/trace_rank0_cycle2.pt.trace.json.gz"]
    for cycle in ("cycle1", "cycle2"):
        assert [p.name for p in (tmp_path / cycle).iterdir()] == [f"trace_rank0_{cycle}.pt.trace.json.gz"]
    assert layout.summary_stem(traces[1]) == "summary_rank0_cycle2"


def test_metadata_is_a_flat_string_that_round_trips(tmp_path):
    _profile_a_tiny_loop(tmp_path)
    raw = json.loads(gzip.open(tmp_path / "cycle1" / "trace_rank0_cycle1.pt.trace.json.gz").read())
    assert isinstance(raw["ftprof"], str)  # not a nested object: HTA 0.5 fails on those
    assert raw["distributedInfo"]["rank"] == 0
    block = summarize(tmp_path / "cycle1" / "trace_rank0_cycle1.pt.trace.json.gz").metadata["ftprof"]
    assert block == {"method": "full", "model": "it_s a _test_", "checkpointing": False, "flops_per_token": 1.5,
                     "cycle": 1}
    assert layout.decode_metadata({"method": "lora"}) == {"method": "lora"}  # traces from before the change
    assert layout.decode_metadata("not json") == {}


def test_holistic_trace_analysis_loads_an_ftprof_trace(tmp_path):
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    _profile_a_tiny_loop(tmp_path)
    analysis = TraceAnalysis(trace_dir=str(tmp_path / "cycle1"))
    frame = analysis.t.get_trace(0)
    names = set(analysis.t.symbol_table.sym_table)
    assert len(frame) > 0 and "ftprof/forward" in names and "aten::addmm" in names


def test_open_hints_name_the_folder_and_three_readers(tmp_path):
    _profile_a_tiny_loop(tmp_path)
    text = "\n".join(layout.open_hints(tmp_path / "cycle1"))
    assert str(tmp_path / "cycle1") in text and "1 file, one per rank" in text
    assert "ui.perfetto.dev" in text and f"--logdir {tmp_path}" in text and "TraceAnalysis(trace_dir=" in text


def test_summarize_writes_beside_the_cycle_folder_not_inside(tmp_path, capsys):
    from ftprof.cli.main import main

    _profile_a_tiny_loop(tmp_path)
    trace = tmp_path / "cycle1" / "trace_rank0_cycle1.pt.trace.json.gz"
    assert main(["profile", "--summarize", str(trace)]) == 0
    assert [p.name for p in (tmp_path / "cycle1").iterdir()] == [trace.name]
    assert (tmp_path / "trace_rank0_cycle1.summary.json").exists()
    assert layout.summaries_dir(tmp_path / "elsewhere" / "x.json") == tmp_path / "elsewhere"
