"""Fine-tuning buckets: known answers on hand-made GPU traces, and FLOP reconciliation on a real recorded run."""

import json

import pytest
import torch

import ftprof
from ftprof.analysis.buckets import BACKWARD, FORWARD, SplitContext, gemm_bucket
from ftprof.analysis.pipeline import summarize
from ftprof.profiling.layout import encode_metadata
from tests.conftest import tiny_config


def _write(path, events, **meta):
    """Kineto writes its metadata (and ftprof's block) before traceEvents."""
    path.write_text(json.dumps({"schemaVersion": 1, **meta, "traceEvents": events}))
    return path


# ------------------------------------------------------------------ a hand-made GPU trace with known answers
class GpuTrace:
    """Builds a Kineto-like trace: CPU operators (with ids, shapes, sequence numbers), launches and kernels."""

    def __init__(self):
        self.events = []
        self.next_id = 1

    def op(self, name, ts, dur, dims=None, seq=True, tid=1):
        ext = self.next_id
        self.next_id += 1
        args = {"External id": ext}
        if dims is not None:
            args["Input Dims"] = dims
        if seq:
            args["Sequence number"] = ext
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid,
                            "args": args})
        return ext

    def kernel(self, name, ext, launch_ts, start, dur, stream=7, cat="kernel"):
        corr = 10_000 + len(self.events)
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launch_ts,
                            "dur": 1, "pid": 1, "tid": 1, "args": {"correlation": corr, "External id": ext}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "ts": start, "dur": dur, "pid": 0, "tid": stream,
                            "args": {"correlation": corr, "External id": ext, "stream": stream}})

    def annotation(self, name, ts, dur):
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "pid": 1,
                            "tid": 1})


def lora_step(t: GpuTrace, t0: float, elementwise_us: float = 20.0, step_us: float = 1000.0,
              elementwise_name: str = "void at::native::vectorized_elementwise_kernel<4, MulFunctor>") -> None:
    """One step of a LoRA layer (r=8, tokens 256, width 512, vocab 1000), 1000 us of CPU time by default."""
    t.annotation("ProfilerStep#1", t0, step_us)
    t.annotation("ftprof/forward", t0, 300)
    base = t.op("aten::mm", t0 + 10, 20, [[256, 512], [512, 512]])
    t.kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", base, t0 + 11, t0 + 50, 40)
    lora_a = t.op("aten::mm", t0 + 40, 10, [[256, 512], [512, 8]])
    t.kernel("nvjet_sm90_tst_64x8_64x16_1x4_h_bz_NNT", lora_a, t0 + 41, t0 + 100, 10)
    ew = t.op("aten::mul", t0 + 60, 5, [[256, 512], [256, 512]])
    t.kernel(elementwise_name, ew, t0 + 61, t0 + 120, elementwise_us)
    sdpa = t.op("aten::_scaled_dot_product_flash_attention", t0 + 70, 20, [[1, 8, 256, 64], [1, 8, 256, 64],
                                                                          [1, 8, 256, 64]])
    t.kernel("flash_fwd_kernel", sdpa, t0 + 71, t0 + 150, 30)
    head = t.op("aten::mm", t0 + 100, 20, [[256, 512], [512, 1000]])
    t.kernel("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_TNN", head, t0 + 101, t0 + 200, 50)
    emb = t.op("aten::embedding", t0 + 5, 2, [[1000, 512], [1, 256]])
    t.kernel("void at::native::indexSelectLargeIndex<float>", emb, t0 + 6, t0 + 20, 5)
    t.annotation("ftprof/backward", t0 + 300, 500)
    # backward: an autograd node whose formula's GEMM has no sequence number (input grad of the base weight),
    # and a recomputed forward matmul inside the node (sequence number: autograd recorded it)
    node = t.op("autograd::engine::evaluate_function: MmBackward0", t0 + 310, 200, seq=True, tid=2)
    inner = t.op("MmBackward0", t0 + 311, 198, seq=True, tid=2)
    recomputed = t.op("aten::mm", t0 + 320, 20, [[256, 512], [512, 512]], seq=True, tid=2)
    t.kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", recomputed, t0 + 321, t0 + 400, 40)
    igrad = t.op("aten::mm", t0 + 400, 20, [[256, 512], [512, 512]], seq=False, tid=2)
    t.kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", igrad, t0 + 401, t0 + 450, 40)
    wgrad = t.op("aten::mm", t0 + 430, 20, [[512, 256], [256, 512]], seq=False, tid=2)
    t.kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTN", wgrad, t0 + 431, t0 + 500, 40)
    del node, inner
    # communication overlapping the weight-grad GEMM by 20 us, on another stream
    nccl = t.op("c10d::reduce_scatter_", t0 + 460, 5, seq=False, tid=2)
    t.kernel("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", nccl, t0 + 461, t0 + 520, 50, stream=20)
    t.annotation("ftprof/optimizer_step", t0 + 800, 150)
    opt = t.op("aten::_fused_adamw_", t0 + 810, 50, seq=False)
    t.kernel("void multi_tensor_apply_kernel<FusedAdam>", opt, t0 + 811, t0 + 820, 30)


