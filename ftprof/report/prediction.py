"""The report's "Prediction error" section: how far each run's prediction (result.json's ``prediction``, made by
ftprof.plan before the run loaded) was from what the run measured. summary.md and report.html get the summary
table (``ftprof.plan.accuracy.summarize``) and the worst cells; prediction_error.csv gets one row per run
(``comparison``, memory in bytes as well as GiB). No section at all when no run recorded a prediction."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ftprof.plan import accuracy
from ftprof.results.store import write_text_atomic

CSV_NAME = "prediction_error.csv"
SHOWN_FAILED = 10  # failed runs with a prediction listed by name


def _pct(value: object, flag: bool = False) -> str:
    if value is None or pd.isna(value):
        return ""
    text = f"{float(value):+.1f}%"
    return f"**{text}**" if flag else text


def _table(summary: pd.DataFrame) -> list[str]:
    flag = -100 * accuracy.UNDER_PREDICTION_FLAG
    lines = ["| quantity | method | runs | median abs error | worst error | worst run | under-predicted >5% |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: |"]
    for r in summary.to_dict("records"):
        memory = r["quantity"] != accuracy.SPEED
        under = "" if r["under_predicted"] is None else str(r["under_predicted"])
        lines.append(f"| {r['quantity']} | {r['method']} | {r['runs']} | {abs(r['median_abs_error_pct']):.1f}% | "
                     f"{_pct(r['worst_error_pct'], memory and r['worst_error_pct'] < flag)} | {r['worst_run']} | "
                     f"{f'**{under}**' if under not in ('', '0') else under} |")
    return lines


def _worst_sentence(summary: pd.DataFrame) -> str:
    """The worst cell of each quantity, over all methods."""
    flag = -100 * accuracy.UNDER_PREDICTION_FLAG
    parts = []
    for r in summary[summary["method"] == accuracy.ALL_METHODS].to_dict("records"):
        memory = r["quantity"] != accuracy.SPEED
        under = " (under-predicted)" if memory and r["worst_error_pct"] < flag else ""
        parts.append(f"{r['quantity']} {_pct(r['worst_error_pct'], bool(under))}{under} for {r['worst_run']}")
    return "Worst: " + "; ".join(parts) + "." if parts else ""


def _notes(df: pd.DataFrame, counts: dict[str, int]) -> list[str]:
    notes = []
    if counts["no_prediction"]:
        notes.append(f"{counts['no_prediction']} ok run(s) recorded no prediction (made before the predictor, or "
                     "without one): not compared.")
    failed = [r for r in df.to_dict("records") if accuracy.has_prediction(r) and r.get("status") != "ok"]
    if failed:
        notes.append(f"{len(failed)} run(s) with a prediction did not finish ok: not compared.")
        for r in failed[:SHOWN_FAILED]:
            peak = accuracy.predicted(r)["memory_bytes"]
            said = f"predicted {peak / accuracy.GIB:.2f} GiB" if peak else "no memory prediction"
            notes.append(f"- {r.get('run_name')} ({r.get('status')}): {said}")
    return notes


def to_markdown(df: pd.DataFrame, csv_written: bool = False) -> str:
    """The section, or "" when no run recorded a prediction."""
    if not len(df) or not any(accuracy.has_prediction(r) for r in df.to_dict("records")):
        return ""
    counts = accuracy.coverage(df)
    summary = accuracy.summarize(df)
    lines = ["## Prediction error", "",
             "How far each run's prediction (result.json's `prediction`, made before the run loaded) was from what "
             "it measured: signed error = (predicted - measured) / measured. Memory under-predicted by more than "
             f"{100 * accuracy.UNDER_PREDICTION_FLAG:g}% is the dangerous direction (a plan that fits, a run that "
             "runs out of memory) and is in bold. A GPU run's measured peak is the allocator's training peak "
             "(`memory_breakdown.training_peak`, else `torch_peak_allocated`); tokens/s are global.", ""]
    if (summary["quantity"] == accuracy.CPU_MEMORY).any():
        lines += [accuracy.CPU_PARTS_WORDS, ""]
    if len(summary):
        lines += _table(summary) + ["", _worst_sentence(summary), ""]
    else:
        lines += ["No ok run with a prediction had a figure to compare.", ""]
    notes = _notes(df, counts)
    if notes:
        lines += notes + [""]
    if csv_written and counts["compared"]:
        lines += [f"Every run's predicted and measured figures: {CSV_NAME}.", ""]
    return "\n".join(lines)


def add_to_report(df: pd.DataFrame, out_dir: Path, files: dict[str, Path], write_csv: bool) -> str:
    """The section for summary.md (and so report.html), "" without predictions; writes prediction_error.csv into
    ``out_dir`` (recorded in ``files``) when ``write_csv`` and a run was compared."""
    section = to_markdown(df, csv_written=write_csv)
    if not section:
        return ""
    table = accuracy.comparison(df, with_bytes=True)
    if write_csv and len(table):
        files[CSV_NAME] = write_text_atomic(Path(out_dir) / CSV_NAME, table.to_csv(index=False))
    return "\n" + section
