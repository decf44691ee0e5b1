"""One sweep cell in its run directory, whichever launcher starts it (a local child process or a Slurm job).

The one owner of what a cell runs (:func:`experiment_command`: ftprof's worker, or a ``trainer: hf|trl|unsloth``
cell's recipe, in the cell's ``python:`` interpreter when it names one), of the files written before it starts
(:func:`prepare`: config.json, a peer cell's peer_config.json, command.sh) and of the result recorded for a cell
whose process ended without writing one (:func:`record_no_result`).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from pathlib import Path

from ftprof.bench.sweep import TRAINER_NAMES, Experiment
from ftprof.config import RunConfig
from ftprof.results import run_dir as files
from ftprof.results.run_dir import RunDirWriter
from ftprof.results.schema import failure_result
from ftprof.results.status import Status
from ftprof.results.store import remove_partial_files, write_json_atomic, write_text_atomic

PEER_CONFIG = "peer_config.json"  # a peer cell's validated configuration for its recipe (FtprofCallback rewrites
# config.json with what it measured)


def run_config(exp: Experiment, run_dir: Path) -> RunConfig:
    """The experiment's validated configuration, writing into ``run_dir`` (its memory logging is already resolved:
    its own, else the sweep's)."""
    return exp.config.replace(output_dir=str(run_dir.parent), run_name=run_dir.name, quiet=True)


def trainer_section(exp: Experiment) -> dict:
    """config.json's ``trainer`` section as bench knows it (FtprofCallback writes the full one)."""
    return {"name": TRAINER_NAMES[exp.trainer], "recipe": exp.trainer, "python": exp.python or sys.executable}


def cell_config(exp: Experiment, run_dir: Path) -> dict:
    """The cell's config.json as bench writes it before the cell starts."""
    data = run_config(exp, run_dir).to_dict()
    if exp.is_peer:
        data["trainer"] = trainer_section(exp)
    return data


def child_command(run_dir: Path) -> list[str]:
    """What bench starts: a worker that loads the run directory's config.json."""
    return [sys.executable, "-m", "ftprof.engine.worker", str(run_dir / files.CONFIG)]


def recipe_command(exp: Experiment, run_dir: Path) -> list[str]:
    """A peer cell's process: its recipe module, in its interpreter, on the cell's validated configuration."""
    return [exp.python or sys.executable, "-m", f"ftprof.integrations.recipes.{exp.trainer}",
            "--config", str(run_dir / PEER_CONFIG), "--run-dir", str(run_dir)]


def experiment_command(exp: Experiment, run_dir: Path) -> list[str]:
    """What a launcher starts for ``exp`` (``<python> -m <module> ...``): the worker (in the cell's interpreter), or
    a peer cell's recipe."""
    cmd = recipe_command(exp, run_dir) if exp.is_peer else child_command(run_dir)
    return [exp.python, *cmd[1:]] if exp.python and not exp.is_peer else cmd


def replay_command(exp: Experiment, run_dir: Path) -> list[str]:
    """The same run as an ``ftprof train`` command line (command.sh and --dry-run show it); a peer cell's recipe."""
    if exp.is_peer:
        return recipe_command(exp, run_dir)
    cfg = run_config(exp, run_dir)
    # replayed by hand over a finished cell: ftprof train refuses a reused run name unless told to replace it
    cfg = dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, overwrite_output_dir=True))
    return [exp.python or sys.executable, "-m", "ftprof", "train", *cfg.cli_args()]


def clear_attempt(run_dir: Path) -> None:
    """A rerun must not inherit the previous attempt's verdict, steps or logs (per-rank files included)."""
    for name in files.ATTEMPT_FILES:
        stem, _, ext = name.partition(".")
        for path in [run_dir / name, *run_dir.glob(f"{stem}_rank*.{ext}")]:
            path.unlink(missing_ok=True)


def command_script(cmd: list[str], env_overrides: dict[str, str]) -> str:
    lines = ["#!/usr/bin/env bash", "# Replays this experiment exactly as ftprof bench ran it.", "set -e",
             f"cd {shlex.quote(os.getcwd())}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env_overrides.items())]
    lines.append("exec " + " ".join(shlex.quote(c) for c in cmd) + ' "$@"')
    return "\n".join(lines) + "\n"


def prepare(exp: Experiment, run_dir: Path, env_overrides: dict[str, str]) -> None:
    """Before the cell starts: the previous attempt's files gone, config.json (and a peer cell's peer_config.json,
    which its recipe reads) written, command.sh replaying the cell with ``env_overrides``."""
    clear_attempt(run_dir)
    config = cell_config(exp, run_dir)
    RunDirWriter(run_dir).write_config(config)
    if exp.is_peer:
        write_json_atomic(run_dir / PEER_CONFIG, config)
    script = write_text_atomic(run_dir / files.COMMAND, command_script(replay_command(exp, run_dir), env_overrides))
    os.chmod(script, 0o755)


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# Lines Slurm's own tools add to a job's stderr (srun reports the task's exit status after the task's last words,
# when it gets there first): never the cell's error.
LAUNCHER_LINE = ("srun: ", "slurmstepd: ")


def last_error_line(stderr: str, default: str) -> str:
    """The last line the cell's own process wrote to stderr (its exception), or ``default``."""
    return next((ln for ln in reversed(stderr.splitlines()) if ln.strip() and not ln.startswith(LAUNCHER_LINE)),
                default)


def record_no_result(run_dir: Path, cfg: RunConfig, status: Status, reason: str,
                     error_type: str | None = None) -> None:
    """The cell's process ended without writing result.json: record what the launcher knows, keep what the process
    wrote. An ``error`` says the last line of stderr (a recipe's exception); another failure class says ``reason``;
    both keep stderr's tail and a note naming ``reason``."""
    remove_partial_files(run_dir)  # a killed writer's half-written .steps.csv.<random>.tmp
    stderr = tail(run_dir / files.STDERR)
    last = last_error_line(stderr, reason)
    res = failure_result(cfg, run_dir, status.value, error_type or status.value,
                         reason if status is not Status.ERROR else last, stderr,
                         f"recorded by ftprof bench: {reason}")
    res.run.steps_completed = files.steps_recorded(run_dir)
    RunDirWriter(run_dir).write_result(res)
