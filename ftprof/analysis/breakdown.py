"""The fine-tuning breakdown of one streamed trace: every active step's time per bucket (kernels on GPU traces,
operators' self time on CPU-only ones), FLOPs per bucket, and the GPU idle time within each step."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ftprof.analysis.buckets import (
    CPU_IDLE_LABEL,
    INDEX,
    KERNELS_PER_BUCKET,
    KEYS,
    LABELS,
    Breakdown,
    infer_context,
    kernel_bucket,
)
from ftprof.analysis.intervals import lookup, step_index, union_us
from ftprof.analysis.op_walk import OpTable, walk_ops
from ftprof.analysis.read import TraceEvents
from ftprof.analysis.run_facts import RunFacts


def from_trace(events: TraceEvents, facts: RunFacts) -> Breakdown:
    """The breakdown of one streamed trace."""
    shapes = bool(events.op_dims)
    ctx = infer_context(events.op_dims, facts)
    ops = walk_ops(events.threads, events.op_dims, ctx)
    steps = sorted(events.step_ranges)
    notes = list(ctx.notes)
    if not steps:
        notes.append("no ProfilerStep ranges in the trace: the whole trace counts as one step")
    if not shapes:
        notes.append("no operator shapes in the trace (record them with --prof-record-shapes): GEMMs are not split "
                     "and FLOPs are not counted")
    gpu = events.gpu
    opt = sorted(events.optimizer_ranges)
    if opt and len(ops.ts):  # operators run by the optimizer step (its ranges are annotations, not operators)
        ops.bucket[step_index(ops.ts, opt) >= 0] = INDEX["optimizer"]
    timed = _gpu(events, ops, steps, shapes) if gpu else _cpu(ops, steps)
    flops = np.zeros(len(KEYS))
    inside = step_index(ops.ts, steps) >= 0
    np.add.at(flops, ops.bucket[inside].astype(np.int64), ops.flops[inside])
    split = {"lora_r": ctx.lora_r, "vocab": ctx.vocab, "tokens_per_micro_batch": ctx.tokens, "method": facts.method}
    out = build(*timed, flops=flops, shapes=shapes, hfu_flops_per_step=facts.hfu_flops_per_step,
                peak=_peak(facts.device) if gpu else None, split=split, notes=notes, gpu=gpu)
    out.device = facts.device if gpu else "cpu"
    return out


def build(per_step: np.ndarray, step_ms: list[float], kernels: dict[str, Counter], counts: dict[str, Counter],
          overlap_ms: float | None, *, flops: np.ndarray, shapes: bool, hfu_flops_per_step: float | None,
          peak: float | None, split: dict, notes: list[str], gpu: bool = True) -> Breakdown:
    """``per_step``: [steps, buckets] microseconds; ``flops``: [buckets] over all steps; ``kernels``/``counts``:
    per bucket, time and calls of each kernel (operator, on CPU traces)."""
    n = max(1, per_step.shape[0])
    mean_step = float(np.mean(step_ms)) if step_ms else float(per_step.sum(axis=1).mean())
    buckets: dict[str, dict] = {}
    for key in KEYS:
        j = INDEX[key]
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
            "kernels": [{"name": k, "ms_per_step": t / 1000.0 / n, "calls_per_step": counts[key][k] / n}
                        for k, t in kernels.get(key, Counter()).most_common(KERNELS_PER_BUCKET)],
        }
    total_flops = float(flops.sum()) / n if shapes and flops.any() else None
    return Breakdown(steps=per_step.shape[0], step_ms=list(step_ms), buckets=buckets, flops_per_step=total_flops,
                     hfu_flops_per_step=hfu_flops_per_step, peak_tflops=peak / 1e12 if peak else None,
                     communication_overlap_ms=overlap_ms, split=split, notes=notes)


def _peak(device: str | None) -> float | None:
    if not device:
        return None
    from ftprof.metrics import peak_flops  # the one peak table (imports torch: only for GPU traces)

    return peak_flops(device)


def _steps_or_all(steps: list, lo: float, hi: float) -> list[tuple[float, float]]:
    return steps or [(lo, hi + 1.0)]


def _cpu(ops: OpTable, steps: list):
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
        per_step[s, INDEX["idle"]] = max(0.0, 1000.0 * ms - per_step[s].sum())
    return per_step, step_ms, kernels, counts, None


# One int64 code per GPU activity for (kernel name, kind, launching operator's bucket, its phase, in optimizer):
# the bucket rule runs once per distinct code rather than once per kernel (a large trace has millions).
_KINDS, _OP_BUCKETS, _PHASES, _IN_OPT = 3, len(KEYS) + 1, 3, 2  # _OP_BUCKETS: 0 is "no operator"


def _gpu(events: TraceEvents, ops: OpTable, steps: list, shapes: bool):
    """Kernels into buckets and steps, vectorized over kernels."""
    k_start = np.frombuffer(events.k_start, dtype=np.float64)
    k_end = np.frombuffer(events.k_end, dtype=np.float64)
    when = events.launch_times()
    np.copyto(when, k_start, where=np.isnan(when))  # no launch in the trace: the kernel's own start
    steps = _steps_or_all(steps, float(when.min()), float(when.max()))
    step = step_index(when, steps)
    opt = sorted(events.optimizer_ranges)
    in_opt = (step_index(when, opt) >= 0) if opt else np.zeros(len(when), dtype=bool)
    del when
    uniq, inverse = np.unique(_combo_codes(events, ops, in_opt), return_inverse=True)
    del in_opt
    name_of = uniq // (_IN_OPT * _PHASES * _OP_BUCKETS * _KINDS)
    rule = np.array([INDEX[_combo_bucket(events, code, shapes)] for code in uniq.tolist()], dtype=np.int64)
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
            kernels.setdefault(KEYS[b], Counter())[events.kernel_names[nid]] += t
            counts.setdefault(KEYS[b], Counter())[events.kernel_names[nid]] += c
    return per_step, step_ms, kernels, counts, _overlap(ok, bucket, k_start, k_end, len(steps))


def _combo_codes(events: TraceEvents, ops: OpTable, in_opt: np.ndarray) -> np.ndarray:
    """Each GPU activity's combination code, built in place (one int64 array)."""
    op_idx = lookup(ops.ext, np.frombuffer(events.k_ext, dtype=np.float64))
    combo = np.frombuffer(events.k_name, dtype=np.uint32).astype(np.int64)
    combo *= _KINDS
    combo += np.frombuffer(events.k_kind, dtype=np.int8)
    combo *= _OP_BUCKETS
    has_op = op_idx >= 0
    if len(ops.bucket):
        combo[has_op] += ops.bucket[op_idx[has_op]] + 1
    combo *= _PHASES
    if len(ops.phase):
        combo[has_op] += ops.phase[op_idx[has_op]]
    combo *= _IN_OPT
    combo += in_opt
    return combo


