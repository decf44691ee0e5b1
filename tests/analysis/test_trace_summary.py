"""The trace summary on hand-made GPU traces (known answers) and on real CPU traces from torch.profiler."""

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest
import torch

from ftprof.analysis.pipeline import summarize
from ftprof.analysis.rules import categorize
from ftprof.cli.main import main


def _kernel(name, ts, dur, **args):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7, "args": args}


def _launch(corr, ts, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2, "pid": 1, "tid": tid,
            "args": {"correlation": corr}}


def _write(path, events, **meta):
    data = {"schemaVersion": 1, "traceEvents": events, **meta}
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as fh:
        json.dump(data, fh)
    return path


def gpu_trace(path, fp32_name="sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32"):
    events = [
        # CPU ranges of the stages (main thread); backward kernels are launched from autograd's thread (tid 2)
        {"ph": "X", "cat": "user_annotation", "name": "ftprof/forward", "ts": -100, "dur": 100, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "user_annotation", "name": "ftprof/backward", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
        _launch(1, -90), _launch(2, -50), _launch(3, 10, tid=2),
        _kernel("nvjet_hsh_256x128_64x4_2x1_v_bz_coopB_TNT", 0, 300, correlation=1),  # bf16 GEMM, 300 us
        _kernel(fp32_name, 300, 100, correlation=2),  # fp32 GEMM, 100 us
        _kernel("void kDequantizeBlockwise<__nv_bfloat16, 512, 64, 8, 2>", 400, 50, correlation=3),
        _kernel("void at::native::vectorized_elementwise_kernel<4, silu>", 450, 50),
        # 100 us gap: 500 -> 600
        _kernel("void rms_norm_kernel<bf16>", 600, 100),
        _kernel("flash_fwd_kernel<bf16>", 700, 150),
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "ts": 850, "dur": 50,
         "args": {"bytes": 4}},
        # overlapping kernel on another stream adds no busy time
        _kernel("void at::native::vectorized_elementwise_kernel<4, add>", 860, 20),
    ]
    return _write(path, events, ftprof=json.dumps({"dtype": "bfloat16", "active_steps": 1}))


def test_gpu_categories_idle_and_fp32_share(tmp_path):
    s = summarize(gpu_trace(tmp_path / "t.json.gz"))
    assert s.device_kind == "gpu"
    cats = s.categories_us
    assert cats["gemm"] == 400 and cats["quantize/dequantize"] == 50 and cats["attention"] == 150
    assert cats["normalization"] == 100 and cats["memory copy"] == 50 and cats["elementwise"] == 70
    assert s.window_us == 900 and s.busy_us == 800
    assert s.idle_share == pytest.approx(100 / 900)
    assert s.fp32_gemm_us == 100 and s.gemm_us == 400
    assert s.stages_us == {"ftprof/forward": 400, "ftprof/backward": 50}  # GPU time of the kernels launched
    assert s.stage_source == "GPU kernels by launch range"
    codes = {d.code: d for d in s.diagnoses}
    assert codes["fp32_gemm"].severity == "warning"
    assert codes["fp32_gemm"].evidence["share"] == pytest.approx(100 / 820)
    assert "fp32 GEMMs take 12.2%" in codes["fp32_gemm"].message
    assert {"dequantization", "gpu_idle", "host_device_copies"} <= set(codes)
    # silu 50 + add 20 (elementwise) + rms_norm 100 (normalization) of 820 us: 20.7%, just over the line
    assert codes["elementwise"].severity == "info"
    assert codes["elementwise"].evidence["share"] == pytest.approx(170 / 820)
    assert codes["elementwise"].evidence["top_kernels"][0]["name"] == "void rms_norm_kernel<bf16>"
    assert s.host_device_copies["DtoH"] == {"count": 1, "us": 50, "bytes": 4}
    assert s.verdict.startswith("GPU-bound")


def test_committed_real_gpu_trace():
    """A real H200 trace of the tiny preset (full fine-tune, fp32 on a GPU), from `ftprof profile`."""
    from pathlib import Path

    s = summarize(Path(__file__).parent.parent / "fixtures" / "tiny_gpu_trace.pt.trace.json.gz")
    assert s.device_kind == "gpu" and s.metadata["distributedInfo"]["rank"] == 0
    assert s.categories_us["gemm"] > 0 and s.categories_us["optimizer"] > 0
    stages = s.stages_us
    assert set(stages) == {"ftprof/forward", "ftprof/backward", "ftprof/optimizer_step"}
    assert stages["ftprof/backward"] > stages["ftprof/forward"] > 0  # backward kernels found via their launches
    assert sum(stages.values()) <= s.busy_us * 1.01
    assert s.top_kernels and s.top_kernels[0]["us"] >= s.top_kernels[-1]["us"]


