"""What a run records: one StepRecord per optimizer step, one RunResult per run. Both flatten to plain dicts.

Units: bytes for memory, seconds for time, tokens/s for throughput, fractions (0..1) for MFU/HFU.
Bump SCHEMA_VERSION when a field changes meaning; readers skip versions newer than theirs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

from ftprof.config import SCHEMA_VERSION
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


STEP_COLUMNS = [f.name for f in fields(StepRecord)]


@dataclass
class RunResult:
    status: str
    run_dir: str
    method: str
    model: str
    device: str
    device_name: str
    world_size: int = 1
    parallel: Optional[str] = None  # fsdp | ddp when world_size > 1
    started_at: str = ""
    finished_at: str = ""
    steps_completed: int = 0
    # per-step work
    seq_len: int = 0
    batch_size: int = 0
    grad_accum: int = 1
    tokens_per_step: int = 0  # per rank
    # throughput (steady state: warm-up steps excluded)
    tokens_per_s: Optional[float] = None  # global = sum over ranks
    tokens_per_s_per_gpu: Optional[float] = None
    real_tokens_per_s: Optional[float] = None
    real_tokens_per_s_per_gpu: Optional[float] = None
    step_time_p50_s: Optional[float] = None
    step_time_p90_s: Optional[float] = None
    step_time_mean_s: Optional[float] = None
    step_time_std_s: Optional[float] = None
    steady_steps: int = 0
    warmup_step_times_s: list[float] = field(default_factory=list)
    loss_first: Optional[float] = None
    loss_last: Optional[float] = None
    # the steady steps' host time by cause (seconds: data_s, gc_s, compile_s; steps_s their own total; allocator
    # retries), and the steps (warm-up ones too) at least 1.2x the steady median with the likeliest cause of each
    # (ftprof.metrics.slow_steps)
    host_time: dict[str, Any] = field(default_factory=dict)
    slow_steps: list[dict[str, Any]] = field(default_factory=list)
    # FLOPs
    params_total: Optional[int] = None
    params_trainable: Optional[int] = None
    params_trainable_matmul: Optional[int] = None
    params_frozen_matmul: Optional[int] = None
    flops_per_token: Optional[float] = None
    recompute_flops_per_token: Optional[float] = None
    peak_flops: Optional[float] = None
    mfu: Optional[float] = None
    hfu: Optional[float] = None
    # memory (bytes)
    torch_peak_allocated: Optional[int] = None
    torch_peak_reserved: Optional[int] = None
    host_peak_rss: Optional[int] = None
    nvml_device_used_peak: Optional[int] = None
    nvml_process_used_peak: Optional[int] = None
    non_torch_overhead: Optional[int] = None  # nvml_process - torch_reserved
    fragmentation: Optional[int] = None  # torch_reserved - torch_allocated
    memory_stages: dict[str, Any] = field(default_factory=dict)
    # exact bytes on this rank: weights_frozen, weights_trainable, gradients, optimizer_state, activations_saved
    # (one micro-batch's forward); on CUDA also transients = torch_peak_allocated minus those, explained = parts/peak
    memory_breakdown: dict[str, Any] = field(default_factory=dict)
    nvml: dict[str, Any] = field(default_factory=dict)  # sampler summary: per-GPU peaks/means, energy, power
    energy_per_token_j: Optional[float] = None  # NVML energy over the steady steps / their tokens (all GPUs)
    setup_time_s: Optional[float] = None
    # fast paths: what ran (config.json says what was asked)
    checkpointing_policy: Optional[str] = None  # none | full | selective (--checkpointing auto resolved)
    checkpointed_layers: Optional[int] = None  # decoder layers the policy applies to (None: all of them)
    checkpointing_auto: dict[str, Any] = field(default_factory=dict)  # auto's estimates, budget and reason
    kept_dequantized: Optional[int] = None  # QLoRA under full: 4-bit linears whose recomputed weight backward reuses
    kernels_applied: list[str] = field(default_factory=list)  # --kernels liger: which fused kernels were patched in
    compile: dict[str, Any] = field(default_factory=dict)  # --compile: blocks, compiled, fallback
    sdpa_backend_used: Optional[str] = None  # the attention kernel SDPA picks for the training shape (CUDA only)
    compile_time_s: Optional[float] = None  # the compile warm-up (first forward + backward), apart from step times
    # real data (empty for synthetic): dataset, split, format, fingerprint, rows, mean/max_seq_len,
    # padding_fraction, label_fraction, tokenize_s (ftprof.data.prepare)
    data: dict[str, Any] = field(default_factory=dict)
    # distributed runs: per-rank figures and how far the slowest/largest rank is from the fastest/smallest
    per_rank: dict[str, Any] = field(default_factory=dict)
    step_time_skew: Optional[float] = None  # max/min - 1 of the ranks' median step times
    memory_skew: Optional[float] = None  # max/min - 1 of the ranks' peak allocated memory
    # failure
    error_type: Optional[str] = None
    error_message: Optional[str] = None
    error_tail: Optional[str] = None
    artifacts: dict[str, str] = field(default_factory=dict)
    profiling: dict[str, Any] = field(default_factory=dict)  # resolved profiler settings and overhead, when on
    notes: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def failure_result(cfg, run_dir, status: str, error_type: str, message: str, tail: str = "",
                   note: str | None = None) -> RunResult:
    """A result for a run that failed before (or without) recording its own: what its configuration says, and why."""
    return RunResult(status=status, run_dir=str(run_dir), method=cfg.method.method, model=cfg.model.model,
                     device=cfg.output.device, device_name="", world_size=cfg.distributed.world_size,
                     seq_len=cfg.data.seq_len, batch_size=cfg.data.batch_size, grad_accum=cfg.train.grad_accum,
                     error_type=error_type, error_message=message[:500], error_tail=tail[-4000:] or None,
                     notes=[note] if note else [])
