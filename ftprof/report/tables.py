"""Run rows -> the tables a person reads: headline columns, repeats aggregated (mean and 95% CI), failures kept."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import pandas as pd

from ftprof.console import fmt_num
from ftprof.metrics import GIB
from ftprof.report import training_check
from ftprof.results.effective import (  # noqa: F401  (config_columns, NOT_CONFIG: this module's old names)
    MEASUREMENT_OPTIONS,
    NOT_CONFIG,
    config_columns,
    config_key,
    effective_frame,
)
from ftprof.results.labels import differing
from ftprof.results.load import read_runs

# Columns of summary.csv / summary.md: (source column, header, kind). Kind says how to format and aggregate.
HEADLINE = [
    ("method", "method", "key"), ("model", "model", "key"), ("world_size", "GPUs", "key"),
    ("batch_size", "batch/GPU", "key"), ("seq_len", "seq len", "key"), ("grad_accum", "grad accum", "key"),
    ("checkpointing", "checkpointing", "key"), ("kernels", "kernels", "key"), ("compile", "compile", "key"),
    ("compile_mode", "compile mode", "key"), ("sdpa_backend", "attention backend", "key"), ("dtype", "dtype", "key"),
    ("memory_logging", "memory logging", "key"), ("profile", "profiled", "key"),
    ("tokens_per_s", "tokens/s", "num"), ("tokens_per_s_per_gpu", "tokens/s/GPU", "num"),
    ("real_tokens_per_s", "real tokens/s", "num"), ("step_time_p50_s", "step p50 (s)", "sec"),
    ("step_time_p90_s", "step p90 (s)", "sec"), ("mfu", "MFU %", "pct"),
    ("torch_peak_allocated", "peak alloc GiB", "gib"),
    ("memory_breakdown_training_peak", "training peak GiB", "gib"),  # loading excluded (quantizing can peak higher)
    ("torch_peak_reserved", "peak reserved GiB", "gib"),
    ("nvml_device_used_peak", "NVML peak GiB", "gib"), ("non_torch_overhead", "non-torch GiB", "gib"),
    ("host_peak_rss", "host peak RSS GiB", "gib"),  # shown when a run ran on the CPU (its only memory figure)
    ("energy_per_token_j", "mJ/token", "mj"), ("status", "status", "status"),
]
# Figures that mean nothing for a CPU run (no GPU peak FLOP/s, no CUDA allocator, no NVML).
GPU_ONLY = ("tokens_per_s_per_gpu", "mfu", "torch_peak_allocated", "memory_breakdown_training_peak",
            "torch_peak_reserved", "nvml_device_used_peak", "non_torch_overhead", "energy_per_token_j")
CPU_NOTE = ("CPU runs: memory is the host RSS peak (in the choice below, the memory breakdown's weights, gradients, "
            "optimizer state and saved activations where recorded); GPU-only figures (MFU, per-GPU throughput, "
            "allocator and NVML peaks, energy) do not apply and are left out; the GPUs column counts the run's "
            "processes.")
KEY_COLUMNS = [c for c, _, kind in HEADLINE if kind == "key"]
NUM_COLUMNS = [c for c, _, kind in HEADLINE if kind not in ("key", "status")]
# Two-sided 95% Student t quantiles by degrees of freedom (1..30); beyond that the normal 1.96.
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def ci95(values: list[float]) -> float | None:
    """Half-width of the 95% confidence interval of the mean; None for fewer than two values."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return (_T95[n - 2] if n - 1 <= len(_T95) else 1.96) * sd / math.sqrt(n)


def load_results(*paths, problems: list[str] | None = None) -> pd.DataFrame:
    """Every run directory under ``paths`` as one DataFrame row (config options and result fields, flattened).

    Unreadable directories and newer schema versions are skipped; their reasons go to ``problems`` (or a warning).
    """
    flat_paths = [p for group in paths for p in ([group] if isinstance(group, (str, bytes)) or
                                                 hasattr(group, "__fspath__") else group)]
    report = read_runs(flat_paths)
    if problems is not None:
        problems.extend(report.problems)
    elif report.problems:
        warnings.warn(f"skipped {len(report.problems)} run dir(s): {report.problems[0]}", stacklevel=2)
    return effective_frame(pd.DataFrame(report.rows))


@dataclass
class SummaryTable:
    frame: pd.DataFrame  # one row per configuration: headline columns (means) + *_ci95 + repeats
    constant: dict[str, object]  # columns equal in every row, lifted into a header line
    # Options outside the headline that differ between rows (max_steps, lora_r, ...): shown, so that no two rows
    # look identical.
    extra_keys: list[str] = field(default_factory=list)
    # Configurations (row of ``frame`` -> why) whose every successful run did not train like the best run of its
    # data (report/training_check.py): their status reads LAGS, and summary.md lists why.
    lagging: dict[int, str] = field(default_factory=dict)

    @property
    def cpu_only(self) -> bool:
        return "device" in self.frame and len(self.frame) > 0 and (self.frame["device"].map(str) == "cpu").all()


