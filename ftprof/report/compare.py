"""Compare a results set against a baseline with a noise model: one verdict per configuration.

Throughput decides, as a distribution: each side's repeats (tokens/s of each run) when both sides have at least two,
else the steady steps of steps.csv (tokens/s of each step). Welch's t-test (scipy.stats) gives the p-value and the
95% confidence interval of the difference. A configuration is

- a ``regression`` when the whole 95% interval of the tokens/s change lies beyond the threshold (slower by more
  than it, with that confidence), or when its peak memory grew by more than the threshold (a peak is not noisy), or
  when it stopped succeeding;
- ``ok`` when the whole interval lies above minus the threshold (no slowdown that large fits the data);
- ``inconclusive`` when the interval straddles minus the threshold: the data cannot tell a regression of that size
  from noise, and the verdict says how many samples would.

The figures shown are each side's headline tokens/s (result.json, the mean over repeats), the same numbers as the
report's table; the interval comes from the samples.

Step-time p50/p90 and MFU are the same slowdown seen again: they are shown beside the verdict, never counted apart.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ftprof.report import environment, profiles
from ftprof.report.tables import config_columns, config_key, effective_frame
from ftprof.results.run_dir import STEPS
from ftprof.results.status import Status

ALPHA = 0.05
# Shown beside the verdict: (column, words, better direction).
CONTEXT = (("step_time_p50_s", "step p50", "lower"), ("step_time_p90_s", "step p90", "lower"),
           ("mfu", "MFU", "higher"))
# Peak memory, the first present on both sides (most faithful first).
MEMORY = ("nvml_process_used_peak", "torch_peak_reserved", "torch_peak_allocated", "host_peak_rss")
REGRESSION, INCONCLUSIVE, OK = "regression", "inconclusive", "ok"


@dataclass
class ThroughputTest:
    samples: str  # "repeats" or "steady steps"
    n_baseline: int
    n_current: int
    baseline: float  # means of the samples
    current: float
    change_pct: float
    halfwidth_pct: float | None  # 95% CI half-width of the difference, in percent of the baseline; None: no spread
    p_value: float | None
    needed: int | None = None  # samples per side that would bring the half-width under the threshold


@dataclass
class ConfigComparison:
    experiment: str
    verdict: str  # regression | inconclusive | ok
    reasons: list[str] = field(default_factory=list)  # why it is a regression / inconclusive
    throughput: ThroughputTest | None = None
    context: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # words -> (base, cur, change %)
    cause: str | None = None  # when both sides were profiled: the buckets that explain the change
    environment: list[str] = field(default_factory=list)  # what differed between the machines ("torch threads 64 → 2")


@dataclass
class Comparison:
    configs: list[ConfigComparison]
    unmatched_current: list[str]
    unmatched_baseline: list[str]
    differences: list[str] = field(default_factory=list)  # when nothing matched: the options that differ

    @property
    def nothing_compared(self) -> bool:
        """No configuration matched one of the baseline: the gate has nothing to pass."""
        return not self.configs

    @property
    def regressions(self) -> list[ConfigComparison]:
        return [c for c in self.configs if c.verdict == REGRESSION]

    @property
    def inconclusive(self) -> list[ConfigComparison]:
        return [c for c in self.configs if c.verdict == INCONCLUSIVE]

    @property
    def failed(self) -> bool:
        return bool(self.regressions) or self.nothing_compared


def _label(row) -> str:
    return f"{row.get('method')} {row.get('model')} b{row.get('batch_size')} s{row.get('seq_len')}" + (
        f" x{row.get('world_size')}" if str(row.get("world_size")) not in ("1", "None", "nan") else "")


def _num(value) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def step_throughputs(run_dir: str | Path) -> list[float]:
    """Tokens/s of each steady step of a run (warm-up and profiled steps left out, as the headline figures do)."""
    try:
        with open(Path(run_dir) / STEPS, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError:
        return []
    steady = [r for r in rows if r.get("warmup") == "False"]
    unprofiled = [r for r in steady if r.get("profiler_phase", "") in ("", "wait")]
    out = []
    for r in unprofiled or steady:
        secs, tokens = _num(r.get("step_time_s")), _num(r.get("tokens"))
        if secs and tokens:
            out.append(tokens / secs)
    return out


def _samples(base: pd.DataFrame, cur: pd.DataFrame) -> tuple[str, list[float], list[float]]:
    """Both sides' throughput samples, of one kind: repeats when both have two or more, else steady steps."""
    def runs(df):
        return [v for v in (_num(x) for x in df["tokens_per_s"]) if v is not None]

    if len(runs(base)) >= 2 and len(runs(cur)) >= 2:
        return "repeats", runs(base), runs(cur)
    steps_b = [t for d in base["run_dir"] for t in step_throughputs(d)]
    steps_c = [t for d in cur["run_dir"] for t in step_throughputs(d)]
    if len(steps_b) >= 2 and len(steps_c) >= 2:
        return "steady steps", steps_b, steps_c
    return "single values", runs(base), runs(cur)


