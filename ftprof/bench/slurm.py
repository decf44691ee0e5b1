"""Run a sweep's experiments as Slurm jobs: one job array per resource shape, one array task per experiment.

Plain ``sbatch`` with a generated script (``<output dir>/.slurm/<job name>.sbatch``, readable and resubmittable by
hand), not a Python submission library: the script is the whole contract, and job states come from ``squeue`` and
``scontrol`` alone (no ``sacct``: clusters without slurmdbd have none). Each array task runs what a local sweep
runs for its cell (``ftprof.bench.cell``: ``python -m ftprof.engine.worker <run dir>/config.json``, or a peer cell's
recipe, in the cell's ``python:`` interpreter when it names one) in the same run directory, through ``srun``; an
experiment with more than one process runs torchrun under ``srun`` (one task per node), its rendezvous at the first
node of the allocation.

The state lives on disk: before ``sbatch`` each run directory gets ``slurm.json`` naming its job (job name and
array task; the job id is added once ``sbatch`` answers), the job writes ``slurm_task.json`` (job id, node) when it
starts and ``slurm_end.txt`` (``scontrol show job -o``) as it ends. A submitter that dies loses nothing: the next
``ftprof bench`` or ``ftprof bench --status`` finds each job in ``squeue`` (by id, else by name and task) and never
submits a cell whose job is still pending or running. A job that ended is reconciled into result.json: Slurm's
verdict (TIMEOUT -> timeout, OUT_OF_MEMORY -> oom_host, PREEMPTED / NODE_FAIL / CANCELLED -> interrupted) wins over
the 'interrupted' the worker records when Slurm's SIGTERM reaches it, and a job that left no result gets one.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ftprof.bench import cell
from ftprof.bench.launcher import LauncherSettings
from ftprof.bench.runner import BenchRunner, Outcome, Planned, _sigterm_as_interrupt, previous_status
from ftprof.bench.sweep import Experiment, Sweep
from ftprof.config import RunConfig
from ftprof.errors import FtprofError
from ftprof.results import run_dir as files
from ftprof.results.load import read_result
from ftprof.results.status import Status
from ftprof.results.store import read_json, write_json_atomic, write_text_atomic

SLURM_DIR = ".slurm"  # under the output directory: the generated sbatch scripts and the jobs' own logs
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
          "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}
# Slurm's verdict on a job -> ftprof's failure class (COMPLETED: the run's own result.json decides).
FAILURE_OF = {"TIMEOUT": Status.TIMEOUT, "DEADLINE": Status.TIMEOUT, "OUT_OF_MEMORY": Status.OOM_HOST,
              "PREEMPTED": Status.INTERRUPTED, "NODE_FAIL": Status.INTERRUPTED, "BOOT_FAIL": Status.INTERRUPTED,
              "CANCELLED": Status.INTERRUPTED, "FAILED": Status.ERROR}
RDZV_PORT = 29500


class SlurmError(FtprofError):
    """sbatch / squeue is missing or refused (one line for the user)."""


@dataclass
class Job:
    job_id: str  # "<array job id>_<task>"
    name: str
    state: str  # squeue's state, or "GONE" once Slurm no longer knows the job
    nodes: str = ""
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


# ---------------------------------------------------------------------------------------------- talking to Slurm
def _slurm(cmd: list[str], *, check: bool = True) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SlurmError(f"'{cmd[0]}' is not installed: --launcher slurm needs the Slurm client tools") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"'{cmd[0]}' did not answer within 60 s") from None
    if check and done.returncode != 0:
        raise SlurmError(f"{cmd[0]} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:] or '?'}")
    return done.stdout


def squeue_jobs() -> dict[str, Job]:
    """Every job the controller still knows (finished ones too, for MinJobAge), one row per array task."""
    out = _slurm(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%j|%T|%N|%r"])
    jobs = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 5:
            jobs[parts[0]] = Job(parts[0], parts[1], parts[2], parts[3], parts[4])
    return jobs


def parse_scontrol(line: str) -> dict[str, str]:
    """``scontrol show job -o`` as key: value (values have no spaces except Command, which comes last)."""
    out = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out


def scontrol_job(job_id: str) -> dict[str, str]:
    """Slurm's account of a job while the controller still knows it (else, or without scontrol, nothing)."""
    try:
        return parse_scontrol(_slurm(["scontrol", "show", "job", "-o", job_id], check=False))
    except SlurmError:
        return {}


