""""Which should I pick?": per memory budget the fastest configuration that fits, the Pareto frontier of tokens/s
against peak memory, and what switching each option bought. Pure: DataFrames of run rows in, dataclasses and
Markdown out (no files, no plotting).

A configuration is the set of runs that share every option (repeats merged): tokens/s is their mean, peak memory
their max (the conservative reading). Peak memory is per GPU and comes from one source for every configuration:
the NVML process peak when every configuration has it (what the device really gave the process: allocator reserve
plus CUDA context), else the torch reserved peak. CPU runs are measured by their memory breakdown (weights,
gradients, optimizer state, saved activations: exact bytes from result.json) when every run has it, because their
host RSS is mostly the imported libraries (about 0.8 GiB) and hides what the options change; else by the host RSS
peak. Configurations, labels and pairs come from each run's effective configuration (results/effective.py).
"""

from __future__ import annotations

import functools
import itertools
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

import pandas as pd

from ftprof.config import CHECKPOINTING, KERNELS, METHODS
from ftprof.console import fmt_gib, fmt_num
from ftprof.metrics import BUDGET_MARGIN_WORDS, GIB, fits_budget
from ftprof.report import noise, training_check
from ftprof.results.effective import config_key, effective_frame
from ftprof.results.labels import labels, missing, short, varying_options

# Common GPU memory sizes (GiB): 8 (4060/3070-class), 12 (3060/4070, laptops), 16 (V100/T4-class), 24
# (L4/A10/4090), 40 (A100-40G), 48 (L40S/A6000), 80 (A100/H100-80G), 141 (H200).
BUDGETS_GIB = (8, 12, 16, 24, 40, 48, 80, 141)
# A configuration fits a budget when its measured peak leaves the budget margin free: the one definition the plan
# uses too (ftprof.metrics.fits_budget).

# Peak-memory sources, most faithful first: (column, words for the reader).
MEMORY_SOURCES = (("nvml_process_used_peak", "NVML process peak"), ("torch_peak_reserved", "torch reserved peak"),
                  ("host_peak_rss", "host RSS peak"))
# CPU runs: the parts of the memory breakdown that the options change (result.json's exact bytes).
BREAKDOWN_PARTS = ("weights_frozen", "weights_trainable", "gradients", "optimizer_state", "activations_saved")
BREAKDOWN_WORDS = ("memory breakdown: weights + gradients + optimizer state + saved activations (host RSS, mostly "
                   "imported libraries, left aside)")
# Categorical options whose switches read best in a fixed order (from the baseline choice to the alternatives).
_ORDERS = {"checkpointing": CHECKPOINTING, "kernels": KERNELS, "method": METHODS}


@dataclass(frozen=True)
class Configuration:
    options: tuple[tuple[str, object], ...]  # every option that varies between configurations, in column order
    label: str  # method plus the varying options, short: "lora b8 ckpt 2 GPUs"
    tokens_per_s: float
    peak_bytes: float
    repeats: int
    spread: float | None = None  # the widest step p90/p50 over its runs (how unsteady its steps were)

    @functools.cached_property
    def _values(self) -> dict[str, str]:
        return {k: "None" if missing(v) else str(v) for k, v in self.options}

    def option(self, name: str) -> object:
        return next((v for k, v in self.options if k == name), None)

    def text(self, name: str) -> str:
        """The option's value as text (how pairs are matched): "None" where it does not apply."""
        return self._values.get(name, "None")


@dataclass(frozen=True)
class Pick:
    budget: str  # "24 GiB" or "NVIDIA H200 (139.8 GiB, the runs' device)"
    budget_bytes: float
    choice: Configuration | None  # None: nothing measured fits
    cost_pct: float | None  # tokens/s of the choice against the fastest overall, in percent (0 = the fastest)


@dataclass(frozen=True)
class OptionEffect:
    option: str
    before: object
    after: object
    pairs: int  # configuration pairs that differ in this option alone
    throughput_pct: float  # median change of tokens/s over those pairs
    memory_bytes: float  # median change of peak memory
    memory_pct: float