def welch(base: list[float], cur: list[float], kind: str, threshold_pct: float) -> ThroughputTest | None:
    """Welch's t-test on tokens/s and the 95% CI half-width of the difference, both relative to the baseline."""
    if not base or not cur:
        return None
    mb, mc = sum(base) / len(base), sum(cur) / len(cur)
    if mb == 0:
        return None
    change = 100.0 * (mc - mb) / mb
    if len(base) < 2 or len(cur) < 2:
        return ThroughputTest(kind, len(base), len(cur), mb, mc, change, None, None)
    from scipy import stats  # a report dependency, loaded only when comparing

    vb, vc = (pd.Series(x).var(ddof=1) / len(x) for x in (base, cur))
    se = math.sqrt(vb + vc)
    if se == 0:  # identical samples: no spread, no doubt
        return ThroughputTest(kind, len(base), len(cur), mb, mc, change, 0.0, 1.0 if mc == mb else 0.0)
    dof = (vb + vc) ** 2 / (vb ** 2 / (len(base) - 1) + vc ** 2 / (len(cur) - 1))
    halfwidth = 100.0 * stats.t.ppf(1 - ALPHA / 2, dof) * se / mb
    p = float(stats.ttest_ind(cur, base, equal_var=False).pvalue)
    test = ThroughputTest(kind, len(base), len(cur), mb, mc, change, halfwidth, p)
    if threshold_pct > 0 and halfwidth > threshold_pct:
        # The half-width shrinks as 1/sqrt(n): the samples per side that would bring it under the threshold.
        test.needed = math.ceil(max(len(base), len(cur)) * (halfwidth / threshold_pct) ** 2)
    return test


def _verdict(test: ThroughputTest | None, threshold_pct: float) -> tuple[str, list[str]]:
    if test is None:
        return OK, []
    worse = -test.change_pct
    if test.halfwidth_pct is None:  # one value a side and no steps.csv: no spread to judge by
        if worse > threshold_pct:
            return REGRESSION, [f"tokens/s {test.change_pct:+.1f}% (single values, spread unknown)"]
        return OK, []
    best, worst = worse - test.halfwidth_pct, worse + test.halfwidth_pct  # the slowdown's 95% interval
    if best > threshold_pct:
        return REGRESSION, [f"tokens/s {test.change_pct:+.1f}% ± {test.halfwidth_pct:.1f}% "
                            f"(p = {test.p_value:.2g}, {test.samples})"]
    if worst <= threshold_pct:
        return OK, []
    unit = "repeats" if test.samples == "repeats" else "steady steps"
    needed = f"; about {test.needed} {unit} per side would settle it" if test.needed else ""
    return INCONCLUSIVE, [f"tokens/s {test.change_pct:+.1f}% ± {test.halfwidth_pct:.1f}%: the interval reaches "
                          f"both sides of -{threshold_pct:g}%{needed}"]


