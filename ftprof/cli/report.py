"""`ftprof report RESULTS...`: tables (terminal, CSV, Markdown), plots, HTML; --baseline flags regressions."""

from __future__ import annotations

import argparse

from rich.table import Table

from ftprof.cli.common import path_argument
from ftprof.console import make_console
from ftprof.results.status import status_style


def _percent(text: str) -> float:
    """A finite, non-negative percentage (NaN would disable the regression gate)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite percentage >= 0, got '{text}'")
    return value


THRESHOLD_PCT = 5.0


def report_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "report", help="turn run directories into tables, CSV, Markdown, plots and an HTML report",
        description="Read every run directory under the given paths (bench sweeps and single runs alike) and write "
                    "raw_summary.csv, summary.csv, summary.md, PNG plots and report.html. With --baseline, compare "
                    "matching experiments and exit 1 on a regression beyond --threshold percent, or when nothing was "
                    "compared: no configuration matches one of the baseline, or none that does has the data (a "
                    "successful run a side, tokens/s with a spread).")
    parser.add_argument("paths", nargs="+", help="results directories or run directories")
    parser.add_argument("--baseline", type=path_argument, help="results directory to compare against")
    parser.add_argument("--threshold", type=_percent,
                        help=f"regression threshold in percent, with --baseline (default {THRESHOLD_PCT:g})")
    parser.add_argument("--format", default="all", choices=("all", "md", "csv"),
                        help="what to write: all (tables, plots, HTML), md or csv (default all)")
    parser.add_argument("--group-by", help="group rows by this column (e.g. method)")
    parser.add_argument("--sort", default="tokens_per_s", help="sort by this column, descending (default tokens_per_s)")
    parser.add_argument("--output-dir", help="where to write (default: <first path>/report)")
    parser.add_argument("--report-to", metavar="TRACKERS",
                        help="also send the summary table to these experiment trackers: tensorboard, wandb, mlflow "
                             "(comma-separated, or all); TensorBoard logs and the MLflow store go under the first path")
    parser.set_defaults(func=report_command)
    return parser


def terminal_table(report) -> Table:
    from ftprof.report.tables import REPEATS_NOTE, display_rows, has_repeats, header_line

    # the throughput's interval only (every column's is in summary.md/csv): repeats are no longer a bare mean
    headers, rows = display_rows(report.table, with_ci={"tokens_per_s"})
    title = "ftprof report" + (f"  ({header_line(report.table)})" if report.table.constant else "")
    caption = REPEATS_NOTE.replace("mean ±", "tokens/s is the mean ±") + " Every column's: summary.md" \
        if has_repeats(report.table) else None
    table = Table(title=title, header_style="bold", caption=caption)
    for h in headers:
        table.add_column(h, justify="left" if h in ("method", "model", "status", "dtype") else "right")
    status_idx = headers.index("status") if "status" in headers else None
    for row in rows:
        style = None
        if status_idx is not None and row[status_idx] != "ok":
            style = status_style(row[status_idx])
            row = row[:status_idx] + [f"[bold]{row[status_idx]}[/bold]"] + row[status_idx + 1:]
        table.add_row(*row, style=style)
    return table


def choose_table(choice) -> Table | None:
    """The "which should I pick?" answer in the terminal: per memory budget the fastest configuration that fits."""
    from ftprof.console import fmt_gib, fmt_num
    from ftprof.metrics import BUDGET_MARGIN_WORDS

    if choice is None or not choice.configurations:
        return None
    table = Table(title=f"Which should I pick? (peak: {choice.memory_source}, fits = leaves a margin of "
                        f"{BUDGET_MARGIN_WORDS} free)", header_style="bold")
    for name in ("memory budget", "fastest that fits", choice.throughput, "peak GiB", "vs fastest"):
        table.add_column(name, justify="left" if name in ("memory budget", "fastest that fits") else "right")
    for p in choice.picks:
        if p.choice is None:
            table.add_row(p.budget, "[dim]nothing measured fits[/dim]", "-", "-", "-")
        else:
            table.add_row(p.budget, p.choice.label, fmt_num(p.choice.tokens_per_s), fmt_gib(p.choice.peak_bytes),
                          f"{p.cost_pct:+.1f}%")
    return table


def _print_gate(console, cmp, threshold: float) -> None:
    """The comparison's verdicts that need a word, then the gate's one-line outcome."""
    from rich.markup import escape

    from ftprof.report.compare import INCONCLUSIVE, NOT_COMPARED

    for c in cmp.configs:
        if c.verdict in (INCONCLUSIVE, NOT_COMPARED):
            console.print(f"[yellow]{c.verdict}[/yellow] {escape(c.experiment)}: {escape('; '.join(c.reasons))}")
    if cmp.nothing_compared:  # a gate that compared nothing has not passed
        console.print(f"[red]nothing compared[/red]: {escape(cmp.why_nothing())}")
    elif not cmp.failed:
        inconclusive = [c for c in cmp.checked if c.verdict == INCONCLUSIVE]
        n = len(cmp.checked)
        console.print(f"[green]no regression beyond {threshold:g}%[/green] ({n} configuration{'' if n == 1 else 's'} "
                      "compared" + (f", {len(inconclusive)} inconclusive" if inconclusive else "")
                      + (f"; {len(cmp.unchecked)} without the data to compare" if cmp.unchecked else "") + ")")


def report_command(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from ftprof.config import normalize_report_to
    from ftprof.errors import ConfigError
    from ftprof.exporters import check_exporters
    from ftprof.report.build import build_report

    if args.threshold is not None and args.baseline is None:
        raise ConfigError("--threshold applies to the comparison with --baseline, and none was given")
    threshold = THRESHOLD_PCT if args.threshold is None else args.threshold
    trackers = normalize_report_to(args.report_to)  # bad names and missing packages: one line, before any work
    check_exporters(trackers or ())

    report = build_report(args.paths, args.output_dir, baseline=args.baseline, threshold_pct=threshold,
                          sort=args.sort, group_by=args.group_by, formats=args.format)
    console = make_console()
    warn = make_console(stderr=True)  # stdout stays the report (people redirect it), what was left out goes beside it
    for problem in report.problems:
        warn.print(f"[yellow]skipped[/yellow] {escape(problem)}")
    console.print(terminal_table(report))
    if report.table.cpu_only:
        from ftprof.report.tables import CPU_NOTE

        console.print(f"[dim]{CPU_NOTE}[/dim]")
    choice = choose_table(report.choice)
    if choice is not None:
        console.print(choice)
        if not report.choice.on_gpu:
            console.print("[dim]CPU runs: the peak is host memory, so the GPU budgets are indicative only.[/dim]")
    cmp = report.comparison
    if cmp is not None:
        for c in cmp.regressions:
            console.print(f"[red]regression[/red] {c.experiment}: {'; '.join(c.reasons)}"
                          + (f" [dim](profile: {c.cause})[/dim]" if c.cause else ""))
        _print_gate(console, cmp, threshold)
    console.print(f"[dim]wrote {', '.join(sorted(report.files))} to {report.out_dir}[/dim]")
    if trackers:
        from pathlib import Path

        from ftprof.exporters import send_summary
        from ftprof.report.tables import to_csv_frame

        sweep_dir = Path(args.paths[0])
        for where in send_summary(to_csv_frame(report.table), trackers, sweep_dir, sweep_dir.resolve().name):
            console.print(f"[dim]sent the summary table to {where}[/dim]")
    return 1 if cmp is not None and cmp.failed else 0
