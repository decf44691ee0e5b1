"""Read a Chrome/Kineto trace (any torch.profiler trace, gzipped or not) and say where the time went.

The trace is streamed (ijson): events are folded into counters as they are read, and only compact arrays of kernel
intervals are kept (16 bytes per kernel), so a 1 GB trace does not become 1 GB of Python objects.

Device time is attributed by kernel name to categories; on CPU-only traces (no kernels), the CPU operators' self
time is used instead. Stage times come from ftprof's record_function labels (ftprof/forward, ftprof/backward,
ftprof/optimizer_step): on GPU traces, each kernel counts for the stage whose CPU range contains its launch
(matched by correlation id); on CPU traces, the ranges' own durations.
"""

from __future__ import annotations

import functools
import gzip
import re
from array import array
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import ijson
import numpy as np
from ijson.common import ObjectBuilder

from ftprof.profiling import buckets
from ftprof.profiling.layout import decode_metadata
from ftprof.profiling.op_flops import keeps_dims

# Kernel (or CPU operator) name -> category. First match wins; order matters.
CATEGORIES: tuple[tuple[str, re.Pattern], ...] = tuple((name, re.compile(rx, re.I)) for name, rx in (
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|broadcast"),
    ("quantize/dequantize", r"dequant|quantize|kDequantize|kQuantize|gemv_4bit|4bit|nf4|gptq|marlin|exllama|"
                            r"machete|awq|int4|unpack"),
    ("attention", r"flash|fmha|attention|sdpa|scaled_dot_product|softmax|cudnn.*mha"),
    ("gemm", r"gemm|nvjet|cutlass|xmma|cublas|matmul|aten::mm$|aten::addmm|aten::bmm|aten::baddbmm|wgmma|splitk|"
             r"mkldnn|aten::linear$"),
    ("optimizer", r"adam|multi_tensor_apply|fused_adam|_foreach|optimizer|sgd"),
    ("normalization", r"rms_?norm|layer_?norm|group_?norm|batch_?norm|aten::norm"),
    ("memory copy", r"memcpy|memset|copy_|aten::to$|aten::_to_copy|contiguous|cat_?kernel|aten::cat"),
    ("elementwise", r"elementwise|vectorized|unrolled|reduce|silu|gelu|mul|add|where|fill|index|embedding|"
                    r"aten::"),
))
# fp32 GEMM kernels by name (cuBLAS/cuBLASLt/CUTLASS conventions) when operator dtypes are not in the trace.
# cuBLASLt's nvjet kernels name their types after the architecture: nvjet_sm90_tst_... is bf16 in and out ('t'),
# fp32 accumulate ('s'); nvjet_..._sss_... is fp32 throughout.
FP32_GEMM = re.compile(r"sgemm|f32f32|s1688|s16816gemm|tf32|nvjet_(sm\d+_)?sss|gemm_fp32|_fp32_|"
                       r"cutlass_80_simt", re.I)
STAGES = ("ftprof/forward", "ftprof/backward", "ftprof/optimizer_step")
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
LORA_GEMM_SHARE = 0.04  # LoRA GEMMs above this share of the step get a diagnosis (7.4% for llama-8b QLoRA, H200)
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")  # runtime and driver calls that replay a CUDA graph
LEAF_MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
MATMUL_OPS = LEAF_MATMULS | {"aten::matmul", "aten::linear"}


@functools.lru_cache(maxsize=65536)
def categorize(name: str) -> str:
    """Category of a kernel or operator name. Memoized: a trace repeats a few hundred names millions of times."""
    for cat, rx in CATEGORIES:
        if rx.search(name):
            return cat
    return "other"


