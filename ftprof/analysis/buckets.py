"""Fine-tuning buckets: the terms a fine-tuner thinks in, and the rules that put one operator or kernel in one.

Every kernel (on CPU-only traces: every operator's self time) lands in exactly one bucket. What decides it:
- the operator that launched the kernel (kernel ``External id`` -> CPU operator), and that operator's ancestors on
  its thread: inside an autograd node (``autograd::engine::evaluate_function: ...``) is backward work; an operator
  with a ``Sequence number`` inside backward runs with autograd recording, which only checkpointing's recomputation
  does there: the recomputed forward (op_walk finds the phase of each operator);
- for GEMMs, the recorded shapes (record_shapes): a dimension equal to the LoRA rank makes a LoRA GEMM, one equal
  to the vocabulary (from the embedding / log-softmax shapes) the lm_head, a backward GEMM contracting over the
  tokens dimension is a weight gradient, the rest are the base model's forward and input-gradient GEMMs;
- otherwise the operator's (or an ancestor's) name (rules.meaning), then the kernel's name (rules.categorize).
FLOPs come from the shapes of the matmul and attention operators (op_flops), counted as ftprof/metrics.py counts the
run's HFU, so their sum can be checked against it. breakdown.py adds it all up per active step.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from ftprof.analysis import op_flops
from ftprof.analysis.read import HOST_DEVICE_COPY
from ftprof.analysis.rules import categorize
from ftprof.analysis.run_facts import RunFacts

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
INDEX = {k: i for i, k in enumerate(KEYS)}  # bucket key -> its column in per-step arrays
KERNELS_PER_BUCKET = 10  # the kernel-level view (and diff) is bounded

NODE_PREFIX = "autograd::engine::evaluate_function:"
FORWARD, BACKWARD, RECOMPUTE = 0, 1, 2  # an operator's phase (FORWARD also for work outside autograd)


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


def infer_context(op_dims: dict, facts: RunFacts) -> SplitContext:
    """Vocabulary, tokens per micro-batch and (without a run config) the LoRA rank, from the recorded shapes."""
    ctx = SplitContext(lora_r=facts.lora_r, lora_fused=facts.lora_fused_a)
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
    if facts.lora_r is None and facts.method is None and ks:
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


def op_bucket(name: str, dims, phase: int, mean: str | None, is_flop: bool, ctx: SplitContext) -> str:
    """Bucket of one CPU operator (its kernels start from it): ``mean`` is what its own or an ancestor's name says
    (rules.meaning), ``is_flop`` whether it carries FLOPs (op_flops.is_flop_op)."""
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


def kernel_bucket(kname: str, kind: int, op_bucket: str | None, op_phase: int, in_optimizer: bool,
                  shapes: bool) -> str:
    """Bucket of one GPU activity. ``kind``: read.KERNEL, HOST_DEVICE_COPY or OTHER_COPY (other copy or memset)."""
    if kind == HOST_DEVICE_COPY:
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


@dataclass
class Breakdown:
    """Per-step figures of every bucket. Times in ms per active step; FLOPs per active step."""

    steps: int
    step_ms: list[float]  # wall time of each active step
    buckets: dict[str, dict[str, Any]]
    flops_per_step: float | None  # sum over buckets; None without shapes
    hfu_flops_per_step: float | None  # the run's HFU count (model + recompute FLOPs) per step, when known
    peak_tflops: float | None
    communication_overlap_ms: float | None  # of the communication time, how much ran beside compute kernels
    split: dict[str, Any]
    notes: list[str]
    device: str | None = None  # the GPU's name, or "cpu"

    @property
    def flops_ratio(self) -> float | None:
        if self.flops_per_step and self.hfu_flops_per_step:
            return self.flops_per_step / self.hfu_flops_per_step
        return None

    def to_dict(self) -> dict[str, Any]:
        """As summary.json holds it: the fields, and the FLOP ratio."""
        out = asdict(self)
        out["flops_ratio"] = self.flops_ratio
        return out


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
