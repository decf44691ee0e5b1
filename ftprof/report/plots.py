"""PNG plots (headless): throughput vs memory, memory breakdown, tokens/s vs batch, step times, NVML over time."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd

from ftprof.metrics import GIB
from ftprof.results.run_dir import STEPS

MAX_EXPERIMENTS_PER_PLOT = 40  # beyond this, per-experiment plots show the first 40 (tables keep them all)


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # headless: no display needed
    import matplotlib.pyplot as plt

    return plt


def labeller(df: pd.DataFrame):
    """A function row -> its label: method plus every option that varies between the runs shown (model, batch,
    checkpointing, GPUs, ...), and "#k" for the k-th repeat of a configuration."""
    from ftprof.report.choose import label, varying_options
    from ftprof.report.tables import config_key, with_checkpointing_policy

    df = with_checkpointing_policy(df)
    varying = varying_options(df) if len(df) else []
    keys = config_key(df) if len(df) else pd.Series(dtype=str)
    counts = keys.value_counts()
    nth = keys.groupby(keys).cumcount() + 1

    def _label(row) -> str:
        row = df.loc[row.name] if row.name in df.index else row  # with the checkpointing policy filled in
        text = label({c: row.get(c) for c in varying}, row.get("method"))
        if row.name in keys.index and counts[keys[row.name]] > 1:
            text += f" #{nth[row.name]}"
        return text

    return _label


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce") if col in df else pd.Series(float("nan"), index=df.index)


def _save(fig, path: Path) -> Path:
    """The figure as a PNG, written atomically like every other file (rendered in memory, then renamed in)."""
    import io

    from ftprof.results.store import write_bytes_atomic

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    _plt().close(fig)
    return write_bytes_atomic(path, buf.getvalue())


def throughput_vs_memory(df: pd.DataFrame, out: Path) -> Path | None:
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    mem_col = "torch_peak_allocated" if _num(ok, "torch_peak_allocated").notna().any() else "host_peak_rss"
    name = labeller(ok)
    for method, group in ok.groupby("method"):
        xs, ys = _num(group, mem_col) / GIB, _num(group, "tokens_per_s")
        ax.scatter(xs, ys, label=method, s=40)
        for (_, row), x, y in zip(group.iterrows(), xs, ys, strict=True):
            ax.annotate(name(row), (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.margins(0.15)
    ax.set_xlabel(f"peak memory (GiB, {'torch allocated' if mem_col == 'torch_peak_allocated' else 'host RSS'})")
    ax.set_ylabel("tokens/s (global)")
    ax.set_title("Throughput against peak memory")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, out / "throughput_vs_memory.png")


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


def memory_breakdown(df: pd.DataFrame, out: Path) -> Path | None:
    """Stacked bars: weights, gradients, optimizer state, activations and transients, allocator reserve, non-torch."""
    rows = df.head(MAX_EXPERIMENTS_PER_PLOT)
    if not _num(rows, "torch_peak_allocated").notna().any():
        return None
    plt = _plt()
    parts = breakdown_parts(rows)
    if parts is None:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(rows) + 2), 4.5))
    bottom = pd.Series([0.0] * len(rows), index=rows.index)
    name = labeller(rows)
    labels = [name(r) for _, r in rows.iterrows()]
    for part, values in parts.items():
        v = values.fillna(0) / GIB
        ax.bar(labels, v, bottom=bottom, label=part)
        bottom = bottom + v
    peak = _num(rows, "memory_breakdown_training_peak") / GIB
    ax.scatter(labels, peak, marker="_", s=300, color="black", zorder=3, label="training peak (recorded)")
    ax.set_ylabel("GiB per GPU")
    ax.set_title("Memory breakdown per experiment (up to the training peak, then reserve and non-torch)")
    ax.tick_params(axis="x", rotation=60)
    ax.legend(fontsize=8)
    return _save(fig, out / "memory_breakdown.png")


def tokens_vs_batch(df: pd.DataFrame, out: Path) -> Path | None:
    ok = df[df["status"] == "ok"].copy()
    if ok.empty or "batch_size" not in ok:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ok["_b"] = _num(ok, "batch_size")
    ok["_t"] = _num(ok, "tokens_per_s")
    # One line per configuration but its batch size (method, model, checkpointing, ...).
    series = labeller(ok.drop(columns=["batch_size"]))
    ok["_series"] = [series(r).split(" #")[0] for _, r in ok.iterrows()]
    markers = "osD^vP*Xh<>"
    for i, (name, group) in enumerate(ok.groupby("_series")):
        g = group.groupby("_b")["_t"].mean().sort_index()
        # a marker on every point: a series with one batch size is a point, never an invisible line
        ax.plot(g.index, g.values, marker=markers[i % len(markers)], markersize=7, label=name)
    failed = df[df["status"] != "ok"]
    for _, r in failed.iterrows():
        ax.axvline(float(r["batch_size"]), color="red", alpha=0.2)
    batches = sorted(set(ok["_b"].dropna()) | set(_num(failed, "batch_size").dropna()))
    if batches and batches[-1] / max(batches[0], 1) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [f"{b:g}" for b in batches])  # batch sizes are integers: tick the ones measured
    ax.minorticks_off()
    ax.set_xlabel("batch size per GPU")
    ax.set_ylabel("tokens/s (global)")
    ax.set_title("Throughput against batch size" + (" (red: failed runs)" if len(failed) else ""))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out / "tokens_vs_batch.png")


def _read_column(path: Path, column: str, where=None) -> list[float]:
    try:
        with open(path, newline="") as fh:
            return [float(r[column]) for r in csv.DictReader(fh) if r.get(column) and (where is None or where(r))]
    except (OSError, ValueError, KeyError):
        return []


def step_times(df: pd.DataFrame, out: Path) -> Path | None:
    data, labels = [], []
    name = labeller(df)
    for _, r in df.head(MAX_EXPERIMENTS_PER_PLOT).iterrows():
        times = _read_column(Path(r["run_dir"]) / STEPS, "step_time_s", lambda row: row.get("warmup") == "False")
        if times:
            data.append(times)
            labels.append(name(r))
    if not data:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(data) + 2), 4.5))
    ax.boxplot(data)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=60)
    ax.set_ylabel("step time (s), steady steps")
    ax.set_title("Step-time distribution")
    return _save(fig, out / "step_times.png")


def nvml_over_time(df: pd.DataFrame, out: Path) -> Path | None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    drew = False
    name = labeller(df)
    for _, r in df.head(MAX_EXPERIMENTS_PER_PLOT).iterrows():
        run_dir = Path(r["run_dir"])
        path = run_dir / "nvml.csv" if (run_dir / "nvml.csv").exists() else run_dir / "nvml_rank0.csv"
        t = _read_column(path, "unix_s", lambda row: row.get("gpu") == "0")
        used = _read_column(path, "memory_used", lambda row: row.get("gpu") == "0")
        if t and len(t) == len(used):
            ax.plot([x - t[0] for x in t], [u / GIB for u in used], label=name(r))
            drew = True
    if not drew:
        plt.close(fig)
        return None
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("GPU memory used (GiB, NVML, device-wide)")
    ax.set_title("NVML memory over time")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, out / "nvml_memory.png")


def pareto(choice, out: Path) -> Path | None:
    """Tokens/s against peak memory per configuration, every point labelled, the frontier drawn (choose.py)."""
    if not choice.configurations:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    front = {id(c) for c in choice.frontier}
    for c in choice.configurations:
        on = id(c) in front
        ax.scatter(c.peak_bytes / GIB, c.tokens_per_s, s=45 if on else 25, color="C0" if on else "0.55", zorder=3)
        ax.annotate(c.label, (c.peak_bytes / GIB, c.tokens_per_s), textcoords="offset points", xytext=(4, 3),
                    fontsize=7, color="black" if on else "0.35")
    ax.step([c.peak_bytes / GIB for c in choice.frontier], [c.tokens_per_s for c in choice.frontier], where="post",
            color="C0", label="Pareto frontier", zorder=2)
    ax.margins(0.15)  # room for the labels of the outermost points
    ax.set_xlabel(f"peak memory per GPU (GiB, {choice.memory_source})")
    ax.set_ylabel("tokens/s (global)")
    ax.set_title("Which configurations are worth it? (frontier: nothing is both faster and smaller)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out / PARETO)


PARETO = "pareto.png"
# What each plot answers: the HTML report's captions.
CAPTIONS = {
    PARETO: "Which configurations are worth it: tokens/s against peak memory, every configuration labelled; the line "
            "joins those that no other configuration beats on both.",
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
