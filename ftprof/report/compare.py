"""Compare a results set against a baseline with a noise model: one verdict per configuration.

Throughput decides, as a distribution: each side's repeats (tokens/s of each run) when both sides have at least two,
else the steady steps of steps.csv (tokens/s of each step). Welch's t-test (scipy.stats) gives the p-value and the
95% confidence interval of the difference. A configuration is

- a ``regression`` when the whole 95% interval of the tokens/s change lies beyond the threshold (slower by more
  than it, with that confidence), or when its peak memory grew by more than the threshold (a peak is not noisy), or
  when it stopped succeeding;
- ``ok`` when the whole interval lies above minus the threshold (no slowdown that large fits the data);
- ``inconclusive`` when the interval straddles minus the threshold: the data cannot tell a regression of that size
  from noise, and the verdict says how many samples would; also when there is no interval at all (one value a side
  and no usable steady steps: steps.csv missing, unreadable, empty or too short) or no tokens/s on a side;
- ``not compared`` when a side has no successful run (a configuration that stopped succeeding is a regression).

A configuration without the data to compare (``not compared``, or inconclusive for want of samples) was not checked:
when no configuration was, the gate fails (``nothing_compared``), as it does when none matched at all.

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
REGRESSION, INCONCLUSIVE, OK, NOT_COMPARED = "regression", "inconclusive", "ok", "not compared"


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
    verdict: str  # regression | inconclusive | ok | not compared
    reasons: list[str] = field(default_factory=list)  # why it is a regression / inconclusive
    throughput: ThroughputTest | None = None
    context: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # words -> (base, cur, change %)
    cause: str | None = None  # when both sides were profiled: the buckets that explain the change
    environment: list[str] = field(default_factory=list)  # what differed between the machines ("torch threads 64 → 2")
    checked: bool = True  # False: the data to compare was missing (no successful run, no throughput samples)


@dataclass
class Comparison:
    configs: list[ConfigComparison]
    unmatched_current: list[str]
    unmatched_baseline: list[str]
    differences: list[str] = field(default_factory=list)  # when nothing matched: the options that differ

    @property
    def nothing_compared(self) -> bool:
        """No configuration matched one of the baseline, or none that matched had the data to compare: the gate
        has nothing to pass."""
        return not self.checked

    @property
    def checked(self) -> list[ConfigComparison]:
        return [c for c in self.configs if c.checked]

    @property
    def unchecked(self) -> list[ConfigComparison]:
        """Matched, but without the data to compare: no successful run on a side, or no throughput samples."""
        return [c for c in self.configs if not c.checked]

    def why_nothing(self) -> str:
        """One line: why nothing was compared (with ``nothing_compared``)."""
        if not self.configs:
            return "no configuration matches one of the baseline" + (
                f" ({'; '.join(self.differences)})" if self.differences else "")
        why = list(dict.fromkeys(c.reasons[0] for c in self.configs if c.reasons))
        more = f"; {len(why) - 2} more" if len(why) > 2 else ""
        n = len(self.configs)
        return (f"{n} configuration{'s' if n > 1 else ''} matched, none with the data to compare: "
                + "; ".join(why[:2]) + more)

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


def step_samples(run_dir: str | Path) -> tuple[list[float], str | None]:
    """Tokens/s of each steady step of a run (warm-up and profiled steps left out, as the headline figures do), and
    why there are fewer than two: steps.csv missing, unreadable, empty, cut short or with too few steady steps."""
    try:
        with open(Path(run_dir) / STEPS, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except FileNotFoundError:
        return [], f"no {STEPS}"
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        return [], f"{STEPS} unreadable ({getattr(exc, 'strerror', None) or exc})"
    if not rows:
        return [], f"{STEPS} empty"
    whole = [r for r in rows if None not in r and None not in r.values()]  # a row cut short: a truncated file
    steady = [r for r in whole if r.get("warmup") == "False"]
    unprofiled = [r for r in steady if r.get("profiler_phase", "") in ("", "wait")]
    out = []
    for r in unprofiled or steady:
        secs, tokens = _num(r.get("step_time_s")), _num(r.get("tokens"))
        if secs and tokens:
            out.append(tokens / secs)
    if len(out) >= 2:
        return out, None
    found = f"{len(out) or 'no'} timed steady step{'' if len(out) == 1 else 's'}"
    return out, f"{STEPS} cut short, {found}" if len(whole) < len(rows) else f"{STEPS} has {found}"


def step_throughputs(run_dir: str | Path) -> list[float]:
    """Tokens/s of each steady step of a run (``step_samples`` without the why)."""
    return step_samples(run_dir)[0]


def _samples(base: pd.DataFrame, cur: pd.DataFrame) -> tuple[str, list[float], list[float], list[str]]:
    """Both sides' throughput samples, of one kind: repeats when both have two or more, else steady steps; when
    neither gives two a side, single values, and why each short side's steps.csv gave too few."""
    def runs(df):
        return [v for v in (_num(x) for x in df["tokens_per_s"]) if v is not None]

    if len(runs(base)) >= 2 and len(runs(cur)) >= 2:
        return "repeats", runs(base), runs(cur), []
    read = {side: [(Path(d).name, *step_samples(d)) for d in df["run_dir"]]
            for side, df in (("baseline", base), ("current", cur))}
    steps = {side: [t for _, values, _ in runs_read for t in values] for side, runs_read in read.items()}
    if len(steps["baseline"]) >= 2 and len(steps["current"]) >= 2:
        return "steady steps", steps["baseline"], steps["current"], []
    why = [f"{side} {name}: {problem}" for side, runs_read in read.items() if len(steps[side]) < 2
           for name, _, problem in runs_read if problem]
    return "single values", runs(base), runs(cur), why


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