def scancel(job_ids: list[str]) -> None:
    if job_ids:
        _slurm(["scancel", *job_ids], check=False)


# ---------------------------------------------------------------------------------------------- the job record
def read_record(run_dir: Path) -> dict | None:
    try:
        data = read_json(run_dir / files.SLURM)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def find_job(record: dict, jobs: dict[str, Job]) -> Job:
    """The record's job in squeue's list: by id, else (submitter died before writing the id) by name and task."""
    job_id = record.get("job_id")
    if job_id and job_id in jobs:
        return jobs[job_id]
    if not job_id:
        for job in jobs.values():
            if job.name == record.get("job_name") and job.job_id.endswith(f"_{record.get('array_task')}"):
                return job
    return Job(job_id or "", record.get("job_name", ""), "GONE")


def active_job(run_dir: Path, jobs: dict[str, Job]) -> Job | None:
    record = read_record(run_dir)
    if record is None or record.get("reconciled"):
        return None
    job = find_job(record, jobs)
    return job if job.active else None


def _end_state(run_dir: Path) -> dict[str, str]:
    try:
        return parse_scontrol((run_dir / files.SLURM_END).read_text(errors="replace"))
    except OSError:
        return {}


def reconcile(run_dir: Path, job: Job) -> str | None:
    """A job that is no longer pending or running: make result.json say what happened (once). Returns the status."""
    record = read_record(run_dir)
    if record is None or record.get("reconciled") or job.active:
        return None
    account = scontrol_job(job.job_id) if job.job_id and job.state != "GONE" else {}
    account = account or _end_state(run_dir)
    state = job.state if job.state != "GONE" else account.get("JobState", "GONE")
    status, problem = previous_status(run_dir)
    verdict = FAILURE_OF.get(state)
    why = f"Slurm job {job.job_id or record.get('job_name')} ended {state}" + (
        f" (exit code {account['ExitCode']})" if account.get("ExitCode") else "")
    if status is None or problem:
        if verdict is None:  # COMPLETED without a result, or a job Slurm has forgotten that left nothing
            verdict = Status.ERROR if state == "COMPLETED" else Status.INTERRUPTED
        _write_failure(run_dir, verdict, why)
        status = verdict.value
    elif status != Status.OK.value and verdict in (Status.TIMEOUT, Status.OOM_HOST):
        _restamp(run_dir, verdict, why)  # the worker saw only SIGTERM; Slurm knows it was the time/memory limit
        status = verdict.value
    nodes = job.nodes or account.get("NodeList", "") or record.get("nodes", "")
    write_json_atomic(run_dir / files.SLURM, {**record, "job_id": job.job_id or record.get("job_id"),
                                              "state": state, "nodes": nodes, "reconciled": True})
    return status


def _write_failure(run_dir: Path, status: Status, why: str) -> None:
    cfg = RunConfig.from_dict(read_json(run_dir / files.CONFIG))
    cell.record_no_result(run_dir, cfg, status, why, error_type=f"slurm_{status.value}")


def _restamp(run_dir: Path, status: Status, why: str) -> None:
    result = read_result(run_dir) or {}
    notes = [*(result.get("notes") or []), f"recorded by ftprof bench: {why}"]
    write_json_atomic(run_dir / files.RESULT, {**result, "status": status.value, "error_type": f"slurm_{status.value}",
                                               "error_message": why, "notes": notes})


