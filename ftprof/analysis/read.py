"""Stream a Chrome/Kineto trace (any torch.profiler trace, gzipped or not) into compact arrays, and read its
metadata.

The trace is streamed (ijson): events are folded into counters as they are read, and only compact arrays of kernel
intervals and operators are kept, so a 1 GB trace does not become 1 GB of Python objects. What is kept is decided
here, once per event: the shapes of the few operators that carry FLOPs or the vocabulary (op_flops.keeps_dims), the
durations of GEMM kernels by launching operator (rules.categorize), for the fp32 GEMM share.
"""

from __future__ import annotations

import gzip
from array import array
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, BinaryIO

import ijson
import numpy as np
from ijson.common import ObjectBuilder

from ftprof.analysis.intervals import lookup
from ftprof.analysis.op_flops import keeps_dims
from ftprof.analysis.rules import categorize
from ftprof.profiling.layout import decode_metadata

STAGES = ("ftprof/forward", "ftprof/backward", "ftprof/optimizer_step")  # ftprof's record_function labels
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")  # runtime and driver calls that replay a CUDA graph
LEAF_MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
MATMUL_OPS = LEAF_MATMULS | {"aten::matmul", "aten::linear"}
# GPU activity kinds (TraceEvents.k_kind)
KERNEL, HOST_DEVICE_COPY, OTHER_COPY = 0, 1, 2


def open_trace(path: Path) -> BinaryIO:
    """The trace file as bytes, gunzipped when it is gzipped (whatever its name says)."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


class ThreadOps:
    """One thread's CPU operators, in compact arrays (names are interned by the parser: they repeat heavily)."""

    __slots__ = ("ts", "dur", "names", "ext", "seq")

    def __init__(self) -> None:
        self.ts, self.dur, self.ext = array("d"), array("d"), array("d")
        self.seq = array("b")  # 1 where the operator carries an autograd sequence number
        self.names: list[str] = []


class TraceEvents:
    """What later stages need of a trace's events, folded as they stream by (``add``, one event at a time)."""

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
        self.threads: dict[tuple, ThreadOps] = {}  # (pid, tid) -> its operators
        self.op_dims: dict[tuple, tuple[str, list]] = {}  # (thread, index) -> (name, input dims): FLOP/vocab ops
        # Per GPU activity, for the fine-tuning buckets: launching operator, launch, name, kind.
        self.k_ext, self.k_corr_all = array("d"), array("d")
        self.k_name, self.k_kind = array("I"), array("b")
        self.k_graph = array("b")  # 1: the activity says it ran inside a CUDA graph (CUPTI's graph id, via Kineto)
        self.kernel_names: list[str] = []  # k_name indexes this list
        self._kernel_ids: dict[str, int] = {}
        self.step_ranges: list[tuple[float, float]] = []  # ProfilerStep#N: one per active step
        self.optimizer_ranges: list[tuple[float, float]] = []
        self.cpu_matmul_us: Counter = Counter()
        # For GPU time per stage: kernel -> its launch (correlation id) -> the ftprof/* range around the launch.
        self.launch_corr, self.launch_ts = array("d"), array("d")
        self.graph_corr: set[float] = set()  # correlation ids of CUDA graph launches
        self.stage_ranges: list[tuple[float, float, str]] = []

    @property
    def gpu(self) -> bool:
        """Whether the trace holds GPU activity (else the CPU operators are the timeline)."""
        return len(self.k_start) > 0

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
            self._add_operator(ev, name, ts, dur, args)

    def _add_operator(self, ev: dict[str, Any], name: str, ts: float, dur: float, args: dict) -> None:
        self.op_time[name] += dur
        self.op_count[name] += 1
        key = (ev.get("pid"), ev.get("tid"))
        th = self.threads.get(key)
        if th is None:
            th = self.threads[key] = ThreadOps()
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
        self.k_kind.append(KERNEL if cat == "kernel" else HOST_DEVICE_COPY if host_device else OTHER_COPY)
        self.k_graph.append(1 if args.get("graph id") else 0)

    def launch_times(self) -> np.ndarray:
        """CPU launch time of each GPU activity (by correlation id); NaN where the launch is not in the trace."""
        k_corr = np.frombuffer(self.k_corr_all, dtype=np.float64)
        lc = np.frombuffer(self.launch_corr, dtype=np.float64)
        lt = np.frombuffer(self.launch_ts, dtype=np.float64)
        idx = lookup(lc, k_corr)
        return np.where(idx >= 0, lt[np.clip(idx, 0, None)] if len(lt) else np.nan, np.nan)


def read_events(path: Path) -> TraceEvents:
    """Every event of the trace, streamed once."""
    events = TraceEvents()
    with open_trace(path) as fh:
        for ev in ijson.items(fh, "traceEvents.item", use_float=True):
            events.add(ev)
    return events


def read_metadata(path: Path) -> dict[str, Any]:
    """Top-level keys written before traceEvents (Kineto puts its metadata, and ftprof's, there); ftprof's block
    decoded.

    Stops at traceEvents, so it costs nothing on a large trace.
    """
    meta: dict[str, Any] = {}
    builder, key = None, None
    with open_trace(path) as fh:
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
