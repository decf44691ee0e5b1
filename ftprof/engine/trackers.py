"""What a run records while it trains. Each tracker is a context manager that starts on enter and stops on exit
(the run enters them together with ``contextlib.ExitStack``), and keeps what it recorded in attributes that exist
from construction on; ``ftprof.engine.result.assemble`` only reads them.

- ``StepLog``: one StepRecord per optimizer step (timed with device synchronisation), flushed to steps.csv, with
  the host time inside each step that was not the model's own work (``HostTime``: garbage collection, compiles).
- ``MemoryTracker`` (ftprof.profiling.memory): allocator stats per stage; ``StepLog`` closes the steady stage.
- ``FirstStepMemory``: activations saved by the first micro-batch's forward and the static memory parts.
- ``NvmlTracker``: the NVML sampler process, stopped with the window of steps whose energy counts.
- the profiler (``TorchProfiler`` or ``NullProfiler``), entered with the others around the loop.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch

from ftprof import metrics
from ftprof.config import RunConfig
from ftprof.profiling.host_time import HostTime
from ftprof.profiling.memory import MemoryTracker, SavedActivations, static_breakdown
from ftprof.results import run_dir as files
from ftprof.results.run_dir import RunDirWriter
from ftprof.results.schema import StepRecord

# Write steps.csv after every step for short runs, then every STEPS_FLUSH_EVERY steps (and at the end).
STEPS_FLUSH_EVERY = 10
STEPS_ALWAYS_FLUSHED = 50


class StepTimer:
    """Wall time of one optimizer step, with device synchronisation (CUDA events on GPU)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._t0 = 0.0
        self._start = self._end = None

    def start(self) -> None:
        if self.cuda:
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self._end.record()
            self._end.synchronize()  # sync point: the step's kernels must finish before we read the time
            return self._start.elapsed_time(self._end) / 1000.0
        return time.perf_counter() - self._t0


class StepLog:
    """The steps of a run, written to steps.csv as they come. Step 1 is the first-step stage; from step 2 on the
    steady stage is open, and it closes on exit with the max of the steps' own peaks (each step resets the
    allocator's peak counter at its start, so the stage cannot read one counter across steps)."""

    def __init__(self, writer: RunDirWriter, memory: MemoryTracker, device: torch.device, max_steps: int):
        self.writer = writer
        self.memory = memory
        self.timer = StepTimer(device)
        self.max_steps = max_steps
        self.steps: list[StepRecord] = []
        self.host = HostTime()
        self._steady_before: int | None = None
        self._retries_before = 0

    def __enter__(self) -> StepLog:
        self.host.__enter__()
        return self

    def begin(self, index: int) -> float:
        """Start timing step ``index``; returns its wall-clock start."""
        if index == 2:
            self._steady_before = self.memory.allocated()
        self.memory.reset_peak()
        self._retries_before = self.memory.alloc_retries()
        self.host.lap()  # what ran between steps is no step's
        started = time.time()
        self.timer.start()
        return started

    def causes(self) -> dict:
        """The step's host time in garbage collection and compiles, and its allocator retries (after ``stop``)."""
        return self.host.lap() | {"alloc_retries": self.memory.alloc_retries() - self._retries_before}

    def end(self, record: StepRecord) -> None:
        self.steps.append(record)
        index = record.step
        if index <= STEPS_ALWAYS_FLUSHED or index % STEPS_FLUSH_EVERY == 0 or index == self.max_steps:
            self.writer.write_steps(self.steps)

    def __exit__(self, *exc) -> None:
        self.host.__exit__(*exc)
        if self._steady_before is not None:
            # the steps after the first (its own stages) that are no warm-up, as the steady figures (all but the
            # first where every step is warm-up)
            steady = [s for s in self.steps[1:] if not s.warmup] or self.steps[1:]
            self.memory.close_stage("steady_state", self._steady_before,
                                    peak_allocated=metrics.max_present(s.mem_peak_allocated for s in steady),
                                    peak_reserved=metrics.max_present(s.mem_peak_reserved for s in steady))
        self.writer.write_steps(self.steps)

    def dicts(self) -> list[dict]:
        return [s.to_dict() for s in self.steps]


class FirstStepMemory:
    """The activations autograd saved in the first micro-batch's forward, and the exact static parts (weights,
    gradients, optimizer state) sized after the first optimizer step, when gradients and state both exist."""

    def __init__(self, measure_activations: bool, device_type: str | None = None):
        # FSDP2 keeps gathered parameters alive through forward: their storages would be miscounted as activations.
        self.measure_activations = measure_activations
        self.device_type = device_type  # static parts elsewhere (offloaded to the host) are not this device's
        self.saved_activations: int | None = None
        self.static: dict[str, int] | None = None

    def forward_meter(self, model, first: bool, selective=None):
        if not first or not self.measure_activations:
            return contextlib.nullcontext()
        if selective is not None:  # selective checkpointing caches matmul outputs outside autograd's hooks
            selective.start_counting()
        return SavedActivations(model)

    def after_forward(self, meter, selective=None) -> None:
        if isinstance(meter, SavedActivations):
            self.saved_activations = meter.bytes
            if selective is not None:
                self.saved_activations += selective.stop_counting()

    def after_optimizer_step(self, model, optimizer) -> None:
        self.static = static_breakdown(model, optimizer, self.device_type)


class NvmlTracker:
    """NVML sampling (memory logging nvml/all) in its own process, watching this process's GPU. On exit it stops
    with the wall-clock window of the steps whose energy counts (``metrics.energy_steps``)."""

    def __init__(self, cfg: RunConfig, device: torch.device, run_dir: Path, rank: int | None, steps: StepLog):
        self.wanted = cfg.output.memory_logging in ("nvml", "all")
        self.device = device
        self.file = files.rank_file(files.NVML, rank)
        self.path = run_dir / self.file
        self.steps = steps
        self.summary: dict = {}
        self.note: str | None = None
        self._sampler = None
        if self.wanted and device.type != "cuda":
            self.note = "NVML sampler skipped: the run is not on a GPU"

    @property
    def ran(self) -> bool:
        return bool(self.summary) and "error" not in self.summary

    def __enter__(self) -> NvmlTracker:
        if not self.wanted or self.device.type != "cuda":
            return self
        from ftprof.profiling.nvml import NvmlSampler

        uuid = str(torch.cuda.get_device_properties(self.device).uuid)
        uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        self._sampler = NvmlSampler(self.path, [uuid])
        self._sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._sampler is None:
            return
        window = metrics.wall_window(metrics.energy_steps(self.steps.dicts()))
        self.summary = self._sampler.stop(window)
        self._sampler = None
        if "error" in self.summary:
            self.note = f"NVML sampler failed: {self.summary['error']}"
