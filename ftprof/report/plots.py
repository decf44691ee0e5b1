"""PNG plots (headless): the Pareto frontier, throughput vs memory, memory breakdown, tokens/s vs batch, step times,
NVML over time. Readable from 2 to 1,000 configurations: a PNG labels only what a reader acts on (the frontier and
each budget's pick) in a column of its own, per-run plots show the fastest ``MAX_EXPERIMENTS_PER_PLOT``, and
every point is in report.html's interactive charts (interactive.py) on hover."""

from __future__ import annotations

import csv
import textwrap
from pathlib import Path

import pandas as pd

from ftprof.metrics import GIB
from ftprof.report.figures import figure, label_column, legend_below, quiet, save, text_width_in
from ftprof.results.labels import labeller, labels
from ftprof.results.run_dir import STEPS

MAX_EXPERIMENTS_PER_PLOT = 40  # beyond this, per-run plots show the 40 fastest (tables and report.html keep all)
MAX_SERIES_IN_LEGEND = 12

__all__ = ["labeller", "all_plots", "breakdown_parts", "CAPTIONS", "PARETO"]


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce") if col in df else pd.Series(float("nan"), index=df.index)


def _fastest(df: pd.DataFrame, n: int = MAX_EXPERIMENTS_PER_PLOT) -> pd.DataFrame:
    """The ``n`` fastest runs (then the failed ones, in their order), for plots with one row per run."""
    order = _num(df, "tokens_per_s").sort_values(ascending=False, na_position="last", kind="stable").index
    return df.loc[order[:n]]


def _of(shown: int, total: int) -> str:
    return f" ({shown} fastest of {total})" if total > shown else ""


def _wrap(text: str, width_in: float) -> str:
    return textwrap.fill(text, max(20, int(width_in / 0.075)))


def pareto(choice, out: Path) -> Path | None:
    """Tokens/s against peak memory per configuration, the frontier drawn; the frontier and the picks labelled."""
    if not choice.configurations:
        return None
    marked = {id(c): c for c in choice.frontier}
    budgets: dict[int, list[str]] = {}
    for p in choice.picks:
        if p.choice is not None:
            marked.setdefault(id(p.choice), p.choice)
            budgets.setdefault(id(p.choice), []).append(p.budget.split(" (")[0])
    texts = [c.label + (f"  ({', '.join(budgets[k])} pick)" if k in budgets else "")
             for k, c in marked.items()]
    with quiet():
        fig, (ax, lab) = figure(6.5 + text_width_in(texts) + 0.4, max(4.8, 0.2 * len(texts) + 2.4), ncols=2,
                                gridspec_kw={"width_ratios": [6.5, text_width_in(texts) + 0.4]})
        rest = [c for c in choice.configurations if id(c) not in marked]
        if rest:
            ax.scatter([c.peak_bytes / GIB for c in rest], [c.tokens_per_s for c in rest], s=12, color="0.65",
                       alpha=0.6, label="other configurations", zorder=2, linewidths=0)
        front = choice.frontier
        ax.step([c.peak_bytes / GIB for c in front], [c.tokens_per_s for c in front], where="post", color="C0",
                label="Pareto frontier", zorder=3)
        ax.scatter([c.peak_bytes / GIB for c in marked.values()], [c.tokens_per_s for c in marked.values()],
                   s=36, color=["C1" if k in budgets else "C0" for k in marked], zorder=4,
                   label="labelled: frontier (blue), a budget's pick (orange)")
        ax.margins(0.08)
        ax.set_xlabel(_wrap(f"peak memory per GPU (GiB, {choice.memory_source})", 6.2))
        ax.set_ylabel(f"{choice.throughput} (global)")
        ax.set_title("Which configurations are worth it?")
        ax.grid(alpha=0.3)
        label_column(ax, lab, [(c.peak_bytes / GIB, c.tokens_per_s, t) for c, t in zip(marked.values(), texts,
                                                                                      strict=True)])
        legend_below(fig, ax)
    return save(fig, out / PARETO)


def _memory_column(ok: pd.DataFrame) -> tuple[pd.Series, str]:
    if _num(ok, "torch_peak_allocated").notna().any():
        return _num(ok, "torch_peak_allocated"), "torch allocated"
    from ftprof.report.choose import _breakdown_bytes

    parts = _breakdown_bytes(ok)
    if parts.notna().all():
        return parts, "memory breakdown: weights, gradients, optimizer state, saved activations"
    return _num(ok, "host_peak_rss"), "host RSS"


