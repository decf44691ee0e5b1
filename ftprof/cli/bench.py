"""`ftprof bench SWEEP.yaml`: run a grid of experiments, each in its own process; failures are rows too."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ftprof.console import fmt_gib, fmt_num
from ftprof.results.status import status_style


def bench_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench", help="run a sweep of experiments from YAML, one process each, recording failures as results",
        description="Run every experiment of a sweep file in its own process. Finished experiments are skipped "
                    "when the same sweep runs again; --retry-failed reruns failed ones, --force reruns all.")
    parser.add_argument("sweep", help="sweep file (YAML)")
    parser.add_argument("--dry-run", action="store_true", help="print the experiments and commands, run nothing")
    parser.add_argument("--output-dir", help="results directory (default: results/<sweep name>)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="skip finished experiments (the default)")
    mode.add_argument("--force", action="store_true", help="rerun every experiment")
    parser.add_argument("--retry-failed", action="store_true", help="rerun experiments that failed (OOM, timeout...)")
    parser.set_defaults(func=bench_command)
    return parser


class BenchDisplay:
    """Overall progress bar, the experiments running now, the last result."""

    def __init__(self, console: Console, total: int):
        self.console = console
        self.progress = Progress(TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=console)
        self.task = self.progress.add_task("bench", total=total)
        self.running: list[str] = []
        self.last = ""
        self.live = Live(self._render(), console=console, refresh_per_second=4, transient=False)

    def _render(self) -> Group:
        lines = [f"[cyan]running[/cyan] {name}" for name in self.running]
        if self.last:
            lines.append(self.last)
        return Group(self.progress, *lines)

    def event(self, kind: str, payload) -> None:
        if kind == "start":
            self.running.append(payload.experiment.name)
        elif kind == "skip":
            self.progress.advance(self.task)
            self.last = f"[dim]skipped {payload.experiment.name} ({payload.previous})[/dim]"
        elif kind == "finish":
            if payload.name in self.running:
                self.running.remove(payload.name)
            self.progress.advance(self.task)
            style = status_style(payload.status)
            tps = payload.result.get("tokens_per_s")
            self.last = (f"last: {payload.name} [{style}]{payload.status}[/{style}] in {payload.seconds:.0f} s"
                         + (f", {tps:,.0f} tok/s" if tps else ""))
        self.live.update(self._render())


def results_table(rows: list[dict], title: str, keys: list[str]) -> Table:
    """The short end-of-sweep table: the options that vary, then the headline figures."""
    table = Table(title=title, header_style="bold")
    keys = keys or ["experiment"]
    for col in (*keys, "status", "tokens/s", "step p50 (s)", "MFU", "torch peak GiB", "NVML peak GiB"):
        table.add_column(col, justify="left" if col in (*keys, "status") else "right")
    for r in rows:
        style = status_style(r.get("status"))
        mfu = r.get("mfu")
        table.add_row(*(str(r.get(k, "")) for k in keys), f"[{style}]{r.get('status')}[/{style}]",
                      fmt_num(_num(r, "tokens_per_s")),
                      fmt_num(_num(r, "step_time_p50_s"), ".3f"), "-" if _num(r, "mfu") is None else
                      f"{100 * float(mfu):.1f}%", fmt_gib(_num(r, "torch_peak_allocated")),
                      fmt_gib(_num(r, "nvml_device_used_peak")))
    return table


def _num(row: dict, key: str):
    value = row.get(key)
    return None if value in (None, "") else float(value)


def bench_command(args: argparse.Namespace) -> int:
    from ftprof.bench.runner import BenchRunner, gpu_slots, plan, replay_command
    from ftprof.bench.sweep import load_sweep
    from ftprof.results.load import read_runs

    sweep = load_sweep(args.sweep)
    out_dir = Path(args.output_dir or Path("results") / sweep.name)
    planned = plan(sweep, out_dir, force=args.force, retry_failed=args.retry_failed)
    console = Console(highlight=False)
    slots = gpu_slots()
    if args.dry_run:
        table = Table(title=f"sweep {sweep.name}: {len(planned)} experiments -> {out_dir}", header_style="bold")
        for col in ("experiment", "action", *sweep.varying):
            table.add_column(col)
        for p in planned:
            table.add_row(p.experiment.name, p.action + (f" ({p.previous})" if p.previous else ""),
                          *(str(p.experiment.values.get(k, "")) for k in sweep.varying))
        console.print(table)
        console.print(f"GPU slots: {', '.join(slots) if slots else 'none (CPU: one experiment at a time)'}; "
                      f"memory logging: {sweep.memory_logging}; timeout {sweep.timeout_s:g} s")
        for p in planned:
            console.print(" ".join(shlex.quote(c) for c in replay_command(p.experiment, p.run_dir)), soft_wrap=True)
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    display = BenchDisplay(console, len(planned))
    runner = BenchRunner(sweep, out_dir, planned, on_event=display.event, slots=slots)
    if not slots:
        console.print("[dim]no GPU: experiments run one at a time; NVML sampling is skipped[/dim]")
    with display.live:
        runner.run()
    summary = runner.write_summary()
    names = {p.experiment.name for p in planned}
    rows = [dict(r, experiment=Path(r["run_dir"]).name) for r in read_runs([out_dir]).rows
            if Path(r["run_dir"]).name in names]
    console.print(results_table(rows, f"sweep {sweep.name}", sweep.varying))
    console.print(f"[dim]wrote {summary}[/dim]")
    if runner.interrupted:
        console.print("[yellow]interrupted[/yellow]: run the same command again to resume")
        return 130
    return 0
