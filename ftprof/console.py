"""Terminal output: a rich progress bar while training (plain progress lines when stdout is not a terminal) and a
summary table at the end. Output that goes to a file or a pipe is never wrapped or cut."""

from __future__ import annotations

import logging
import os
import time
import warnings

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ftprof.config import RunConfig
from ftprof.metrics import GIB
from ftprof.results.schema import RunResult

# Not a terminal: a plain progress line every this many seconds, or every tenth of the run, whichever comes first.
PLAIN_PROGRESS_S = 30.0
PLAIN_PROGRESS_FRACTION = 0.1
FILE_WIDTH = 1000  # a file has no width: tables are laid out at their natural width, nothing is cut with "…"


def make_console(stderr: bool = False) -> Console:
    """rich Console for ftprof's output. On a terminal, its width; into a file or a pipe, no wrapping and no cutting
    (a path or a table row stays one line, whatever COLUMNS says)."""
    console = Console(highlight=False, stderr=stderr)
    if not console.is_terminal:
        console = Console(highlight=False, stderr=stderr, width=FILE_WIDTH, soft_wrap=True)
    return console


# Environment that keeps the libraries ftprof drives quiet (inherited by torchrun workers too).
_QUIET_ENV = {"TRANSFORMERS_VERBOSITY": "error", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
              "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1", "PYTHONWARNINGS": "ignore",
              "TORCH_CPP_LOG_LEVEL": "ERROR",
              # torch.profiler's C++ side (Kineto) logs straight to fd 2. Every profiled run filters its known noise
              # out of fd 2 (ftprof/profiling/kineto_noise.py, which keeps any other line); under --quiet its level
              # setting, above its highest level (USDT = 5), silences all of it in every process (torchrun's ranks
              # inherit it).
              "KINETO_LOG_LEVEL": "6"}


def silence_third_party() -> None:
    """--quiet: no library banners, progress bars, INFO lines or Python warnings (ftprof still prints its run dir
    and any failure). Set before the libraries are imported (C++ libraries read their level once)."""
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)

def fmt_gib(value: int | None) -> str:
    """Bytes as GiB in a table column: two decimals, "-" for none, "<0.01" for a few MiB (a tiny model's weights:
    "0.00" would read as nothing measured)."""
    if value is None:
        return "-"
    return "<0.01" if 0 < value < 0.005 * GIB else f"{value / GIB:.2f}"


def fmt_gib_digits(nbytes: float) -> str:
    """Bytes as GiB in a sentence, with the digits that matter: 61.5, 9.73, 0.0042."""
    value = nbytes / GIB
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"