def _differing_options(eff: pd.DataFrame) -> list[str]:
    # an option set for some methods only (quant_type) differs when its set values do, not by being unset where it
    # does not apply (results/labels.differing: the labels' rule); ``eff``: the runs' effective configuration
    return differing(eff, [c for c in config_columns(eff, measurement_if_varying=True) if c not in KEY_COLUMNS])


def summarize(df: pd.DataFrame, sort: str | None = None, group_by: str | None = None) -> SummaryTable:
    if df.empty:
        return SummaryTable(pd.DataFrame(columns=[c for c, _, _ in HEADLINE]), {})
    df = df.copy()
    for col in NUM_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="coerce") if col in df else float("nan")
    eff = effective_frame(df)  # once: the key and the differing options both read it
    df["_key"] = config_key(eff, measurement_if_varying=True)
    extra = _differing_options(eff)
    frame = _aggregate(df, extra)
    if group_by and group_by in frame:
        frame = frame.sort_values([group_by] + ([sort] if sort and sort in frame else []),
                                  ascending=[True] + ([False] if sort and sort in frame else []))
    elif sort and sort in frame:
        frame = frame.sort_values(sort, ascending=False, na_position="last")
    frame = frame.reset_index(drop=True)
    lagging = _lagging_configurations(df, frame.pop("_key"))
    constant = {}
    if len(frame) > 1:  # an option that applies to no row (None everywhere) is not a fact about the runs
        for col in KEY_COLUMNS:
            if col in frame and frame[col].map(str).nunique() == 1 and frame[col].notna().all():
                constant[col] = frame[col].iloc[0]
    return SummaryTable(frame, constant, extra, lagging)


LAGS = "ok, loss lags"  # the status a table shows for a configuration in ``SummaryTable.lagging``


def _lagging_configurations(df: pd.DataFrame, keys: pd.Series) -> dict[int, str]:
    """Position in ``keys`` (the table's configurations, in order) -> why, for each configuration whose every
    successful run of ``df`` (runs, with ``_key``) training_check flags."""
    ok = df[df["status"].map(str) == "ok"] if "status" in df else df.iloc[0:0]
    flags = training_check.lagging_runs(ok)
    if not flags:
        return {}
    every = pd.Series(ok.index.isin(list(flags)), index=ok.index).groupby(ok["_key"]).all()
    why = {ok.at[i, "_key"]: line for i, line in reversed(list(flags.items()))}  # a configuration's first run's
    return {pos: why[key] for pos, key in enumerate(keys) if bool(every.get(key, False))}


def _ci95_column(groups, col: str) -> pd.Series:
    """ci95 for every group at once (the same numbers as ``ci95``)."""
    n, sd = groups[col].count(), groups[col].std(ddof=1)
    t = n.map(lambda k: _T95[k - 2] if 2 <= k <= len(_T95) + 1 else 1.96)
    half = t * sd / n.pow(0.5)
    return half.where(n >= 2).astype(object).where(n >= 2, None)


def _aggregate(df: pd.DataFrame, extra: list[str]) -> pd.DataFrame:
    """One row per configuration (``_key``), in first-seen order: the first run's options, the statuses, the
    repeats, and each figure's mean and 95% CI over the successful runs (over all runs when none succeeded)."""
    keys = df["_key"]
    firsts = df.drop_duplicates("_key").set_index("_key")
    status = df["status"].map(str) if "status" in df else pd.Series("?", index=df.index)
    is_ok = status == "ok"
    any_ok = is_ok.groupby(keys, sort=False).any()
    # each configuration's runs that count: the successful ones, or all of them when none succeeded
    counted = df[is_ok | ~keys.map(any_ok).astype(bool)]
    groups = counted.groupby("_key", sort=False)
    frame = pd.DataFrame(index=firsts.index)
    for col in KEY_COLUMNS + extra + ["device"]:
        frame[col] = firsts[col] if col in firsts else None
    frame["status"] = status.groupby(keys, sort=False).agg(lambda s: ",".join(sorted(set(s))))
    frame["repeats"] = keys.groupby(keys, sort=False).size()
    for col in NUM_COLUMNS:
        frame[col] = groups[col].mean().astype(object)
        frame[col] = frame[col].where(frame[col].notna(), None)
        frame[f"{col}_ci95"] = _ci95_column(groups, col)
    failed = (frame["status"] != "ok") & ~any_ok  # a failed run keeps its peak memory (OOM: where it stopped)
    for col in ("tokens_per_s", "tokens_per_s_per_gpu", "real_tokens_per_s"):
        frame.loc[failed, col] = None
    errors = firsts["error_message"] if "error_message" in firsts else pd.Series(None, index=firsts.index)
    frame["error"] = errors.where(frame["status"] != "ok", None)
    return frame.rename_axis("_key").reset_index()  # each row's configuration key kept as a column


