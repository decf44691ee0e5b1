"""`ftprof bench SWEEP.yaml`: run a grid of experiments, each in its own process; failures are rows too."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ftprof.console import fmt_gib, fmt_num, make_console
from ftprof.errors import ConfigError
from ftprof.results.status import status_style


def bench_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench", help="run a sweep of experiments from YAML, one process each, recording failures as results",
        description="Run every experiment of a sweep file in its own process. Finished experiments are skipped "
                    "when the same sweep runs again; --retry-failed reruns failed ones, --force reruns all. One bench "
                    "at a time per output directory. Exit status: 0 all ok, 1 some experiment failed, 2 bad input "
                    "or output directory in use, 130 interrupted.")
    parser.add_argument("sweep", help="sweep file (YAML)")
    parser.add_argument("--status", action="store_true",
                        help="show where a submitted (Slurm) sweep stands: each experiment's job, state and result")
    parser.add_argument("--dry-run", action="store_true", help="print the experiments and commands, run nothing")
    parser.add_argument("--output-dir", help="results directory (default: results/<sweep name>)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="skip finished experiments (the default)")
    mode.add_argument("--force", action="store_true", help="rerun every experiment")
    parser.add_argument("--retry-failed", action="store_true", help="rerun experiments that failed (OOM, timeout...)")
    parser.add_argument("--wait", action="store_true",
                        help="if another bench holds the output directory, wait for it instead of exiting (status 2)")
    slurm = parser.add_argument_group("launcher", "where experiments run; these override the sweep file's "
                                               "launcher: section (BENCHMARKS.md)")
    slurm.add_argument("--launcher", choices=("local", "slurm"), help="local child processes (default) or Slurm jobs")
    slurm.add_argument("--partition", help="Slurm partition")
    slurm.add_argument("--account", help="Slurm account")
    slurm.add_argument("--qos", help="Slurm quality of service")
    slurm.add_argument("--time", help="Slurm time limit per experiment (minutes, or [days-]hh:mm:ss)")
    slurm.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the experiment's nproc_per_node)")
    slurm.add_argument("--nodes", type=int, help="nodes per experiment (default: the experiment's nnodes)")
    slurm.add_argument("--cpus-per-task", type=int, help="CPUs per task (one task per node)")
    slurm.add_argument("--mem", help="memory per node, e.g. 200G")
    slurm.add_argument("--constraint", help="Slurm node constraint (features)")
    slurm.add_argument("--sbatch", action="append", metavar="OPTION",
                       help="an extra sbatch option, e.g. --sbatch=--exclusive (repeatable)")
    slurm.add_argument("--max-jobs", type=int, help="experiments that may run at once (the job array's limit)")
    slurm.add_argument("--no-watch", action="store_true",
                       help="submit and return; `ftprof bench --status SWEEP` shows progress later")
    slurm.add_argument("--cancel", action="store_true",
                       help="on Ctrl-C, cancel the submitted jobs (without it they keep running)")
    parser.set_defaults(func=bench_command)
    return parser


def _percent(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


# The headline figures: (column, how a row's value reads). A column no row has a value for is left out (a CPU sweep
# has no MFU, allocator or NVML peak: its host RSS peak stands in).
FIGURES = (("tokens/s", lambda r: fmt_num(_num(r, "tokens_per_s")), "tokens_per_s"),
           ("step p50 (s)", lambda r: fmt_num(_num(r, "step_time_p50_s"), ".3f"), "step_time_p50_s"),
           ("MFU", lambda r: _percent(_num(r, "mfu")), "mfu"),
           ("torch peak GiB", lambda r: fmt_gib(_num(r, "torch_peak_allocated")), "torch_peak_allocated"),
           ("NVML peak GiB", lambda r: fmt_gib(_num(r, "nvml_device_used_peak")), "nvml_device_used_peak"),
           ("host peak RSS GiB", lambda r: fmt_gib(_num(r, "host_peak_rss")), "host_peak_rss"))


def results_table(rows: list[dict], title: str, keys: list[str]) -> Table:
    """The short end-of-sweep table: the options that vary, then the headline figures any row has."""
    table = Table(title=title, header_style="bold")
    keys = keys or ["experiment"]
    on_gpu = any(_num(r, "torch_peak_allocated") is not None for r in rows)
    figures = [(name, show) for name, show, key in FIGURES
               if any(_num(r, key) is not None for r in rows) and not (key == "host_peak_rss" and on_gpu)]
    for col in (*keys, "status", *(name for name, _ in figures)):
        table.add_column(col, justify="left" if col in (*keys, "status") else "right")
    for r in rows:
        style = status_style(r.get("status"))
        table.add_row(*(str(r.get(k, "")) for k in keys), f"[{style}]{r.get('status')}[/{style}]",
                      *(show(r) for _, show in figures))
    return table


def with_repeat_column(rows: list[dict], varying: list[str], repeats: int) -> tuple[list[dict], list[str]]:
    """The table's key columns (the options that vary) and, where the sweep repeats its cells, a ``repeat`` column:
    repeats of one cell differ by their name's -r<N> alone, and would read as identical rows."""
    if repeats <= 1:
        return rows, list(varying)
    return [dict(r, repeat=r["experiment"].rpartition("-r")[2]) for r in rows], [*varying, "repeat"]