def refresh(run_dirs: list[Path], jobs: dict[str, Job] | None = None) -> dict[Path, Job]:
    """Reconcile every run directory whose job has ended; returns the jobs still pending or running."""
    jobs = squeue_jobs() if jobs is None else jobs
    active = {}
    for run_dir in run_dirs:
        record = read_record(run_dir)
        if record is None or record.get("reconciled"):
            continue
        job = find_job(record, jobs)
        if job.active:
            active[run_dir] = job
        else:
            reconcile(run_dir, job)
    return active


# ---------------------------------------------------------------------------------------------- the batch script
def job_shape(exp: Experiment, settings: LauncherSettings) -> tuple[int, int, int]:
    """(nodes, processes per node, GPUs per node) of one experiment."""
    d = exp.config.distributed
    nodes = d.nnodes if d.nnodes > 1 else (settings.nodes or 1)
    if settings.gpus_per_node is not None:
        gpus = settings.gpus_per_node
    else:
        gpus = 0 if exp.config.output.device == "cpu" else d.nproc_per_node
    return nodes, d.nproc_per_node, gpus


def task_commands(planned: list[Planned]) -> list[tuple[Path, list[str]]]:
    """Each array task's run directory and process: what a local sweep starts for that cell (ftprof's worker, or a
    peer cell's recipe, in the cell's interpreter)."""
    return [(p.run_dir, cell.experiment_command(p.experiment, p.run_dir)) for p in planned]


def _launch_line(shape: tuple[int, int, int]) -> str:
    """The srun line that starts the task's command (``CMD``: ``<python> -m <module> <args>``); with several
    processes, ftprof's torchrun wrapper in the same interpreter runs the module, one task per node."""
    nodes, nproc, _ = shape
    if nodes * nproc > 1:
        return ('srun --ntasks-per-node=1 --kill-on-bad-exit=1 "${CMD[0]}" -m ftprof.engine.torchrun_entry'
                ' --nnodes="$SLURM_NNODES" --nproc-per-node=' + str(nproc)
                + ' --rdzv-backend=c10d --rdzv-endpoint="$HEAD:$PORT" --rdzv-id="$SLURM_JOB_ID" "${CMD[@]:1}"')
    return 'srun --ntasks=1 "${CMD[@]}"'


def _directives(job_name: str, tasks: int, shape: tuple[int, int, int], settings: LauncherSettings,
                log_dir: Path) -> list[str]:
    nodes, _, gpus = shape
    directives = [f"--job-name={job_name}", f"--array=0-{tasks - 1}"
                  + (f"%{settings.max_jobs}" if settings.max_jobs else ""),
                  f"--nodes={nodes}", "--ntasks-per-node=1", f"--output={log_dir}/%x-%A_%a.log"]
    if gpus:
        directives.append(f"--gpus-per-node={gpus}")
    for key in ("partition", "account", "qos", "time", "constraint", "mem", "cpus_per_task"):
        value = getattr(settings, key)
        if value is not None:
            directives.append(f"--{key.replace('_', '-')}={value}")
    return directives + list(settings.sbatch)