def _fmt(value, kind: str, ci=None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if kind == "gib":
        text, ci = f"{value / GIB:.2f}", None if ci is None else ci / GIB
    elif kind == "pct":
        text, ci = f"{100 * value:.1f}", None if ci is None else 100 * ci
    elif kind == "mj":
        text, ci = f"{1000 * value:.2f}", None if ci is None else 1000 * ci
    elif kind == "num":  # the one number format (console.fmt_num): "4,464", "82.7", never "82.743"
        text = fmt_num(value)
    elif kind == "sec":
        text = f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"
    else:
        return str(value)
    if ci is not None and not math.isnan(ci):
        text += f" ± {fmt_num(ci)}" if kind == "num" else f" ± {ci:.2g}"
    return text


def display_rows(table: SummaryTable, with_ci: bool | set[str] = True) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells. Constant columns go to the header line; columns empty in every row, and the
    per-GPU throughput when every run used one GPU, are left out. ``with_ci``: every column's 95% interval
    beside its mean (repeats), or only those of the columns named."""
    skip = set(table.constant)
    if str(table.constant.get("world_size")) == "1":
        skip.add("tokens_per_s_per_gpu")
    if table.cpu_only:
        skip.update(GPU_ONLY)
    elif "device" in table.frame and not (table.frame["device"].map(str) == "cpu").any():
        skip.add("host_peak_rss")  # GPU runs: device memory is the figure; host RSS stays in summary.csv
    headline = list(HEADLINE)
    at = max(i for i, (_, _, k) in enumerate(headline) if k == "key") + 1
    headline[at:at] = [(c, c, "key") for c in table.extra_keys]
    cols = [(c, h, k) for c, h, k in headline if c in table.frame.columns and c not in skip]
    # an option that applies to no row (compile mode where nothing compiled) is no column either
    cols = [(c, h, k) for c, h, k in cols if k == "status" or table.frame[c].notna().any()]
    headers = [_header(h, table) for _, h, _ in cols]
    rows = []
    for i, r in table.frame.iterrows():
        rows.append([LAGS if k == "status" and i in table.lagging else
                     _fmt(r.get(c), k, r.get(f"{c}_ci95") if with_ci is True or c in (with_ci or ()) else None)
                     for c, _, k in cols])
    return headers, rows


REPEATS_NOTE = "Repeats are aggregated: mean ± 95% confidence interval (Student t)."


def has_repeats(table: SummaryTable) -> bool:
    return bool(len(table.frame)) and "repeats" in table.frame and table.frame["repeats"].max() > 1


def _header(name: str, table: SummaryTable) -> str:
    """A column's header: "GPUs" counts processes ("procs") when every run ran on the CPU."""
    return "procs" if name == "GPUs" and table.cpu_only else name


def header_line(table: SummaryTable) -> str:
    names = {c: _header(h, table) for c, h, _ in HEADLINE}
    return ", ".join(f"{names.get(k, k)}: {v}" for k, v in table.constant.items())


def to_markdown(table: SummaryTable, title: str = "ftprof report") -> str:
    headers, rows = display_rows(table)
    lines = [f"# {title}", ""]
    if table.constant:
        lines += [f"All runs: {header_line(table)}.", ""]
    if table.cpu_only:
        lines += [CPU_NOTE, ""]
    if has_repeats(table):
        lines += [REPEATS_NOTE, ""]
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("| " + " | ".join("---" for _ in headers) + " |")
    for row, (i, r) in zip(rows, table.frame.iterrows(), strict=True):
        cells = [c if r.get("status") == "ok" and i not in table.lagging else f"**{c}**" if h == "status" else c
                 for c, h in zip(row, headers, strict=True)]
        lines.append("| " + " | ".join(cells) + " |")
    if table.lagging:
        lines += ["", f"Did not train like the others ({LAGS}; left out of the pick below):", ""]
        lines += [f"- {_row_name(table.frame.loc[i])}: {why}" for i, why in table.lagging.items()]
    failed = table.frame[table.frame["status"] != "ok"] if "status" in table.frame else table.frame.iloc[0:0]
    if len(failed):
        lines += ["", "Failed runs:", ""]
        lines += [f"- {_row_name(r)}: **{r.get('status')}**" + (f": {r.get('error')}" if r.get("error") else "")
                  for _, r in failed.iterrows()]
    return "\n".join(lines) + "\n"


def _row_name(r: pd.Series) -> str:
    return f"{r.get('method')} batch {r.get('batch_size')} seq {r.get('seq_len')}"


def to_csv_frame(table: SummaryTable) -> pd.DataFrame:
    """summary.csv: the headline columns (raw units) with their CI columns, constant ones included."""
    cols = [c for c, _, _ in HEADLINE if c in table.frame.columns] + table.extra_keys
    extra = [f"{c}_ci95" for c in NUM_COLUMNS if f"{c}_ci95" in table.frame.columns] + ["repeats", "error"]
    frame = table.frame[cols + [c for c in extra if c in table.frame.columns]]
    if table.lagging:  # why each configuration that did not train like the others lags
        frame = frame.assign(loss_lags=[table.lagging.get(i) for i in frame.index])
    return frame
