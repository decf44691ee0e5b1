"""A/B: what changed between two profiles, bucket by bucket, and which buckets explain the difference.

A pure function over summaries (``TraceSummary.to_dict()``, i.e. what summary.json holds), so the CLI and the
report call the same thing. Each side may be one summary or several (repeats, or cycles): their active steps are
pooled. The difference of mean step time per bucket gets a 95% confidence interval over those steps (Welch).

Two sides of one shape compare per step (ms/step). When their tokens per step differ (another batch size, sequence
length or gradient accumulation) a step is not the same work: they compare per token (µs/token), and say so. A
bucket that only one side has "appeared" or "vanished": no interval is given for it (its samples on the other side
are not measurements, only absence).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import fmean, variance
from typing import Any

from ftprof.analysis.buckets import KERNELS_PER_BUCKET, KEYS
from ftprof.analysis.diff_sides import Side, side_of

# Two-sided 95% quantiles of Student's t, by degrees of freedom (1..30); beyond 30, the normal's 1.96 is close enough.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
EXPLAIN_SHARE = 0.8  # the explanation names buckets until they cover this much of the difference
EXPLAIN_MAX = 4
STEADY = 0.01  # without an interval, a step-time change below 1% counts as none


def t975(df: float) -> float:
    if df >= len(_T975):
        return 1.96
    return _T975[max(0, int(math.floor(df)) - 1)]  # rounding df down: the wider (conservative) interval


def welch_ci(a: list[float], b: list[float]) -> float | None:
    """Half-width of the 95% confidence interval of mean(b) - mean(a); None with fewer than two samples a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = variance(a) / len(a), variance(b) / len(b)
    se2 = va + vb
    if se2 == 0:
        return 0.0
    df = se2 ** 2 / ((va ** 2 / (len(a) - 1) if va else 0.0) + (vb ** 2 / (len(b) - 1) if vb else 0.0))
    return t975(df) * math.sqrt(se2)


@dataclass
class BucketDiff:
    key: str
    label: str
    a_ms: float  # mean ms per active step
    b_ms: float
    delta_ms: float
    ci_ms: float | None  # half-width of the 95% interval of delta_ms; None for a bucket only one side has
    change: str = ""  # "appeared" (only in B), "vanished" (only in A), "" (in both)


@dataclass
class KernelChange:
    bucket: str
    name: str
    a_ms: float | None  # None: not among A's listed kernels of that bucket
    b_ms: float | None
    delta_ms: float
    change: str  # "appeared", "disappeared", "changed"; "entered top" / "left top" when the other side's list was full