def fmt_num(value: float | None, spec: str | None = None) -> str:
    """A number for people. Without ``spec``, one format everywhere: thousands separated by commas and no decimals
    from 100 up ("4,464"), one decimal below 100 ("82.7", never "82.743", which reads as 82 thousand), two below 10."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if spec is not None:
        return format(value, spec)
    size = abs(value)
    return format(value, ",.0f" if size >= 100 else ".1f" if size >= 10 else ".2f")


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


class RunDisplay:
    """What a run prints. On a terminal a progress bar; otherwise a plain line now and then. Quiet: the run dir at
    the start and one line at the end (the failure, if any), nothing else."""

    def __init__(self, cfg: RunConfig, quiet: bool = False, console: Console | None = None):
        from ftprof.ranks import env_info

        self.cfg = cfg
        self.quiet = quiet
        self.silent = not env_info().is_main  # a distributed run's other ranks: rank 0 speaks for the run
        self.console = console or make_console()
        self.progress: Progress | None = None
        self.plain = not self.console.is_terminal
        self._step = 0
        self._last_line = 0.0

    def log(self, message: str) -> None:
        if not self.quiet:
            self.console.print(f"[dim]ftprof:[/dim] {message}")

    def start(self, trainer) -> None:
        if self.quiet:
            if not self.silent:
                self.console.print(f"ftprof: run dir {trainer.run_dir}", markup=False)
            return
        c = trainer.built.counts
        self.log(f"{self.cfg.method.method} on {self.cfg.model.model} ({c.total / 1e6:,.1f}M params, "
                 f"{c.trainable_total / 1e6:,.2f}M trainable) | {trainer.built.device_name} {self.cfg.model.dtype} | "
                 f"batch {self.cfg.data.batch_size}x{self.cfg.train.grad_accum} seq {self.cfg.data.seq_len} | "
                 f"run dir {trainer.run_dir}")
        self._last_line = time.monotonic()
        if self.plain:  # a file or a pipe: no bar, which would only appear at the end
            return
        self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeRemainingColumn(), console=self.console,
                                 transient=False)
        self.task = self.progress.add_task("train", total=self.cfg.train.max_steps, info="")
        self.progress.start()

    def on_step(self, record) -> None:
        self._step = record.step  # the run's own step number (a resumed run counts on from its checkpoint's)
        if self.quiet:
            return
        tps = record.tokens / record.step_time_s if record.step_time_s > 0 else 0.0
        warm = " (warm-up)" if record.warmup else ""
        info = f"loss {record.loss:.4f} | {fmt_num(tps)} tok/s | {record.step_time_s:.3f} s{warm}"
        if self.progress is not None:
            self.progress.update(self.task, completed=self._step, info=info)
        elif self.plain and self._plain_due():
            self.console.print(f"ftprof: step {self._step}/{self.cfg.train.max_steps} | {info}")

    def _plain_due(self) -> bool:
        total = self.cfg.train.max_steps
        every = max(1, round(total * PLAIN_PROGRESS_FRACTION))
        now = time.monotonic()
        if self._step == total or self._step % every == 0 or now - self._last_line >= PLAIN_PROGRESS_S:
            self._last_line = now
            return True
        return False

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def show(self, renderable) -> None:
        if not self.quiet:
            self.console.print(renderable)

    def summary(self, res: RunResult) -> None:
        if self.quiet:
            if self.silent:
                return
            line = f"ftprof: {res.run.method} {res.status}, run dir {res.run_dir}"
            if res.status != "ok":
                line += f": {res.failure.error_type}: {res.failure.error_message}"
            self.console.print(line, markup=False)
            return
        self.console.print(summary_table(res))
        for line in slow_step_lines(res):
            self.console.print(f"[dim]slow step:[/dim] {line}")
        for note in res.notes:
            self.console.print(f"[dim]note:[/dim] {note}")
        if res.status != "ok":
            self.console.print(f"[bold red]{res.status}[/bold red]: {res.failure.error_type}: "
                               f"{res.failure.error_message}")


SLOW_STEPS_SHOWN = 3


def slow_step_line(step: dict) -> str:
    """A slow step (``ftprof.metrics.slow_steps``) for people: its time, how far over the steady median, and what
    took the extra time."""
    which = "warm-up step" if step.get("warmup") else "step"
    line = f"{which} {step['step']} took {step['step_time_s']:.3f} s, {step['extra_s']:.3f} s over the steady median: "
    return line + (f"{step['cause']} {step['cause_s']:.3f} s" if step.get("cause_s") is not None else step["cause"])


def slow_step_lines(res: RunResult) -> list[str]:
    """One line per slow step, the first few (result.json holds them all)."""
    slow = res.host_time.slow_steps
    lines = [slow_step_line(s) for s in slow[:SLOW_STEPS_SHOWN]]
    if len(slow) > SLOW_STEPS_SHOWN:
        lines.append(f"{len(slow) - SLOW_STEPS_SHOWN} more in result.json (slow_steps)")
    return lines


CPU_NOTE = "CPU run: GPU-only figures (MFU, per-GPU throughput, allocator peaks) do not apply and are left out."


def summary_table(res: RunResult) -> Table:
    """The end-of-run table. A CPU run shows host memory only, and a caption saying why the GPU figures are gone."""
    ok = res.status == "ok"
    run, speed, mem = res.run, res.throughput, res.memory
    on_cpu = str(run.device).startswith("cpu")
    table = Table(title=f"ftprof {run.method} on {run.model} [{'green' if ok else 'red'}]{res.status}[/]",
                  show_header=True, header_style="bold", caption=CPU_NOTE if on_cpu else None)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("device", f"{run.device_name} x{run.world_size}"),
        ("steps (steady / warm-up)", f"{speed.steady_steps} / {len(speed.warmup_step_times_s)}"),
        ("tokens/s (global)", fmt_num(speed.tokens_per_s)),
        ("tokens/s per GPU", fmt_num(speed.tokens_per_s_per_gpu)),
        ("real tokens/s", fmt_num(speed.real_tokens_per_s)),
        ("step time p50 / p90 (s)",
         f"{fmt_num(speed.step_time_p50_s, '.4f')} / {fmt_num(speed.step_time_p90_s, '.4f')}"),
        ("MFU / HFU", f"{fmt_pct(res.flops.mfu)} / {fmt_pct(res.flops.hfu)}"),
        ("loss first -> last", f"{fmt_num(speed.loss_first, '.4f')} -> {fmt_num(speed.loss_last, '.4f')}"),
        ("torch peak allocated / reserved (GiB)",
         f"{fmt_gib(mem.torch_peak_allocated)} / {fmt_gib(mem.torch_peak_reserved)}"),
        ("host peak RSS (GiB)", fmt_gib(mem.host_peak_rss)),
        ("run dir", res.run_dir),
    ]
    gpu_only = ("tokens/s per GPU", "MFU / HFU", "torch peak allocated / reserved (GiB)")
    for name, value in rows:
        if not (on_cpu and name in gpu_only):
            table.add_row(name, value)
    return table
