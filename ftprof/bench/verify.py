"""``ftprof plan --verify K``: run the plan's top K through ``ftprof bench`` (one process each, failures kept as
results), then put each run's prediction (the one it recorded before loading) beside what it measured."""

from __future__ import annotations

from pathlib import Path

from ftprof.plan import accuracy


def run_top(sweep_file: Path, out_dir: Path) -> list[Path]:
    """Run the sweep file into ``out_dir`` (resumable, as any sweep); the experiments' run directories."""
    from ftprof.bench.flow import run_sweep
    from ftprof.bench.sweep import load_sweep

    sweep = load_sweep(sweep_file)
    run_sweep(sweep, out_dir, dir_option="--plan-dir")  # out_dir: <plan dir>/verify
    return [out_dir / e.name for e in sweep.experiments]


def compare(run_dirs: list[Path]):
    """(per-run comparison, per-quantity summary) of the runs that finished with a prediction; runs that failed
    are listed with their status by the caller (an OOM is the prediction's worst outcome)."""
    rows = []
    for run_dir in run_dirs:
        try:
            rows.append(accuracy.row_from_run_dir(run_dir))
        except (ValueError, OSError):
            continue  # no result (the experiment did not start): bench reported it
    return accuracy.comparison(rows), accuracy.summarize(rows), rows