@dataclass
class Diagnosis:
    code: str
    severity: str  # "warning" | "info"
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class TraceSummary:
    trace: str
    device_kind: str  # "gpu" or "cpu": which timeline the categories are measured on
    window_us: float  # span of the recorded activity
    busy_us: float  # union of kernel intervals (GPU) or thread busy time (CPU)
    idle_share: float | None
    categories_us: dict[str, float]
    stages_us: dict[str, float]
    stage_source: str
    top_kernels: list[dict[str, Any]]
    top_operators: list[dict[str, Any]]
    host_device_copies: dict[str, Any]
    fp32_gemm_us: float
    gemm_us: float
    verdict: str
    diagnoses: list[Diagnosis]
    metadata: dict[str, Any]
    profiler_overhead: float | None = None
    breakdown: dict[str, Any] | None = None  # fine-tuning buckets per active step (buckets.Breakdown as a dict)
    rank: int | None = None
    logits_softmax_us: float = 0.0  # the loss's softmax over the vocabulary (absent under a fused linear loss)
    idle_by_stage_us: dict[str, dict[str, float]] = field(default_factory=dict)  # GPU gaps by the stage they end in
    graph_replay_us: float = 0.0  # GPU kernel time launched by CUDA graph replays (no operator, no shapes behind it)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _open(path: Path) -> BinaryIO:
    with open(path, "rb") as fh:
        magic = fh.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def union_us(starts, ends) -> float:
    """Total length of the union of intervals (kernels on several streams overlap). Vectorized, sorted copies only:
    about 24 bytes per kernel at the peak."""
    if not len(starts):
        return 0.0
    s, e = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    del order
    np.maximum.accumulate(e, out=e)  # e[i]: how far the busy segment reaches by kernel i
    first = np.flatnonzero(s[1:] > e[:-1]) + 1  # a new segment starts where a kernel begins after all earlier end
    last = np.empty(len(first) + 1, dtype=np.int64)
    last[:-1] = first - 1
    last[-1] = len(s) - 1
    busy = float(e[last].sum() - s[0] - s[first].sum())
    return busy


class _Thread:
    """One thread's CPU operators, in compact arrays (names are interned by the parser: they repeat heavily)."""

    __slots__ = ("ts", "dur", "names", "ext", "seq")

    def __init__(self) -> None:
        self.ts, self.dur, self.ext = array("d"), array("d"), array("d")
        self.seq = array("b")  # 1 where the operator carries an autograd sequence number
        self.names: list[str] = []