@dataclass
class SummaryDiff:
    """Every *_ms figure is in ``unit``: ms per step, or µs per token when the sides' tokens per step differ."""

    a_step_ms: float
    b_step_ms: float
    delta_ms: float
    ci_ms: float | None
    a_steps: int
    b_steps: int
    buckets: list[BucketDiff]
    explanation: str
    kernels: list[KernelChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unit: str = "ms/step"
    a_side: dict[str, Any] = field(default_factory=dict)  # Side.to_dict(): name, method, shape, tokens per step
    b_side: dict[str, Any] = field(default_factory=dict)

    @property
    def per_token(self) -> bool:
        return self.unit != "ms/step"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sides(side: dict | list[dict]) -> list[dict]:
    summaries = side if isinstance(side, list) else [side]
    out = [s["breakdown"] for s in summaries if s.get("breakdown")]
    if not out:
        raise ValueError("a summary without fine-tuning buckets (summarized before they existed?)")
    return out


def _pooled(breakdowns: list[dict], key: str, scale: float) -> list[float]:
    """One bucket in every active step of every summary, times ``scale`` (0 in steps of a summary that lacks it)."""
    values: list[float] = []
    for bd in breakdowns:
        b = bd["buckets"].get(key)
        values.extend([scale * ms for ms in b["per_step_ms"]] if b else [0.0] * bd["steps"])
    return values


def _scales(a: Side, b: Side) -> tuple[float, float, str]:
    """(A's factor, B's factor, unit): 1 and ms/step for one shape; 1000 / tokens per step (ms/step -> µs/token)
    when the sides' tokens per step differ."""
    ta, tb = a.tokens_per_step, b.tokens_per_step
    if ta and tb and ta != tb:
        return 1000.0 / ta, 1000.0 / tb, "µs/token"
    return 1.0, 1.0, "ms/step"


def _bucket_rows(bda: list[dict], bdb: list[dict], sa: float, sb: float) -> list[BucketDiff]:
    rows = []
    for key in KEYS:
        in_a, in_b = any(key in bd["buckets"] for bd in bda), any(key in bd["buckets"] for bd in bdb)
        if not (in_a or in_b):
            continue
        pa, pb = _pooled(bda, key, sa), _pooled(bdb, key, sb)
        label = next(bd["buckets"][key]["label"] for bd in bda + bdb if key in bd["buckets"])
        change = "" if in_a and in_b else "appeared" if in_b else "vanished"
        rows.append(BucketDiff(key, label, fmean(pa), fmean(pb), fmean(pb) - fmean(pa),
                               welch_ci(pa, pb) if not change else None, change))
    return rows


def diff_summaries(a: dict | list[dict], b: dict | list[dict], top_kernels: int = 10,
                   sides: tuple[Side, Side] | None = None) -> SummaryDiff:
    """B against A (A is the baseline): per-bucket time per step (per token when the shapes differ), the difference
    with its 95% interval, the buckets that explain it, and the kernels that appeared, disappeared or changed most
    (at most ``top_kernels``). ``sides``: who A and B are (default: from each side's first summary, named A, B)."""
    bda, bdb = _sides(a), _sides(b)
    if sides is None:
        sides = (side_of(_first(a), "A"), side_of(_first(b), "B"))
    sa, sb, unit = _scales(*sides)
    steps_a = [sa * ms for bd in bda for ms in bd["step_ms"]]
    steps_b = [sb * ms for bd in bdb for ms in bd["step_ms"]]
    delta = fmean(steps_b) - fmean(steps_a)
    out = SummaryDiff(a_step_ms=fmean(steps_a), b_step_ms=fmean(steps_b), delta_ms=delta,
                      ci_ms=welch_ci(steps_a, steps_b), a_steps=len(steps_a), b_steps=len(steps_b),
                      buckets=_bucket_rows(bda, bdb, sa, sb), explanation="",
                      kernels=kernel_changes(bda, bdb, top_kernels, sa, sb), unit=unit,
                      a_side=sides[0].to_dict(), b_side=sides[1].to_dict())
    out.explanation = explain(out)
    if out.per_token:
        out.notes.append(f"the shapes differ ({sides[0].shape} against {sides[1].shape}): compared per token, "
                         "not per step")
    if out.ci_ms is None:
        out.notes.append("one active step on a side: no confidence interval (profile more steps, or repeat)")
    if {bd.get("device") for bd in bda} != {bd.get("device") for bd in bdb}:
        out.notes.append("the two profiles were recorded on different kinds of device")
    return out


def _first(side: dict | list[dict]) -> dict:
    return side[0] if isinstance(side, list) else side


def explain(d: SummaryDiff) -> str:
    """'+41.0 ms/step (+12%): other elementwise +35.0, 4-bit dequantization +6.0' (the step difference, then the
    buckets moving the same way, largest first, until they cover most of it)."""
    sign = 1.0 if d.delta_ms >= 0 else -1.0
    pct = f" ({100 * d.delta_ms / d.a_step_ms:+.0f}%)" if d.a_step_ms else ""
    head = f"{d.delta_ms:+,.1f} {d.unit}{pct}"
    if d.ci_ms is not None and abs(d.delta_ms) <= d.ci_ms:
        head += f", within noise (95% CI ±{d.ci_ms:,.1f})"
    if d.ci_ms is None and abs(d.delta_ms) < STEADY * d.a_step_ms:
        # the step did not move (a CPU-bound step absorbs GPU work into idle): say what moved inside it
        movers = sorted(d.buckets, key=lambda r: -abs(r.delta_ms))[:2]
        return f"{head}, step time unchanged; inside it: " + ", ".join(_mover(r) for r in movers)
    movers = sorted((r for r in d.buckets if r.delta_ms * sign > 0), key=lambda r: -abs(r.delta_ms))
    named, covered = [], 0.0
    for r in movers[:EXPLAIN_MAX]:
        named.append(_mover(r))
        covered += abs(r.delta_ms)
        if covered >= EXPLAIN_SHARE * abs(d.delta_ms):
            break
    return head + (": " + ", ".join(named) if named else "")


def _mover(r: BucketDiff) -> str:
    return f"{r.label} {r.delta_ms:+,.1f}" + (f" ({r.change})" if r.change else "")


def kernel_changes(bda: list[dict], bdb: list[dict], limit: int, sa: float = 1.0,
                   sb: float = 1.0) -> list[KernelChange]:
    """Kernels, within each bucket, that appeared, disappeared or changed most (ms per step, mean over sides).

    Summaries list each bucket's top kernels only: a kernel missing from a full list may sit below it. It is called
    new (or gone) only when the other side's list was not full; otherwise it "entered" (or "left") the top, and is
    shown only if its time beats that list's smallest. ``sa``, ``sb``: each side's factor to the compared unit."""
    changes: list[KernelChange] = []
    for key in KEYS:
        ka, fa = _kernels(bda, key, sa)
        kb, fb = _kernels(bdb, key, sb)
        floor_a = min(ka.values()) if fa and ka else 0.0
        floor_b = min(kb.values()) if fb and kb else 0.0
        for name in ka.keys() | kb.keys():
            ta, tb = ka.get(name), kb.get(name)
            if ta is None and (tb or 0.0) <= floor_a:
                continue  # may have been just below A's list
            if tb is None and (ta or 0.0) <= floor_b:
                continue
            if ta is None:
                change = "entered top" if fa else "appeared"
            elif tb is None:
                change = "left top" if fb else "disappeared"
            else:
                change = "changed"
            changes.append(KernelChange(key, name, ta, tb, (tb or 0.0) - (ta or 0.0), change))
    changes.sort(key=lambda c: -abs(c.delta_ms))
    return changes[:limit]


def _kernels(breakdowns: list[dict], key: str, scale: float = 1.0) -> tuple[dict[str, float], bool]:
    """Mean ms per step of each listed kernel of one bucket over a side's summaries, and whether any list was full."""
    total: dict[str, float] = {}
    steps = sum(bd["steps"] for bd in breakdowns) or 1
    full = False
    for bd in breakdowns:
        kernels = bd["buckets"].get(key, {}).get("kernels", [])
        full = full or len(kernels) >= KERNELS_PER_BUCKET
        for k in kernels:
            total[k["name"]] = total.get(k["name"], 0.0) + k["ms_per_step"] * bd["steps"]
    return {n: scale * t / steps for n, t in total.items()}, full