def _memory(b, c) -> tuple[str, float, float, float] | None:
    for col in MEMORY:
        bv, cv = _num(b.get(col)), _num(c.get(col))
        if bv and cv is not None:
            return col, bv, cv, 100.0 * (cv - bv) / bv
    return None


def _first_ok(df: pd.DataFrame):
    ok = df[df["status"] == Status.OK.value]
    return (ok if len(ok) else df).iloc[0], ok


def _means(ok: pd.DataFrame, col: str) -> float | None:
    values = [v for v in (_num(x) for x in ok.get(col, [])) if v is not None]
    return sum(values) / len(values) if values else None


def compare_config(base: pd.DataFrame, cur: pd.DataFrame, threshold_pct: float) -> ConfigComparison:
    b_first, b_ok = _first_ok(base)
    c_first, c_ok = _first_ok(cur)
    label = _label(c_first)
    if len(b_ok) and not len(c_ok):
        statuses = ",".join(sorted(set(cur["status"].map(str))))
        return ConfigComparison(label, REGRESSION, [f"status ok -> {statuses}"])
    if not len(b_ok) or not len(c_ok):
        return ConfigComparison(label, OK, ["no successful baseline run to compare with"])
    kind, bs, cs = _samples(b_ok, c_ok)
    test = welch(bs, cs, kind, threshold_pct)
    headline = _means(b_ok, "tokens_per_s"), _means(c_ok, "tokens_per_s")
    if test is not None and kind != "repeats" and all(headline):
        # Steps' own rates average differently from total tokens over total time: show (and judge) the headline
        # change, with the steps' spread around it.
        test.baseline, test.current = headline
        test.change_pct = 100.0 * (test.current - test.baseline) / test.baseline
    verdict, reasons = _verdict(test, threshold_pct)
    out = ConfigComparison(label, verdict, reasons, test)
    for col, words, _ in CONTEXT:
        bv, cv = _means(b_ok, col), _means(c_ok, col)
        if bv and cv is not None:
            out.context[words] = (bv, cv, 100.0 * (cv - bv) / bv)
    peaks = {col: (max(_num(x) or 0 for x in b_ok[col]), max(_num(x) or 0 for x in c_ok[col]))
             for col in MEMORY if col in b_ok and col in c_ok}
    mem = _memory({k: v[0] for k, v in peaks.items()}, {k: v[1] for k, v in peaks.items()})
    if mem is not None:
        col, bv, cv, pct = mem
        out.context[f"peak memory ({col})"] = (bv, cv, pct)
        if pct > threshold_pct:
            out.verdict = REGRESSION
            out.reasons.append(f"{col} {pct:+.1f}%")
    return out


def compare(current: pd.DataFrame, baseline: pd.DataFrame, threshold_pct: float) -> Comparison:
    cur, base = current.copy(), baseline.copy()
    cur["_key"], base["_key"] = config_key(cur), config_key(base)
    cur_groups, base_groups = dict(tuple(cur.groupby("_key"))), dict(tuple(base.groupby("_key")))
    configs = [compare_config(base_groups[k], cur_groups[k], threshold_pct) for k in cur_groups if k in base_groups]
    for key, c in zip([k for k in cur_groups if k in base_groups], configs, strict=True):
        base_dirs, cur_dirs = list(base_groups[key]["run_dir"]), list(cur_groups[key]["run_dir"])
        c.environment = environment.group_differences(base_dirs, cur_dirs)
        if c.verdict != OK:  # only where the verdict needs a why: profiles are read for those configurations alone
            c.cause = profiles.cause(base_dirs, cur_dirs)
            if c.environment:  # the machine changed too: said beside the verdict, as a possible cause
                c.reasons.append(f"environment differs: {', '.join(c.environment)}")
    return Comparison(configs, [_label(g.iloc[0]) for k, g in cur_groups.items() if k not in base_groups],
                      [_label(g.iloc[0]) for k, g in base_groups.items() if k not in cur_groups],
                      [] if configs else key_differences(cur, base))