class _Accumulator:
    def __init__(self) -> None:
        self.kernel_time: Counter = Counter()
        self.kernel_count: Counter = Counter()
        self.op_time: Counter = Counter()  # inclusive CPU operator time
        self.op_count: Counter = Counter()
        self.k_start, self.k_end = array("d"), array("d")
        self.cpu_stage: Counter = Counter()
        self.copies: Counter = Counter()
        self.copy_us: Counter = Counter()
        self.copy_bytes: Counter = Counter()
        self.matmul_dtype_by_ext: dict[int, str] = {}
        self.kernel_ext: dict[int, list[float]] = defaultdict(list)  # external id -> kernel durations (gemm)
        self.threads: dict[tuple, _Thread] = {}  # (pid, tid) -> its operators
        self.op_dims: dict[tuple, tuple[str, list]] = {}  # (thread, index) -> (name, input dims): FLOP/vocab ops
        # Per GPU activity, for the fine-tuning buckets: launching operator, launch, name, kind.
        self.k_ext, self.k_corr_all = array("d"), array("d")
        self.k_name, self.k_kind = array("I"), array("b")
        self.k_graph = array("b")  # 1: the activity says it ran inside a CUDA graph (CUPTI's graph id, via Kineto)
        self.kernel_names: list[str] = []
        self._kernel_ids: dict[str, int] = {}
        self.step_ranges: list[tuple[float, float]] = []  # ProfilerStep#N: one per active step
        self.optimizer_ranges: list[tuple[float, float]] = []
        self.cpu_matmul_us: Counter = Counter()
        # For GPU time per stage: kernel -> its launch (correlation id) -> the ftprof/* range around the launch.
        self.launch_corr, self.launch_ts = array("d"), array("d")
        self.graph_corr: set[float] = set()  # correlation ids of CUDA graph launches
        self.stage_ranges: list[tuple[float, float, str]] = []

    def add(self, ev: dict[str, Any]) -> None:
        ph, cat, name = ev.get("ph"), ev.get("cat", ""), ev.get("name", "")
        if ph != "X":
            return
        dur = float(ev.get("dur", 0) or 0)
        ts = float(ev.get("ts", 0) or 0)
        args = ev.get("args") or {}
        if cat in GPU_CATS:
            self.kernel_time[name] += dur
            self.kernel_count[name] += 1
            self.k_start.append(ts)
            self.k_end.append(ts + dur)
            self._kernel_detail(name, cat, args)
            if cat == "gpu_memcpy":
                kind = "HtoD" if "HtoD" in name else "DtoH" if "DtoH" in name else "other"
                self.copies[kind] += 1
                self.copy_us[kind] += dur
                self.copy_bytes[kind] += int(args.get("bytes", 0) or 0)
            elif cat == "kernel" and categorize(name) == "gemm" and "External id" in args:
                self.kernel_ext[int(args["External id"])].append(dur)
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            self.launch_corr.append(float(args["correlation"]))
            self.launch_ts.append(ts)
            if name.startswith(GRAPH_LAUNCHES):  # every kernel of the replayed graph carries this correlation id
                self.graph_corr.add(float(args["correlation"]))
        elif cat == "user_annotation":
            if name in STAGES:
                self.cpu_stage[name] += dur
                self.stage_ranges.append((ts, ts + dur, name))
            if name.startswith("ProfilerStep#"):
                self.step_ranges.append((ts, ts + dur))
            if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")) or name == "ftprof/optimizer_step":
                self.optimizer_ranges.append((ts, ts + dur))
        elif cat == "cpu_op":
            self.op_time[name] += dur
            self.op_count[name] += 1
            key = (ev.get("pid"), ev.get("tid"))
            th = self.threads.get(key)
            if th is None:
                th = self.threads[key] = _Thread()
            if keeps_dims(name) and "Input Dims" in args:
                self.op_dims[(key, len(th.ts))] = (name, args["Input Dims"])
            th.ts.append(ts)
            th.dur.append(dur)
            th.names.append(name)
            th.ext.append(float(args.get("External id", "nan")))
            th.seq.append(1 if "Sequence number" in args else 0)
            if name in MATMUL_OPS and "Input type" in args:
                types = [t for t in args["Input type"] if t]
                dtype = types[-1] if types else ""
                if "External id" in args:
                    self.matmul_dtype_by_ext[int(args["External id"])] = dtype
                if name in LEAF_MATMULS:  # CPU traces: matmul time by dtype (leaf ops only, no double count)
                    self.cpu_matmul_us[dtype] += dur

    def _kernel_id(self, name: str) -> int:
        kid = self._kernel_ids.get(name)
        if kid is None:
            kid = self._kernel_ids[name] = len(self.kernel_names)
            self.kernel_names.append(name)
        return kid

    def _kernel_detail(self, name: str, cat: str, args: dict) -> None:
        self.k_ext.append(float(args.get("External id", "nan")))
        self.k_corr_all.append(float(args.get("correlation", "nan")))
        self.k_name.append(self._kernel_id(name))
        host_device = cat == "gpu_memcpy" and ("HtoD" in name or "DtoH" in name)
        self.k_kind.append(0 if cat == "kernel" else 1 if host_device else 2)
        self.k_graph.append(1 if args.get("graph id") else 0)


def _kernel_stages(acc: _Accumulator) -> tuple[np.ndarray, list[str]]:
    """Each GPU activity's ftprof stage, as an index into the returned stage names (-1: launched outside every
    stage, or its launch is not in the trace): the stage whose CPU range contains its launch.

    Backward kernels are launched from autograd's own thread, so the GPU-side annotation of ftprof/backward misses
    them; matching launches by time (any thread) does not.
    """
    n = len(acc.k_start)
    if not n or not acc.stage_ranges:
        return np.full(n, -1, dtype=np.int64), []
    ranges = sorted(acc.stage_ranges)
    names = sorted({name for _, _, name in ranges})
    range_stage = np.array([names.index(name) for _, _, name in ranges])
    when = buckets.launch_times(acc, np.frombuffer(acc.k_corr_all, dtype=np.float64))  # NaN: no launch
    idx = buckets.step_index(when, [(start, end) for start, end, _ in ranges])
    return np.where(idx >= 0, range_stage[np.clip(idx, 0, None)], -1), names


