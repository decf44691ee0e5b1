"""Run rows -> the tables a person reads: headline columns, repeats aggregated (mean and 95% CI), failures kept."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import pandas as pd

from ftprof.console import fmt_num
from ftprof.metrics import GIB
from ftprof.results.load import read_runs

# Columns of summary.csv / summary.md: (source column, header, kind). Kind says how to format and aggregate.
HEADLINE = [
    ("method", "method", "key"), ("model", "model", "key"), ("world_size", "GPUs", "key"),
    ("batch_size", "batch/GPU", "key"), ("seq_len", "seq len", "key"), ("grad_accum", "grad accum", "key"),
    ("checkpointing", "checkpointing", "key"), ("kernels", "kernels", "key"), ("compile", "compile", "key"),
    ("compile_mode", "compile mode", "key"), ("sdpa_backend", "attention", "key"), ("dtype", "dtype", "key"),
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
CPU_NOTE = ("CPU runs: memory is the host RSS peak; GPU-only figures (MFU, per-GPU throughput, allocator and NVML "
            "peaks, energy) do not apply and are left out.")
KEY_COLUMNS = [c for c, _, kind in HEADLINE if kind == "key"]
NUM_COLUMNS = [c for c, _, kind in HEADLINE if kind not in ("key", "status")]
# Options that do not change what is measured: ignored when matching repeats and baselines.
# gradient_checkpointing is the yes/no derived from the checkpointing policy (HF's spelling); the policy is the column.
NOT_CONFIG = {"output_dir", "run_name", "quiet", "run_dir", "prof_output_dir", "memory_logging", "seed",
              "gradient_checkpointing", "slurm_job_id", "slurm_nodes"}  # slurm_*: where bench ran it

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
    df = pd.DataFrame(report.rows)
    if "world_size" not in df and len(df):
        df["world_size"] = 1
    return with_checkpointing_policy(df)


def with_checkpointing_policy(df: pd.DataFrame) -> pd.DataFrame:
    """Runs recorded before the checkpointing policy existed have only the yes/no: their policy is full or none."""
    if "gradient_checkpointing" not in df or not len(df):
        return df
    df = df.copy()
    implied = df["gradient_checkpointing"].map(lambda v: None if v is None or v != v else "full" if v else "none")
    df["checkpointing"] = df["checkpointing"].where(df["checkpointing"].notna(), implied) \
        if "checkpointing" in df else implied
    return df


# Of those, options that do change the step time a little (what measuring costs): a configuration of their own in a
# table when they vary across the runs shown (an overhead sweep), ignored otherwise and when matching baselines.
MEASUREMENT_OPTIONS = ("memory_logging",)


def config_columns(df: pd.DataFrame, measurement_if_varying: bool = False) -> list[str]:
    """Columns that identify an experiment's configuration (from config.json), for repeats and baselines."""
    from ftprof.config import flat_field_owners

    cols = [c for c in flat_field_owners() if c in df.columns and c not in NOT_CONFIG]
    if measurement_if_varying:
        cols += [c for c in MEASUREMENT_OPTIONS if c in df.columns and df[c].map(str).nunique() > 1]
    return cols


def config_key(df: pd.DataFrame, measurement_if_varying: bool = False) -> pd.Series:
    cols = config_columns(df, measurement_if_varying)
    if not cols:
        return pd.Series([""] * len(df), index=df.index)
    return df[cols].apply(lambda row: "|".join(str(v) for v in row), axis=1)


@dataclass
class SummaryTable:
    frame: pd.DataFrame  # one row per configuration: headline columns (means) + *_ci95 + repeats
    constant: dict[str, object]  # columns equal in every row, lifted into a header line
    # Options outside the headline that differ between rows (max_steps, lora_r, ...): shown, so that no two rows
    # look identical.
    extra_keys: list[str] = field(default_factory=list)

    @property
    def cpu_only(self) -> bool:
        return "device" in self.frame and len(self.frame) > 0 and (self.frame["device"].map(str) == "cpu").all()


def _differing_options(df: pd.DataFrame) -> list[str]:
    # an option set for some methods only (quant_type) differs when its set values do, not by being unset
    return [c for c in config_columns(df, measurement_if_varying=True)
            if c not in KEY_COLUMNS and df[c].dropna().map(str).nunique() > 1]


