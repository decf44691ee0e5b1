"""Compare a results set against a baseline: match experiments by configuration, flag regressions."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ftprof.report.tables import config_key

# Headline figures and the direction that is better.
FIGURES = {
    "tokens_per_s": "higher", "tokens_per_s_per_gpu": "higher", "real_tokens_per_s": "higher",
    "step_time_p50_s": "lower", "step_time_p90_s": "lower", "mfu": "higher",
    "torch_peak_allocated": "lower", "torch_peak_reserved": "lower", "nvml_device_used_peak": "lower",
    "energy_per_token_j": "lower",
}


@dataclass
class Change:
    experiment: str
    figure: str
    baseline: float | None
    current: float | None
    change_pct: float | None
    regression: bool


@dataclass
class Comparison:
    changes: list[Change]
    unmatched_current: list[str]
    unmatched_baseline: list[str]
    status_regressions: list[str]

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    @property
    def failed(self) -> bool:
        return bool(self.regressions or self.status_regressions)


def _label(row) -> str:
    return f"{row.get('method')} {row.get('model')} b{row.get('batch_size')} s{row.get('seq_len')}" + (
        f" x{row.get('world_size')}" if str(row.get("world_size")) not in ("1", "None", "nan") else "")


def _mean_by_key(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["_key"] = config_key(df)
    for fig in FIGURES:
        df[fig] = pd.to_numeric(df[fig], errors="coerce") if fig in df else float("nan")
    ok = df[df["status"] == "ok"]
    means = ok.groupby("_key")[list(FIGURES)].mean()
    first = df.groupby("_key").first()
    status = df.groupby("_key")["status"].agg(lambda s: "ok" if (s == "ok").any() else s.iloc[0])
    return first.drop(columns=list(FIGURES) + ["status"], errors="ignore").join(means).join(status)


def compare(current: pd.DataFrame, baseline: pd.DataFrame, threshold_pct: float) -> Comparison:
    cur, base = _mean_by_key(current), _mean_by_key(baseline)
    changes: list[Change] = []
    status_regressions: list[str] = []
    for key in cur.index.intersection(base.index):
        c, b = cur.loc[key], base.loc[key]
        label = _label(c)
        if b["status"] == "ok" and c["status"] != "ok":
            status_regressions.append(f"{label}: {b['status']} -> {c['status']}")
            continue
        for fig, better in FIGURES.items():
            bv, cv = b.get(fig), c.get(fig)
            if bv is None or cv is None or (isinstance(bv, float) and math.isnan(bv)) or \
                    (isinstance(cv, float) and math.isnan(cv)) or bv == 0:
                continue
            pct = 100.0 * (cv - bv) / abs(bv)
            worse = -pct if better == "higher" else pct
            changes.append(Change(label, fig, float(bv), float(cv), pct, worse > threshold_pct))
    return Comparison(changes, [_label(cur.loc[k]) for k in cur.index.difference(base.index)],
                      [_label(base.loc[k]) for k in base.index.difference(cur.index)], status_regressions)


def to_markdown(cmp: Comparison, threshold_pct: float) -> str:
    lines = ["## Comparison with the baseline", "",
             f"Regression: a figure worse by more than {threshold_pct:g}% (or a run that stopped succeeding).", ""]
    if cmp.status_regressions:
        lines += [f"- **status regression** {s}" for s in cmp.status_regressions] + [""]
    lines += ["| experiment | figure | baseline | current | change | |", "| --- | --- | ---: | ---: | ---: | --- |"]
    for ch in cmp.changes:
        flag = "**regression**" if ch.regression else ""
        lines.append(f"| {ch.experiment} | {ch.figure} | {ch.baseline:.4g} | {ch.current:.4g} | "
                     f"{ch.change_pct:+.1f}% | {flag} |")
    if cmp.unmatched_current:
        lines += ["", "New (no baseline): " + "; ".join(cmp.unmatched_current)]
    if cmp.unmatched_baseline:
        lines += ["", "Missing (only in the baseline): " + "; ".join(cmp.unmatched_baseline)]
    return "\n".join(lines) + "\n"