def test_buckets_on_a_hand_made_gpu_trace(tmp_path):
    t = GpuTrace()
    lora_step(t, 0.0)
    meta = {"method": "lora", "lora_r": 8, "flops_per_token": 1.0}
    path = _write(tmp_path / "t.json", t.events, ftprof=encode_metadata(meta))
    bd = summarize(path).breakdown
    b = bd["buckets"]
    ms = {k: round(v["ms_per_step"] * 1000) for k, v in b.items()}  # in us
    assert ms["base_gemm"] == 40 + 40  # forward + input grad
    assert ms["lora_gemm"] == 10
    assert ms["recompute"] == 40
    assert ms["weight_grad_gemm"] == 40
    assert ms["loss"] == 50  # lm_head: a dimension is the vocabulary (from the embedding's shapes)
    assert ms["attention"] == 30 and ms["optimizer"] == 30 and ms["communication"] == 50
    assert ms["elementwise"] == 20 + 5  # the multiply and the embedding gather
    assert bd["split"] == {"lora_r": 8, "vocab": 1000, "tokens_per_micro_batch": 256, "method": "lora"}
    assert bd["communication_overlap_ms"] * 1000 == pytest.approx(20)  # 500..520 is inside the reduce-scatter
    # FLOPs from the shapes: 2*M*K*N per matmul, 4*B*H*T*S*D for attention's forward
    assert b["base_gemm"]["flops_per_step"] == 2 * 2 * 256 * 512 * 512
    assert b["lora_gemm"]["flops_per_step"] == 2 * 256 * 512 * 8
    assert b["attention"]["flops_per_step"] == 4 * 8 * 256 * 256 * 64
    assert b["base_gemm"]["tflops"] == pytest.approx(4 * 256 * 512 * 512 / 80e-6 / 1e12)
    # idle: the step's window (1000 us of CPU range) minus the union of its kernels
    busy = 40 + 10 + 20 + 30 + 50 + 5 + 40 + 40 + 40 + (50 - 20) + 30
    assert ms["idle"] == 1000 - busy
    assert bd["steps"] == 1 and bd["step_ms"] == [1.0]


def test_bucket_kernels_are_per_step_like_their_time(tmp_path):
    """A bucket's top kernels give milliseconds and calls per profiled step (the calls were window totals beside
    per-step times: twice the calls of a step in a two-step window)."""
    t = GpuTrace()
    lora_step(t, 0.0)
    lora_step(t, 1000.0)
    path = _write(tmp_path / "t.json", t.events, ftprof=encode_metadata({"method": "lora", "lora_r": 8}))
    bd = summarize(path).breakdown
    assert bd["steps"] == 2
    top = bd["buckets"]["weight_grad_gemm"]["kernels"][0]
    assert top["calls_per_step"] == 1 and round(top["ms_per_step"] * 1000) == 40


