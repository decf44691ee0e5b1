"""Fine-tuning buckets: where each active step's time and FLOPs go, in the terms a fine-tuner thinks in.

Every kernel (on CPU-only traces: every operator's self time) lands in exactly one bucket. What decides it:
- the operator that launched the kernel (kernel ``External id`` -> CPU operator), and that operator's ancestors on
  its thread: inside an autograd node (``autograd::engine::evaluate_function: ...``) is backward work; an operator
  with a ``Sequence number`` inside backward runs with autograd recording, which only checkpointing's recomputation
  does there: the recomputed forward;
- for GEMMs, the recorded shapes (record_shapes): a dimension equal to the LoRA rank makes a LoRA GEMM, one equal
  to the vocabulary (from the embedding / log-softmax shapes) the lm_head, a backward GEMM contracting over the
  tokens dimension is a weight gradient, the rest are the base model's forward and input-gradient GEMMs;
- otherwise the operator's (or an ancestor's) name, then the kernel's name (trace_summary.categorize).
FLOPs come from the shapes of the matmul and attention operators (op_flops), counted as ftprof/metrics.py counts the
run's HFU, so their sum can be checked against it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from ftprof.profiling import op_flops

# (key, label) in display order. Keys are stable (summary.json, diffs); labels are for people.
BUCKETS: tuple[tuple[str, str], ...] = (
    ("base_gemm", "base GEMMs (fwd + input grad)"),
    ("lora_gemm", "LoRA GEMMs"),
    ("weight_grad_gemm", "weight-grad GEMMs"),
    ("gemm", "GEMMs (no shapes: not split)"),
    ("dequant", "4-bit dequantization"),
    ("recompute", "recomputed forward"),
    ("attention", "attention"),
    ("loss", "loss (lm_head + cross entropy)"),
    ("norm_act", "norms and activations"),
    ("elementwise", "other elementwise"),
    ("optimizer", "optimizer"),
    ("communication", "communication"),
    ("host_copies", "host-device copies"),
    ("other", "other (CPU framework work)"),
    ("idle", "GPU idle"),
)
LABELS = dict(BUCKETS)
CPU_IDLE_LABEL = "host time outside operators"  # the "idle" bucket of CPU-only traces (Python, the framework)
KEYS = tuple(k for k, _ in BUCKETS)
_INDEX = {k: i for i, k in enumerate(KEYS)}
KERNELS_PER_BUCKET = 10  # the kernel-level view (and diff) is bounded

NODE_PREFIX = "autograd::engine::evaluate_function:"
FORWARD, BACKWARD, RECOMPUTE = 0, 1, 2
# Names (of an operator or of an ancestor, autograd nodes included) that say what the work belongs to.
_MEANING = tuple((key, re.compile(rx, re.I)) for key, rx in (
    ("dequant", r"dequant|quantize|4bit|nf4|gptq|marlin|exllama|machete|awq|MatMul4Bit"),
    ("loss", r"log_softmax|nll_loss|cross_entropy|LogSoftmaxBackward|NllLossBackward"),
    ("attention", r"attention|sdpa|flash|fmha|softmax"),
    ("norm_act", r"rms_?norm|layer_?norm|group_?norm|rsqrt|aten::pow$|PowBackward|silu|gelu|relu|sigmoid|tanh|"
                 r"softplus|swiglu|geglu|mish|elu"),
    ("optimizer", r"Optimizer\.|adam|_foreach|multi_tensor|sgd"),
))


@lru_cache(maxsize=65536)
def meaning(name: str) -> str | None:
    for key, rx in _MEANING:
        if rx.search(name):
            return key
    return None


@dataclass
class SplitContext:
    """What tells GEMMs apart. Each value may be unknown (None): then that split is not made."""

    lora_r: int | None = None
    # With --lora-fused-a, q/k/v's adapters share one A matmul of rank 3r and gate/up's one of 2r. (A base
    # projection with that many outputs looks the same: the split cannot tell them apart.)
    lora_fused: bool = False
    vocab: int | None = None
    tokens: int | None = None  # M of the forward GEMMs: batch * sequence length per micro-batch
    notes: list[str] = field(default_factory=list)

    def lora_ranks(self) -> tuple[int, ...]:
        r = self.lora_r or 0
        return (r, 2 * r, 3 * r) if self.lora_fused else (r,)


def gemm_bucket(name: str, dims: list | None, phase: int, ctx: SplitContext) -> str:
    """Bucket of one leaf matmul operator from its shapes."""
    if name in ("aten::bmm", "aten::baddbmm"):
        return "attention"  # batched matmuls in fine-tuning are eager attention's QK^T and AV
    mkn = op_flops.matmul_mkn(name, dims) if dims else None
    if mkn is None:
        return "gemm"
    _, m, k, n = mkn
    if ctx.vocab and ctx.vocab in (m, k, n):
        return "loss"
    if ctx.lora_r and any(r in (m, k, n) for r in ctx.lora_ranks()):
        return "lora_gemm"
    if phase == BACKWARD and ctx.tokens and k == ctx.tokens:
        return "weight_grad_gemm"
    return "base_gemm"


def infer_context(op_dims: dict, lora_r: int | None, method: str | None) -> SplitContext:
    """Vocabulary, tokens per micro-batch and (without a run config) the LoRA rank, from the recorded shapes."""
    ctx = SplitContext(lora_r=lora_r)
    vocab: Counter = Counter()
    ms: Counter = Counter()
    ns: Counter = Counter()
    ks: Counter = Counter()
    for name, dims in op_dims.values():
        try:
            if name == "aten::embedding":
                vocab[int(dims[0][0])] += 1
            elif name in op_flops.VOCAB_OPS:
                vocab[int(dims[0][-1])] += 1
            elif name in ("aten::mm", "aten::addmm"):
                _, m, k, n = op_flops.matmul_mkn(name, dims) or (0, 0, 0, 0)
                ms[m] += 1
                ks[k] += 1
                ns[n] += 1
        except (IndexError, TypeError, ValueError):
            continue
    ctx.vocab = vocab.most_common(1)[0][0] if vocab else None
    ctx.tokens = ms.most_common(1)[0][0] if ms else None
    if lora_r is None and method is None and ks:
        ctx.lora_r = _guess_rank(ks, ns)
        if ctx.lora_r:
            ctx.notes.append(f"LoRA rank {ctx.lora_r} inferred from the GEMM shapes (no run config)")
    return ctx


def _guess_rank(ks: Counter, ns: Counter) -> int | None:
    """A LoRA rank shows up as the output of many GEMMs (x @ A) and the inner dimension of as many (h @ B), and is
    far smaller than the model width (the most common inner dimension)."""
    width = ks.most_common(1)[0][0]
    candidates = [v for v in ns if v in ks and 4 * v <= width and min(ns[v], ks[v]) >= 2]
    return min(candidates) if candidates else None


# ---------------------------------------------------------------------------------------------------- operators
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


def walk_ops(threads: dict, op_dims: dict, ctx: SplitContext, categorize) -> OpTable:
    """One pass per thread over operators nested by time: phase, meaning, FLOPs and self time of each."""
    parts = [_walk_thread(key, th, op_dims, ctx, categorize) for key, th in threads.items() if len(th.ts)]
    if not parts:
        empty = np.zeros(0)
        return OpTable(empty, empty, empty, empty.astype(np.int8), empty.astype(np.int16), empty, [])
    names = [n for th in threads.values() if len(th.ts) for n in th.names]
    return OpTable(*(np.concatenate([p[j] for p in parts]) for j in range(6)), names)


def _walk_thread(key, th, op_dims: dict, ctx: SplitContext, categorize) -> tuple:
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
        bucket[i] = _INDEX[_op_bucket(name, dims, ph, mean, is_flop, ctx, categorize)]
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
    bucket[inside] = _INDEX["recompute"]


def _op_bucket(name: str, dims, phase: int, mean: str | None, is_flop: bool, ctx: SplitContext, categorize) -> str:
    if phase == RECOMPUTE:
        return "recompute"
    cat = categorize(name)
    if cat == "communication":
        return "communication"
    if mean == "optimizer":
        return mean
    if is_flop and name in op_flops.LEAF_MATMULS:  # a matmul inside a 4-bit layer is still the base GEMM
        return gemm_bucket(name, dims, phase, ctx)
    if mean == "dequant":
        return mean
    if mean is not None:
        return mean
    if is_flop or cat == "attention":
        return "attention"
    if cat == "normalization":
        return "norm_act"
    if cat == "optimizer":
        return "optimizer"
    if cat in ("elementwise", "memory copy"):
        return "elementwise"
    return "other"


# ---------------------------------------------------------------------------------------------------- kernels
def kernel_bucket(kname: str, kind: int, op_bucket: str | None, op_phase: int, in_optimizer: bool,
                  shapes: bool, categorize) -> str:
    """Bucket of one GPU activity. ``kind``: 0 kernel, 1 host<->device copy, 2 other copy or memset."""
    if kind == 1:
        return "host_copies"
    cat = categorize(kname)
    if cat == "communication":
        return "communication"
    if op_phase == RECOMPUTE:
        return "recompute"
    if in_optimizer or op_bucket == "optimizer":
        return "optimizer"
    if cat == "quantize/dequantize" or op_bucket == "dequant":
        return "dequant"
    if cat == "gemm":
        if op_bucket in ("base_gemm", "lora_gemm", "weight_grad_gemm", "loss", "attention", "gemm"):
            return op_bucket
        return "base_gemm" if shapes else "gemm"
    if op_bucket in ("attention", "loss", "norm_act"):
        return op_bucket
    if cat == "attention":
        return "attention"
    if cat == "normalization":
        return "norm_act"
    if cat == "optimizer":
        return "optimizer"
    return "elementwise"


# ---------------------------------------------------------------------------------------------------- result
@dataclass
class Breakdown:
    """Per-step figures of every bucket. Times in ms per active step; FLOPs per active step."""

    steps: int
    step_ms: list[float]  # wall time of each active step
    buckets: dict[str, dict[str, Any]]
    flops_per_step: float | None  # sum over buckets; None without shapes
    model_flops_per_step: float | None  # the run's HFU count (model + recompute FLOPs) per step, when known
    peak_tflops: float | None
    communication_overlap_ms: float | None  # of the communication time, how much ran beside compute kernels
    split: dict[str, Any]
    notes: list[str]
    device: str | None = None  # the GPU's name, or "cpu"

    @property
    def flops_ratio(self) -> float | None:
        if self.flops_per_step and self.model_flops_per_step:
            return self.flops_per_step / self.model_flops_per_step
        return None


def step_index(times: np.ndarray, steps: list[tuple[float, float]]) -> np.ndarray:
    """Index of the step range containing each time (-1: outside every step)."""
    if not steps:
        return np.zeros(len(times), dtype=np.int64)
    starts = np.array([s for s, _ in steps])
    ends = np.array([e for _, e in steps])
    idx = np.searchsorted(starts, times, side="right") - 1
    ok = (idx >= 0) & (times < ends[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1)


def build(per_step: np.ndarray, flops: np.ndarray, step_ms: list[float], kernels: dict[str, Counter],
          counts: dict[str, Counter], shapes: bool, model_flops_per_step: float | None, peak: float | None,
          overlap_ms: float | None, split: dict, notes: list[str], gpu: bool = True) -> Breakdown:
    """``per_step``: [steps, buckets] microseconds; ``flops``: [buckets] over all steps."""
    n = max(1, per_step.shape[0])
    mean_step = float(np.mean(step_ms)) if step_ms else float(per_step.sum(axis=1).mean())
    buckets: dict[str, dict[str, Any]] = {}
    for key in KEYS:
        j = _INDEX[key]
        col = per_step[:, j] / 1000.0
        if not col.any():
            continue
        ms = float(col.mean())
        f = float(flops[j]) / n if shapes else None
        tflops = f / (ms / 1000.0) / 1e12 if f and ms > 0 else None
        buckets[key] = {
            "label": LABELS[key] if gpu or key != "idle" else CPU_IDLE_LABEL,
            "ms_per_step": ms, "share": ms / mean_step if mean_step else None,
            "per_step_ms": [float(x) for x in col], "flops_per_step": f or None, "tflops": tflops,
            "peak_fraction": tflops * 1e12 / peak if tflops and peak else None,
            "kernels": [{"name": k, "ms_per_step": t / 1000.0 / n, "count": counts[key][k]}
                        for k, t in kernels.get(key, Counter()).most_common(KERNELS_PER_BUCKET)],
        }
    total_flops = float(flops.sum()) / n if shapes and flops.any() else None
    return Breakdown(steps=per_step.shape[0], step_ms=list(step_ms), buckets=buckets, flops_per_step=total_flops,
                     model_flops_per_step=model_flops_per_step, peak_tflops=peak / 1e12 if peak else None,
                     communication_overlap_ms=overlap_ms, split=split, notes=notes)


# ---------------------------------------------------------------------------------------------------- from a trace
def _union(starts: np.ndarray, ends: np.ndarray) -> float:
    from ftprof.profiling.trace_summary import union_us

    return union_us(starts, ends)


def from_trace(acc, meta: dict, ftmeta: dict, run_config: dict | None, categorize) -> Breakdown:
    """The breakdown of one streamed trace (``acc``: trace_summary's accumulator)."""
    run_config = run_config or {}
    method = run_config.get("method", {}).get("method") or ftmeta.get("method")
    lora_r = run_config.get("method", {}).get("lora_r") or ftmeta.get("lora_r")
    if method == "full":
        lora_r = None
    shapes = bool(acc.op_dims)
    ctx = infer_context(acc.op_dims, lora_r, method)
    ctx.lora_fused = bool(run_config.get("method", {}).get("lora_fused_a", ftmeta.get("lora_fused_a")))
    ops = walk_ops(acc.threads, acc.op_dims, ctx, categorize)
    steps = sorted(acc.step_ranges)
    notes = list(ctx.notes)
    if not steps:
        notes.append("no ProfilerStep ranges in the trace: the whole trace counts as one step")
    if not shapes:
        notes.append("no operator shapes in the trace (record them with --prof-record-shapes): GEMMs are not split "
                     "and FLOPs are not counted")
    gpu = len(acc.k_start) > 0
    opt = sorted(acc.optimizer_ranges)
    if opt and len(ops.ts):  # operators run by the optimizer step (its ranges are annotations, not operators)
        ops.bucket[step_index(ops.ts, opt) >= 0] = _INDEX["optimizer"]
    args = _gpu(acc, ops, steps, shapes, categorize) if gpu else _cpu(ops, steps, categorize)
    per_step, step_ms, kernels, counts, overlap = args
    flops = np.zeros(len(KEYS))
    op_step = step_index(ops.ts, steps)
    inside = op_step >= 0
    np.add.at(flops, ops.bucket[inside].astype(np.int64), ops.flops[inside])
    split = {"lora_r": ctx.lora_r, "vocab": ctx.vocab, "tokens_per_micro_batch": ctx.tokens, "method": method}
    out = build(per_step, flops, step_ms, kernels, counts, shapes, _model_flops(run_config, ftmeta),
                _peak(meta) if gpu else None, overlap, split, notes, gpu)
    out.device = _device_name(meta) if gpu else "cpu"
    return out


def _model_flops(run_config: dict, ftmeta: dict) -> float | None:
    """The run's HFU FLOPs per optimizer step (model + recompute FLOPs per token, times tokens per step)."""
    per_token = ftmeta.get("flops_per_token")
    if not per_token:
        return None
    data = run_config.get("data", {})
    batch = data.get("batch_size") or ftmeta.get("batch_size")
    seq = data.get("seq_len") or ftmeta.get("seq_len")
    accum = run_config.get("train", {}).get("grad_accum") or ftmeta.get("grad_accum") or 1
    if not (batch and seq):
        return None
    return (per_token + (ftmeta.get("recompute_flops_per_token") or 0.0)) * batch * seq * accum


def _device_name(meta: dict) -> str | None:
    props = meta.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        return props[0].get("name")
    return None


def _peak(meta: dict) -> float | None:
    name = _device_name(meta)
    if not name:
        return None
    from ftprof.metrics import peak_flops  # the one peak table (imports torch: only for GPU traces)

    return peak_flops(name)


def _steps_or_all(steps: list, lo: float, hi: float) -> list[tuple[float, float]]:
    return steps or [(lo, hi + 1.0)]


def _cpu(ops: OpTable, steps: list, categorize):
    steps = _steps_or_all(steps, float(ops.ts.min()) if len(ops.ts) else 0.0,
                          float(ops.ts.max()) if len(ops.ts) else 0.0)
    idx = step_index(ops.ts, steps)
    per_step = np.zeros((len(steps), len(KEYS)))
    ok = idx >= 0
    np.add.at(per_step, (idx[ok], ops.bucket[ok].astype(np.int64)), ops.self_us[ok])
    kernels: dict[str, Counter] = {}
    counts: dict[str, Counter] = {}
    for i in np.flatnonzero(ok).tolist():
        key = KEYS[ops.bucket[i]]
        kernels.setdefault(key, Counter())[ops.names[i]] += float(ops.self_us[i])
        counts.setdefault(key, Counter())[ops.names[i]] += 1
    step_ms = [(e - s) / 1000.0 for s, e in steps]
    for s, ms in enumerate(step_ms):
        per_step[s, _INDEX["idle"]] = max(0.0, 1000.0 * ms - per_step[s].sum())
    return per_step, step_ms, kernels, counts, None


def _gpu(acc, ops: OpTable, steps: list, shapes: bool, categorize):
    """Kernels into buckets and steps. Vectorized over kernels (a large trace has millions): the bucket rule runs
    once per distinct (kernel name, kind, operator bucket, phase, in optimizer) combination."""
    k_start = np.frombuffer(acc.k_start, dtype=np.float64)
    k_end = np.frombuffer(acc.k_end, dtype=np.float64)
    k_name = np.frombuffer(acc.k_name, dtype=np.uint32).astype(np.int64)
    op_idx = _lookup(ops.ext, np.frombuffer(acc.k_ext, dtype=np.float64))
    when = launch_times(acc, np.frombuffer(acc.k_corr_all, dtype=np.float64))
    np.copyto(when, k_start, where=np.isnan(when))  # no launch in the trace: the kernel's own start
    steps = _steps_or_all(steps, float(when.min()), float(when.max()))
    step = step_index(when, steps)
    opt = sorted(acc.optimizer_ranges)
    in_opt = (step_index(when, opt) >= 0) if opt else np.zeros(len(when), dtype=bool)
    del when
    # one int64 code per kernel for (name, kind, operator bucket, phase, in optimizer), built in place
    combo = k_name
    combo *= 3
    combo += np.frombuffer(acc.k_kind, dtype=np.int8)
    combo *= len(KEYS) + 1
    has_op = op_idx >= 0
    if len(ops.bucket):
        combo[has_op] += ops.bucket[op_idx[has_op]] + 1
    combo *= 3
    if len(ops.phase):
        combo[has_op] += ops.phase[op_idx[has_op]]
    combo *= 2
    combo += in_opt
    del op_idx, has_op, in_opt
    uniq, inverse = np.unique(combo, return_inverse=True)
    del combo, k_name
    rule = np.empty(len(uniq), dtype=np.int64)
    name_of = uniq // (2 * 3 * (len(KEYS) + 1) * 3)
    for j, c in enumerate(uniq.tolist()):
        c, io = divmod(c, 2)
        c, ph = divmod(c, 3)
        c, ob = divmod(c, len(KEYS) + 1)
        nid, kd = divmod(c, 3)
        rule[j] = _INDEX[kernel_bucket(acc.kernel_names[nid], kd, KEYS[ob - 1] if ob else None, ph, bool(io),
                                       shapes, categorize)]
    bucket = rule[inverse]
    dur = k_end - k_start
    ok = step >= 0
    every = bool(ok.all())  # the usual case: no masked copies
    per_step = np.zeros((len(steps), len(KEYS)))
    np.add.at(per_step, (step, bucket) if every else (step[ok], bucket[ok]), dur if every else dur[ok])
    # time and calls per (bucket, kernel name), through the combinations (few) rather than the kernels (many)
    time_of = np.bincount(inverse if every else inverse[ok], weights=dur if every else dur[ok], minlength=len(uniq))
    calls = np.bincount(inverse if every else inverse[ok], minlength=len(uniq))
    del inverse, dur
    step_ms = _gpu_step_times(per_step, steps, step, k_start, k_end)
    kernels: dict[str, Counter] = {}
    counts: dict[str, Counter] = {}
    for b, nid, t, c in zip(rule.tolist(), name_of.tolist(), time_of.tolist(), calls.tolist(), strict=True):
        if c:
            kernels.setdefault(KEYS[b], Counter())[acc.kernel_names[nid]] += t
            counts.setdefault(KEYS[b], Counter())[acc.kernel_names[nid]] += c
    return per_step, step_ms, kernels, counts, _overlap(ok, bucket, k_start, k_end, len(steps))


def _gpu_step_times(per_step: np.ndarray, steps: list, step: np.ndarray, k_start: np.ndarray,
                    k_end: np.ndarray) -> list[float]:
    """Each step's time (its CPU range, or its kernels' span when the GPU ran later) and GPU idle within it."""
    out = []
    for s, (lo, hi) in enumerate(steps):
        mine = step == s
        if not mine.any():
            out.append((hi - lo) / 1000.0)
            continue
        starts, ends = (k_start, k_end) if mine.all() else (k_start[mine], k_end[mine])
        busy = _union(starts, ends)
        window = max(hi - lo, float(ends.max() - starts.min()))
        per_step[s, _INDEX["idle"]] = max(0.0, window - busy)
        out.append(window / 1000.0)
    return out


def _overlap(ok: np.ndarray, bucket: np.ndarray, k_start: np.ndarray, k_end: np.ndarray, n_steps: int):
    """ms per step of communication that ran while compute kernels ran (|comm| + |rest| - |comm or rest|)."""
    comm = ok & (bucket == _INDEX["communication"])
    if not comm.any():
        return None
    rest = ok & ~comm
    both = _union(k_start[ok], k_end[ok])
    return (_union(k_start[comm], k_end[comm]) + _union(k_start[rest], k_end[rest]) - both) / 1000.0 / n_steps


def _lookup(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Index into ``keys`` of each wanted value (-1 where absent or NaN)."""
    if not len(keys):
        return np.full(len(wanted), -1, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    pos = np.clip(np.searchsorted(sorted_keys, wanted), 0, len(keys) - 1)
    found = sorted_keys[pos] == wanted
    return np.where(found, order[pos], -1)


def launch_times(acc, k_corr: np.ndarray) -> np.ndarray:
    """CPU launch time of each kernel (by correlation id); NaN where the launch is not in the trace."""
    lc = np.frombuffer(acc.launch_corr, dtype=np.float64)
    lt = np.frombuffer(acc.launch_ts, dtype=np.float64)
    idx = _lookup(lc, k_corr)
    return np.where(idx >= 0, lt[np.clip(idx, 0, None)] if len(lt) else np.nan, np.nan)


def columns(breakdown: dict | None) -> dict[str, float | None]:
    """Flat per-bucket figures of a summary's breakdown, for tables (``ftprof report``): ``<key>_ms`` (ms per
    active step) and ``<key>_tflops`` for every bucket, ``step_ms`` and ``flops_ratio``. Empty without buckets."""
    if not breakdown or not breakdown.get("buckets"):
        return {}
    step = breakdown.get("step_ms") or []
    out: dict[str, float | None] = {"step_ms": sum(step) / len(step) if step else None,
                                    "flops_ratio": breakdown.get("flops_ratio")}
    for key in KEYS:
        b = breakdown["buckets"].get(key)
        out[f"{key}_ms"] = b["ms_per_step"] if b else None
        out[f"{key}_tflops"] = b.get("tflops") if b else None
    return out
