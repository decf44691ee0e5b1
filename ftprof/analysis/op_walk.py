"""The walk over every thread's CPU operators, nested by time: the phase (forward, backward, recomputed forward),
bucket, FLOPs and self time of each operator."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ftprof.analysis import op_flops
from ftprof.analysis.buckets import BACKWARD, FORWARD, INDEX, NODE_PREFIX, RECOMPUTE, SplitContext, op_bucket
from ftprof.analysis.read import ThreadOps
from ftprof.analysis.rules import meaning


@dataclass
class OpTable:
    """Every CPU operator of the trace, flattened over threads, with what the walk found."""

    ext: np.ndarray  # External id (links kernels to the operator that launched them)
    ts: np.ndarray
    self_us: np.ndarray
    phase: np.ndarray  # FORWARD (or outside autograd), BACKWARD, RECOMPUTE
    bucket: np.ndarray  # bucket index of the operator itself (used for its kernels and its CPU self time)
    flops: np.ndarray  # FLOPs counted on this operator (the outermost FLOP operator of a nest)
    names: list[str]


def walk_ops(threads: dict[tuple, ThreadOps], op_dims: dict, ctx: SplitContext) -> OpTable:
    """One pass per thread over operators nested by time: phase, meaning, FLOPs and self time of each."""
    parts = [_walk_thread(key, th, op_dims, ctx) for key, th in threads.items() if len(th.ts)]
    if not parts:
        empty = np.zeros(0)
        return OpTable(empty, empty, empty, empty.astype(np.int8), empty.astype(np.int16), empty, [])
    names = [n for th in threads.values() if len(th.ts) for n in th.names]
    return OpTable(*(np.concatenate([p[j] for p in parts]) for j in range(6)), names)


def _walk_thread(key, th: ThreadOps, op_dims: dict, ctx: SplitContext) -> tuple:
    n = len(th.ts)
    ts_np, dur_np = np.frombuffer(th.ts, dtype=np.float64), np.frombuffer(th.dur, dtype=np.float64)
    self_t = dur_np.copy()
    phase = np.zeros(n, dtype=np.int8)
    bucket = np.zeros(n, dtype=np.int16)
    flops = np.zeros(n, dtype=np.float64)
    node_of = np.full(n, -1, dtype=np.int64)  # the autograd node (its own range) an operator runs under
    spans: dict[int, list[float]] = {}  # node -> [first, last] time of the recompute it ran
    order = np.lexsort((-dur_np, ts_np)).tolist()  # by start, outermost first
    # stack entries: [end, index, in_backward, is_node, recompute, meaning, flops_taken, node]
    stack: list[list] = []
    for i in order:
        start = th.ts[i]
        while stack and start >= stack[-1][0]:
            stack.pop()
        name = th.names[i]
        parent = stack[-1] if stack else None
        if parent is not None:
            self_t[parent[1]] -= th.dur[i]
        is_node = name.startswith(NODE_PREFIX)
        in_bwd = is_node or (parent is not None and parent[2])
        node = i if parent is not None and parent[3] else parent[7] if parent is not None else -1
        recompute = parent is not None and (parent[4] or (parent[2] and not parent[3] and not is_node
                                                          and th.seq[i] and "Backward" not in name))
        if recompute and node >= 0:
            span = spans.setdefault(node, [start, start])
            span[1] = max(span[1], start + th.dur[i])
        mean = meaning(name) or (parent[5] if parent is not None else None)
        taken = parent is not None and parent[6]
        if name == "PythonDispatchMode" and parent is not None and op_flops.is_flop_op(th.names[parent[1]]):
            # A dispatch mode (selective checkpointing's) caught the matmul: the operator runs again beneath it,
            # or not at all when the mode hands back a saved output. Only an operator that runs carries FLOPs.
            flops[parent[1]] = 0.0
            taken = False
        ph = RECOMPUTE if recompute else BACKWARD if in_bwd else FORWARD
        is_flop = op_flops.is_flop_op(name)
        dims = op_dims.get((key, i), (None, None))[1]
        if is_flop and not taken:
            flops[i] = op_flops.op_flops(name, dims) if dims else 0.0
        phase[i], node_of[i] = ph, node
        bucket[i] = INDEX[op_bucket(name, dims, ph, mean, is_flop, ctx)]
        stack.append([start + th.dur[i], i, in_bwd, is_node, recompute, mean, taken or is_flop, node])
    _widen_recompute(spans, node_of, ts_np, phase, bucket)
    return (np.frombuffer(th.ext, dtype=np.float64), ts_np, np.maximum(self_t, 0.0), phase, bucket, flops)


def _widen_recompute(spans: dict, node_of: np.ndarray, ts: np.ndarray, phase: np.ndarray, bucket: np.ndarray) -> None:
    """Checkpointing recomputes a whole block inside the autograd node that first needs one of its tensors. Parts
    of that forward run with autograd off (custom autograd Functions such as bitsandbytes' 4-bit matmul) and carry
    no sequence number: every operator of the node between the first and the last recorded recompute is recompute.
    """
    if not spans:
        return
    lo_of = np.full(len(node_of), np.inf)  # node index -> its recompute span (node indices are operator indices)
    hi_of = np.full(len(node_of), -np.inf)
    for node, (first, last) in spans.items():
        lo_of[node], hi_of[node] = first, last
    hit = node_of >= 0
    lo = np.where(hit, lo_of[np.clip(node_of, 0, None)], np.inf)
    hi = np.where(hit, hi_of[np.clip(node_of, 0, None)], -np.inf)
    inside = (phase == BACKWARD) & (ts >= lo) & (ts < hi)
    phase[inside] = RECOMPUTE
    bucket[inside] = INDEX["recompute"]
