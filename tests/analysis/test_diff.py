"""A/B diffs: a planted slowdown is named, with its confidence interval, down to the kernel."""

import copy
import gzip
import json
from pathlib import Path

import pytest

from ftprof.analysis import diff_output
from ftprof.analysis.diff import diff_summaries, t975, welch_ci
from ftprof.analysis.diff_sides import side_of
from ftprof.analysis.pipeline import summarize
from ftprof.cli.main import main
from ftprof.profiling.layout import encode_metadata
from tests.analysis.test_buckets import GpuTrace, _write, lora_step

FIXTURE = Path(__file__).parent.parent / "fixtures" / "tiny_gpu_trace.pt.trace.json.gz"


def _steps(path, extra_elementwise_us=0.0, steps=4, name=None, **meta):
    """``steps`` LoRA steps, 2 ms apart; B's elementwise kernel takes ``extra_elementwise_us`` longer (and the
    step as much), with 1-3 us of step-to-step noise on both sides. ``meta``: more of the trace's ftprof block."""
    t = GpuTrace()
    for i in range(steps):
        noise = (i % 3) + 1.0
        kwargs = {"elementwise_name": name} if name else {}
        lora_step(t, 2000.0 * i, elementwise_us=20.0 + noise + extra_elementwise_us,
                  step_us=1000.0 + noise + extra_elementwise_us, **kwargs)
    return _write(path, t.events, ftprof=encode_metadata({"method": "lora", "lora_r": 8, **meta}))


def test_a_planted_elementwise_slowdown_is_named_with_its_interval(tmp_path):
    a = summarize(_steps(tmp_path / "a.json")).to_dict()
    b = summarize(_steps(tmp_path / "b.json", extra_elementwise_us=300.0)).to_dict()
    d = diff_summaries(a, b)
    assert d.a_steps == d.b_steps == 4
    assert d.delta_ms == pytest.approx(0.3)
    rows = {r.key: r for r in d.buckets}
    assert rows["elementwise"].delta_ms == pytest.approx(0.3)
    assert rows["elementwise"].ci_ms is not None and rows["elementwise"].ci_ms < 0.3  # the interval excludes 0
    assert rows["base_gemm"].delta_ms == pytest.approx(0.0)
    assert d.explanation.startswith("+0.3 ms/step (+30%): other elementwise +0.3")
    assert "within noise" not in d.explanation
    top = d.kernels[0]
    assert top.bucket == "elementwise" and top.change == "changed" and top.delta_ms == pytest.approx(0.3)


def test_no_change_is_within_noise_and_a_new_kernel_appears(tmp_path):
    a = summarize(_steps(tmp_path / "a.json")).to_dict()
    b = summarize(_steps(tmp_path / "b.json", name="triton_poi_fused_mul_0")).to_dict()
    d = diff_summaries(a, b)
    assert abs(d.delta_ms) < 1e-9 and "within noise" in d.explanation
    changes = {(k.name, k.change) for k in d.kernels}
    assert ("triton_poi_fused_mul_0", "appeared") in changes
    assert ("void at::native::vectorized_elementwise_kernel<4, MulFunctor>", "disappeared") in changes


def test_edited_real_h200_trace_names_the_bucket(tmp_path):
    """The committed H200 trace against a copy whose elementwise kernels take 5x longer."""
    data = json.loads(gzip.open(FIXTURE).read())
    added = 0.0
    for ev in data["traceEvents"]:
        if ev.get("cat") == "kernel" and "elementwise_kernel" in ev["name"]:
            added += 4 * ev["dur"]
            ev["dur"] *= 5
    slow = tmp_path / "slow.pt.trace.json.gz"
    with gzip.open(slow, "wt") as fh:
        json.dump(data, fh)
    d = diff_summaries(summarize(FIXTURE).to_dict(), summarize(slow).to_dict())
    rows = {r.key: r for r in d.buckets}
    moved = sum(r.delta_ms for r in d.buckets if r.key != "idle")
    assert moved == pytest.approx(added / 1000, rel=1e-4)  # every added microsecond lands in some bucket
    biggest = max((r for r in d.buckets if r.key != "idle"), key=lambda r: r.delta_ms)
    assert biggest.key == "elementwise" and rows["elementwise"].delta_ms > 0.5 * added / 1000
    assert d.ci_ms is None and any("one active step" in n for n in d.notes)
    # the tiny model's step is CPU-bound: the step time holds, GPU idle gives way to the elementwise work
    assert "step time unchanged; inside it: GPU idle -1.1, other elementwise +1.0" in d.explanation
    assert d.kernels and all("elementwise_kernel" in k.name for k in d.kernels)
    assert {k.change for k in d.kernels} <= {"changed", "entered top"}  # nothing truly new in a rescaled trace


