"""One sweep, start to end: check the output directory, hold its lock, plan, run, write the summary.

``ftprof bench`` and ``ftprof.run_sweep`` both call :func:`run_sweep`; the exit status a sweep earns is
:meth:`SweepRun.exit_code` (0 every experiment ok, 1 some experiment failed or was not run (another process held
its claim), 130 interrupted; bad input and a busy output directory are errors before anything runs, exit 2).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ftprof.bench.launcher import LauncherSettings
from ftprof.bench.lock import OutputLock
from ftprof.bench.runner import SWEEP_RECORD, BenchRunner, Outcome, Planned, plan, write_sweep_record
from ftprof.bench.sweep import Sweep, load_sweep
from ftprof.errors import ConfigError
from ftprof.results.status import Status
from ftprof.results.store import check_writable_dir

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


@dataclass
class SweepRun:
    sweep: Sweep
    out_dir: Path
    planned: list[Planned]
    outcomes: list[Outcome] = field(default_factory=list)
    interrupted: bool = False
    summary: Path | None = None

    def _statuses(self) -> dict[str, Status | None]:
        now = {o.name: o.status for o in self.outcomes}
        # a cell submitted and not watched to its end (Slurm, --no-watch) has no verdict yet: its old one is void
        return {p.experiment.name: Status.parse(now.get(p.experiment.name, p.previous)) for p in self.planned
                if p.action != "busy" and not (p.action == "run" and p.experiment.name not in now)}

    def failed(self) -> list[str]:
        """Experiments whose recorded status is a failure: run now, or kept from an earlier run."""
        return [name for name, s in self._statuses().items() if s is not None and s.failed]

    def resumable(self) -> list[str]:
        """The failed experiments a plain rerun runs again (``killed``: stopped from outside the run)."""
        return [name for name, s in self._statuses().items() if s is not None and s.failed and s.resumed]

    def every_outcome(self) -> list[Outcome]:
        """An outcome for each experiment of the sweep that has a result: run now, or kept from an earlier run (a
        finished sweep run again runs nothing and still has them), in the sweep's order."""
        from ftprof.results.load import read_result

        now = {o.name: o for o in self.outcomes}
        out = []
        for p in self.planned:
            if p.experiment.name in now:
                out.append(now[p.experiment.name])
                continue
            try:
                result = read_result(p.run_dir)
            except ValueError:
                result = None
            if result is not None:
                out.append(Outcome(p.experiment.name, result.get("status"), 0.0, result))
        return out

    def not_run(self) -> list[str]:
        """Experiments this sweep should have run and did not: another process held their claim."""
        return [p.experiment.name for p in self.planned if p.action == "busy"]

    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        return EXIT_FAILED if self.failed() or self.not_run() else EXIT_OK


def results_dir(sweep: Sweep, output_dir: str | Path | None) -> Path:
    """Where a sweep's results go: --output-dir, else results/<sweep name>."""
    return Path(output_dir).expanduser() if output_dir else Path("results") / sweep.name


def output_dir_for(sweep: Sweep, output_dir: str | Path | None) -> Path:
    """``results_dir``, checked writable (and created)."""
    return check_writable_dir(results_dir(sweep, output_dir), "--output-dir")


def recorded_sweep(out_dir: Path) -> dict | None:
    """What ``out_dir``'s sweep.json says of the sweep whose results it holds; None where there is none to read (a
    new directory, one bench never finished a start in, a damaged file: nothing to tell the sweep by)."""
    try:
        record = json.loads((out_dir / SWEEP_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("name"), str) else None


def check_same_sweep(sweep: Sweep, out_dir: Path, option: str = "--output-dir") -> None:
    """``out_dir`` holds no results of a different sweep; else ConfigError naming it. A sweep is its name (what
    sweep.json records, and what names results/<name>): an edited sweep file, or one renamed that keeps its
    ``name:``, is the same sweep and runs on into its directory; another name would replace its summary."""
    record = recorded_sweep(out_dir)
    if record is None or record["name"] == sweep.name:
        return
    held = record["name"]
    source = record.get("sweep_file")
    source = f" (from {Path(source).name})" if isinstance(source, str) and source else ""
    raise ConfigError(f"{out_dir} holds the results of sweep '{held}'{source}, and this is sweep '{sweep.name}' "
                      f"({sweep.path.name}): use another {option} (or, if it is the same sweep renamed, set "
                      f"name: {held} in {sweep.path.name})")


def run_sweep(sweep: Sweep | str | Path, output_dir: str | Path | None = None, *, force: bool = False,
              retry_failed: bool = False, wait: bool = False, slots: list[str] | None = None,
              on_event: Callable[[str, object], None] | None = None,
              on_wait: Callable[[str], None] | None = None,
              on_plan: Callable[[list[Planned]], None] | None = None,
              launcher: LauncherSettings | None = None, watch: bool = True, cancel: bool = False,
              locked: bool = False, dir_option: str = "--output-dir") -> SweepRun:
    """Run a sweep in ``output_dir`` (default results/<sweep name>) holding its lock (OutputDirBusy when another
    bench holds it, unless ``wait``). ``on_plan`` sees the plan before anything runs (to set up a display).
    ``launcher`` (default: the sweep file's) picks local child processes or Slurm jobs (a job runs what a child
    process would: ftprof's worker or a peer cell's recipe, in the cell's ``python:``); with Slurm, ``watch=False``
    returns once the jobs are submitted and ``cancel`` cancels them on Ctrl-C. ``locked``: the caller holds the output
    directory's OutputLock already (``ftprof bench`` takes it before anything slow, so a busy one is refused at
    once). A directory holding a different sweep's results is refused (ConfigError naming ``dir_option``)."""
    if not isinstance(sweep, Sweep):
        sweep = load_sweep(sweep)
    launcher = launcher or sweep.launcher
    out_dir = output_dir_for(sweep, output_dir)
    check_same_sweep(sweep, out_dir, dir_option)
    out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.nullcontext() if locked else OutputLock(out_dir, wait=wait, on_wait=on_wait):
        check_same_sweep(sweep, out_dir, dir_option)  # again, holding the lock: a bench it waited for may have run
        if launcher.type == "slurm":
            from ftprof.bench import slurm

            slurm.refresh([out_dir / e.name for e in sweep.experiments])  # jobs that ended: results recorded
            planned = slurm.plan_with_jobs(plan(sweep, out_dir, force=force, retry_failed=retry_failed),
                                           slurm.squeue_jobs())
        else:
            planned = plan(sweep, out_dir, force=force, retry_failed=retry_failed)
        write_sweep_record(sweep, out_dir, planned)  # the directory is this sweep's from now, even if bench dies
        if on_plan is not None:
            on_plan(planned)
        if launcher.type == "slurm":
            runner = slurm.SlurmRunner(sweep, out_dir, planned, launcher, on_event=on_event, watch=watch,
                                       cancel=cancel)
        else:
            runner = BenchRunner(sweep, out_dir, planned, on_event=on_event, slots=slots)
        runner.run()
        summary = runner.write_summary()
    return SweepRun(sweep, out_dir, planned, runner.outcomes, runner.interrupted, summary)