@dataclass
class Choice:
    configurations: list[Configuration]
    memory_source: str  # words: "NVML process peak" ...
    on_gpu: bool
    picks: list[Pick] = field(default_factory=list)
    frontier: list[Configuration] = field(default_factory=list)
    effects: list[OptionEffect] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # "label: why" for runs that did not train like the others
    throughput: str = "tokens/s"  # what Configuration.tokens_per_s counts: every token, or REAL_TOKENS

    @property
    def fastest(self) -> Configuration | None:
        return max(self.configurations, key=lambda c: c.tokens_per_s, default=None)


REAL_TOKENS = "real tokens/s"  # the throughput the choice ranks by where the runs pad differently
PADDING_SPREAD = 0.01  # real tokens' share of the tokens differing by more than this between runs: padding differs


def _ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The successful runs with a throughput. ``tokens_per_s`` is the one the choice ranks by: every token's, or
    where the runs pad differently (packing against padding, other data) the real tokens' (``real_throughput``)."""
    if df.empty or "status" not in df:
        return df.iloc[0:0]
    ok = df[df["status"] == "ok"].copy()
    ok["tokens_per_s"] = pd.to_numeric(ok.get("tokens_per_s"), errors="coerce")
    ok = ok[ok["tokens_per_s"].notna()]
    ok.attrs["throughput"] = REAL_TOKENS if real_throughput(ok) else "tokens/s"
    if ok.attrs["throughput"] == REAL_TOKENS:
        ok["tokens_per_s"] = pd.to_numeric(ok["real_tokens_per_s"], errors="coerce")
    return ok


def real_throughput(ok: pd.DataFrame) -> bool:
    """Whether the runs trained on shares of real (not padded) tokens that differ: then tokens/s counts padding as
    work, and a padded configuration outranks a packed one that trains more real tokens a second."""
    if not len(ok) or "real_tokens_per_s" not in ok:
        return False
    real = pd.to_numeric(ok["real_tokens_per_s"], errors="coerce")
    if real.isna().any():
        return False
    share = real / ok["tokens_per_s"]
    return bool(share.max() - share.min() > PADDING_SPREAD)


def memory_source(ok: pd.DataFrame) -> tuple[str | None, str]:
    """The most faithful peak-memory column that every successful run has; for CPU runs the memory breakdown's
    parts (``_breakdown_bytes``) when every run recorded them."""
    on_cpu = len(ok) and "device" in ok and (ok["device"].map(str) == "cpu").all()
    if on_cpu and _breakdown_bytes(ok).notna().all():
        return "_breakdown_bytes", BREAKDOWN_WORDS
    for col, words in MEMORY_SOURCES:
        if col in ok and len(ok) and pd.to_numeric(ok[col], errors="coerce").notna().all():
            return col, words
    return None, "no peak memory recorded"


def _breakdown_bytes(ok: pd.DataFrame) -> pd.Series:
    cols = [f"memory_breakdown_{p}" for p in BREAKDOWN_PARTS]
    if not all(c in ok for c in cols):
        return pd.Series(float("nan"), index=ok.index)
    return ok[cols].apply(pd.to_numeric, errors="coerce").sum(axis=1, min_count=len(cols))


def _spread(group: pd.DataFrame) -> float | None:
    if "step_time_p90_s" not in group or "step_time_p50_s" not in group:
        return None
    ratio = pd.to_numeric(group["step_time_p90_s"], errors="coerce") / \
        pd.to_numeric(group["step_time_p50_s"], errors="coerce")
    return None if ratio.dropna().empty else float(ratio.max())


def configurations(df: pd.DataFrame) -> tuple[list[Configuration], str, bool]:
    """Successful runs merged by effective configuration (those that did not train like the others left out);
    with the memory source's words and whether they ran on a GPU."""
    ok = _ok_rows(effective_frame(df))
    return _configurations(ok.drop(index=list(training_check.lagging_runs(ok))))


def _configurations(ok: pd.DataFrame) -> tuple[list[Configuration], str, bool]:
    col, words = memory_source(ok)
    if col is None:
        return [], words, False
    ok[col] = _breakdown_bytes(ok) if col == "_breakdown_bytes" else pd.to_numeric(ok[col], errors="coerce")
    varying = varying_options(ok)
    names = labels(ok, varying, repeats=False)
    out = []
    for _, group in ok.groupby(config_key(ok), sort=False):
        first = group.iloc[0]
        options = {c: first.get(c) for c in varying}
        out.append(Configuration(tuple(options.items()), names[group.index[0]], float(group["tokens_per_s"].mean()),
                                 float(group[col].max()), len(group), _spread(group)))
    on_gpu = col not in ("host_peak_rss", "_breakdown_bytes")
    return out, words, on_gpu