def test_cli_baseline(tmp_path, capsys):
    a, b = _steps(tmp_path / "a.json"), _steps(tmp_path / "b.json", extra_elementwise_us=300.0)
    assert main(["profile", "--summarize", str(b), "--baseline", str(a)]) == 0
    out = capsys.readouterr().out
    assert "against" in out and "other elementwise +0.3" in out
    md = (tmp_path / "b.vs-a.diff.md").read_text()
    assert md.startswith("# B: b (lora) against A: a (lora), per active step") and "| other elementwise |" in md
    assert json.loads((tmp_path / "b.vs-a.diff.json").read_text())["explanation"].startswith("+0.3 ms/step")
    assert b.exists() and a.exists()  # the traces are never overwritten
    # a summary file works as the baseline too
    assert main(["profile", "--summarize", str(a)]) == 0
    capsys.readouterr()
    assert main(["profile", "--summarize", str(b), "--baseline", str(tmp_path / "a.summary.json")]) == 0
    assert "other elementwise +0.3" in capsys.readouterr().out
    # another baseline's comparison is a file of its own
    c = _steps(tmp_path / "c.json", extra_elementwise_us=600.0)
    assert main(["profile", "--summarize", str(b), "--baseline", str(c)]) == 0
    assert (tmp_path / "b.vs-c.diff.json").is_file() and (tmp_path / "b.vs-a.diff.md").read_text() == md


def test_cli_baseline_needs_summarize(tmp_path, capsys):
    assert main(["profile", "--baseline", str(tmp_path / "a.json")]) == 2
    assert "--baseline needs --summarize" in capsys.readouterr().err
    assert main(["profile", "--summarize", str(FIXTURE), "--baseline", str(tmp_path / "nope.json")]) == 2
    assert "--baseline: " in capsys.readouterr().err


def test_welch_interval():
    assert t975(1) == 12.706 and t975(1000) == 1.96
    assert welch_ci([1.0], [2.0, 3.0]) is None
    # equal variances and sizes: t(6 df) * sqrt(2 * var / n)
    assert welch_ci([1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 4.0, 5.0]) == pytest.approx(2.447 * (2 * (5 / 3) / 4) ** 0.5)


def test_different_shapes_compare_per_token_and_say_so(tmp_path):
    """B runs twice the tokens per step in twice the time: per token, nothing changed."""
    a = summarize(_steps(tmp_path / "a.json", batch_size=2, seq_len=128)).to_dict()
    b = summarize(_steps(tmp_path / "b.json", extra_elementwise_us=1000.0, batch_size=4, seq_len=128)).to_dict()
    d = diff_summaries(a, b)
    assert d.per_token and d.unit == "µs/token"
    assert d.a_side["tokens_per_step"] == 256 and d.b_side["tokens_per_step"] == 512
    assert d.a_step_ms == pytest.approx(1000 * 1.002 / 256, rel=1e-2)  # µs per token of a ~1 ms step
    assert abs(d.delta_ms) < 0.02 * d.a_step_ms
    assert d.explanation.split()[1] == "µs/token"
    assert any("shapes differ (2x128 against 4x128)" in n for n in d.notes)
    md = diff_output.to_markdown(d, "a", "b")
    assert md.startswith("# B: B (lora, 4x128) against A: A (lora, 2x128), per token (the shapes differ)")
    assert "| bucket | A µs/token | B µs/token |" in md


def test_same_shape_compares_per_step(tmp_path):
    a = summarize(_steps(tmp_path / "a.json", batch_size=2, seq_len=128)).to_dict()
    b = summarize(_steps(tmp_path / "b.json", batch_size=2, seq_len=128)).to_dict()
    d = diff_summaries(a, b)
    assert not d.per_token and d.unit == "ms/step" and not any("shapes differ" in n for n in d.notes)


def test_a_bucket_only_one_side_has_appeared_or_vanished_without_an_interval(tmp_path):
    a = summarize(_steps(tmp_path / "a.json")).to_dict()
    b = copy.deepcopy(a)
    key = next(k for k in a["breakdown"]["buckets"] if k != "idle")
    del a["breakdown"]["buckets"][key]  # only B has it
    rows = {r.key: r for r in diff_summaries(a, b).buckets}
    assert rows[key].change == "appeared" and rows[key].ci_ms is None and rows[key].a_ms == 0.0
    rows = {r.key: r for r in diff_summaries(b, a).buckets}
    assert rows[key].change == "vanished" and rows[key].ci_ms is None
    md = diff_output.to_markdown(diff_summaries(b, a), "a", "b")
    line = next(x for x in md.splitlines() if x.startswith(f"| {rows[key].label} |"))
    assert line.endswith("| gone in B |") and "±" not in line


def test_a_side_from_its_run_config_knows_the_run_name_and_accumulation():
    summary = {"metadata": {"ftprof": encode_metadata({"method": "qlora", "batch_size": 2, "seq_len": 64,
                                                       "model": "tiny"})}}
    side = side_of(summary, "trace_rank0_cycle1")
    assert side.describe() == "trace_rank0_cycle1 (qlora on tiny, 2x64)" and side.tokens_per_step == 128
    config = {"output": {"run_name": "qlora-base"}, "method": {"method": "qlora"}, "data": {"batch_size": 2,
              "seq_len": 64}, "train": {"grad_accum": 4}}
    side = side_of(summary, "trace_rank0_cycle1", config)
    assert side.describe() == "qlora-base (qlora on tiny, 2x64 x4 accum)" and side.tokens_per_step == 512
    assert side_of({}, "x").describe() == "x" and side_of({}, "x").tokens_per_step is None