def _gpu_stage_times(acc: _Accumulator, stages: np.ndarray, names: list[str]) -> Counter:
    """GPU time per ftprof stage (``stages``, ``names``: from ``_kernel_stages``)."""
    busy = np.frombuffer(acc.k_end) - np.frombuffer(acc.k_start)
    inside = stages >= 0
    per_stage = np.bincount(stages[inside], weights=busy[inside], minlength=len(names))
    return Counter({name: float(t) for name, t in zip(names, per_stage, strict=True) if t > 0})


OUTSIDE_STAGES = "outside"  # work launched outside ftprof's stage ranges


def idle_by_stage(acc: _Accumulator, stages: np.ndarray, names: list[str]) -> dict[str, dict[str, float]]:
    """Where the GPU waited. Each gap in the GPU timeline (no activity on any stream) is charged to the stage of the
    work that ended it, i.e. what the GPU was waiting for the host to launch; a gap between work of two stages is
    charged to the transition ("ftprof/optimizer_step -> ftprof/forward": a step boundary). Per key: the idle time,
    the number of gaps, and the time in gaps of 1 ms or more (host work or a sync rather than launch latency).
    Vectorized: a large trace has millions of kernels."""
    order = np.argsort(np.frombuffer(acc.k_start), kind="stable")
    end = np.frombuffer(acc.k_end)[order]
    covered = np.maximum.accumulate(end)  # the GPU is busy until covered[i] after the first i + 1 activities
    reaches = end[1:] >= covered[:-1]  # activity i + 1 is (so far) the last the GPU finishes
    del end
    gap = np.frombuffer(acc.k_start)[order[1:]]
    gap -= covered[:-1]
    del covered
    waited = np.flatnonzero(gap > 0)  # gap i: between the first i + 1 activities and activity i + 1
    gap = gap[waited]
    # Before gap i the GPU was finishing the latest activity <= i whose end reached the running maximum.
    reached = np.flatnonzero(np.concatenate(([True], reaches)))
    del reaches
    before = stages[order[reached[np.searchsorted(reached, waited, side="right") - 1]]]
    del reached
    # One code per (stage before, stage after) pair (-1, outside, shifted to 0); summed per code, not per gap.
    width = len(names) + 1
    code = (before + 1) * width + stages[order[waited + 1]] + 1
    del before, waited, order
    codes, which = np.unique(code, return_inverse=True)
    idle = np.bincount(which, weights=gap, minlength=len(codes))
    count = np.bincount(which, minlength=len(codes))
    long = np.bincount(which, weights=np.where(gap >= 1000.0, gap, 0.0), minlength=len(codes))
    labels = [OUTSIDE_STAGES, *names]
    out: dict[str, dict[str, float]] = {}
    for c, t, k, lg in zip(codes.tolist(), idle.tolist(), count.tolist(), long.tolist(), strict=True):
        b, a = divmod(c, width)
        out[labels[a] if b == a else f"{labels[b]} -> {labels[a]}"] = {"idle_us": t, "gaps": k, "long_gaps_us": lg}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["idle_us"]))


def _self_times(acc: _Accumulator) -> Counter:
    """Self time per CPU operator: inclusive time minus the time of its direct children, per thread."""
    self_time: Counter = Counter()
    for th in acc.threads.values():
        ts_a, dur_a, names = th.ts, th.dur, th.names
        ts_np, dur_np = np.frombuffer(ts_a, dtype=np.float64), np.frombuffer(dur_a, dtype=np.float64)
        order = np.lexsort((-dur_np, ts_np)).tolist()  # by start, longest (outermost) first
        stack: list[list] = []  # [end, name, duration, child_time]
        for i in order:
            start = ts_a[i]
            while stack and start >= stack[-1][0]:
                _pop(stack, self_time)
            stack.append([start + dur_a[i], names[i], dur_a[i], 0.0])
        while stack:
            _pop(stack, self_time)
    return self_time