def test_gemm_split_rules():
    ctx = SplitContext(lora_r=16, vocab=32000, tokens=4096)
    assert gemm_bucket("aten::mm", [[4096, 4096], [4096, 16]], FORWARD, ctx) == "lora_gemm"
    assert gemm_bucket("aten::addmm", [[4096], [4096, 4096], [4096, 4096]], FORWARD, ctx) == "base_gemm"
    assert gemm_bucket("aten::mm", [[4096, 4096], [4096, 4096]], BACKWARD, ctx) == "weight_grad_gemm"
    assert gemm_bucket("aten::mm", [[4096, 4096], [4096, 32000]], FORWARD, ctx) == "loss"
    assert gemm_bucket("aten::bmm", [[32, 128, 64], [32, 64, 128]], FORWARD, ctx) == "attention"
    assert gemm_bucket("aten::mm", None, FORWARD, ctx) == "gemm"
    # --lora-fused-a: q/k/v's shared A has rank 3r, gate/up's 2r; its weight gradient is LoRA's, not the base's
    shared_a_grad = [[48, 4096], [4096, 4096]]
    assert gemm_bucket("aten::mm", shared_a_grad, BACKWARD, ctx) == "weight_grad_gemm"
    fused = SplitContext(lora_r=16, vocab=32000, tokens=4096, lora_fused=True)
    assert gemm_bucket("aten::mm", shared_a_grad, BACKWARD, fused) == "lora_gemm"
    assert gemm_bucket("aten::mm", [[4096, 4096], [4096, 32]], FORWARD, fused) == "lora_gemm"


# ------------------------------------------------------------------ a real run, recorded on CPU
@pytest.fixture(scope="module")
def lora_checkpointed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    cfg = tiny_config(tmp, "lora", max_steps=6, prof_active_steps=2, profile=True, prof_record_shapes=True,
                      gradient_checkpointing=True, run_name="r")
    result = ftprof.train(cfg)
    assert result.status == "ok", result.error_tail
    return tmp / "r"


@pytest.mark.slow  # one tiny training run (about 5 s alone; more on a loaded machine)
def test_bucket_flops_reconcile_with_the_runs_hfu_count(lora_checkpointed):
    summary = json.loads((lora_checkpointed / "profile" / "summary.json").read_text())
    bd = summary["breakdown"]
    assert bd["steps"] == 2 and len(bd["step_ms"]) == 2
    # every FLOP the run executed, recompute included, is in some bucket: within 5% of the HFU count
    assert bd["hfu_flops_per_step"] > 0
    assert bd["flops_ratio"] == pytest.approx(1.0, abs=0.05)
    b = bd["buckets"]
    assert {"base_gemm", "lora_gemm", "recompute", "attention", "loss", "optimizer"} <= set(b)
    assert "weight_grad_gemm" not in b  # LoRA trains no base weight
    config = json.loads((lora_checkpointed / "config.json").read_text())
    assert bd["split"]["lora_r"] == config["method"]["lora_r"]
    assert bd["split"]["tokens_per_micro_batch"] == config["data"]["batch_size"] * config["data"]["seq_len"]
    # the recomputed forward's FLOPs match the run's own recompute count
    ft = summary["metadata"]["ftprof"]
    tokens = config["data"]["batch_size"] * config["data"]["seq_len"]
    assert b["recompute"]["flops_per_step"] == pytest.approx(ft["recompute_flops_per_token"] * tokens, rel=0.05)
    for key in ("base_gemm", "lora_gemm", "attention"):
        assert b[key]["flops_per_step"] > 0 and b[key]["ms_per_step"] > 0
        assert len(b[key]["per_step_ms"]) == 2
    md = (lora_checkpointed / "profile" / "summary.md").read_text()
    assert "## Fine-tuning buckets" in md and "of the run's HFU count" in md


