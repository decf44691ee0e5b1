"""The report's "Slow steps" section: every run that had steps well over its steady median, and what took the
extra time (``ftprof.metrics.slow_steps`` decided both when the run ended; this only lists them)."""

from __future__ import annotations

import json

import pandas as pd

from ftprof.console import slow_step_line
from ftprof.metrics import SLOW_STEP_RATIO

SHOWN_PER_RUN = 5


def runs_with_slow_steps(df: pd.DataFrame) -> list[tuple[str, list[dict]]]:
    """(run name, slow steps) for each run that recorded any, in the frame's order."""
    if "slow_steps" not in df:
        return []
    out = []
    for name, cell in zip(df["run_name"], df["slow_steps"], strict=True):
        try:
            steps = json.loads(cell) if isinstance(cell, str) else []
        except ValueError:
            continue
        if steps:
            out.append((str(name), steps))
    return out


def to_markdown(df: pd.DataFrame) -> str:
    """The section, or "" when no run had a slow step."""
    runs = runs_with_slow_steps(df)
    if not runs:
        return ""
    lines = ["## Slow steps", "",
             f"Steps at least {SLOW_STEP_RATIO:g}x their run's steady median, with the host cause that took most of "
             "the extra time (README \"Definitions\"); warm-up steps only where a host cause explains them.", ""]
    for name, steps in runs:
        shown = "; ".join(slow_step_line(s) for s in steps[:SHOWN_PER_RUN])
        more = f"; {len(steps) - SHOWN_PER_RUN} more" if len(steps) > SHOWN_PER_RUN else ""
        lines.append(f"- {name}: {shown}{more}")
    return "\n".join(lines) + "\n"