def throughput_vs_memory(df: pd.DataFrame, out: Path) -> Path | None:
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return None
    mem, words = _memory_column(ok)
    with quiet():
        fig, ax = figure(7, 5)
        for method, group in ok.groupby("method"):
            ax.scatter(mem[group.index] / GIB, _num(group, "tokens_per_s"), label=method, s=24, alpha=0.8)
        ax.margins(0.08)
        ax.set_xlabel(_wrap(f"peak memory (GiB, {words})", 6.5))
        ax.set_ylabel("tokens/s (global)")
        ax.set_title("Throughput against peak memory, by method")
        ax.grid(alpha=0.3)
        legend_below(fig, ax)
    return save(fig, out / "throughput_vs_memory.png")


def breakdown_parts(rows: pd.DataFrame) -> dict[str, pd.Series] | None:
    """The stacked parts per run, in bytes: the recorded breakdown (its parts add up to the recorded training peak),
    then the allocator reserve and non-torch memory at the run peak. None for runs without a recorded breakdown."""
    parts = {
        "frozen weights": _num(rows, "memory_breakdown_weights_frozen"),
        "trainable weights": _num(rows, "memory_breakdown_weights_trainable"),
        "gradients": _num(rows, "memory_breakdown_gradients"),
        "optimizer state": _num(rows, "memory_breakdown_optimizer_state"),
        "activations (saved for backward)": _num(rows, "memory_breakdown_activations_saved"),
        "logits gradients (estimate)": _num(rows, "memory_breakdown_logits_gradients"),
        # as the run computed it: the training peak minus the parts above (loading excluded, not the overall peak)
        "transients (backward temporaries, recompute, dequantized weights)":
            _num(rows, "memory_breakdown_transients"),
    }
    if not any(p.notna().any() for p in parts.values()):  # older runs without a recorded breakdown
        return None
    parts = {k: v.clip(lower=0) for k, v in parts.items()}
    parts["allocator reserve (run peak)"] = (_num(rows, "torch_peak_reserved")
                                             - _num(rows, "torch_peak_allocated")).clip(lower=0)
    parts["non-torch (CUDA context...)"] = _num(rows, "non_torch_overhead").clip(lower=0)
    return parts


def _hbar_height(n: int, legend_rows: int = 0) -> float:
    return max(3.6, 0.26 * n + 1.9 + 0.22 * legend_rows)


def memory_breakdown(df: pd.DataFrame, out: Path) -> Path | None:
    """Stacked horizontal bars, one per run: weights, gradients, optimizer state, activations and transients,
    allocator reserve, non-torch."""
    gpu = df[_num(df, "torch_peak_allocated").notna()]
    rows = _fastest(gpu)
    parts = breakdown_parts(rows) if len(rows) else None
    if parts is None:
        return None
    names = list(labels(df).loc[rows.index])
    y = list(range(len(rows)))
    with quiet():
        fig, ax = figure(7.5 + text_width_in(names), _hbar_height(len(rows), legend_rows=4))
        left = pd.Series([0.0] * len(rows), index=rows.index)
        for part, values in parts.items():
            v = values.fillna(0) / GIB
            ax.barh(y, v, left=left, label=part, height=0.7)
            left = left + v
        ax.scatter(_num(rows, "memory_breakdown_training_peak") / GIB, y, marker="|", s=160, color="black",
                   zorder=3, label="training peak (recorded)")
        ax.set_yticks(y, names, fontsize=7.5)
        ax.invert_yaxis()
        ax.set_xlabel("GiB per GPU")
        ax.set_title("Where the memory went" + _of(len(rows), len(gpu)))
        ax.grid(axis="x", alpha=0.3)
        legend_below(fig, ax)
    return save(fig, out / "memory_breakdown.png")