def sbatch_script(job_name: str, tasks: list[tuple[Path, list[str]]], shape: tuple[int, int, int],
                  settings: LauncherSettings, log_dir: Path, env: dict[str, str]) -> str:
    """The job array's script: task i runs ``tasks[i]`` (a run directory and its process, ``task_commands``)."""
    quote = shlex.quote
    choose = [f"  {i}) RUN_DIR={quote(str(run_dir))}; CMD=({' '.join(map(quote, cmd))}) ;;"
              for i, (run_dir, cmd) in enumerate(tasks)]
    lines = ["#!/usr/bin/env bash", *(f"#SBATCH {d}" for d in _directives(job_name, len(tasks), shape, settings,
                                                                          log_dir)),
             "# Written by ftprof bench: array task i runs the experiment in its RUN_DIR (its command.sh replays it",
             "# outside Slurm). stdout.log, stderr.log, slurm_task.json and slurm_end.txt land in that directory.",
             "set -u",
             'case "$SLURM_ARRAY_TASK_ID" in', *choose, "esac",
             'JOB="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
             'record_end() { scontrol show job -o "$JOB" >"$RUN_DIR/.slurm_end.tmp" 2>&1;'
             ' mv -f "$RUN_DIR/.slurm_end.tmp" "$RUN_DIR/slurm_end.txt"; }',
             "trap record_end EXIT",
             "trap 'exit 143' TERM",
             f"cd {quote(os.getcwd())}",
             *(f"export {k}={quote(v)}" for k, v in sorted(env.items())),
             'printf \'{"job_id": "%s", "nodes": "%s", "started": "%s"}\\n\' "$JOB" "$SLURM_JOB_NODELIST" '
             '"$(date -Iseconds)" >"$RUN_DIR/.slurm_task.tmp" && mv -f "$RUN_DIR/.slurm_task.tmp" '
             '"$RUN_DIR/slurm_task.json"',
             'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
             f'PORT=$(( {RDZV_PORT} + SLURM_JOB_ID % 1000 ))',
             'export HEAD PORT',
             _launch_line(shape) + ' >"$RUN_DIR/stdout.log" 2>"$RUN_DIR/stderr.log"']
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- the sweep
class SlurmRunner(BenchRunner):
    """Submit the planned experiments, then watch them until they end (unless ``watch`` is False). Ctrl-C stops
    watching and leaves the jobs alone, unless ``cancel``; it cancels them."""

    def __init__(self, sweep: Sweep, out_dir: Path, planned: list[Planned], settings: LauncherSettings,
                 on_event: Callable[[str, object], None] | None = None, *, watch: bool = True,
                 cancel: bool = False):
        super().__init__(sweep, out_dir, planned, on_event=on_event, slots=[])
        self.settings = settings
        self.watch = watch
        self.cancel = cancel
        self.submitted: dict[Path, Planned] = {}

    def run(self) -> list[Outcome]:
        with _sigterm_as_interrupt():
            try:
                self._submit_all()
                if self.watch:
                    self._watch()
            except KeyboardInterrupt:
                self.interrupted = True
                if self.cancel:
                    self._cancel()
        return self.outcomes

    def _submit_all(self) -> None:
        for p in self.planned:
            if p.action in ("skip", "busy"):
                self.on_event("skip", p)
        groups: dict[tuple[int, int, int], list[Planned]] = {}
        for p in self.planned:
            if p.action == "run":
                groups.setdefault(job_shape(p.experiment, self.settings), []).append(p)
        for shape, group in groups.items():
            claimed = [(p, c) for p in group if (c := self._claim(p)) is not None]
            try:
                if claimed:
                    self._submit([p for p, _ in claimed], shape)
            finally:
                for _, claim in claimed:
                    claim.release()  # from here on the job id on disk is the claim

    def _submit(self, group: list[Planned], shape: tuple[int, int, int]) -> None:
        job_name = f"ftprof-{self.sweep.name}-{uuid.uuid4().hex[:8]}"
        log_dir = self.out_dir / SLURM_DIR
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        for key in ("PYTORCH_ALLOC_CONF", "MEMORY_LOGGING", "PYTHONPATH"):
            if os.environ.get(key):
                env[key] = os.environ[key]
        now = _dt.datetime.now().isoformat(timespec="seconds")
        script_path = log_dir / f"{job_name}.sbatch"
        write_text_atomic(script_path, sbatch_script(job_name, task_commands(group), shape, self.settings,
                                                     log_dir, env))
        for task, p in enumerate(group):
            cell.prepare(p.experiment, p.run_dir, env)
            write_json_atomic(p.run_dir / files.SLURM, {"job_name": job_name, "array_task": task, "job_id": None,
                                                        "script": str(script_path), "submitted": now})
        answer = _slurm(["sbatch", "--parsable", str(script_path)]).strip()
        array_id = answer.split(";")[0]
        for task, p in enumerate(group):
            record = read_record(p.run_dir) or {}
            write_json_atomic(p.run_dir / files.SLURM, {**record, "job_id": f"{array_id}_{task}"})
            self.submitted[p.run_dir] = p
            self.on_event("submit", (p, f"{array_id}_{task}"))

    def _watch(self) -> None:
        waiting = dict(self.submitted)
        started = time.monotonic()
        seen: dict[Path, str] = {}
        while waiting:
            jobs = squeue_jobs()
            for run_dir, p in list(waiting.items()):
                job = find_job(read_record(run_dir) or {}, jobs)
                if job.active:
                    if seen.get(run_dir) != job.state:
                        seen[run_dir] = job.state
                        self.on_event("state", (p, job))
                    continue
                status = reconcile(run_dir, job)
                if status is None:  # someone else (another --status) reconciled it already
                    status, _ = previous_status(run_dir)
                try:
                    result = read_result(run_dir) or {}
                except ValueError:
                    result = {}
                del waiting[run_dir]
                outcome = Outcome(p.experiment.name, status or Status.ERROR.value,
                                  time.monotonic() - started, result)
                self.outcomes.append(outcome)
                self.on_event("finish", outcome)
            if waiting:
                time.sleep(self.settings.poll_s)

    def _cancel(self) -> None:
        run_dirs = list(self.submitted)
        ids = [job.job_id for job in refresh(run_dirs).values()]
        scancel(ids)
        deadline = time.monotonic() + 60
        while ids and time.monotonic() < deadline and refresh(run_dirs):
            time.sleep(1)