def summarize(df: pd.DataFrame, sort: str | None = None, group_by: str | None = None) -> SummaryTable:
    if df.empty:
        return SummaryTable(pd.DataFrame(columns=[c for c, _, _ in HEADLINE]), {})
    df = df.copy()
    for col in NUM_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="coerce") if col in df else float("nan")
    df["_key"] = config_key(df, measurement_if_varying=True)
    extra = _differing_options(df)
    rows = []
    for _, group in df.groupby("_key", sort=False):
        first = group.iloc[0]
        row = {c: first.get(c) for c in KEY_COLUMNS + extra}
        row["device"] = first.get("device")
        ok = group[group["status"] == "ok"] if "status" in group else group
        statuses = sorted(set(group.get("status", pd.Series(["?"]))))
        row["status"] = statuses[0] if len(statuses) == 1 else ",".join(statuses)
        row["repeats"] = len(group)
        for col in NUM_COLUMNS:
            values = [float(v) for v in (ok if len(ok) else group)[col].dropna()]
            row[col] = sum(values) / len(values) if values else None
            row[f"{col}_ci95"] = ci95(values)
        if row["status"] != "ok" and len(ok) == 0:  # a failed run keeps its peak memory (OOM: where it stopped)
            for col in ("tokens_per_s", "tokens_per_s_per_gpu", "real_tokens_per_s"):
                row[col] = None
        row["error"] = first.get("error_message") if row["status"] != "ok" else None
        rows.append(row)
    frame = pd.DataFrame(rows)
    if group_by and group_by in frame:
        frame = frame.sort_values([group_by] + ([sort] if sort and sort in frame else []),
                                  ascending=[True] + ([False] if sort and sort in frame else []))
    elif sort and sort in frame:
        frame = frame.sort_values(sort, ascending=False, na_position="last")
    frame = frame.reset_index(drop=True)
    constant = {}
    if len(frame) > 1:
        for col in KEY_COLUMNS:
            if col in frame and frame[col].map(str).nunique() == 1:
                constant[col] = frame[col].iloc[0]
    return SummaryTable(frame, constant, extra)


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


def display_rows(table: SummaryTable, with_ci: bool = True) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells. Constant columns go to the header line; columns empty in every row, and the
    per-GPU throughput when every run used one GPU, are left out."""
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
    cols = [(c, h, k) for c, h, k in cols if k in ("key", "status") or table.frame[c].notna().any()]
    headers = [h for _, h, _ in cols]
    rows = []
    for _, r in table.frame.iterrows():
        rows.append([_fmt(r.get(c), k, r.get(f"{c}_ci95") if with_ci else None) for c, _, k in cols])
    return headers, rows


def header_line(table: SummaryTable) -> str:
    names = {c: h for c, h, _ in HEADLINE}
    return ", ".join(f"{names.get(k, k)}: {v}" for k, v in table.constant.items())


def to_markdown(table: SummaryTable, title: str = "ftprof report") -> str:
    headers, rows = display_rows(table)
    lines = [f"# {title}", ""]
    if table.constant:
        lines += [f"All runs: {header_line(table)}.", ""]
    if table.cpu_only:
        lines += [CPU_NOTE, ""]
    if len(table.frame) and "repeats" in table.frame and table.frame["repeats"].max() > 1:
        lines += ["Repeats are aggregated: mean ± 95% confidence interval (Student t).", ""]
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("| " + " | ".join("---" for _ in headers) + " |")
    for row, (_, r) in zip(rows, table.frame.iterrows(), strict=True):
        cells = [c if r.get("status") == "ok" else f"**{c}**" if h == "status" else c
                 for c, h in zip(row, headers, strict=True)]
        lines.append("| " + " | ".join(cells) + " |")
    failed = table.frame[table.frame["status"] != "ok"] if "status" in table.frame else table.frame.iloc[0:0]
    if len(failed):
        lines += ["", "Failed runs:", ""]
        lines += [f"- {r.get('method')} batch {r.get('batch_size')} seq {r.get('seq_len')}: **{r.get('status')}**"
                  + (f": {r.get('error')}" if r.get("error") else "") for _, r in failed.iterrows()]
    return "\n".join(lines) + "\n"


def to_csv_frame(table: SummaryTable) -> pd.DataFrame:
    """summary.csv: the headline columns (raw units) with their CI columns, constant ones included."""
    cols = [c for c, _, _ in HEADLINE if c in table.frame.columns] + table.extra_keys
    extra = [f"{c}_ci95" for c in NUM_COLUMNS if f"{c}_ci95" in table.frame.columns] + ["repeats", "error"]
    return table.frame[cols + [c for c in extra if c in table.frame.columns]]