def _pop(stack: list[list], self_time: Counter) -> None:
    _, name, dur, child = stack.pop()
    self_time[name] += max(0.0, dur - child)
    if stack:
        stack[-1][3] += dur


def _read_metadata(path: Path) -> dict[str, Any]:
    """Top-level keys written before traceEvents (Kineto puts its metadata, and ftprof's, there).

    Stops at traceEvents, so it costs nothing on a large trace.
    """
    meta: dict[str, Any] = {}
    builder, key = None, None
    with _open(path) as fh:
        for prefix, event, value in ijson.parse(fh, use_float=True):
            if builder is None:
                if prefix == "" and event == "map_key":
                    if value == "traceEvents":
                        break
                    key = value
                elif prefix == key and event in ("start_map", "start_array"):
                    builder = ObjectBuilder()
                    builder.event(event, value)
                elif prefix == key:
                    meta[key] = value
                continue
            if prefix == key and event in ("end_map", "end_array"):
                builder.event(event, value)
                meta[key] = builder.value
                builder = None
            else:
                builder.event(event, value)
    if "ftprof" in meta:
        meta["ftprof"] = decode_metadata(meta["ftprof"])
    return meta


def ftprof_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """ftprof's own block of trace metadata ({} for traces ftprof did not write)."""
    block = meta.get("ftprof")
    return block if isinstance(block, dict) else {}


def summarize(path: str | Path, run_config: dict | None = None) -> TraceSummary:
    path = Path(path)
    acc = _Accumulator()
    with _open(path) as fh:
        for ev in ijson.items(fh, "traceEvents.item", use_float=True):
            acc.add(ev)
    meta = _read_metadata(path)
    ftmeta = ftprof_metadata(meta)
    dtype = (run_config or {}).get("model", {}).get("dtype") or ftmeta.get("dtype")
    checkpointing = (run_config or {}).get("model", {}).get("gradient_checkpointing", ftmeta.get("checkpointing"))
    gpu = len(acc.k_start) > 0
    if gpu:
        window = max(acc.k_end) - min(acc.k_start)
        busy = union_us(acc.k_start, acc.k_end)
        cats: Counter = Counter()
        for name, t in acc.kernel_time.items():
            cats[categorize(name)] += t
        times = acc.kernel_time
    else:
        self_t = _self_times(acc)
        window = _cpu_window(acc)
        busy = sum(self_t.values())
        cats = Counter()
        for name, t in self_t.items():
            cats[categorize(name)] += t
        times = self_t
    kernel_stages, stage_names = _kernel_stages(acc) if gpu else (np.empty(0, dtype=np.int64), [])
    gpu_stages = _gpu_stage_times(acc, kernel_stages, stage_names) if gpu else Counter()
    stages = gpu_stages or acc.cpu_stage
    gemm_us, fp32_us = _gemm_split(acc, gpu, times)
    summary = TraceSummary(
        trace=str(path), device_kind="gpu" if gpu else "cpu", window_us=window, busy_us=busy,
        idle_share=(1 - busy / window) if gpu and window > 0 else None,
        categories_us=dict(cats.most_common()), stages_us={k: stages[k] for k in STAGES if k in stages},
        stage_source="GPU kernels by launch range" if gpu_stages else "CPU ranges (user_annotation)",
        top_kernels=[{"name": n, "us": t, "count": acc.kernel_count[n]} for n, t in acc.kernel_time.most_common(15)],
        top_operators=[{"name": n, "self_us" if not gpu else "inclusive_us": t, "count": acc.op_count[n]}
                       for n, t in (times if not gpu else acc.op_time).most_common(15)],
        host_device_copies={k: {"count": acc.copies[k], "us": acc.copy_us[k], "bytes": acc.copy_bytes[k]}
                            for k in acc.copies},
        fp32_gemm_us=fp32_us, gemm_us=gemm_us, verdict="", diagnoses=[], metadata=meta,
        idle_by_stage_us=idle_by_stage(acc, kernel_stages, stage_names) if gpu else {})
    summary.graph_replay_us = graph_replay_us(acc)
    summary.logits_softmax_us = sum(t for n, t in acc.kernel_time.items() if any(k in n for k in LOGITS_KERNELS))
    summary.breakdown = breakdown_dict(buckets.from_trace(acc, meta, ftmeta, run_config, categorize))
    info = meta.get("distributedInfo")
    summary.rank = int(info["rank"]) if isinstance(info, dict) and "rank" in info else None
    summary.verdict = _verdict(summary)
    fused_a = (run_config or {}).get("method", {}).get("lora_fused_a", ftmeta.get("lora_fused_a"))
    summary.diagnoses = diagnose(summary, dtype=dtype, checkpointing=checkpointing, fused_a=fused_a)
    return summary