def test_buckets_of_a_plain_torch_profiler_trace(tmp_path):
    """A trace ftprof did not write: full fine-tuning of an MLP with a vocabulary-sized head, two steps."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(300, 48), torch.nn.Linear(48, 96), torch.nn.GELU(),
                                torch.nn.Linear(96, 300))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 300, (4, 16))
    sched = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                schedule=sched) as prof:
        for _ in range(3):
            logits = model(x)
            torch.nn.functional.cross_entropy(logits.view(-1, 300), x.view(-1)).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    trace = tmp_path / "plain.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    bd = summarize(trace).breakdown
    b = bd["buckets"]
    assert bd["steps"] == 2
    assert bd["split"]["vocab"] == 300 and bd["split"]["tokens_per_micro_batch"] == 64
    assert bd["split"]["lora_r"] is None  # no adapters to find
    assert {"base_gemm", "weight_grad_gemm", "loss", "norm_act", "optimizer"} <= set(b)
    # the first linear: forward and input grad (the embedding trains) in base GEMMs, its weight grad apart
    tokens = 64
    assert b["base_gemm"]["flops_per_step"] == pytest.approx(2 * 2 * tokens * 48 * 96)
    assert b["weight_grad_gemm"]["flops_per_step"] == pytest.approx(2 * tokens * 48 * 96)
    assert b["loss"]["flops_per_step"] == pytest.approx(3 * 2 * tokens * 96 * 300)  # lm_head fwd, input and weight grad
    assert bd["hfu_flops_per_step"] is None and bd["flops_ratio"] is None


def test_selective_checkpointing_replays_carry_no_flops(tmp_path):
    """Under selective checkpointing a dispatch mode catches each matmul: in the forward the matmul runs beneath
    it (counted once), in the recompute a saved output comes back and nothing runs (not counted)."""
    t = GpuTrace()
    t.annotation("ProfilerStep#1", 0, 1000)
    dims = [[256, 512], [512, 512]]
    t.op("aten::mm", 10, 50, dims)  # forward: outer operator, the mode, the matmul that runs
    t.op("PythonDispatchMode", 11, 48, dims, seq=False)
    t.op("aten::mm", 12, 46, dims, seq=False)
    t.op("autograd::engine::evaluate_function: MmBackward0", 300, 100, seq=True)
    t.op("MmBackward0", 301, 98, seq=True)
    t.op("aten::mm", 310, 5, dims)  # recompute: the mode hands back the saved output
    t.op("PythonDispatchMode", 311, 3, dims, seq=False)
    bd = summarize(_write(tmp_path / "t.json", t.events)).breakdown
    assert bd["buckets"]["base_gemm"]["flops_per_step"] == 2 * 256 * 512 * 512
    assert bd["buckets"]["recompute"]["flops_per_step"] is None  # its time is there, no FLOPs
    assert bd["flops_per_step"] == 2 * 256 * 512 * 512


def test_columns_flatten_a_breakdown_for_tables(tmp_path):
    from ftprof.analysis.buckets import KEYS, columns

    t = GpuTrace()
    lora_step(t, 0.0)
    bd = summarize(_write(tmp_path / "t.json", t.events, ftprof=encode_metadata({"method": "lora", "lora_r": 8}))) \
        .breakdown
    cols = columns(bd)
    assert cols["lora_gemm_ms"] == pytest.approx(0.01) and cols["step_ms"] == pytest.approx(1.0)
    assert cols["lora_gemm_tflops"] == pytest.approx(2 * 256 * 512 * 8 / 10e-6 / 1e12)
    assert cols["dequant_ms"] is None and set(cols) == {"step_ms", "flops_ratio"} | {
        f"{k}_{x}" for k in KEYS for x in ("ms", "tflops")}
    assert columns(None) == {}
