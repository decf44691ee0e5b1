"""Whole-trace measurements over the streamed events: the device timeline's window and busy time, time per category,
time per ftprof stage, where the GPU waited, the GEMM and fp32 GEMM time, and time in CUDA graph replays.

Device time is attributed by kernel name to categories; on CPU-only traces (no kernels), the CPU operators' self
time is used instead. Stage times come from ftprof's record_function labels (ftprof/forward, ftprof/backward,
ftprof/optimizer_step): on GPU traces, each kernel counts for the stage whose CPU range contains its launch
(matched by correlation id); on CPU traces, the ranges' own durations.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ftprof.analysis.intervals import step_index, union_us
from ftprof.analysis.read import KERNEL, TraceEvents
from ftprof.analysis.rules import FP32_GEMM, categorize, is_logits_kernel

OUTSIDE_STAGES = "outside"  # work launched outside ftprof's stage ranges


@dataclass
class Timeline:
    """The timeline the categories are measured on: GPU kernels, or (CPU-only traces) operators' self time."""

    window_us: float  # span of the recorded activity
    busy_us: float  # union of kernel intervals (GPU) or thread busy time (CPU)
    categories: Counter  # category -> time
    times: Counter  # kernel (GPU) or operator (CPU, self time) -> time


def timeline(events: TraceEvents) -> Timeline:
    if events.gpu:
        window = max(events.k_end) - min(events.k_start)
        busy = union_us(events.k_start, events.k_end)
        times = events.kernel_time
    else:
        times = self_times(events)
        window = _cpu_window(events)
        busy = sum(times.values())
    cats: Counter = Counter()
    for name, t in times.items():
        cats[categorize(name)] += t
    return Timeline(window, busy, cats, times)


def kernel_stages(events: TraceEvents) -> tuple[np.ndarray, list[str]]:
    """Each GPU activity's ftprof stage, as an index into the returned stage names (-1: launched outside every
    stage, or its launch is not in the trace): the stage whose CPU range contains its launch.

    Backward kernels are launched from autograd's own thread, so the GPU-side annotation of ftprof/backward misses
    them; matching launches by time (any thread) does not.
    """
    n = len(events.k_start)
    if not n or not events.stage_ranges:
        return np.full(n, -1, dtype=np.int64), []
    ranges = sorted(events.stage_ranges)
    names = sorted({name for _, _, name in ranges})
    range_stage = np.array([names.index(name) for _, _, name in ranges])
    when = events.launch_times()  # NaN: no launch
    idx = step_index(when, [(start, end) for start, end, _ in ranges])
    return np.where(idx >= 0, range_stage[np.clip(idx, 0, None)], -1), names


def gpu_stage_times(events: TraceEvents, stages: np.ndarray, names: list[str]) -> Counter:
    """GPU time per ftprof stage (``stages``, ``names``: from ``kernel_stages``)."""
    busy = np.frombuffer(events.k_end) - np.frombuffer(events.k_start)
    inside = stages >= 0
    per_stage = np.bincount(stages[inside], weights=busy[inside], minlength=len(names))
    return Counter({name: float(t) for name, t in zip(names, per_stage, strict=True) if t > 0})


def idle_by_stage(events: TraceEvents, stages: np.ndarray, names: list[str]) -> dict[str, dict[str, float]]:
    """Where the GPU waited. Each gap in the GPU timeline (no activity on any stream) is charged to the stage of the
    work that ended it, i.e. what the GPU was waiting for the host to launch; a gap between work of two stages is
    charged to the transition ("ftprof/optimizer_step -> ftprof/forward": a step boundary). Per key: the idle time,
    the number of gaps, and the time in gaps of 1 ms or more (host work or a sync rather than launch latency).
    Vectorized: a large trace has millions of kernels."""
    order = np.argsort(np.frombuffer(events.k_start), kind="stable")
    end = np.frombuffer(events.k_end)[order]
    covered = np.maximum.accumulate(end)  # the GPU is busy until covered[i] after the first i + 1 activities
    reaches = end[1:] >= covered[:-1]  # activity i + 1 is (so far) the last the GPU finishes
    del end
    gap = np.frombuffer(events.k_start)[order[1:]]
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


def self_times(events: TraceEvents) -> Counter:
    """Self time per CPU operator: inclusive time minus the time of its direct children, per thread."""
    self_time: Counter = Counter()
    for th in events.threads.values():
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


def _cpu_window(events: TraceEvents) -> float:
    threads = [th for th in events.threads.values() if len(th.ts)]
    starts = [min(th.ts) for th in threads]
    ends = [max(t + d for t, d in zip(th.ts, th.dur, strict=True)) for th in threads]
    return (max(ends) - min(starts)) if starts else 0.0


def gemm_split(events: TraceEvents, times: Counter) -> tuple[float, float]:
    """(all GEMM time, fp32 GEMM time) over ``times`` (Timeline.times). Operator dtypes when the trace has shapes;
    kernel names otherwise."""
    gemm = sum(t for n, t in times.items() if categorize(n) == "gemm")
    if events.gpu and events.matmul_dtype_by_ext:
        fp32 = sum(sum(d) for ext, d in events.kernel_ext.items() if events.matmul_dtype_by_ext.get(ext) == "float")
    elif events.gpu:
        fp32 = sum(t for n, t in events.kernel_time.items() if categorize(n) == "gemm" and FP32_GEMM.search(n))
    else:  # CPU traces: operator dtypes (only with record_shapes)
        fp32 = events.cpu_matmul_us.get("float", 0.0)
    return gemm, fp32


def graph_replay_us(events: TraceEvents) -> float:
    """GPU kernel time launched by CUDA graph replays: kernels with a graph id, or with the correlation id of a
    graph launch (CUPTI gives every kernel of a replay the launch's)."""
    if not len(events.k_start):
        return 0.0
    corr = np.frombuffer(events.k_corr_all, dtype=np.float64)
    replayed = (np.frombuffer(events.k_graph, dtype=np.int8) == 1) | np.isin(corr, list(events.graph_corr))
    kernels = (np.frombuffer(events.k_kind, dtype=np.int8) == KERNEL) & replayed
    return float((np.frombuffer(events.k_end, dtype=np.float64) - np.frombuffer(events.k_start, dtype=np.float64))[
        kernels].sum())


def logits_softmax_us(events: TraceEvents) -> float:
    """Kernel time of the loss's softmax over the vocabulary (rules.LOGITS_KERNELS)."""
    return sum(t for n, t in events.kernel_time.items() if is_logits_kernel(n))