def graph_replay_us(acc: _Accumulator) -> float:
    """GPU kernel time launched by CUDA graph replays: kernels with a graph id, or with the correlation id of a
    graph launch (CUPTI gives every kernel of a replay the launch's)."""
    if not len(acc.k_start):
        return 0.0
    corr = np.frombuffer(acc.k_corr_all, dtype=np.float64)
    replayed = (np.frombuffer(acc.k_graph, dtype=np.int8) == 1) | np.isin(corr, list(acc.graph_corr))
    kernels = (np.frombuffer(acc.k_kind, dtype=np.int8) == 0) & replayed
    return float((np.frombuffer(acc.k_end, dtype=np.float64) - np.frombuffer(acc.k_start, dtype=np.float64))[
        kernels].sum())


def breakdown_dict(b: buckets.Breakdown) -> dict[str, Any]:
    out = asdict(b)
    out["flops_ratio"] = b.flops_ratio
    return out


def _cpu_window(acc: _Accumulator) -> float:
    starts = [min(th.ts) for th in acc.threads.values() if len(th.ts)]
    ends = [max(t + d for t, d in zip(th.ts, th.dur, strict=True)) for th in acc.threads.values() if len(th.ts)]
    return (max(ends) - min(starts)) if starts else 0.0


def _gemm_split(acc: _Accumulator, gpu: bool, times: Counter) -> tuple[float, float]:
    """(all GEMM time, fp32 GEMM time). Operator dtypes when the trace has shapes; kernel names otherwise."""
    gemm = sum(t for n, t in times.items() if categorize(n) == "gemm")
    if gpu and acc.matmul_dtype_by_ext:
        fp32 = sum(sum(d) for ext, d in acc.kernel_ext.items() if acc.matmul_dtype_by_ext.get(ext) == "float")
    elif gpu:
        fp32 = sum(t for n, t in acc.kernel_time.items() if categorize(n) == "gemm" and FP32_GEMM.search(n))
    else:  # CPU traces: operator dtypes (only with record_shapes)
        fp32 = acc.cpu_matmul_us.get("float", 0.0)
    return gemm, fp32


def _idle_where(s: TraceSummary) -> str:
    """'; most of it before backward kernels (...)': where the largest share of the idle time falls."""
    if not s.idle_by_stage_us:
        return ""
    total = sum(row["idle_us"] for row in s.idle_by_stage_us.values()) or 1.0
    stage, row = next(iter(s.idle_by_stage_us.items()))
    where = f"at {stage}" if " -> " in stage else f"in {stage}"
    long_share = row["long_gaps_us"] / row["idle_us"] if row["idle_us"] else 0.0
    # The remedy each kind has in ftprof: the host's batch work out of the step's critical path (measured on an
    # H200: 42 ms/step outside the stages, +3.2% tokens/s with prefetching), or blocks replayed as CUDA graphs.
    kind = ("mostly gaps of 1 ms or more: host work or a sync (--prefetch, on by default, makes the next batch "
            "while the GPU runs)" if long_share >= 0.5
            else "mostly short gaps: launch overhead (--compile --compile-mode reduce-overhead replays blocks as "
            "CUDA graphs)")
    return f"; {100 * row['idle_us'] / total:.0f}% of it {where}, {int(row['gaps'])} gaps, {kind}"