def key_differences(current: pd.DataFrame, baseline: pd.DataFrame, limit: int = 3) -> list[str]:
    """Why no configuration matched: the options with no value in common between the two sides (else those whose
    values differ at all), as "seq_len 1024 here, 2048 in the baseline"."""
    def shown(values: set[str]) -> str:
        return ", ".join(sorted(values)[:limit]) + (", ..." if len(values) > limit else "")

    cur, base = effective_frame(current), effective_frame(baseline)
    found: list[tuple[bool, str]] = []
    for col in dict.fromkeys(config_columns(cur) + config_columns(base) + ["world_size"]):
        here, there = ({str(v) for v in df[col]} if col in df else {"None"} for df in (cur, base))
        if here != there:
            found.append((not here & there, f"{col} {shown(here)} here, {shown(there)} in the baseline"))
    disjoint = [text for apart, text in found if apart]
    return (disjoint or [text for _, text in found])[:limit]


def _fmt_test(t: ThroughputTest | None) -> str:
    if t is None:
        return "-"
    spread = "" if t.halfwidth_pct is None else f" ± {t.halfwidth_pct:.1f}%"
    return f"{t.baseline:,.1f} → {t.current:,.1f} ({t.change_pct:+.1f}%{spread})"


def to_markdown(cmp: Comparison, threshold_pct: float) -> str:
    lines = ["## Comparison with the baseline", "",
             f"One verdict per configuration. Regression: the 95% confidence interval of the tokens/s change "
             f"(Welch's t-test) lies wholly beyond -{threshold_pct:g}%, peak memory up by more than "
             f"{threshold_pct:g}%, or a run that stopped succeeding. Ok: the interval lies wholly above "
             f"-{threshold_pct:g}%. Inconclusive: it reaches both sides, so a regression that size cannot be told "
             "from noise. Samples: each side's repeats when both have two or more, else the steady steps of "
             "steps.csv; tokens/s is each side's headline figure.", "",
             "| experiment | verdict | tokens/s (baseline → current, ± 95% CI) | samples | p | step p50 | peak memory "
             "| why |", "| --- | --- | ---: | --- | ---: | ---: | ---: | --- |"]
    for c in cmp.configs:
        t = c.throughput
        verdict = f"**{c.verdict}**" if c.verdict == REGRESSION else c.verdict
        samples = "-" if t is None else f"{t.samples} ({t.n_baseline} / {t.n_current})"
        p = "-" if t is None or t.p_value is None else f"{t.p_value:.2g}"
        p50 = c.context.get("step p50")
        mem = next((v for k, v in c.context.items() if k.startswith("peak memory")), None)
        lines.append(f"| {c.experiment} | {verdict} | {_fmt_test(t)} | {samples} | {p} | "
                     f"{'-' if p50 is None else f'{p50[2]:+.1f}%'} | {'-' if mem is None else f'{mem[2]:+.1f}%'} | "
                     f"{'; '.join(c.reasons + ([f'profile: {c.cause}'] if c.cause else []))} |")
    if cmp.nothing_compared:
        lines += ["", "**No configuration matched the baseline**, so nothing was compared"
                  + (f" ({'; '.join(cmp.differences)})." if cmp.differences else ".")]
    envs = sorted({d for c in cmp.configs for d in c.environment})
    if envs:
        lines += ["", "The environments differ (env.json), which can explain a change as well as the code: "
                  + "; ".join(envs) + "."]
    if cmp.unmatched_current:
        lines += ["", "New (no baseline): " + "; ".join(cmp.unmatched_current)]
    if cmp.unmatched_baseline:
        lines += ["", "Missing (only in the baseline): " + "; ".join(cmp.unmatched_baseline)]
    return "\n".join(lines) + "\n"