def test_idle_is_charged_to_what_the_gpu_waited_for(tmp_path):
    # Two gaps: 100 us before the norm kernel (launched outside ftprof's ranges, after the unlaunched silu), and
    # 1.5 ms before a forward kernel of the next step, after backward work: a step boundary, a long gap.
    events = json.loads(gzip.open(gpu_trace(tmp_path / "a.json.gz"), "rt").read())["traceEvents"]
    events += [{"ph": "X", "cat": "user_annotation", "name": "ftprof/forward", "ts": 2000, "dur": 600, "pid": 1,
                "tid": 1}, _launch(9, 2100), _kernel("nvjet_hsh_256x128_64x4_2x1_v_bz_coopB_TNT", 2600, 100,
                                                     correlation=9)]
    events += [_launch(8, 20, tid=2), _kernel("nvjet_hsh_256x128_64x4_2x1_v_bz_coopB_TNT", 1000, 100, correlation=8)]
    s = summarize(_write(tmp_path / "b.json.gz", events))
    assert s.idle_by_stage_us == {
        "ftprof/backward -> ftprof/forward": {"idle_us": 1500.0, "gaps": 1, "long_gaps_us": 1500.0},
        "outside -> ftprof/backward": {"idle_us": 100.0, "gaps": 1, "long_gaps_us": 0.0},
        "outside": {"idle_us": 100.0, "gaps": 1, "long_gaps_us": 0.0}}
    assert sum(r["idle_us"] for r in s.idle_by_stage_us.values()) == pytest.approx(s.window_us - s.busy_us)
    idle = {d.code: d for d in s.diagnoses}["gpu_idle"]
    assert "88% of it at ftprof/backward -> ftprof/forward, 1 gaps, mostly gaps of 1 ms or more" in idle.message
    assert "--prefetch" in idle.message  # the option that addresses host work between the stages
    from ftprof.analysis.summary_output import to_markdown

    assert "| backward -> forward | 1.50 | 1 | 1.50 |" in to_markdown(s)


def test_idle_by_stage_of_a_real_gpu_trace_adds_up():
    s = summarize(Path(__file__).parent.parent / "fixtures" / "tiny_gpu_trace.pt.trace.json.gz")
    idle = s.idle_by_stage_us
    assert sum(r["idle_us"] for r in idle.values()) == pytest.approx(s.window_us - s.busy_us, rel=1e-5)
    assert any(" -> " in key for key in idle) and "ftprof/backward" in idle  # step and stage changes, and inside
    assert all(r["long_gaps_us"] <= r["idle_us"] for r in idle.values())


def test_fp32_gemm_found_through_operator_dtypes(tmp_path):
    # With record_shapes the launching operator's dtype decides, whatever the kernel is called.
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 10, "pid": 1, "tid": 1,
         "args": {"Input type": ["float", "float"], "External id": 11}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 20, "dur": 10, "pid": 1, "tid": 1,
         "args": {"Input type": ["c10::BFloat16", "c10::BFloat16"], "External id": 12}},
        _kernel("some_gemm_kernel_a", 0, 70, **{"External id": 11}),
        _kernel("some_gemm_kernel_b", 100, 30, **{"External id": 12}),
    ]
    s = summarize(_write(tmp_path / "t.json", events))
    assert s.fp32_gemm_us == 70 and s.gemm_us == 100


def test_elementwise_heavy_trace_is_a_warning_and_a_gemm_heavy_one_is_silent(tmp_path):
    heavy = [_kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", 0, 500),
             _kernel("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add>", 500, 300),
             _kernel("void at::native::elementwise_kernel<128, 4, pow>", 800, 100)]
    codes = {d.code: d for d in summarize(_write(tmp_path / "h.json", heavy)).diagnoses}
    assert codes["elementwise"].severity == "warning" and "44.4%" in codes["elementwise"].message
    light = [_kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", 0, 900),
             _kernel("void at::native::vectorized_elementwise_kernel<8, add>", 900, 100)]
    assert "elementwise" not in {d.code for d in summarize(_write(tmp_path / "l.json", light)).diagnoses}


