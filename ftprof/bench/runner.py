"""Run a sweep: one process per experiment, in its own directory, failures recorded as results, resumable.

Each experiment's validated configuration is written to its run directory's config.json, and a child process
loads it (``python -m ftprof.engine.worker config.json``) in a new process session (so Ctrl-C, timeouts and kills
reach its whole tree), with stdout.log, stderr.log and command.sh (the same run as an ``ftprof train`` command line,
environment included, for people to read and replay) beside the run files. On a machine with several GPUs
experiments run side by side on disjoint GPUs, each seeing only its own through CUDA_VISIBLE_DEVICES; on CPU they
run one at a time.

A ``trainer: hf|trl|unsloth`` cell runs its recipe (``recipe_command``, also its command.sh) in its ``python:``
instead of the worker; claims, timeouts, failure classification and resume are the same. What a cell runs, the
files it starts with and the result recorded for one that left none are ``ftprof.bench.cell``'s, shared with the
Slurm launcher.

A child that dies without writing result.json is classified here: ``timeout`` (bench killed it at its limit),
``interrupted`` (Ctrl-C or SIGTERM to bench), ``oom_host`` (SIGKILL while the kernel's OOM-kill count rose:
``ftprof.host_memory.oom_kill_counts``, read as each child starts and ends), ``killed`` (any other signal, named:
SIGKILL from a person or another program, SIGTERM not sent by bench), ``error`` (a nonzero exit). A rerun runs
``interrupted`` and ``killed`` cells again (the stop came from outside the run); the other failures are kept
unless ``--retry-failed`` (``Status.resumed``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ftprof.bench import cell
from ftprof.bench.cell import (  # noqa: F401 - re-exported: bench's callers read a cell's commands from here
    PEER_CONFIG,
    cell_config,
    clear_attempt,
    command_script,
    experiment_command,
    recipe_command,
    replay_command,
    run_config,
)
from ftprof.bench.lock import Claim, claim_cell, claim_holder
from ftprof.bench.sweep import Experiment, Sweep
from ftprof.host_memory import VMSTAT, oom_kill_counts, oom_kills_between
from ftprof.lifetime import answer_ctrl_c, preexec_die_with
from ftprof.results import run_dir as files
from ftprof.results.load import read_result, read_runs
from ftprof.results.run_dir import RunDirWriter
from ftprof.results.schema import failure_result
from ftprof.results.status import Status
from ftprof.results.store import write_csv_atomic, write_json_atomic

INTERRUPT_GRACE_S = 30.0  # time a child gets to record 'interrupted' after Ctrl-C before it is killed
POLL_S = 0.2


@dataclass
class Planned:
    experiment: Experiment
    run_dir: Path
    previous: str | None  # status found on disk, None if never run
    action: str  # "run" | "skip" | "busy" (a live process, here or on another host, is running it now)
    reason: str = ""  # why: a damaged file, who holds the cell
    force: bool = False  # --force: a live claim on the cell is taken over
    overrides: str | None = None  # whose live claim --force took over (or, planning, will take over)


@dataclass
class Running:
    planned: Planned
    proc: subprocess.Popen
    slot: str | None
    started: float
    deadline: float
    claim: Claim | None = None
    timed_out: bool = False
    interrupted: bool = False
    oom_kills: dict[str, int] = field(default_factory=dict)  # the kernel's OOM-kill counts as it started


@dataclass
class Outcome:
    name: str
    status: str
    seconds: float
    result: dict = field(default_factory=dict)


def previous_status(run_dir: Path) -> tuple[str | None, str]:
    """The status a run directory records (None: never finished) and, for a damaged result.json or config.json,
    why it counts as a failed run ('error')."""
    try:
        result = read_result(run_dir)
    except ValueError as exc:
        return Status.ERROR.value, str(exc)
    if result is None:
        return None, ""
    config = run_dir / files.CONFIG
    if config.exists():
        try:
            read_result(run_dir, files.CONFIG)
        except ValueError as exc:
            return Status.ERROR.value, str(exc)
    return result["status"], ""


def plan(sweep: Sweep, out_dir: Path, *, force: bool = False, retry_failed: bool = False) -> list[Planned]:
    planned = []
    for exp in sweep.experiments:
        run_dir = out_dir / exp.name
        prev, reason = previous_status(run_dir)
        status = Status.parse(prev)
        holder = claim_holder(run_dir)
        if holder is not None and not force:
            action, reason = "busy", f"being run by {holder}"
        elif force or status is None or status.resumed:
            action = "run"
        elif status.failed:
            action = "run" if retry_failed else "skip"
        else:
            action = "skip"
        if force and holder is not None:
            reason = f"--force: overrides the claim of {holder}"
        planned.append(Planned(exp, run_dir, prev, action, reason, force=force, overrides=holder if force else None))
    return planned


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def killed_by(signum: int, before: dict[str, int], after: dict[str, int]) -> tuple[Status, str]:
    """A child killed by ``signum`` that bench did not send: ``oom_host`` only when it is SIGKILL and the kernel's
    OOM-kill count rose while it ran (``before``/``after``: ``oom_kill_counts``), else ``killed`` with the signal
    named (and whether the OOM killer can be ruled out)."""
    name = signal_name(signum)
    if signum != signal.SIGKILL:  # the OOM killer sends SIGKILL only
        return Status.KILLED, f"killed by {name}, not sent by ftprof bench"
    rose = oom_kills_between(before, after)
    cgroup_read = any(src != VMSTAT for src in after)
    if any(src != VMSTAT for src in rose) or (rose and not cgroup_read):
        return Status.OOM_HOST, (f"killed by SIGKILL while the kernel's OOM killer killed a process (oom_kill rose "
                                 f"in {rose[0]}): out of host memory")
    if rose:  # a process outside this cgroup was OOM-killed meanwhile
        return Status.KILLED, ("killed by SIGKILL, not sent by ftprof bench; possibly out of host memory (the "
                               "kernel's OOM killer killed a process meanwhile: `dmesg` names it)")
    if not after:
        return Status.KILLED, ("killed by SIGKILL, not sent by ftprof bench (the kernel's OOM-kill counts are "
                               "unreadable here)")
    return Status.KILLED, "killed by SIGKILL, not sent by ftprof bench nor by the kernel's OOM killer"


def gpu_slots() -> list[str]:
    """Visible GPUs as CUDA_VISIBLE_DEVICES entries (no CUDA context is created in this process)."""
    from ftprof.checks import host_has_cuda

    if not host_has_cuda():  # no NVIDIA driver: no GPU, said without importing torch
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        import torch

        count = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no CUDA build or driver: CPU
        count = 0
    if count == 0:
        return []
    entries = [e.strip() for e in visible.split(",") if e.strip()] if visible else [str(i) for i in range(count)]
    return entries[:count]


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM and SIGHUP (the terminal closed) raise KeyboardInterrupt in the main thread (so bench stops its
    children, records them and writes its summary)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def _signals_set_flag(flag: list[bool]):
    """While bench stops its children, Ctrl-C and SIGTERM only set ``flag`` (hurry: kill now) instead of raising,
    so the children are still waited for and recorded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        flag[0] = True

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class BenchRunner:
    def __init__(self, sweep: Sweep, out_dir: Path, planned: list[Planned],
                 on_event: Callable[[str, object], None] | None = None, slots: list[str] | None = None):
        self.sweep = sweep
        self.out_dir = out_dir
        self.planned = planned
        self.on_event = on_event or (lambda kind, payload: None)
        self.slots = gpu_slots() if slots is None else slots
        self.outcomes: list[Outcome] = []
        self.interrupted = False
        self._running: list[Running] = []

    # ------------------------------------------------------------------ one experiment
    def _launch(self, p: Planned, slot: str | None, claim: Claim) -> Running:
        overrides = {"PYTHONUNBUFFERED": "1"}
        if slot is not None:
            overrides["CUDA_VISIBLE_DEVICES"] = slot
            overrides["CUDA_DEVICE_ORDER"] = os.environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        elif self.slots == [] and "CUDA_VISIBLE_DEVICES" in os.environ:
            overrides["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        for key in ("PYTORCH_ALLOC_CONF", "MEMORY_LOGGING"):
            if os.environ.get(key):
                overrides[key] = os.environ[key]
        cell.prepare(p.experiment, p.run_dir, overrides)
        cmd = experiment_command(p.experiment, p.run_dir)
        env = {**os.environ, **overrides}
        oom_kills = oom_kill_counts()
        with open(p.run_dir / files.STDOUT, "wb") as out, open(p.run_dir / files.STDERR, "wb") as err:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True,
                                    preexec_fn=preexec_die_with(os.getpid()))
        claim.add_process(proc.pid)
        now = time.monotonic()
        self.on_event("start", p)
        return Running(p, proc, slot, now, now + self.sweep.timeout_s, claim, oom_kills=oom_kills)

    def _claim(self, p: Planned) -> Claim | None:
        """Claim the cell just before it starts; a cell another process took since planning is skipped."""
        claim = claim_cell(p.run_dir, force=p.force)
        if claim is not None and claim.overridden:
            p.overrides = claim.overridden
            print(f"ftprof bench: --force: {p.experiment.name}: took over the claim of {claim.overridden}",
                  file=sys.stderr, flush=True)
        if claim is None:
            p.action, p.reason = "busy", f"being run by {claim_holder(p.run_dir) or 'another process'}"
            self.on_event("skip", p)
        return claim

    def _finish(self, r: Running) -> Outcome:
        code = r.proc.returncode
        status, problem = previous_status(r.planned.run_dir)
        if status is None or problem or (r.timed_out and status != Status.OK):
            classified, reason = self._classify(r, code)
            self._write_failure(r, classified, code, reason)
            status = classified.value
        try:
            result = read_result(r.planned.run_dir) or {}
        except ValueError:
            result = {}
        if r.claim is not None:
            r.claim.release()
        outcome = Outcome(r.planned.experiment.name, status, time.monotonic() - r.started, result)
        self.outcomes.append(outcome)
        self.on_event("finish", outcome)
        return outcome

    def _classify(self, r: Running, code: int) -> tuple[Status, str]:
        """The failure class of a child that left no result, and the reason recorded with it."""
        if r.timed_out:
            return Status.TIMEOUT, f"timed out after {self.sweep.timeout_s:g} s"
        if r.interrupted or code in (Status.INTERRUPTED.exit_code, -signal.SIGINT):
            return Status.INTERRUPTED, "interrupted"
        if code is not None and code < 0:
            return killed_by(-code, r.oom_kills, oom_kill_counts())
        return Status.ERROR, f"exited with code {code}"

    def _write_failure(self, r: Running, status: Status, code: int, reason: str) -> None:
        """The child died before writing result.json: record what bench knows, keep what the child wrote."""
        exp, run_dir = r.planned.experiment, r.planned.run_dir
        if not (run_dir / files.CONFIG).is_file():
            RunDirWriter(run_dir).write_config(cell_config(exp, run_dir))
        cell.record_no_result(run_dir, exp.config, status, reason)

    def _unrunnable(self, p: Planned, reason: str) -> None:
        """An experiment that cannot start here is still a row: status error, with the reason."""
        p.run_dir.mkdir(parents=True, exist_ok=True)
        cfg = p.experiment.config
        res = failure_result(cfg, p.run_dir, Status.ERROR.value, "unrunnable", reason,
                             note=f"recorded by ftprof bench: {reason}")
        RunDirWriter(p.run_dir).write_config(cell_config(p.experiment, p.run_dir))
        RunDirWriter(p.run_dir).write_result(res)
        outcome = Outcome(p.experiment.name, Status.ERROR.value, 0.0, res.to_dict())
        self.outcomes.append(outcome)
        self.on_event("finish", outcome)

    @staticmethod
    def _signal(r: Running, sig: int) -> None:
        """Signal the experiment's process group and every descendant: torchrun's workers may sit in sessions of
        their own, and a killed experiment must not leave a worker holding a GPU."""
        import psutil

        try:
            family = psutil.Process(r.proc.pid).children(recursive=True)
        except psutil.Error:
            family = []
        try:
            os.killpg(r.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for child in family:
            try:
                child.send_signal(sig)
            except psutil.Error:
                pass

    def _running_procs(self) -> list[subprocess.Popen]:
        return [r.proc for r in self._running]

    # ------------------------------------------------------------------ the loop
    def run(self) -> list[Outcome]:
        """Run the planned experiments. SIGTERM is handled like Ctrl-C (children stopped, 'interrupted' recorded)
        while this runs in the main thread."""
        answer_ctrl_c()  # and the experiments inherit Python's Ctrl-C, which _stop_all relies on
        with _sigterm_as_interrupt():
            return self._run()

    def _run(self) -> list[Outcome]:
        pending = [p for p in self.planned if p.action == "run"]
        for p in self.planned:
            if p.action in ("skip", "busy"):
                self.on_event("skip", p)
        free: list[str] = list(self.slots)
        cpu_free = [True]  # without GPUs, one experiment at a time
        running = self._running = []
        try:
            while pending or running:
                while pending:
                    p = pending[0]
                    need = p.experiment.gpus
                    if self.slots and need > len(self.slots):
                        pending.pop(0)
                        self._unrunnable(p, f"needs {need} GPUs; this machine has {len(self.slots)}")
                        continue
                    if (not self.slots and not cpu_free[0]) or (self.slots and need > len(free)):
                        break  # wait for a slot of its size
                    pending.pop(0)
                    claim = self._claim(p)
                    if claim is None:
                        continue
                    if self.slots:
                        slot = ",".join(free[:need])
                        del free[:need]
                    else:
                        slot, cpu_free[0] = None, False
                    try:
                        running.append(self._launch(p, slot, claim))
                    except BaseException:
                        claim.release()
                        raise
                time.sleep(POLL_S)
                for r in list(running):
                    if r.proc.poll() is None:
                        if time.monotonic() > r.deadline and not r.timed_out:
                            r.timed_out = True
                            self._signal(r, signal.SIGKILL)
                        continue
                    running.remove(r)
                    if r.slot is None:
                        cpu_free[0] = True
                    else:
                        free.extend(r.slot.split(","))
                    self._finish(r)
        except KeyboardInterrupt:
            self.interrupted = True
            try:
                self._stop_all(running)
            except KeyboardInterrupt:  # a second Ctrl-C before _stop_all's handlers were in place: at once
                self._stop_all(running, hurry=True)
        return self.outcomes

    def _stop_all(self, running: list[Running], hurry: bool = False) -> None:
        """Ctrl-C: ask each child to stop (it records 'interrupted'), kill what does not stop in time. A second
        Ctrl-C (or SIGTERM) while waiting kills the children at once; they are still waited for and recorded."""
        hurry = [hurry]
        with _signals_set_flag(hurry):
            for r in running:
                r.interrupted = True
                self._signal(r, signal.SIGINT)
            deadline = time.monotonic() + INTERRUPT_GRACE_S
            for r in list(running):
                while r.proc.poll() is None:
                    if hurry[0] or time.monotonic() > deadline:
                        self._signal(r, signal.SIGKILL)
                        r.proc.wait()
                        break
                    time.sleep(POLL_S)
                self._finish(r)
                running.remove(r)

    # ------------------------------------------------------------------ summary
    def write_summary(self) -> Path:
        path = write_csv_atomic(self.out_dir / "raw_summary.csv", sweep_rows(self.out_dir, self.planned))
        write_sweep_record(self.sweep, self.out_dir, self.planned)
        return path


def sweep_rows(out_dir: Path, planned: list[Planned]) -> list[dict]:
    """One row per experiment of the sweep that left a run directory, in the sweep's order: its result, or, where its
    result.json or config.json is damaged, an error row naming the file and why (the cell stays in the table and in
    raw_summary.csv instead of dropping out of both)."""
    by_name = {Path(row["run_dir"]).name: row for row in read_runs([out_dir]).rows}
    rows = []
    for p in planned:
        name = p.experiment.name
        if name in by_name:
            rows.append(dict(by_name[name], experiment=name))
            continue
        status, why = previous_status(p.run_dir)
        if status == Status.ERROR.value and why:
            rows.append({**p.experiment.values, "run_dir": str(p.run_dir), "experiment": name, "status": status,
                         "error_type": "damaged", "error_message": why})
    return rows


SWEEP_RECORD = "sweep.json"  # which sweep an output directory holds (a different one is refused: flow.py)


def write_sweep_record(sweep: Sweep, out_dir: Path, planned: list[Planned]) -> Path:
    """sweep.json: the sweep whose results ``out_dir`` holds, written before its experiments start and again with
    the summary."""
    return write_json_atomic(out_dir / SWEEP_RECORD, {
        "name": sweep.name, "sweep_file": str(sweep.path), "memory_logging": sweep.memory_logging,
        "timeout_s": sweep.timeout_s, "experiments": [p.experiment.name for p in planned]})