def _lagging(ok: pd.DataFrame, flags: dict) -> list[str]:
    """"label: why" for each successful run (of ``ok``) left out because it did not train like the best run of its
    data (``flags``: training_check.lagging_runs)."""
    if not flags:
        return []
    names = labels(ok, varying_options(ok), repeats=False)
    return [f"{names[i]}: {why}" for i, why in flags.items()]


def pareto_front(configs: list[Configuration]) -> list[Configuration]:
    """Configurations no other beats on both tokens/s and peak memory, by ascending memory."""
    front: list[Configuration] = []
    for c in sorted(configs, key=lambda c: (c.peak_bytes, -c.tokens_per_s)):
        if not front or c.tokens_per_s > front[-1].tokens_per_s:
            front.append(c)
    return front


def pick(configs: list[Configuration], budget_bytes: float, budget: str) -> Pick:
    fits = [c for c in configs if fits_budget(c.peak_bytes, budget_bytes)]
    best = max(fits, key=lambda c: c.tokens_per_s, default=None)
    fastest = max(configs, key=lambda c: c.tokens_per_s, default=None)
    cost = None if best is None or fastest is None else 100.0 * (best.tokens_per_s / fastest.tokens_per_s - 1)
    return Pick(budget, budget_bytes, best, cost)


def _comparable(a: Configuration, b: Configuration, option: str) -> bool:
    """Same configuration but for ``option``; an option that does not apply to one side (None: a LoRA rank on a
    full fine-tune) does not count as a difference."""
    if a.text(option) == b.text(option) or "None" in (a.text(option), b.text(option)):
        return False
    return all(a.text(k) == b.text(k) or "None" in (a.text(k), b.text(k)) for k, _ in a.options if k != option)


def _pairs(configs: list[Configuration], option: str, before: object, after: object):
    """(a, b) with ``option`` switched from ``before`` to ``after`` and nothing else. Options set on every
    configuration of either side must match exactly: they key a lookup, so the pairing is linear, not quadratic,
    in the number of configurations; the rest (set on some only) are checked pair by pair."""
    a_side = [c for c in configs if c.text(option) == str(before)]
    b_side = [c for c in configs if c.text(option) == str(after)]
    firm = [k for k, _ in configs[0].options if k != option and all(c.text(k) != "None" for c in a_side + b_side)]
    buckets = defaultdict(list)
    for b in b_side:
        buckets[tuple(b.text(k) for k in firm)].append(b)
    return [(a, b) for a in a_side for b in buckets.get(tuple(a.text(k) for k in firm), ())
            if _comparable(a, b, option)]


def _value_pairs(values: list[object], option: str = "") -> list[tuple[object, object]]:
    """Ordered switches to report: neighbours for numbers (b2 -> b4 -> b8), off -> on for flags, every pair else
    (in the option's own order where it has one: none -> full -> selective)."""
    if option in _ORDERS:
        order = list(_ORDERS[option])
        return list(itertools.combinations(sorted(values, key=lambda v: order.index(v) if v in order else 99), 2))
    try:
        nums = sorted(values, key=float)
        return list(itertools.pairwise(nums))
    except (TypeError, ValueError):
        return list(itertools.combinations(sorted(values, key=str), 2))


def option_effects(configs: list[Configuration]) -> list[OptionEffect]:
    """For each varying option and each switch of its value: the median change over the configuration pairs that
    differ in that option alone (the sweep's own cells, nothing interpolated)."""
    if not configs:
        return []
    effects = []
    for option in [k for k, _ in configs[0].options]:
        values = {str(c.option(option)): c.option(option) for c in configs if not missing(c.option(option))}
        if all(str(v) in ("True", "False") for v in values.values()):
            switches = [(values[a], values[b]) for a, b in (("False", "True"),) if a in values and b in values]
        else:
            switches = _value_pairs(list(values.values()), option)
        for before, after in switches:
            pairs = _pairs(configs, option, before, after)
            if not pairs:
                continue
            tput = statistics.median(100.0 * (b.tokens_per_s / a.tokens_per_s - 1) for a, b in pairs)
            mem = statistics.median(b.peak_bytes - a.peak_bytes for a, b in pairs)
            mem_pct = statistics.median(100.0 * (b.peak_bytes / a.peak_bytes - 1) for a, b in pairs if a.peak_bytes)
            effects.append(OptionEffect(option, before, after, len(pairs), tput, mem, mem_pct))
    return effects


