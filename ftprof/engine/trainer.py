"""One training run in this process: open the run directory, enter the trackers, build, loop, assemble the result.

    build (engine/build.py)  ->  loop (engine/loop.py)  ->  result (engine/result.py)
          trackers (engine/trackers.py) entered together around both

A failure anywhere (OOM, Ctrl-C, any error) leaves the trackers stopped and becomes the result's status; what was
recorded up to that point is kept. A ConfigError found while building (bad input only the model can reveal) is
recorded as an error and raised again, so the command line reports it in one line.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ftprof import ranks
from ftprof.config.saving import resume_changes
from ftprof.engine import aggregate, distributed
from ftprof.engine.build import Built, build
from ftprof.engine.compile import eager_rounding
from ftprof.engine.loop import run_steps
from ftprof.engine.proof import NotTrainedError, TrainingCheck
from ftprof.engine.result import Recorded, assemble
from ftprof.engine.save import load_checkpoint, prune_checkpoints, save_merged, save_trained, write_checkpoint
from ftprof.engine.trackers import FirstStepMemory, NvmlTracker, StepLog
from ftprof.errors import ConfigError
from ftprof.lifetime import stop_requested
from ftprof.models import attention, kernels
from ftprof.profiling.memory import MemoryTracker
from ftprof.profiling.noop import NullProfiler
from ftprof.resolved import ResolvedRun
from ftprof.results.env import collect_env
from ftprof.results.parts import Saved
from ftprof.results.run_dir import RunDirWriter, default_run_name, make_run_dir
from ftprof.results.schema import RunResult, StepRecord
from ftprof.results.status import Status
from ftprof.runtime import allocator_setting, memory_cap


def now_iso() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


CPU_ALLOC_FAILED = "DefaultCPUAllocator: can't allocate memory"  # torch's host allocator, out of memory


def classify_exception(exc: BaseException) -> Status:
    if isinstance(exc, torch.OutOfMemoryError):
        return Status.OOM_DEVICE
    if isinstance(exc, KeyboardInterrupt) or stop_requested():  # (a peer's leaving, once asked to stop)
        return Status.INTERRUPTED
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and CPU_ALLOC_FAILED in str(exc)):
        return Status.OOM_HOST
    if isinstance(exc, NotTrainedError):
        return Status.NOT_TRAINED
    return Status.ERROR


def open_run_dir(resolved: ResolvedRun) -> RunDirWriter:
    """The run directory, with config.json and env.json written by the main rank."""
    cfg, dist = resolved.config, resolved.dist
    run_name = cfg.output.run_name
    if dist.enabled and run_name is None:  # every rank must write into the same directory
        run_name = ranks.all_gather_object(default_run_name(cfg.method.method, cfg.model.model))[0]
    path = make_run_dir(cfg.output.output_dir, run_name, cfg.method.method, cfg.model.model)
    writer = RunDirWriter(path, rank=dist.rank if dist.enabled else None)
    if dist.is_main:
        writer.write_config(cfg.to_dict())
        writer.write_env(collect_env(allocator_setting()))
    return writer


ProfilerFactory = Callable[["Trainer", Built], object]


class Trainer:
    """Holds one run's parts; every attribute exists from construction on (``built`` is None until built)."""

    def __init__(self, resolved: ResolvedRun, *, log: Callable[[str], None] = print,
                 on_start: Callable[[Trainer], None] = lambda trainer: None,
                 on_step: Callable[[StepRecord], None] = lambda record: None,
                 make_profiler: ProfilerFactory | None = None):
        self.resolved = resolved
        self.cfg = resolved.config
        self.device = resolved.device
        self.dist = resolved.dist
        self.log, self.on_start, self.on_step = log, on_start, on_step
        self.make_profiler = make_profiler or (lambda trainer, built: NullProfiler())
        self.started_at = now_iso()
        if resolved.device_type == "cuda":
            torch.cuda.set_device(self.device)  # libraries that use "the current device" (bitsandbytes) agree
        gc.collect()  # leftovers of earlier runs in this process must not count as this run's memory
        self.writer = open_run_dir(resolved)
        self.run_dir = self.writer.path
        self.memory = MemoryTracker(self.device)
        self.steps = StepLog(self.writer, self.memory, self.device, self.cfg.train.max_steps)
        self.first = FirstStepMemory(measure_activations=not resolved.shards, device_type=resolved.device_type)
        self.nvml = NvmlTracker(self.cfg, self.device, self.run_dir, self.dist.rank if self.dist.enabled else None,
                                self.steps)
        self.profiler = NullProfiler()
        self.built: Built | None = None
        self.kernels_applied: list[str] = []  # Liger kernels patched in (models/kernels.py)
        self.setup_time_s: float | None = None
        self.saved: Saved | None = None  # what --save wrote
        self.check: TrainingCheck | None = None  # the proof that the run trained (engine/proof.py)
        self.not_trained: str | None = None  # why it did not, when it did not
        self.start_step = 0  # the step a resumed run's checkpoint had reached (--resume-from-checkpoint)
        self.checkpoints: list[str] = []  # what --save-steps wrote, in order
        self.merged_dir: Path | None = None  # what --save-merged wrote

    def write_checkpoint(self, step: int) -> None:
        """--save-steps: checkpoint-<step>/ in the run directory, then the oldest beyond --save-total-limit go."""
        path = write_checkpoint(self.resolved, self.built, self.run_dir, step, self.log)
        self.checkpoints.append(path.name)
        prune_checkpoints(self.run_dir, self.cfg.save.save_total_limit, self.log)

    def run(self) -> RunResult:
        """Train and return this rank's result (status ok or a failure class); files are written by ``teardown``."""
        status, error = Status.OK, None
        try:
            with contextlib.ExitStack() as trackers:
                trackers.enter_context(memory_cap(self.device, self.cfg.output.memory_limit_gib))
                if self.resolved.shards and not self.dist.enabled:  # --fsdp-cpu-offload on one GPU
                    trackers.enter_context(distributed.single_process_group(self.device))
                trackers.enter_context(self.nvml)
                trackers.enter_context(self.memory)
                self.kernels_applied = trackers.enter_context(
                    kernels.patched(self.cfg.model.kernels, self.resolved.source.config.model_type,
                                    self.cfg.model.compile))
                trackers.enter_context(attention.preferred(self.cfg.model.sdpa_backend))
                trackers.enter_context(eager_rounding(self.cfg.model.compile))
                t0 = time.perf_counter()
                self.built = build(self.resolved, self.memory, self.log)
                self.setup_time_s = time.perf_counter() - t0
                self.profiler = trackers.enter_context(self.make_profiler(self, self.built))
                if self.cfg.save.resume_from_checkpoint:  # weights, optimizer, data position, RNG
                    self.start_step = load_checkpoint(self.resolved, self.built,
                                                      Path(self.cfg.save.resume_from_checkpoint), self.log)
                trackers.enter_context(self.steps)
                self.on_start(self)
                self.check = TrainingCheck(self.built.model, self.cfg.train.max_steps - self.start_step)
                run_steps(self.cfg, self.built, self.device, self.memory, self.steps, self.first, self.profiler,
                          self.on_step, self.check, stop_early=not self.dist.enabled, start=self.start_step,
                          checkpoint=self.write_checkpoint if self.cfg.save.save_steps else None)
                self.prove_trained()
                if self.cfg.save.save:  # after the last step's time; inside the process group FSDP2 needs
                    self.saved = save_trained(self.resolved, self.built, self.run_dir, self.log)
                if self.cfg.save.save_merged:
                    self.merged_dir = save_merged(self.resolved, self.built, self.run_dir, self.log)
        except ConfigError as exc:
            self.teardown(self.result(Status.ERROR, exc))
            self.release()
            raise
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - every failure becomes a recorded status
            status, error = classify_exception(exc), exc
        return self.result(status, error)

    def prove_trained(self) -> None:
        """Raise NotTrainedError unless every rank's checks passed (collective: the ranks agree on the status)."""
        reason = self.check.verdict()
        if self.dist.enabled:
            reasons = ranks.all_gather_object(reason)
            failed = [(rank, r) for rank, r in enumerate(reasons) if r]
            reason = f"rank {failed[0][0]}: {failed[0][1]}" if failed else None
        if reason:
            self.not_trained = reason
            raise NotTrainedError(reason)

    def result(self, status: Status, exc: BaseException | None = None) -> RunResult:
        recorded = Recorded(self.resolved, str(self.run_dir), self.started_at, now_iso(), self.built, self.setup_time_s,
                            self.steps, self.memory, self.first, self.nvml, self.profiler, self.kernels_applied,
                            saved=self.saved, check=self.check, not_trained=self.not_trained)
        res = assemble(recorded, status, exc)
        if self.start_step:
            changed = resume_changes(self.cfg.save.resume_from_checkpoint, self.cfg.to_flat())
            res.notes.append(f"resumed from {self.cfg.save.resume_from_checkpoint} at step {self.start_step}: "
                             f"steps {self.start_step + 1}-{self.cfg.train.max_steps} ran here"
                             + (f"; changed since the checkpoint: {', '.join(changed)}" if changed else ""))
        if self.merged_dir is not None:  # result.json's artifacts: in the run directory, else where it is
            inside = self.merged_dir.resolve().is_relative_to(Path(self.run_dir).resolve())
            res.artifacts["merged_model"] = os.path.relpath(self.merged_dir, self.run_dir) if inside \
                else str(self.merged_dir.resolve())  # (absolute: a path relative to where ftprof ran resolves nowhere)
        if self.checkpoints:
            res.notes.append(f"--save-steps wrote {', '.join(self.checkpoints)} (--save-total-limit keeps the "
                             "newest)" if self.cfg.save.save_total_limit else
                             f"--save-steps wrote {', '.join(self.checkpoints)}")
        if self.dist.enabled and status is Status.OK:
            res = self.aggregate_ranks(res)
        elif self.dist.enabled:
            # No collective after a failure (a rank that is gone would hang it): say how many ranks ran, and that
            # the figures are this rank's alone.
            res.run.world_size, res.run.parallel = self.resolved.world_size, self.cfg.distributed.parallel
            res.notes.append(f"figures are rank {self.dist.rank}'s: the ranks' figures are combined only when "
                             "the run finishes")
        return res

    def aggregate_ranks(self, res: RunResult) -> RunResult:
        """Collective: every rank sends its figures; rank 0 returns the run's aggregate (others: their own)."""
        payload = {"rank": self.dist.rank, "steps": self.steps.dicts(), "summary": aggregate.rank_summary(res),
                   "nvml": res.nvml.summary}
        gathered = ranks.all_gather_object(payload)
        if not self.dist.is_main:
            return res
        rows = aggregate.aggregate_steps([g["steps"] for g in gathered])
        self.writer.write_aggregate_steps(rows)
        return aggregate.aggregate_result(res, gathered, rows, self.cfg.distributed.parallel)

    def teardown(self, result: RunResult) -> RunResult:
        self.writer.write_memory_stages(self.memory.stage_rows())
        if self.dist.enabled:
            self.writer.write_result(result, rank_file=True)
        if self.dist.is_main:
            self.writer.write_result(result)
        return result

    def release(self) -> None:
        """Free the model and optimizer now, so a next run in the same process starts from an empty device."""
        self.built = None
        gc.collect()  # PEFT wrappers hold reference cycles: without this the weights outlive the run
        if self.resolved.device_type == "cuda":
            torch.cuda.empty_cache()