def failure_lines(rows: list[dict]) -> list[str]:
    """Why each failed experiment failed, one line each (its result.json's error): the table says only its status."""
    out = []
    for r in rows:
        if r.get("status") not in ("ok", None) and r.get("error_message"):
            kind = f"{r['error_type']}: " if r.get("error_type") else ""
            out.append(f"{r['status']} {r.get('experiment', r.get('run_name'))}: {kind}{r['error_message']}")
    return out


def _num(row: dict, key: str):
    value = row.get(key)
    return None if value in (None, "") else float(value)


def bench_command(args: argparse.Namespace) -> int:
    from ftprof.bench.flow import check_same_sweep, output_dir_for, results_dir
    from ftprof.bench.lock import OutputLock
    from ftprof.bench.sweep import load_sweep

    check_combinations(args)
    sweep = load_sweep(args.sweep)
    launcher = sweep.launcher.merged({key: getattr(args, key) for key in LAUNCHER_OPTIONS}
                                     | {"type": args.launcher, "sbatch": tuple(args.sbatch or ())}, "")
    check_slurm_only(args, launcher.type, sweep.path)
    if args.output_dir is not None and not str(args.output_dir).strip():
        raise ConfigError("--output-dir: empty path (leave it out for results/<sweep name>)")
    # --status of a directory nothing ran into yet reads it as it is: output_dir_for would create it (and the lock)
    target = results_dir(sweep, args.output_dir)
    out_dir = target if args.status and not target.is_dir() else output_dir_for(sweep, args.output_dir)
    check_same_sweep(sweep, out_dir)  # another sweep's results there: refused whatever the mode (run, plan, status)
    cannot_run_here = None
    if launcher.type == "local":  # the experiments run here: what this machine cannot run is refused now
        # (a dry run previews a GPU sweep anywhere, a laptop or a login node: it says why, after the plan)
        cannot_run_here = check_devices(sweep, preview=args.dry_run)
    console = make_console()
    if args.status:
        return status_command(console, sweep, out_dir)
    if sweep.old_meanings_note:
        console.print(sweep.old_meanings_note, style="yellow", markup=False, soft_wrap=True)
    if args.dry_run:
        from ftprof.bench.runner import gpu_slots, plan

        dry_run(console, sweep, out_dir, plan(sweep, out_dir, force=args.force, retry_failed=args.retry_failed),
                gpu_slots() if launcher.type == "local" else [], launcher)
        if cannot_run_here:
            console.print(f"not on this machine: {cannot_run_here}", style="yellow", markup=False, soft_wrap=True)
        return 0
    # held from here to the end: a busy output directory is refused before torch is imported (gpu_slots)
    with OutputLock(out_dir, wait=args.wait,
                    on_wait=lambda who: console.print(f"[yellow]waiting[/yellow] for {who} to release {out_dir}")):
        return _run_locked(console, sweep, out_dir, args, launcher)


def _run_locked(console, sweep, out_dir: Path, args: argparse.Namespace, launcher) -> int:
    """The sweep run (or submitted and watched), holding the output directory; its table and exit status."""
    from ftprof.bench.runner import gpu_slots

    slots = gpu_slots() if launcher.type == "local" else []
    if launcher.type == "slurm":
        console.print(experiment_table(sweep, out_dir))
    elif not slots:
        console.print("[dim]no GPU: experiments run one at a time; NVML sampling is skipped[/dim]")
    done = _run_with_display(console, sweep, out_dir, args, slots, launcher)
    _print_outcome(console, done, out_dir, sweep)
    code = done.exit_code()
    _print_next_step(console, done, args, launcher.type, code)
    return code


LAUNCHER_OPTIONS = ("partition", "account", "qos", "time", "gpus_per_node", "nodes", "cpus_per_task", "mem",
                    "constraint", "max_jobs")


