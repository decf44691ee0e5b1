"""``assemble``: a run's RunResult from what its trackers recorded. It reads, computes through ``ftprof.metrics``
and returns; it starts or stops nothing."""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from ftprof import metrics
from ftprof.engine.build import Built
from ftprof.engine.trackers import FirstStepMemory, NvmlTracker, StepLog
from ftprof.models.kernels import FUSED_LOSS
from ftprof.preflight import Preflight
from ftprof.profiling.memory import MemoryTracker, host_peak_rss
from ftprof.results import run_dir as files
from ftprof.results.schema import RunResult
from ftprof.results.status import Status


@dataclass(frozen=True)
class Recorded:
    """Everything a finished (or failed) run leaves to be assembled. ``built`` is None when building failed."""

    pre: Preflight
    run_dir: str
    started_at: str
    finished_at: str
    built: Built | None
    setup_time_s: float | None
    steps: StepLog
    memory: MemoryTracker
    first: FirstStepMemory
    nvml: NvmlTracker
    profiler: object  # TorchProfiler or NullProfiler
    kernels_applied: list[str]


def assemble(rec: Recorded, status: Status, exc: BaseException | None = None) -> RunResult:
    cfg = rec.pre.config
    device = rec.pre.device
    res = RunResult(status=status.value, run_dir=rec.run_dir, method=cfg.method.method, model=cfg.model.model,
                    device=str(device), device_name=rec.built.device_name if rec.built else str(device),
                    started_at=rec.started_at, finished_at=rec.finished_at, steps_completed=len(rec.steps.steps),
                    seq_len=cfg.data.seq_len, batch_size=cfg.data.batch_size, grad_accum=cfg.train.grad_accum,
                    setup_time_s=rec.setup_time_s)
    res.data = dict(rec.pre.data.stats) if rec.pre.data is not None else {}  # real data's stats (ftprof.data)
    if cfg.distributed.fsdp_cpu_offload:  # FSDP2 ran, in one process or several (aggregation says how many)
        res.parallel = "fsdp"
    steps = rec.steps.dicts()
    _throughput(res, rec, steps)
    _memory(res, rec, steps)
    _nvml(res, rec.nvml, steps)
    if exc is not None:
        res.error_type = type(exc).__name__
        res.error_message = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else type(exc).__name__
        res.error_tail = "".join(traceback.format_exception(exc)[-8:])[-4000:]
    res.artifacts = {"config": files.CONFIG, "env": files.ENV, "steps": files.STEPS, **rec.profiler.artifacts(),
                     **({"nvml": rec.nvml.file} if rec.nvml.ran else {})}
    res.notes.extend(rec.pre.notes)
    if rec.profiler.enabled:
        res.profiling = {**rec.profiler.resolved(), **metrics.profiler_overhead(steps)}
        res.notes.extend(res.profiling.get("notes", []))
    return res


def _throughput(res: RunResult, rec: Recorded, steps: list[dict]) -> None:
    if steps:
        res.loss_first, res.loss_last = steps[0]["loss"], steps[-1]["loss"]
        res.tokens_per_step = steps[-1]["tokens"]
    res.warmup_step_times_s = [s["step_time_s"] for s in steps if s["warmup"]]
    steady, left_out = metrics.steady_window(steps)
    if left_out:
        res.notes.append(f"steady-state figures from {len(steady)} unprofiled steps ({left_out} profiled steps "
                         "left out)")
    if rec.built is not None:
        c = rec.built.counts
        res.params_total, res.params_trainable = c.total, c.trainable_total
        res.params_trainable_matmul, res.params_frozen_matmul = c.trainable_matmul, c.frozen_matmul
        res.flops_per_token = rec.built.flops.per_token
        res.recompute_flops_per_token = rec.built.flops.recompute_per_token
        res.peak_flops = metrics.peak_flops(rec.built.device_name) if rec.pre.device.type == "cuda" else None
        res.checkpointing_policy = rec.built.checkpointing
        res.checkpointed_layers = rec.built.checkpointed_layers
        res.kept_dequantized = rec.built.kept_dequantized or None
        res.kernels_applied = list(rec.kernels_applied)
        if rec.built.auto_choice is not None:
            res.checkpointing_auto = rec.built.auto_choice.to_dict()
        res.sdpa_backend_used = rec.built.sdpa_backend_used
        wanted = rec.pre.config.model.sdpa_backend
        if wanted != "auto" and res.sdpa_backend_used not in (None, wanted):
            res.notes.append(f"--sdpa-backend {wanted}: SDPA cannot run it for this shape and runs "
                             f"{res.sdpa_backend_used}")
        if rec.built.compiled is not None:
            res.compile = rec.built.compiled.to_dict()
            res.compile_time_s = rec.built.compiled.compile_time_s
            if rec.built.compiled.fallback:
                res.notes.append(f"--compile fell back to eager: {rec.built.compiled.fallback}")
    figures = metrics.steady_figures(steady, res.world_size, res.flops_per_token, res.recompute_flops_per_token,
                                     res.peak_flops)
    res.host_time = metrics.host_time(steady) or {}
    res.slow_steps = metrics.slow_steps(steps)
    if figures is None:
        if steps:
            res.notes.append("every step was a warm-up step: no steady-state figures")
        return
    for key, value in figures.items():
        setattr(res, key, value)


def _memory(res: RunResult, rec: Recorded, steps: list[dict]) -> None:
    cfg = rec.pre.config
    memory = rec.memory
    stages = memory.stage_fields()
    res.memory_stages = stages
    res.host_peak_rss = host_peak_rss()
    training_peak = None
    if memory.cuda:
        # The run's peaks: every stage's, every step's, and the counters left open when the run ended (an OOM).
        res.torch_peak_allocated = metrics.run_peak([s.peak_allocated for s in memory.stages]
                                                    + [memory.open_peak.get("allocated")],
                                                    (s["mem_peak_allocated"] for s in steps))
        res.torch_peak_reserved = metrics.run_peak([s.peak_reserved for s in memory.stages]
                                                   + [memory.open_peak.get("reserved")],
                                                   (s["mem_peak_reserved"] for s in steps))
        res.fragmentation = metrics.gap(res.torch_peak_reserved, res.torch_peak_allocated)
        training_peak = metrics.training_peak({s.stage: s.peak_allocated for s in memory.stages},
                                              (s["mem_peak_allocated"] for s in steps))
    vocab = getattr(rec.pre.source.config, "vocab_size", None)
    fused = FUSED_LOSS in rec.kernels_applied  # Liger's fused loss never holds the logits' gradients
    logits = metrics.logits_gradient_bytes(cfg.data.batch_size * cfg.data.seq_len, vocab) \
        if vocab and not fused else None
    res.memory_breakdown = metrics.memory_breakdown(rec.first.static, rec.first.saved_activations, training_peak,
                                                    logits)


def _nvml(res: RunResult, nvml: NvmlTracker, steps: list[dict]) -> None:
    if nvml.note:
        res.notes.append(nvml.note)
    if not nvml.ran:
        return
    summary = nvml.summary
    res.nvml = summary
    res.nvml_device_used_peak = summary.get("device_used_peak")
    res.nvml_process_used_peak = summary.get("process_used_peak")
    res.energy_per_token_j = metrics.energy_per_token(summary.get("energy_j"), metrics.energy_steps(steps))
    res.non_torch_overhead = metrics.gap(res.nvml_process_used_peak, res.torch_peak_reserved)