def _combo_bucket(events: TraceEvents, code: int, shapes: bool) -> str:
    """The bucket of every GPU activity with this combination code."""
    code, in_opt = divmod(code, _IN_OPT)
    code, phase = divmod(code, _PHASES)
    code, op_bucket = divmod(code, _OP_BUCKETS)
    name_id, kind = divmod(code, _KINDS)
    return kernel_bucket(events.kernel_names[name_id], kind, KEYS[op_bucket - 1] if op_bucket else None, phase,
                         bool(in_opt), shapes)


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
        busy = union_us(starts, ends)
        window = max(hi - lo, float(ends.max() - starts.min()))
        per_step[s, INDEX["idle"]] = max(0.0, window - busy)
        out.append(window / 1000.0)
    return out


def _overlap(ok: np.ndarray, bucket: np.ndarray, k_start: np.ndarray, k_end: np.ndarray, n_steps: int):
    """ms per step of communication that ran while compute kernels ran (|comm| + |rest| - |comm or rest|)."""
    comm = ok & (bucket == INDEX["communication"])
    if not comm.any():
        return None
    rest = ok & ~comm
    both = union_us(k_start[ok], k_end[ok])
    return (union_us(k_start[comm], k_end[comm]) + union_us(k_start[rest], k_end[rest]) - both) / 1000.0 / n_steps
