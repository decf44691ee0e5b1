"""Runs that were profiled, in the report: each run's fine-tuning buckets as columns, and, against a baseline that
was profiled too, the buckets that explain a configuration's change (the regression's cause)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ftprof.analysis import buckets
from ftprof.analysis.diff import diff_summaries
from ftprof.results.run_dir import PROFILE

SUMMARY = "summary.json"  # the run's last cycle (rank 0), beside the cycle folders
PREFIX = "bucket_"


def run_summary(run_dir: str | Path) -> dict | None:
    """The profile summary of a run directory, or None when it was not profiled (or the file is unreadable)."""
    try:
        data = json.loads((Path(run_dir) / PROFILE / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def with_bucket_columns(df: pd.DataFrame) -> pd.DataFrame:
    """``bucket_<bucket>_ms`` / ``_tflops``, ``bucket_step_ms`` and ``bucket_flops_ratio`` for profiled runs."""
    if "run_dir" not in df or not len(df):
        return df
    rows = [buckets.columns((run_summary(d) or {}).get("breakdown")) for d in df["run_dir"]]
    if not any(rows):
        return df
    extra = pd.DataFrame([{f"{PREFIX}{k}": v for k, v in r.items()} for r in rows], index=df.index)
    return pd.concat([df, extra], axis=1)


def cause(base_dirs: list[str], cur_dirs: list[str]) -> str | None:
    """The buckets that explain the change between two groups of profiled runs ("+41 ms/step: elementwise +35,
    ..."), or None when either side has no profile with buckets."""
    a = [s for s in map(run_summary, base_dirs) if s and s.get("breakdown")]
    b = [s for s in map(run_summary, cur_dirs) if s and s.get("breakdown")]
    if not a or not b:
        return None
    try:
        return diff_summaries(a, b).explanation or None
    except ValueError:  # summaries without buckets
        return None
