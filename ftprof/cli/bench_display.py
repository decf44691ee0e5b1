"""What `ftprof bench` shows while a sweep runs. On a terminal, a rich Live display (progress bar, the experiments
running now, the last result); into a pipe or a file, one plain line per event as it happens (a finished experiment:
its name, status, tokens/s and time), flushed at once, never a redrawn frame that the next line would be glued to."""

from __future__ import annotations

import sys
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ftprof.results.status import status_style


def finish_text(outcome) -> tuple[str, str]:
    """(status, "1,234 tok/s, 45 s") of a finished experiment."""
    tps = outcome.result.get("tokens_per_s")
    figures = ([f"{tps:,.0f} tok/s"] if tps else []) + [f"{outcome.seconds:.0f} s"]
    return outcome.status, ", ".join(figures)


class LiveBenchDisplay:
    """Overall progress bar, the experiments running now, the last result (a terminal only)."""

    def __init__(self, console: Console, total: int):
        self.console = console
        self.progress = Progress(TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=console)
        self.task = self.progress.add_task("bench", total=total)
        self.running: list[str] = []
        self.jobs: dict[str, str] = {}  # Slurm: experiment -> job state
        self.last = ""
        self.live = Live(self._render(), console=console, refresh_per_second=4, transient=False)

    def start(self) -> None:
        self.live.start()

    def stop(self) -> None:
        self.live.stop()

    def _render(self) -> Group:
        lines = [f"[cyan]running[/cyan] {name}" for name in self.running]
        if self.jobs:
            counts: dict[str, int] = {}
            for state in self.jobs.values():
                counts[state] = counts.get(state, 0) + 1
            lines.append("slurm: " + ", ".join(f"{n} {state.lower()}" for state, n in sorted(counts.items())))
        if self.last:
            lines.append(self.last)
        return Group(self.progress, *lines)

    def event(self, kind: str, payload) -> None:
        if kind == "start":
            self.running.append(payload.experiment.name)
        elif kind == "skip":
            self.progress.advance(self.task)
            self.last = f"[dim]skipped {payload.experiment.name} ({payload.previous})[/dim]"
        elif kind == "submit":
            planned, job_id = payload
            self.jobs[planned.experiment.name] = "SUBMITTED"
            self.last = f"[dim]submitted {planned.experiment.name} as job {job_id}[/dim]"
        elif kind == "state":
            planned, job = payload
            self.jobs[planned.experiment.name] = job.state
            if job.state == "RUNNING" and job.nodes:
                self.last = f"[cyan]running[/cyan] {planned.experiment.name} (job {job.job_id} on {job.nodes})"
        elif kind == "finish":
            self._finish(payload)
        self.live.update(self._render())

    def _finish(self, outcome) -> None:
        if outcome.name in self.jobs:
            self.jobs[outcome.name] = "DONE" if outcome.status == "ok" else "FAILED"
        if outcome.name in self.running:
            self.running.remove(outcome.name)
        self.progress.advance(self.task)
        status, figures = finish_text(outcome)
        style = status_style(status)
        self.last = f"last: {outcome.name} [{style}]{status}[/{style}], {figures}"


class PlainBenchDisplay:
    """One line per event, written and flushed as it happens: ``[3/12] name ok, 1,234 tok/s, 45 s``."""

    def __init__(self, total: int, out: TextIO | None = None):
        self.total = total
        self.done = 0
        self.out = out

    def start(self) -> None:
        self._line(f"bench: {self.total} experiment{'s' if self.total != 1 else ''}")

    def stop(self) -> None:
        pass

    def _line(self, text: str) -> None:
        out = self.out or sys.stdout  # looked up late: tests and callers may swap sys.stdout
        out.write(text + "\n")
        out.flush()

    def _count(self) -> str:
        self.done += 1
        return f"[{self.done}/{self.total}]"

    def event(self, kind: str, payload) -> None:
        if kind == "start":
            self._line(f"started {payload.experiment.name}")
        elif kind == "skip":
            self._line(f"{self._count()} {payload.experiment.name} skipped ({payload.previous})")
        elif kind == "submit":
            planned, job_id = payload
            self._line(f"submitted {planned.experiment.name} as job {job_id}")
        elif kind == "state":
            planned, job = payload
            if job.state == "RUNNING":
                self._line(f"running {planned.experiment.name} (job {job.job_id}"
                           + (f" on {job.nodes})" if job.nodes else ")"))
        elif kind == "finish":
            status, figures = finish_text(payload)
            self._line(f"{self._count()} {payload.name} {status}, {figures}")


def bench_display(console: Console, total: int) -> LiveBenchDisplay | PlainBenchDisplay:
    """The live display on a terminal, plain lines anywhere else."""
    return LiveBenchDisplay(console, total) if console.is_terminal else PlainBenchDisplay(total)