def choose(df: pd.DataFrame, device: tuple[str, float] | None = None, budgets_gib=BUDGETS_GIB) -> Choice:
    """The whole answer. ``device``: (name, total bytes) of the GPU the runs came from, added as a budget."""
    ok = _ok_rows(effective_frame(df))
    flags = training_check.lagging_runs(ok)
    configs, words, on_gpu = _configurations(ok.drop(index=list(flags)))
    result = Choice(configs, words, on_gpu, left_out=_lagging(ok, flags),
                    throughput=ok.attrs.get("throughput", "tokens/s"))
    if not configs:
        return result
    budgets = [(f"{g} GiB", g * GIB) for g in budgets_gib]
    if device is not None and device[1]:
        budgets.append((f"{device[0]} ({device[1] / GIB:.1f} GiB, the runs' device)", device[1]))
    budgets.sort(key=lambda b: b[1])
    result.picks = [pick(configs, size, name) for name, size in budgets]
    result.frontier = pareto_front(configs)
    result.effects = option_effects(configs)
    return result


def _fmt_pct(value: float) -> str:
    return f"{value:+.1f}%"


def _value(option: str, value: object) -> str:
    return short(option, value) if option != "method" else str(value)


def to_markdown(choice: Choice) -> str:
    lines = ["## Which should I pick?", ""]
    if not choice.configurations:
        return "\n".join(lines + [f"No successful run with a peak memory to choose from ({choice.memory_source}).", ""])
    fastest = choice.fastest
    lines += [f"Peak memory per GPU: {choice.memory_source} (max over repeats); a configuration fits a budget when its "
              f"peak leaves a margin of {BUDGET_MARGIN_WORDS} free (for driver, allocator and data differences; "
              f"the plan uses the same margin). Cost: {choice.throughput} against the fastest overall "
              f"({fastest.label}, {fmt_num(fastest.tokens_per_s)} {choice.throughput}).", ""]
    if choice.throughput == REAL_TOKENS:
        lines += ["The runs pad differently (packing, or other data): they are ranked by real tokens/s, the "
                  "tokens that train (tokens/s counts padding as work).", ""]
    if not choice.on_gpu:
        lines += [f"These runs ran on the CPU: memory is the {choice.memory_source}, so the GPU budgets below are "
                  "indicative only.", ""]
    if choice.left_out:
        lines += ["Left out (a run that did not train like the others of its data is no candidate, however fast):",
                  ""] + [f"- {line}" for line in choice.left_out] + [""]
    lines += [f"| memory budget | fastest that fits | {choice.throughput} | peak GiB | cost |",
              "| --- | --- | ---: | ---: | ---: |"]
    for p in choice.picks:
        if p.choice is None:
            lines.append(f"| {p.budget} | nothing measured fits | - | - | - |")
        else:
            lines.append(f"| {p.budget} | {p.choice.label} | {fmt_num(p.choice.tokens_per_s)} | "
                         f"{fmt_gib(p.choice.peak_bytes)} | {_fmt_pct(p.cost_pct)} |")
    lines += ["", "Pareto frontier (no other configuration is both faster and smaller): "
              + "; ".join(f"{c.label} ({fmt_num(c.tokens_per_s)} {choice.throughput}, {fmt_gib(c.peak_bytes)} GiB)"
                          for c in choice.frontier) + ".", ""]
    lines += noise.to_markdown(choice.configurations)
    if choice.effects:
        lines += ["### What each option bought", "",
                  "Switching one option with every other fixed, median over the sweep's pairs of cells that differ in "
                  "it alone.", "",
                  f"| option | switch | pairs | {choice.throughput} | peak memory |",
                  "| --- | --- | ---: | ---: | ---: |"]
        for e in choice.effects:
            lines.append(f"| {e.option} | {_value(e.option, e.before)} → {_value(e.option, e.after)} | {e.pairs} | "
                         f"{_fmt_pct(e.throughput_pct)} | {e.memory_bytes / GIB:+.2f} GiB ({_fmt_pct(e.memory_pct)}) |")
        lines.append("")
    return "\n".join(lines) + "\n"