def _verdict(s: TraceSummary) -> str:
    if s.device_kind == "cpu":
        return "CPU run: all compute on the host"
    if s.idle_share is not None and s.idle_share > 0.3:
        return f"CPU-bound: the GPU is idle {100 * s.idle_share:.0f}% of the recorded window"
    return f"GPU-bound: the GPU is busy {100 * (1 - (s.idle_share or 0)):.0f}% of the recorded window"


def diagnose(s: TraceSummary, dtype: str | None = None, checkpointing: bool | None = None,
             fused_a: bool | None = None) -> list[Diagnosis]:
    out: list[Diagnosis] = []
    total = sum(s.categories_us.values()) or 1.0
    of_time = "of GPU kernel time" if s.device_kind == "gpu" else "of CPU operator time"
    if s.fp32_gemm_us > 0 and (dtype in (None, "bfloat16", "float16")):
        share = s.fp32_gemm_us / total
        sev = "warning" if share > 0.02 else "info"
        out.append(Diagnosis("fp32_gemm", sev, f"fp32 GEMMs take {100 * share:.1f}% {of_time} in a "
                             f"{dtype or 'low-precision'} run: something was upcast (lm_head, adapters or "
                             "embeddings, e.g. by prepare_model_for_kbit_training) or runs outside autocast",
                             {"fp32_gemm_us": s.fp32_gemm_us, "gemm_us": s.gemm_us, "share": share}))
    deq = s.categories_us.get("quantize/dequantize", 0.0)
    if deq > 0:
        share = deq / total
        out.append(Diagnosis("dequantization", "warning" if share > 0.15 else "info",
                             f"quantize/dequantize work takes {100 * share:.1f}% {of_time}; for QLoRA, "
                             "--dequant-kernel triton (the default on CUDA) dequantizes each weight in one pass, "
                             "1.8x faster than bitsandbytes' kernels on an H200",
                             {"us": deq, "share": share}))
    lora = ((s.breakdown or {}).get("buckets") or {}).get("lora_gemm") or {}
    if (lora.get("share") or 0) > LORA_GEMM_SHARE:
        fix = ("the A matmuls already run once per shared input (--lora-fused-a); the rest are the B matmuls and "
               "their gradients" if fused_a else "--lora-fused-a (on by default) applies one A matmul to each input "
               "that several adapted projections read (q, k, v; gate, up)")
        out.append(Diagnosis("lora_gemms", "info",
                             f"LoRA's low-rank GEMMs take {100 * lora['share']:.1f}% of the step, memory-bound at "
                             f"a few percent of peak: {fix}",
                             {"ms_per_step": lora.get("ms_per_step"), "share": lora["share"]}))
    if s.graph_replay_us > 0:
        share = s.graph_replay_us / total
        out.append(Diagnosis("cuda_graphs", "info",
                             f"{100 * share:.1f}% {of_time} ran from CUDA graph replays (--compile-mode "
                             "reduce-overhead or max-autotune): those kernels have no operator or shapes behind "
                             "them, so the fine-tuning buckets place them by kernel name only (no LoRA/base GEMM "
                             "split, no FLOPs); profile with --compile-mode default for the full split",
                             {"us": s.graph_replay_us, "share": share}))
    if s.idle_share is not None and s.idle_share > 0.1:
        out.append(Diagnosis("gpu_idle", "warning" if s.idle_share > 0.3 else "info",
                             f"the GPU is idle {100 * s.idle_share:.1f}% of the recorded window: launch overhead, "
                             f"host work or synchronisation between kernels{_idle_where(s)}",
                             {"idle_us": s.window_us - s.busy_us, "window_us": s.window_us,
                              "by_stage": s.idle_by_stage_us}))
    copies = s.host_device_copies
    n_copies = sum(v["count"] for v in copies.values())
    if n_copies:
        dtoh = copies.get("DtoH", {}).get("count", 0)
        out.append(Diagnosis("host_device_copies", "warning" if dtoh > 2 * max(1, _steps(s)) else "info",
                             f"{n_copies} host-device copies inside the recorded steps ({dtoh} device-to-host: "
                             "each one can synchronise the host with the GPU)", copies))
    out.extend(_elementwise(s, total))
    out.extend(_logits(s, total))
    if checkpointing:
        out.extend(_recomputation(s))
    return out