def tokens_vs_batch(df: pd.DataFrame, out: Path) -> Path | None:
    ok = df[df["status"] == "ok"].copy()
    if ok.empty or "batch_size" not in ok:
        return None
    ok["_b"] = _num(ok, "batch_size")
    ok["_t"] = _num(ok, "tokens_per_s")
    # One line per configuration but its batch size (method, model, checkpointing, ...).
    ok["_series"] = labels(ok.drop(columns=["batch_size"]), repeats=False)
    series = list(ok.groupby("_series"))
    failed = df[df["status"] != "ok"]
    with quiet():
        fig, ax = figure(7.5, 5.5)
        markers = "osD^vP*Xh<>"
        for i, (name, group) in enumerate(series):
            g = group.groupby("_b")["_t"].mean().sort_index()
            # a marker on every point: a series with one batch size is a point, never an invisible line
            ax.plot(g.index, g.values, marker=markers[i % len(markers)], markersize=6, label=name,
                    lw=1.2 if len(series) <= MAX_SERIES_IN_LEGEND else 0.5)
        for b in _num(failed, "batch_size").dropna():
            ax.axvline(float(b), color="red", alpha=0.2)
        batches = sorted(set(ok["_b"].dropna()) | set(_num(failed, "batch_size").dropna()))
        if batches and batches[-1] / max(batches[0], 1) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [f"{b:g}" for b in batches])  # batch sizes are integers: tick the ones measured
        ax.minorticks_off()
        ax.set_xlabel("batch size per GPU")
        ax.set_ylabel("tokens/s (global)")
        shown = legend_below(fig, ax, MAX_SERIES_IN_LEGEND)
        ax.set_title("Throughput against batch size" + (" (red: failed runs)" if len(failed) else "")
                     + ("" if shown else f"\n{len(series)} series: names on hover in report.html"))
        ax.grid(alpha=0.3)
    return save(fig, out / "tokens_vs_batch.png")


def _read_column(path: Path, column: str, where=None) -> list[float]:
    try:
        with open(path, newline="") as fh:
            return [float(r[column]) for r in csv.DictReader(fh) if r.get(column) and (where is None or where(r))]
    except (OSError, ValueError, KeyError):
        return []


def step_times(df: pd.DataFrame, out: Path) -> Path | None:
    data, names = [], []
    rows = _fastest(df)
    all_names = labels(df)
    for idx, r in rows.iterrows():
        times = _read_column(Path(r["run_dir"]) / STEPS, "step_time_s", lambda row: row.get("warmup") == "False")
        if times:
            data.append(times)
            names.append(all_names[idx])
    if not data:
        return None
    with quiet():
        fig, ax = figure(7 + text_width_in(names), _hbar_height(len(data)))
        ax.boxplot(data, orientation="horizontal")
        ax.set_yticks(range(1, len(names) + 1), names, fontsize=7.5)
        ax.invert_yaxis()
        ax.set_xlabel("step time (s), steady steps")
        ax.set_title("Step-time distribution" + _of(len(data), len(df)))
        ax.grid(axis="x", alpha=0.3)
    return save(fig, out / "step_times.png")


def nvml_over_time(df: pd.DataFrame, out: Path) -> Path | None:
    curves = []
    names = labels(df)
    for idx, r in _fastest(df).iterrows():
        run_dir = Path(r["run_dir"])
        path = run_dir / "nvml.csv" if (run_dir / "nvml.csv").exists() else run_dir / "nvml_rank0.csv"
        t = _read_column(path, "unix_s", lambda row: row.get("gpu") == "0")
        used = _read_column(path, "memory_used", lambda row: row.get("gpu") == "0")
        if t and len(t) == len(used):
            curves.append(([x - t[0] for x in t], [u / GIB for u in used], names[idx]))
    if not curves:
        return None
    with quiet():
        fig, ax = figure(8, 5.5)
        for xs, ys, name in curves:
            ax.plot(xs, ys, label=name, lw=1)
        ax.set_xlabel("seconds since the run started")
        ax.set_ylabel("GPU memory used (GiB, NVML, device-wide)")
        ax.set_title("NVML memory over time" + _of(len(curves), len(df)))
        ax.grid(alpha=0.3)
        legend_below(fig, ax, MAX_SERIES_IN_LEGEND)
    return save(fig, out / "nvml_memory.png")


PARETO = "pareto.png"
# What each plot answers: the HTML report's captions.
CAPTIONS = {
    PARETO: "Which configurations are worth it: tokens/s against peak memory; the line joins those that no other "
            "configuration beats on both, labelled with each budget's pick (every configuration is in the "
            "interactive chart, on hover).",
    "throughput_vs_memory.png": "How much memory does each extra token/s cost, per method?",
    "memory_breakdown.png": "Where did the training peak go: weights, gradients, optimizer state, activations, "
                            "transients, allocator reserve and non-torch memory?",
    "tokens_vs_batch.png": "Does a larger batch still pay: tokens/s against batch size per method (red: failed runs).",
    "step_times.png": "How steady is each run: the spread of its steady-state step times.",
    "nvml_memory.png": "When did device memory grow: NVML memory used over each run.",
}


def all_plots(df: pd.DataFrame, out: Path, choice=None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    if df.empty:
        return []
    made = [p for p in [pareto(choice, out)] if p is not None] if choice is not None else []
    makers = (throughput_vs_memory, memory_breakdown, tokens_vs_batch, step_times, nvml_over_time)
    return made + [p for p in (m(df, out) for m in makers) if p is not None]
