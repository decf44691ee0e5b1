"""Summary views: the per-rank table names the slowest rank; Markdown carries the buckets."""

import json

from ftprof.analysis import summary_output
from ftprof.analysis.pipeline import summarize
from ftprof.cli.main import main
from ftprof.profiling.layout import encode_metadata
from tests.analysis.test_buckets import GpuTrace, lora_step


def _rank_trace(folder, rank, extra_us):
    t = GpuTrace()
    for i in range(2):
        lora_step(t, 2000.0 * i, elementwise_us=20.0 + extra_us, step_us=1000.0 + extra_us)
    path = folder / f"trace_rank{rank}_cycle1.pt.trace.json.gz"
    import gzip

    with gzip.open(path, "wt") as fh:
        json.dump({"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 2},
                   "ftprof": encode_metadata({"method": "lora", "lora_r": 8}), "traceEvents": t.events}, fh)
    return path


def test_a_cycle_folder_is_summarized_per_rank_with_the_slowest_named(tmp_path, capsys):
    cycle = tmp_path / "cycle1"
    cycle.mkdir()
    _rank_trace(cycle, 0, 0.0)
    _rank_trace(cycle, 1, 250.0)
    assert main(["profile", "--summarize", str(cycle)]) == 0
    out = capsys.readouterr().out
    assert "Per rank" in out and "slowest: rank 1, 1.25 ms per step (+0.25 over the fastest)" in out
    assert "Where the time went (GPU kernels)" in out.replace("\n", " ")  # whose time the shares are of
    assert sorted(p.name for p in cycle.iterdir()) == ["trace_rank0_cycle1.pt.trace.json.gz",
                                                       "trace_rank1_cycle1.pt.trace.json.gz"]
    assert (tmp_path / "trace_rank1_cycle1.summary.json").exists()
    summaries = [summarize(p) for p in sorted(cycle.iterdir())]
    assert [s.rank for s in summaries] == [0, 1]
    assert summary_output.slowest_rank(summaries) == (1, 1.25, 0.25)


def test_markdown_has_the_buckets_table(tmp_path):
    s = summarize(_rank_trace(tmp_path, 0, 0.0))
    md = summary_output.to_markdown(s)
    assert "## Fine-tuning buckets (per active step, 2 steps, step 1.00 ms)" in md
    assert "| LoRA GEMMs | 0.01 |" in md and "FLOPs counted from shapes" in md


def test_every_table_is_per_step_and_a_negative_overhead_is_noise(tmp_path):
    """The buckets and the category, stage, kernel and operator tables share one unit, ms per active step, so the
    two breakdowns of a step read side by side (the window's totals divided by its steps). A profiled step that ran
    faster than unprofiled ones measured noise, not the profiler."""
    summary = summarize(_rank_trace(tmp_path, 0, 0.0))
    summary.profiler_overhead = -0.26
    md = summary_output.to_markdown(summary)
    steps = summary.breakdown["steps"]
    assert steps == 2 and "| category | ms/step | share |" in md and "| stage | ms/step |" in md
    assert "| bucket | ms/step |" in md and "| operator | ms/step | calls/step |" in md
    (category, total_us), = list(summary.categories_us.items())[:1]
    assert f"| {category} | {total_us / steps / 1000:,.2f} |" in md
    op = summary.top_operators[0]
    calls = op["count"] / steps
    assert f"| {f'{calls:,.0f}' if calls == int(calls) else f'{calls:,.1f}'} |" in md
    assert "-26.0% against unprofiled steps of the same run: no measurable overhead" in md
    assert "no measurable overhead" not in summary_output.overhead_line(0.05)