# Above this share of GPU kernel time, unfused elementwise work is worth a line (measured on an H200: 28% for
# llama-8b LoRA and QLoRA with checkpointing, where GEMMs took 56%).
ELEMENTWISE_SHARE = 0.2


def _elementwise(s: TraceSummary, total: float) -> list[Diagnosis]:
    if s.device_kind != "gpu":
        return []
    us = s.categories_us.get("elementwise", 0.0) + s.categories_us.get("normalization", 0.0)
    share = us / total
    if share <= ELEMENTWISE_SHARE:
        return []
    top = [k for k in s.top_kernels if categorize(k["name"]) in ("elementwise", "normalization")][:3]
    return [Diagnosis("elementwise", "warning" if share > 0.3 else "info",
                      f"elementwise and normalization kernels take {100 * share:.1f}% of GPU kernel time (unfused "
                      "RMSNorm in fp32, activations, rotary embeddings, residual and LoRA adds): fusing them is the "
                      "lever: --compile (each decoder block compiled) or --kernels liger (fused RMSNorm, SwiGLU, "
                      "RoPE)",
                      {"us": us, "share": share, "top_kernels": top})]


def _recomputation(s: TraceSummary) -> list[Diagnosis]:
    """Time: the recomputed forward as the buckets measured it, else estimated as one more forward; FLOPs: exact,
    when ftprof wrote the trace."""
    fwd, bwd = s.stages_us.get("ftprof/forward", 0.0), s.stages_us.get("ftprof/backward", 0.0)
    if fwd + bwd <= 0:
        return []
    share = fwd / (fwd + bwd + s.stages_us.get("ftprof/optimizer_step", 0.0))
    evidence = {"forward_us": fwd, "backward_us": bwd, "time_share": share}
    meta = s.metadata.get("ftprof") if isinstance(s.metadata.get("ftprof"), dict) else {}
    flops, extra = meta.get("flops_per_token"), meta.get("recompute_flops_per_token")
    measured = ((s.breakdown or {}).get("buckets") or {}).get("recompute") or {}
    if measured.get("share"):  # the fine-tuning buckets timed the recomputed forward itself (a trace with shapes)
        evidence["measured_share"] = measured["share"]
        text = f"{100 * measured['share']:.0f}% of step time (the recomputed forward, measured)"
    else:
        text = f"about {100 * share:.0f}% of step time (estimated as one more forward)"
    if flops and extra:
        evidence["flops_share"] = extra / (flops + extra)
        text += f"; {100 * evidence['flops_share']:.0f}% of the FLOPs executed"
    return [Diagnosis("recomputation", "info", "activation checkpointing recomputes the forward in backward: " + text
                      + "; --checkpointing selective saves the matmul outputs instead, --checkpointing auto picks "
                      "the fastest policy that fits the GPU's memory", evidence)]


# The loss's NLL and fp32 softmax over the vocabulary: their presence means the logits (and their fp32 gradients,
# 2 x 4 bytes x tokens x vocab in backward) are materialized; a fused linear cross entropy never builds them.
LOGITS_KERNELS = ("nll_loss", "SoftMaxForward", "SoftMaxBackward")


def _logits(s: TraceSummary, total: float) -> list[Diagnosis]:
    if s.device_kind != "gpu":
        return []
    us = s.logits_softmax_us
    if not us:
        return []
    return [Diagnosis("logits", "info",
                      f"the loss materializes the logits and their fp32 softmax ({100 * us / total:.1f}% of GPU "
                      "kernel time; in backward two fp32 logit-sized gradients are held at once): --kernels liger's "
                      "fused linear cross entropy computes the loss in chunks without them",
                      {"us": us, "share": us / total})]


def _steps(s: TraceSummary) -> int:
    meta = s.metadata.get("ftprof")
    return int(meta.get("active_steps", 1)) if isinstance(meta, dict) else 1
