"""What a run records: one StepRecord per optimizer step, one RunResult per run (made of the parts in
ftprof.results.parts). Both flatten to plain dicts.

Units: bytes for memory, seconds for time, tokens/s for throughput, fractions (0..1) for MFU/HFU.
Bump SCHEMA_VERSION when a field changes meaning; readers skip versions newer than theirs.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

from ftprof.config import SCHEMA_VERSION
from ftprof.results.parts import (
    Checkpointing,
    Compile,
    DataStats,
    Distributed,
    Evaluation,
    Failure,
    Flops,
    HostTime,
    Memory,
    NvmlSummary,
    Part,
    Prediction,
    RunIdentity,
    Saved,
    Throughput,
    TrainingProof,
    part,
    record,
)
from ftprof.results.status import STATUSES


@dataclass
class StepRecord:
    step: int  # 1-based optimizer step
    loss: float
    step_time_s: float
    tokens: int  # positions fed to the model in this step (all micro-batches), on this rank
    real_tokens: int  # non-padding positions carrying a label
    lr: float
    warmup: bool  # excluded from steady-state figures
    profiler_phase: str  # "", "wait", "warmup" or "active": where the step sat in the profiler schedule
    started_unix: float  # wall clock at the step's start (aligns steps with nvml.csv samples)
    mem_allocated: int
    mem_peak_allocated: int
    mem_reserved: int
    mem_peak_reserved: int
    # host time inside the step that is not the model's own work (ftprof.profiling.host_time), and the allocator's
    # retries (a cudaMalloc that failed, the cache freed and the malloc tried again: it synchronizes the device)
    data_s: float = 0.0  # making the micro-batches and queueing their copies (BatchFeed), this step's and the next's
    gc_s: float = 0.0  # Python garbage collection
    compile_s: float = 0.0  # torch.compile: tracing, recompiling, lazy backward compile, CUDA-graph recording
    alloc_retries: int = 0  # CUDA only; 0 on CPU, which has no caching allocator
    # evaluation after this step (None where none ran): outside step_time_s, timed apart
    eval_loss: Optional[float] = None  # mean loss over the eval split's label tokens
    eval_s: Optional[float] = None  # wall time of the evaluation, device work included

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


STEP_COLUMNS = [f.name for f in fields(StepRecord)]


@dataclass
class RunResult(Part):
    """A run's outcome, in parts (ftprof.results.parts), each written by the code that measured it. ``to_dict``
    flattens it to result.json's keys, in the order result.json has always had them; ``from_dict`` reads them back."""

    status: str
    run_dir: str
    run: RunIdentity = part(RunIdentity, required=True)
    throughput: Throughput = part(Throughput)
    host_time: HostTime = part(HostTime)
    flops: Flops = part(Flops)
    memory: Memory = part(Memory)
    nvml: NvmlSummary = part(NvmlSummary)
    setup_time_s: Optional[float] = None  # building the run: loading the model, the method, the optimizer, compiling
    checkpointing: Checkpointing = part(Checkpointing)
    compile: Compile = part(Compile)
    data: Optional[DataStats] = record(DataStats)  # real data's stats (None, {} in the file, for synthetic data)
    distributed: Distributed = part(Distributed)
    failure: Failure = part(Failure)
    evaluation: Evaluation = part(Evaluation)
    saved: Saved = part(Saved)
    training_proof: Optional[TrainingProof] = record(TrainingProof)  # what proved the run trained (engine/proof.py)
    prediction: Optional[Prediction] = record(Prediction)  # what ftprof.plan predicted for the run before it loaded
    artifacts: dict[str, str] = field(default_factory=dict)  # open: artifact name -> path in the run directory
    profiling: dict[str, Any] = field(default_factory=dict)  # open: resolved profiler settings and overhead, when on
    notes: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")

    def __getattr__(self, name: str) -> Any:
        """Only for names a RunResult does not have: a result.json key says where it lives now."""
        path = key_paths().get(name)
        if path and path != name:
            raise AttributeError(f"RunResult has no '{name}': read result.{path} (result.json keeps the key "
                                 f"'{name}')")
        raise AttributeError(f"'RunResult' object has no attribute '{name}'")

    def to_dict(self) -> dict[str, Any]:
        return self.flat()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """A result from result.json's flat keys (keys this version does not know are skipped)."""
        return cls.from_flat(data)


@functools.cache
def key_paths() -> dict[str, str]:
    """Each result.json key -> where a RunResult holds it (``tokens_per_s`` -> ``throughput.tokens_per_s``)."""
    return RunResult.key_paths()


def failure_result(cfg, run_dir, status: str, error_type: str, message: str, tail: str = "",
                   note: str | None = None) -> RunResult:
    """A result for a run that failed before (or without) recording its own: what its configuration says, and why."""
    run = RunIdentity(method=cfg.method.method, model=cfg.model.model, device=cfg.output.device, device_name="",
                      world_size=cfg.distributed.world_size, seq_len=cfg.data.seq_len, batch_size=cfg.data.batch_size,
                      grad_accum=cfg.train.grad_accum)
    return RunResult(status=status, run_dir=str(run_dir), run=run,
                     failure=Failure(error_type, message[:500], tail[-4000:] or None), notes=[note] if note else [])