# Options that mean nothing together: (option, option, why), refused in one line.
CONFLICTS = (("status", "dry_run", "--status shows a submitted sweep, --dry-run what a run would do"),
             ("status", "force", "--status runs nothing"), ("status", "retry_failed", "--status runs nothing"),
             ("status", "wait", "--status never waits for the output directory"),
             ("force", "retry_failed", "--force reruns every experiment, the failed ones included"))
# Options for Slurm jobs only: refused when the sweep runs locally (not silently ignored).
SLURM_ONLY = (*LAUNCHER_OPTIONS, "sbatch", "no_watch", "cancel")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_combinations(args: argparse.Namespace) -> None:
    """Options given together that cannot both apply: one line naming them (before the sweep is read)."""
    for one, other, why in CONFLICTS:
        if getattr(args, one) and getattr(args, other):
            raise ConfigError(f"{_flag(one)} and {_flag(other)} cannot be used together: {why}")


def check_slurm_only(args: argparse.Namespace, launcher_type: str, sweep_path: Path) -> None:
    """A Slurm option on a sweep that runs locally would be ignored: one line naming it instead."""
    from ftprof.errors import ConfigError

    given = [dest for dest in SLURM_ONLY if getattr(args, dest) not in (None, False, [])]
    if given and launcher_type != "slurm":
        raise ConfigError(f"{_flag(given[0])} applies to Slurm jobs only, and this sweep runs locally (pass "
                          f"--launcher slurm, or set launcher: {{type: slurm}} in {sweep_path.name})")


def _run_with_display(console, sweep, out_dir: Path, args: argparse.Namespace, slots: list, launcher):
    """Run (or watch) the sweep with its display (live on a terminal, plain lines otherwise), started once the plan
    is known; the caller holds the output directory's lock."""
    from ftprof.bench.flow import run_sweep
    from ftprof.cli.bench_display import bench_display

    displays: list = []

    def start_display(planned) -> None:
        displays.append(bench_display(console, len(planned)))
        displays[0].start()

    try:
        return run_sweep(sweep, out_dir, force=args.force, retry_failed=args.retry_failed, slots=slots,
                         on_plan=start_display, launcher=launcher, watch=not args.no_watch, cancel=args.cancel,
                         on_event=lambda kind, p: displays[0].event(kind, p), locked=True)
    finally:
        if displays:
            displays[0].stop()


def _print_outcome(console, done, out_dir: Path, sweep) -> None:
    """The end-of-sweep table of this sweep's experiments, why each failed one failed, and what did not run."""
    from ftprof.bench.runner import sweep_rows
    from ftprof.report.training_check import lagging_lines

    rows, keys = with_repeat_column(sweep_rows(out_dir, done.planned), sweep.varying, sweep.repeats)
    console.print(results_table(rows, f"sweep {sweep.name}", keys))
    for line in failure_lines(rows):
        console.print(line, markup=False)
    for line in lagging_lines(rows):  # a fast run that computed the wrong thing
        console.print(line, markup=False, style="yellow")
    for p in done.planned:
        if p.action == "busy":
            console.print(f"[yellow]not run[/yellow] {p.experiment.name}: {p.reason}")
    console.print(f"[dim]wrote {done.summary}[/dim]")


def _print_next_step(console, done, args: argparse.Namespace, launcher_type: str, code: int) -> None:
    """One line on what to do next: resume, watch the jobs, or retry the failed experiments."""
    if done.interrupted and launcher_type == "slurm":
        console.print("[yellow]stopped watching[/yellow]: "
                      + ("the jobs were cancelled; " if args.cancel else "submitted jobs keep running; ")
                      + f"`ftprof bench --status {args.sweep}` shows where they stand")
    elif done.interrupted:
        console.print(f"[yellow]interrupted[/yellow]: {resume_advice(args.force)}")
    elif launcher_type == "slurm" and args.no_watch:
        console.print(f"submitted; `ftprof bench --status {args.sweep}` shows where the jobs stand")
    elif done.failed():
        resumable = len(done.resumable())
        kept = len(done.failed()) - resumable
        how = ("--retry-failed reruns them" if not resumable else "a rerun runs them again (killed from outside)"
               if not kept else f"a rerun runs the {resumable} killed from outside again, --retry-failed all of them")
        console.print(f"[red]{len(done.failed())} experiment(s) failed[/red] (exit status {code}); {how}")


