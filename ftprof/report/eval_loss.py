"""The report's "Eval loss" section: for each run that evaluated (--eval-steps, --eval-dataset, --eval-split), its
eval loss first, last and best (with the step), how many evaluations and their time (outside the step times)."""

from __future__ import annotations

import math

import pandas as pd

COLUMNS = ("eval_loss_first", "eval_loss_last", "eval_loss_best", "eval_loss_best_step", "eval_runs", "eval_time_s")


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def eval_rows(df: pd.DataFrame) -> list[dict]:
    """One dict per run that has an eval loss, in the frame's order."""
    if "eval_loss_last" not in df:
        return []
    rows = []
    for _, run in df.iterrows():
        if _number(run.get("eval_loss_last")) is None:
            continue
        rows.append({"run": str(run.get("run_name", "")), **{c: _number(run.get(c)) for c in COLUMNS}})
    return rows


def _cell(value: float | None, digits: int) -> str:
    if value is None:
        return ""
    return f"{value:.{digits}f}" if digits else str(int(value))


def to_markdown(df: pd.DataFrame) -> str:
    """The section, or "" when no run evaluated."""
    rows = eval_rows(df)
    if not rows:
        return ""
    lines = ["## Eval loss", "", "Mean loss per label token on the eval split; evaluations run between steps, outside "
             "the step times.", "",
             "| run | first | last | best | best at step | evaluations | eval time (s) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['run']} | {_cell(r['eval_loss_first'], 4)} | {_cell(r['eval_loss_last'], 4)} | "
                     f"{_cell(r['eval_loss_best'], 4)} | {_cell(r['eval_loss_best_step'], 0)} | "
                     f"{_cell(r['eval_runs'], 0)} | {_cell(r['eval_time_s'], 2)} |")
    return "\n".join(lines) + "\n"
