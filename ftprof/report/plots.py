"""PNG plots (headless): throughput vs memory, memory breakdown, tokens/s vs batch, step times, NVML over time."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd

from ftprof.console import GIB

MAX_EXPERIMENTS_PER_PLOT = 40  # beyond this, per-experiment plots show the first 40 (tables keep them all)


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # headless: no display needed
    import matplotlib.pyplot as plt

    return plt


def _label(row) -> str:
    parts = [str(row.get("method")), f"b{row.get('batch_size')}", f"s{row.get('seq_len')}"]
    if row.get("world_size") not in (None, 1, "1"):
        parts.append(f"{row.get('world_size')}gpu")
    return " ".join(parts)


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce") if col in df else pd.Series([float("nan")] * len(df))


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def throughput_vs_memory(df: pd.DataFrame, out: Path) -> Path | None:
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    mem_col = "torch_peak_allocated" if _num(ok, "torch_peak_allocated").notna().any() else "host_peak_rss"
    for method, group in ok.groupby("method"):
        ax.scatter(_num(group, mem_col) / GIB, _num(group, "tokens_per_s"), label=method, s=40)
    ax.set_xlabel(f"peak memory (GiB, {'torch allocated' if mem_col == 'torch_peak_allocated' else 'host RSS'})")
    ax.set_ylabel("tokens/s (global)")
    ax.set_title("Throughput against peak memory")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, out / "throughput_vs_memory.png")


def memory_breakdown(df: pd.DataFrame, out: Path) -> Path | None:
    """Stacked bars: weights, gradients, optimizer state, activations and transients, allocator reserve, non-torch."""
    rows = df.head(MAX_EXPERIMENTS_PER_PLOT)
    if not _num(rows, "torch_peak_allocated").notna().any():
        return None
    plt = _plt()
    if _num(rows, "memory_breakdown_weights_frozen").notna().any():  # exact sizes recorded by the run
        parts = {
            "frozen weights": _num(rows, "memory_breakdown_weights_frozen"),
            "trainable weights": _num(rows, "memory_breakdown_weights_trainable"),
            "gradients": _num(rows, "memory_breakdown_gradients"),
            "optimizer state": _num(rows, "memory_breakdown_optimizer_state"),
            "activations (saved for backward)": _num(rows, "memory_breakdown_activations_saved"),
            "logits gradients (estimate)": _num(rows, "memory_breakdown_logits_gradients"),
        }
        label = "transients"
    else:  # older runs: stage deltas
        parts = {
            "weights (load)": _num(rows, "memory_stages_mem_load_delta"),
            "method setup": _num(rows, "memory_stages_mem_method_setup_delta"),
            "optimizer state": _num(rows, "memory_stages_mem_first_optimizer_step_delta"),
        }
        label = "activations, grads, transients"
    parts = {k: v.clip(lower=0) for k, v in parts.items()}
    known = sum(p.fillna(0) for p in parts.values())
    parts[label] = (_num(rows, "torch_peak_allocated") - known).clip(lower=0)
    parts["allocator reserve"] = (_num(rows, "torch_peak_reserved") - _num(rows, "torch_peak_allocated")).clip(lower=0)
    parts["non-torch (CUDA context...)"] = _num(rows, "non_torch_overhead").clip(lower=0)
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(rows) + 2), 4.5))
    bottom = pd.Series([0.0] * len(rows), index=rows.index)
    labels = [_label(r) for _, r in rows.iterrows()]
    for name, values in parts.items():
        v = values.fillna(0) / GIB
        ax.bar(labels, v, bottom=bottom, label=name)
        bottom = bottom + v
    ax.set_ylabel("GiB")
    ax.set_title("Memory breakdown per experiment")
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
    for method, group in ok.groupby("method"):
        g = group.groupby("_b")["_t"].mean().sort_index()
        ax.plot(g.index, g.values, marker="o", label=method)
    failed = df[df["status"] != "ok"]
    for _, r in failed.iterrows():
        ax.axvline(float(r["batch_size"]), color="red", alpha=0.2)
    ax.set_xlabel("batch size per GPU")
    ax.set_ylabel("tokens/s (global)")
    ax.set_title("Throughput against batch size" + (" (red: failed runs)" if len(failed) else ""))
    ax.legend()
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
    for _, r in df.head(MAX_EXPERIMENTS_PER_PLOT).iterrows():
        times = _read_column(Path(r["run_dir"]) / "steps.csv", "step_time_s", lambda row: row.get("warmup") == "False")
        if times:
            data.append(times)
            labels.append(_label(r))
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
    for _, r in df.head(MAX_EXPERIMENTS_PER_PLOT).iterrows():
        run_dir = Path(r["run_dir"])
        path = run_dir / "nvml.csv" if (run_dir / "nvml.csv").exists() else run_dir / "nvml_rank0.csv"
        t = _read_column(path, "unix_s", lambda row: row.get("gpu") == "0")
        used = _read_column(path, "memory_used", lambda row: row.get("gpu") == "0")
        if t and len(t) == len(used):
            ax.plot([x - t[0] for x in t], [u / GIB for u in used], label=_label(r))
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