def experiment_table(sweep, out_dir: Path) -> Table:
    """The experiments up front (a Slurm sweep runs elsewhere: this is what it submits)."""
    table = Table(title=f"sweep {sweep.name}: {len(sweep.experiments)} experiments -> {out_dir}", header_style="bold")
    for col in ("experiment", *sweep.varying):
        table.add_column(col)
    for exp in sweep.experiments:
        table.add_row(exp.name, *(str(exp.values.get(k, "")) for k in sweep.varying))
    return table


def check_devices(sweep, preview: bool = False) -> str | None:
    """Each experiment's GPU-only options and --save-dir against this machine (no torch): one line naming the first
    that cannot run, instead of launching it to fail. ``preview`` (a dry run): the first device problem is returned
    instead (the plan is still worth printing); a --save-dir problem is refused all the same."""
    from ftprof.checks import check_device, check_save_dir

    device_problem = None
    for exp in sweep.experiments:
        where = f"{sweep.path}: experiment {exp.name}"
        try:
            check_device(exp.config)
        except ConfigError as exc:
            if not preview:
                raise ConfigError(f"{where}: {exc}") from None
            device_problem = device_problem or f"{where}: {exc}"
        if exp.config.save.save_dir:  # written here after the cell trains: refused now if it cannot be
            try:
                check_save_dir(exp.config, clean=False)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
    return device_problem


def status_command(console: Console, sweep, out_dir: Path) -> int:
    """`ftprof bench --status`: each experiment's job, its state and result; ended jobs are recorded on the way
    (when no other bench holds the output directory)."""
    from ftprof.bench.lock import OutputDirBusy, OutputLock
    from ftprof.bench.slurm import sweep_status

    if not out_dir.is_dir():  # nothing ran or was submitted into it: nothing to record, nothing to create
        cells = sweep_status(sweep, out_dir, reconcile_ended=False)
    else:
        try:
            with OutputLock(out_dir):
                cells = sweep_status(sweep, out_dir)
        except OutputDirBusy:
            cells = sweep_status(sweep, out_dir, reconcile_ended=False)
    table = Table(title=f"sweep {sweep.name} ({out_dir})", header_style="bold")
    for col in ("experiment", "job", "slurm state", "node", "status"):
        table.add_column(col)
    for c in cells:
        style = status_style(c.status)
        table.add_row(c.experiment, c.job_id or "-", c.state or "-", c.nodes or "-",
                      f"[{style}]{c.status}[/{style}]" if c.status else "-")
    console.print(table)
    counts: dict[str, int] = {}
    for c in cells:
        key = c.state.lower() if c.state in ("PENDING", "RUNNING", "COMPLETING") and not c.status else (
            c.status or "not submitted")
        counts[key] = counts.get(key, 0) + 1
    console.print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return 0


def resume_advice(force: bool) -> str:
    """What to type to resume: --force would rerun the finished experiments too."""
    return ("run the same command without --force to resume (with it, finished experiments run again)" if force
            else "run the same command again to resume")


MAX_TABLE_ROWS = 500


def dry_run(console: Console, sweep, out_dir: Path, planned, slots: list[str], launcher=None) -> None:
    """The plan as a table, then each experiment's replay command (plain lines: thousands print in a second)."""
    from ftprof.bench.runner import replay_command

    title = f"sweep {sweep.name}: {len(planned)} experiments -> {out_dir}"
    columns = ("experiment", "action", *sweep.varying)
    rows = [(p.experiment.name,
             p.action + (f" ({p.previous})" if p.previous else "") + (f": {p.reason}" if p.reason else ""),
             *(str(p.experiment.values.get(k, "")) for k in sweep.varying)) for p in planned]
    if len(rows) > MAX_TABLE_ROWS:  # rich lays out a table in seconds per thousand rows: plain lines instead
        sys.stdout.write("".join("\t".join(row) + "\n" for row in [(title,), columns, *rows]))
    else:
        table = Table(title=title, header_style="bold")
        for col in columns:
            table.add_column(col)
        for row in rows:
            table.add_row(*row)
        console.print(table)
    if launcher is not None and launcher.type == "slurm":  # (Slurm's time limit stops a job, not timeout_s)
        limit = launcher.time or "the partition's"
        console.print(f"Slurm: one job per experiment (partition {launcher.partition or 'the default'}, time limit "
                      f"{limit}); memory logging: {sweep.memory_logging}")
    else:
        console.print(f"GPU slots: {', '.join(slots) if slots else 'none (CPU: one experiment at a time)'}; "
                      f"memory logging: {sweep.memory_logging}; timeout {sweep.timeout_s:g} s")
    sys.stdout.write("".join(" ".join(shlex.quote(c) for c in replay_command(p.experiment, p.run_dir)) + "\n"
                             for p in planned))
