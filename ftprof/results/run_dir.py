"""The run directory: its naming and the one place where its file names are spelled (README.md lists them)."""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path

from ftprof.results.schema import STEP_COLUMNS, RunResult, StepRecord
from ftprof.results.store import write_csv_atomic, write_json_atomic

CONFIG = "config.json"  # the resolved RunConfig; child processes load it (ftprof.engine.worker)
ENV = "env.json"
STEPS = "steps.csv"
RESULT = "result.json"
MEMORY_STAGES = "memory_stages.csv"
NVML = "nvml.csv"
COMMAND = "command.sh"  # bench: the experiment as a readable, replayable command line
STDOUT, STDERR = "stdout.log", "stderr.log"  # bench: the experiment's output
PROFILE = "profile"  # torch.profiler artifacts (a folder)
SLURM = "slurm.json"  # bench --launcher slurm: the job that runs this experiment (name, array task, job id)
SLURM_TASK = "slurm_task.json"  # written by that job when it starts: its job id and node(s)
SLURM_END = "slurm_end.txt"  # written by that job as it ends: Slurm's account (scontrol show job -o)
# What one attempt of a run leaves behind: a rerun clears these (per-rank variants included) before it starts.
ATTEMPT_FILES = (RESULT, STEPS, MEMORY_STAGES, ENV, NVML, STDOUT, STDERR, SLURM_TASK, SLURM_END)


def rank_file(name: str, rank: int | None) -> str:
    """``steps.csv`` -> ``steps_rank1.csv`` for a rank's own file; the name itself when ``rank`` is None."""
    if rank is None:
        return name
    stem, dot, ext = name.partition(".")
    return f"{stem}_rank{rank}{dot}{ext}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text.strip("/")).strip("-")[-48:] or "model"


def default_run_name(method: str, model: str, now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now()
    return f"{method}-{_slug(Path(model).name if '/' in model else model)}-{now:%Y%m%d-%H%M%S}"


def make_run_dir(output_dir: str, run_name: str | None, method: str, model: str) -> Path:
    """An explicit run name is reused as is (re-running overwrites it); a default name never collides."""
    parent = Path(output_dir).expanduser()
    if run_name:
        path = parent / run_name
    else:
        base = default_run_name(method, model)
        path, n = parent / base, 2
        while path.exists():
            path, n = parent / f"{base}-{n}", n + 1
    path.mkdir(parents=True, exist_ok=True)
    return path


class RunDirWriter:
    """Writes a run's files. With ``rank`` set (a distributed run), per-rank files get a ``_rank{r}`` suffix."""

    def __init__(self, path: Path, rank: int | None = None):
        self.path = path
        self.rank = rank

    def _name(self, name: str) -> str:
        return rank_file(name, self.rank)

    def write_config(self, config: dict) -> None:
        write_json_atomic(self.path / CONFIG, config)

    def write_env(self, env: dict) -> None:
        write_json_atomic(self.path / ENV, env)

    def write_steps(self, steps: list[StepRecord]) -> None:
        write_csv_atomic(self.path / self._name(STEPS), (s.to_dict() for s in steps), STEP_COLUMNS)

    def write_aggregate_steps(self, rows: list[dict]) -> None:
        """steps.csv of a distributed run: per step, the slowest rank's time and every rank's tokens."""
        write_csv_atomic(self.path / STEPS, rows, STEP_COLUMNS)

    def write_memory_stages(self, rows: list[dict]) -> None:
        if rows:
            write_csv_atomic(self.path / self._name(MEMORY_STAGES), rows)

    def write_result(self, result: RunResult, rank_file: bool = False) -> None:
        write_json_atomic(self.path / (self._name(RESULT) if rank_file else RESULT), result.to_dict())


def steps_recorded(run_dir: Path) -> int:
    """Rows of steps.csv (a killed distributed run has only rank 0's steps_rank0.csv): steps done before it died."""
    for name in (STEPS, rank_file(STEPS, 0)):
        try:
            with open(run_dir / name, encoding="utf-8", errors="replace") as fh:
                return max(0, sum(1 for line in fh if line.strip()) - 1)
        except OSError:
            continue
    return 0


def finished_run(output_dir: str | Path, run_name: str | None) -> Path | None:
    """The directory ``run_name`` names under ``output_dir`` when it holds a finished run (its result.json: ok or
    failed). A run that was killed before its result (bench reruns such cells under their names) is not finished."""
    if not run_name:
        return None  # a default name never collides (make_run_dir)
    path = Path(output_dir).expanduser() / run_name
    return path if (path / RESULT).is_file() else None


def _refuse_stale_checkpoints(path: Path, run_name: str) -> None:
    """A run directory a killed run left checkpoints in is no new run's: its checkpoints would pass for the new
    run's (--save-total-limit pruned the new ones and kept the old, --resume-from-checkpoint latest took them)."""
    from ftprof.config.saving import checkpoint_dirs
    from ftprof.errors import ConfigError

    left = checkpoint_dirs(path, finished=False)
    if left:
        newest = left[-1][1]
        raise ConfigError(f"--run-name {run_name}: {path} holds {newest.name} of a run that did not finish; "
                          f"continue it with --resume-from-checkpoint {newest} and another --run-name, or give "
                          "--overwrite-output-dir to start over")


def replace_named_run(output_dir: str | Path, run_name: str | None, overwrite: bool) -> None:
    """A reused run name never replaces a finished run silently: refused in one line (ConfigError), or with
    ``overwrite`` (--overwrite-output-dir) the directory is emptied first, finished or not: its checkpoints would
    otherwise pass for the new run's (``--resume-from-checkpoint latest`` takes the newest under the output
    directory)."""
    import shutil

    from ftprof.errors import ConfigError

    path = Path(output_dir).expanduser() / run_name if run_name else None
    if path is None or not path.is_dir():
        return
    if finished_run(output_dir, run_name) and not overwrite:
        raise ConfigError(f"--run-name {run_name}: {path} holds a finished run; give --overwrite-output-dir to "
                          "replace it, or another --run-name")
    if not overwrite:
        _refuse_stale_checkpoints(path, run_name)
        return
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