def test_bf16_only_trace_has_no_fp32_diagnosis(tmp_path):
    s = summarize(gpu_trace(tmp_path / "t.json", fp32_name="nvjet_hsh_128x64_64x4_1x2_h_bz_TNN"))
    assert s.fp32_gemm_us == 0
    assert "fp32_gemm" not in {d.code for d in s.diagnoses}


def test_categorize_examples():
    assert categorize("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "communication"
    assert categorize("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64>") == "gemm"
    assert categorize("void multi_tensor_apply_kernel<FusedAdam>") == "optimizer"
    assert categorize("aten::_fused_adamw_") == "optimizer"
    assert categorize("aten::scaled_dot_product_attention") == "attention"


@pytest.mark.slow  # > 4 s on the 2-core machine: `pytest -m 'not slow'` is the fast subset
def test_summary_streams_large_traces(tmp_path):
    n = 150_000
    # kernel events with the args Kineto writes (~400 bytes each, as in real traces)
    args = {"queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": 1234567, "registers per thread": 32,
            "shared memory": 0, "blocks per SM": 132.5, "warps per SM": 16.0, "grid": [4096, 1, 1],
            "block": [128, 1, 1], "est. achieved occupancy %": 100}
    events = [_kernel(f"void at::native::vectorized_elementwise_kernel<{i % 50}>", 2 * i, 1, **args)
              for i in range(n)]
    path = _write(tmp_path / "big.json", events)
    size = path.stat().st_size
    tracemalloc.start()
    s = summarize(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert s.busy_us == n and s.window_us == 2 * n - 1
    assert peak < size / 3, (peak, size)  # far below the file: events are folded as they stream


def test_real_cpu_trace_from_plain_torch_profiler(tmp_path, capsys):
    """A trace ftprof did not write: a plain torch.profiler run of a small MLP."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    x = torch.randn(32, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            model(x).sum().backward()
    trace = tmp_path / "plain.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    assert main(["profile", "--summarize", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "Where the time went" in out and "gemm" in out
    data = json.loads((tmp_path / "plain.summary.json").read_text())
    assert (tmp_path / "plain.summary.md").exists()
    assert data["device_kind"] == "cpu" and data["categories_us"]["gemm"] > 0
    # record_shapes gave operator dtypes: every matmul here is fp32
    assert data["fp32_gemm_us"] > 0


@pytest.mark.parametrize("content", [b"not a trace", b"\x1f\x8b\x08garbage"])
def test_unreadable_trace_is_a_one_line_error(tmp_path, capsys, content):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    assert main(["profile", "--summarize", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot read" in err and "\n" not in err


def test_missing_trace(tmp_path, capsys):
    assert main(["profile", "--summarize", str(tmp_path / "nope.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_summarize_never_overwrites_the_trace(tmp_path):
    trace = gpu_trace(tmp_path / "x.json")
    before = trace.read_bytes()
    assert main(["profile", "--summarize", str(trace)]) == 0
    assert trace.read_bytes() == before and (tmp_path / "x.summary.json").exists()


def test_diagnoses_name_the_fast_path_options():
    """Each finding names the run option that addresses it (the fixture: a real H200 trace of an eager run)."""
    from ftprof.analysis.pipeline import summarize

    summary = summarize(Path(__file__).parents[1] / "fixtures" / "tiny_gpu_trace.pt.trace.json.gz")
    messages = {d.code: d.message for d in summary.diagnoses}
    assert "--compile" in messages["elementwise"] and "--kernels liger" in messages["elementwise"]
    assert summary.logits_softmax_us > 0 and "fused linear cross entropy" in messages["logits"]


def test_kernels_replayed_from_cuda_graphs_are_counted_and_named(tmp_path):
    """Under --compile-mode reduce-overhead the blocks' kernels come from graph replays: no operator launched them,
    so the buckets cannot split them by shapes. The summary says how much ran that way."""
    events = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 5, "pid": 1, "tid": 1,
         "args": {"correlation": 9}},
        _launch(10, 1),
        _kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 10, 300, correlation=9),  # from the replay
        _kernel("triton_poi_fused_add_mul_silu_2", 310, 40, correlation=9),  # from the replay
        _kernel("triton_red_fused_sum_3", 350, 20, correlation=11, **{"graph id": 4}),  # says so itself
        _kernel("vectorized_elementwise_kernel", 370, 30, correlation=10),  # launched on its own
    ]
    s = summarize(_write(tmp_path / "t.json", events))
    assert s.graph_replay_us == pytest.approx(360)
    diag = {d.code: d for d in s.diagnoses}["cuda_graphs"]
    assert diag.evidence["share"] == pytest.approx(360 / 390) and "--compile-mode default" in diag.message
    plain = summarize(gpu_trace(tmp_path / "plain.json"))
    assert plain.graph_replay_us == 0 and "cuda_graphs" not in {d.code for d in plain.diagnoses}


def test_large_lora_gemm_share_names_the_fused_a_option(tmp_path):
    from ftprof.analysis.diagnoses import diagnose

    s = summarize(gpu_trace(tmp_path / "t.json"))
    s.breakdown = {"buckets": {"lora_gemm": {"ms_per_step": 40.0, "share": 0.074}}}
    diag = {d.code: d for d in diagnose(s)}
    assert "--lora-fused-a (on by default)" in diag["lora_gemms"].message
    assert diag["lora_gemms"].evidence["share"] == 0.074
    fused = {d.code: d for d in diagnose(s, fused_a=True)}["lora_gemms"]  # a run that had it: what is left
    assert "already run once" in fused.message and "B matmuls" in fused.message
    s.breakdown = {"buckets": {"lora_gemm": {"ms_per_step": 4.0, "share": 0.01}}}
    assert "lora_gemms" not in {d.code for d in diagnose(s)}


def test_recomputation_is_the_measured_bucket_when_there_is_one(tmp_path):
    """With shapes, the buckets time the recomputed forward itself: the diagnosis gives that, not an estimate."""
    from ftprof.analysis.diagnoses import diagnose

    s = summarize(gpu_trace(tmp_path / "t.json"))
    s.stages_us = {"ftprof/forward": 300.0, "ftprof/backward": 600.0, "ftprof/optimizer_step": 100.0}
    estimated = {d.code: d for d in diagnose(s, checkpointing=True)}["recomputation"]
    assert "about 30% of step time (estimated" in estimated.message
    s.breakdown = {"buckets": {"recompute": {"ms_per_step": 0.2, "share": 0.156}}}
    measured = {d.code: d for d in diagnose(s, checkpointing=True)}["recomputation"]
    assert "16% of step time (the recomputed forward, measured)" in measured.message
    assert measured.evidence["measured_share"] == 0.156


@pytest.mark.parametrize(("kind", "said", "not_said"), [("gpu", "--dequant-kernel triton", "on the CPU"),
                                                          ("cpu", "a GPU run uses a one-pass kernel", "--dequant")])
def test_dequantization_advice_is_for_the_device_the_run_was_on(kind, said, not_said):
    """A CPU run is not told to use a CUDA-only kernel."""
    from ftprof.analysis.diagnoses import _dequantization
    from ftprof.analysis.summary import TraceSummary

    s = TraceSummary("t", kind, 1e6, 1e6, 0.0, {"quantize/dequantize": 3e5}, {}, "", [], [], {}, 0.0, 0.0, "", [], {})
    (d,) = _dequantization(s, 1e6, "of the time")
    assert said in d.message and not_said not in d.message


@pytest.mark.parametrize(("meta", "named"), [({"method": "qlora"}, True), ({"method": "lora", "fp8_base": True}, False),
                                             ({"method": "full"}, False), ({"method": "lora", "lean_recompute": True},
                                                                           False)])
def test_recomputation_names_lean_recompute_only_where_it_helps(tmp_path, meta, named):
    """A LoRA or QLoRA run in 16 bits that did not have it: not a full fine-tune (refused), not beside --fp8-base
    (measured no faster there)."""
    from ftprof.analysis.diagnoses import diagnose

    s = summarize(gpu_trace(tmp_path / "t.json"))
    s.stages_us = {"ftprof/forward": 300.0, "ftprof/backward": 600.0, "ftprof/optimizer_step": 100.0}
    s.metadata = {"ftprof": meta}
    message = {d.code: d for d in diagnose(s, checkpointing=True)}["recomputation"].message
    assert ("--lean-recompute" in message) is named