def plan_with_jobs(planned: list[Planned], jobs: dict[str, Job]) -> list[Planned]:
    """A cell whose job is still pending or running is busy: never submitted twice."""
    for p in planned:
        job = active_job(p.run_dir, jobs)
        if job is not None:
            p.action, p.reason = "busy", f"Slurm job {job.job_id} is {job.state.lower()}"
    return planned


@dataclass
class CellState:
    experiment: str
    job_id: str
    state: str  # Slurm's (PENDING, RUNNING...) while it is known and active, else the recorded status
    nodes: str
    status: str | None


def sweep_status(sweep: Sweep, out_dir: Path, *, reconcile_ended: bool = True) -> list[CellState]:
    """Where each experiment of a submitted sweep stands (``ftprof bench --status``)."""
    run_dirs = [out_dir / e.name for e in sweep.experiments]
    try:  # squeue only when a job may still be out there (an unreachable controller takes seconds to say so)
        jobs = squeue_jobs() if any(not (read_record(d) or {"reconciled": True}).get("reconciled")
                                    for d in run_dirs) else {}
    except SlurmError:  # no Slurm here (a local sweep, or a login node without the tools): what the files say
        jobs, reconcile_ended = {}, False
    active = refresh(run_dirs, jobs) if reconcile_ended else {
        d: j for d in run_dirs if (j := active_job(d, jobs)) is not None}
    cells = []
    for exp, run_dir in zip(sweep.experiments, run_dirs, strict=True):
        record = read_record(run_dir) or {}
        status, _ = previous_status(run_dir)
        job = active.get(run_dir)
        if job is not None:
            cells.append(CellState(exp.name, job.job_id, job.state, job.nodes, status))
            continue
        task = _task_info(run_dir)
        cells.append(CellState(exp.name, record.get("job_id") or task.get("job_id", ""),
                               record.get("state", "") if record else "", record.get("nodes") or task.get("nodes", ""),
                               status))
    return cells


def _task_info(run_dir: Path) -> dict:
    try:
        data = json.loads((run_dir / files.SLURM_TASK).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