def _verdict(test: ThroughputTest | None, threshold_pct: float, why: list[str]) -> tuple[str, list[str]]:
    """The throughput verdict and its reasons; ``why``: what the samples lacked (steps.csv unusable, no tokens/s)."""
    data = f" ({'; '.join(why)})" if why else ""
    if test is None:  # no tokens/s on a side: nothing to judge by
        return INCONCLUSIVE, [f"nothing to compare: no tokens/s{data}"]
    worse = -test.change_pct
    if test.halfwidth_pct is None:  # one value a side and no usable steps.csv: no spread to judge by
        if worse > threshold_pct:  # a slowdown that large is flagged all the same (the gate errs on failing)
            return REGRESSION, [f"tokens/s {test.change_pct:+.1f}% (single values, spread unknown{data})"]
        return INCONCLUSIVE, [f"tokens/s {test.change_pct:+.1f}% from one value a side, no spread to judge by{data}"]
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
    if not len(b_ok) or not len(c_ok):  # nothing measured to compare: not checked, whatever the current side did
        statuses = [f"{side} {','.join(sorted(set(df['status'].map(str))))}" for side, df in
                    (("baseline", base), ("current", cur))]
        what = "on either side" if not len(c_ok) else "in the baseline"
        return ConfigComparison(label, NOT_COMPARED, [f"no successful run {what} ({', '.join(statuses)})"],
                                checked=False)
    kind, bs, cs, why = _samples(b_ok, c_ok)
    test = welch(bs, cs, kind, threshold_pct)
    headline = _means(b_ok, "tokens_per_s"), _means(c_ok, "tokens_per_s")
    if test is not None and kind != "repeats" and all(headline):
        # Steps' own rates average differently from total tokens over total time: show (and judge) the headline
        # change, with the steps' spread around it.
        test.baseline, test.current = headline
        test.change_pct = 100.0 * (test.current - test.baseline) / test.baseline
    missing = [f"none in the {side}'s result.json" for side, v in (("baseline", bs), ("current", cs)) if not v]
    verdict, reasons = _verdict(test, threshold_pct, missing + why)
    # no interval: only a slowdown past the threshold says anything
    out = ConfigComparison(label, verdict, reasons, test,
                           checked=test is not None and (test.halfwidth_pct is not None or verdict == REGRESSION))
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
            out.verdict, out.checked = REGRESSION, True
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
        if c.verdict in (REGRESSION, INCONCLUSIVE):  # where the verdict needs a why: profiles read for those alone
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
             "from noise, or there is no interval (one value a side, steps.csv missing, unreadable, empty or too "
             "short) or no tokens/s. Not compared: no successful run on a side. Samples: each side's repeats when "
             "both have two or more, else the steady steps of steps.csv; tokens/s is each side's headline "
             "figure.", "",
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
    if cmp.nothing_compared and not cmp.configs:
        lines += ["", "**No configuration matched the baseline**, so nothing was compared"
                  + (f" ({'; '.join(cmp.differences)})." if cmp.differences else ".")]
    elif cmp.nothing_compared:
        lines += ["", f"**Nothing was compared**: {cmp.why_nothing()}. The gate fails: it checked nothing."]
    elif cmp.unchecked:
        lines += ["", f"{len(cmp.unchecked)} of {len(cmp.configs)} matching configurations lacked the data to "
                  "compare (not compared, or inconclusive without an interval); the gate judged the others."]
    envs = sorted({d for c in cmp.configs for d in c.environment})
    if envs:
        lines += ["", "The environments differ (env.json), which can explain a change as well as the code: "
                  + "; ".join(envs) + "."]
    if cmp.unmatched_current:
        lines += ["", "New (no baseline): " + "; ".join(cmp.unmatched_current)]
    if cmp.unmatched_baseline:
        lines += ["", "Missing (only in the baseline): " + "; ".join(cmp.unmatched_baseline)]
    return "\n".join(lines) + "\n"
