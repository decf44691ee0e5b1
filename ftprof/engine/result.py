"""``assemble``: a run's RunResult from what its trackers recorded. It reads, computes through ``ftprof.metrics``
and returns; it starts or stops nothing."""

from __future__ import annotations

import dataclasses
import traceback
from dataclasses import dataclass

from ftprof import metrics
from ftprof.data.formats import IGNORE_INDEX
from ftprof.engine.build import Built
from ftprof.engine.proof import TrainingCheck
from ftprof.engine.trackers import FirstStepMemory, NvmlTracker, StepLog
from ftprof.models import kernels, split_layer
from ftprof.models.kernels import FUSED_LOSS
from ftprof.profiling.memory import MemoryTracker, host_peak_rss
from ftprof.resolved import ResolvedRun
from ftprof.results import run_dir as files
from ftprof.results.parts import (
    Checkpointing,
    Compile,
    DataStats,
    Evaluation,
    Failure,
    Flops,
    HostTime,
    HostTimeTotals,
    Memory,
    MemoryBreakdown,
    NvmlSummary,
    RunIdentity,
    Saved,
)
from ftprof.results.schema import RunResult
from ftprof.results.status import Status


@dataclass(frozen=True)
class Recorded:
    """Everything a finished (or failed) run leaves to be assembled. ``built`` is None when building failed."""

    resolved: ResolvedRun
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
    saved: Saved | None = None  # what --save wrote
    check: TrainingCheck | None = None  # the proof that the run trained (None when it never reached the steps)
    not_trained: str | None = None  # why the proof failed


def assemble(rec: Recorded, status: Status, exc: BaseException | None = None) -> RunResult:
    """This process's result: each part from what measured it. (A distributed run's ranks are combined after.)"""
    cfg = rec.resolved.config
    device = rec.resolved.device
    run = RunIdentity(method=cfg.method.method, model=cfg.model.model, device=str(device),
                      device_name=rec.built.device_name if rec.built else str(device), started_at=rec.started_at,
                      finished_at=rec.finished_at, steps_completed=len(rec.steps.steps), seq_len=cfg.data.seq_len,
                      batch_size=cfg.data.batch_size, grad_accum=cfg.train.grad_accum)
    if cfg.distributed.fsdp_cpu_offload:  # FSDP2 ran, in one process or several (aggregation says how many)
        run.parallel = "fsdp"
    res = RunResult(status=status.value, run_dir=rec.run_dir, run=run, setup_time_s=rec.setup_time_s)
    if rec.resolved.data is not None and rec.resolved.data.stats:  # real data's stats (ftprof.data.prepare)
        res.data = DataStats.from_dict(rec.resolved.data.stats)
    steps = rec.steps.dicts()
    _throughput(res, steps)
    steady, left_out = metrics.steady_window(steps)
    note = metrics.steady_window_note(steady, left_out)
    if note:
        res.notes.append(note)
    if rec.built is not None:
        res.flops = _flops(rec.built, rec.resolved)
        res.checkpointing = _checkpointing(rec.built)
        res.compile = _compile(rec.built, rec.kernels_applied, res.notes, cfg.model.sdpa_backend)
    if not record_steady_state(res, steps, steady, res.run.world_size) and steps:
        if not any("no steady-state figures" in n for n in rec.resolved.notes):  # (preflight's says it already)
            res.notes.append("every step was a warm-up step: no steady-state figures")
    res.prediction = rec.resolved.prediction  # made before the model loaded (ftprof/plan)
    res.memory = _memory(rec, steps)
    res.nvml = _nvml(res.memory, rec.nvml, steps, res.notes)
    res.evaluation = _evaluation(steps, rec.built)
    if rec.saved is not None:
        res.saved = rec.saved
    if rec.check is not None and rec.check.trainable_changed is not None:  # compared after the last step
        res.training_proof = rec.check.record(rec.not_trained)
    if exc is not None:
        res.failure = _failure(exc)
    res.artifacts = {"config": files.CONFIG, "env": files.ENV, "steps": files.STEPS, **rec.profiler.artifacts(),
                     **({"nvml": rec.nvml.file} if rec.nvml.ran else {})}
    res.notes.extend(rec.resolved.notes)
    if rec.profiler.enabled:
        res.profiling = {**rec.profiler.resolved(), **metrics.profiler_overhead(steps)}
        res.notes.extend(res.profiling.get("notes", []))
    return res


def record_steady_state(res: RunResult, steps: list[dict], steady: list[dict], world_size: int) -> bool:
    """The steady window's throughput, step times and utilization, the host time by cause and the slow steps, into
    ``res`` (for one process, or the ranks' aggregated rows). False when no step was steady."""
    totals = metrics.host_time(steady)
    res.host_time = HostTime(HostTimeTotals.from_dict(totals) if totals else None, metrics.slow_steps(steps))
    f = res.flops
    figures = metrics.steady_figures(steady, world_size, f.flops_per_token, f.recompute_flops_per_token, f.peak_flops)
    if figures is None:
        return False
    f.mfu, f.hfu = figures.pop("mfu"), figures.pop("hfu")
    res.throughput = dataclasses.replace(res.throughput, **figures)
    return True


def _throughput(res: RunResult, steps: list[dict]) -> None:
    if steps:
        res.throughput.loss_first, res.throughput.loss_last = steps[0]["loss"], steps[-1]["loss"]
        res.throughput.tokens_per_step = steps[-1]["tokens"]
    res.throughput.warmup_step_times_s = [s["step_time_s"] for s in steps if s["warmup"]]


def _evaluation(steps: list[dict], built: Built | None) -> Evaluation:
    """Eval loss first, last and best, and the evaluations' time, from the steps they followed."""
    evals = [s for s in steps if s.get("eval_loss") is not None]
    if not evals:
        return Evaluation()
    best = min(evals, key=lambda s: s["eval_loss"])
    tokens = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in built.eval_batches) if built else None
    return Evaluation(eval_loss_first=evals[0]["eval_loss"], eval_loss_last=evals[-1]["eval_loss"],
                      eval_loss_best=best["eval_loss"], eval_loss_best_step=best["step"], eval_runs=len(evals),
                      eval_time_s=sum(s["eval_s"] for s in evals), eval_tokens=tokens)


def _flops(built: Built, resolved: ResolvedRun) -> Flops:
    c = built.counts
    peak = metrics.peak_flops(built.device_name) if resolved.device_type == "cuda" else None
    return Flops(params_total=c.total, params_trainable=c.trainable_total, params_trainable_matmul=c.trainable_matmul,
                 params_frozen_matmul=c.frozen_matmul, flops_per_token=built.flops.per_token,
                 recompute_flops_per_token=built.flops.recompute_per_token, peak_flops=peak)


def _checkpointing(built: Built) -> Checkpointing:
    return Checkpointing(checkpointing_policy=built.checkpointing, checkpointed_layers=built.checkpointed_layers,
                         checkpointing_auto=built.auto_choice, kept_dequantized=built.kept_dequantized or None,
                         split_layers=len(split_layer.split_layers(built.model)) or None)


def _compile(built: Built, kernels_applied: list[str], notes: list[str], wanted_sdpa: str) -> Compile:
    out = Compile(kernels_applied=list(kernels_applied), outcome=built.compiled,
                  sdpa_backend_used=built.sdpa_backend_used,
                  loss_chunk_tokens=kernels.LOSS_CHUNK_TOKENS if FUSED_LOSS in kernels_applied else None)
    if wanted_sdpa != "auto" and out.sdpa_backend_used not in (None, wanted_sdpa):
        notes.append(f"--sdpa-backend {wanted_sdpa}: SDPA cannot run it for this shape and runs "
                     f"{out.sdpa_backend_used}")
    if built.compiled is not None:
        out.compile_time_s = built.compiled.compile_time_s
        if built.compiled.fallback:
            notes.append(f"--compile fell back to eager: {built.compiled.fallback}")
    return out


def _memory(rec: Recorded, steps: list[dict]) -> Memory:
    cfg = rec.resolved.config
    vocab = getattr(rec.resolved.source.config, "vocab_size", None)
    fused = FUSED_LOSS in rec.kernels_applied  # Liger's fused loss never holds the logits' gradients
    logits = metrics.logits_gradient_bytes(cfg.data.batch_size * cfg.data.seq_len, vocab) \
        if vocab and not fused else None
    return memory_record(rec.memory, steps, rec.first.static, rec.first.saved_activations, logits)


def memory_record(memory: MemoryTracker, steps: list[dict], static: dict | None, saved_activations: int | None,
                  logits_bytes: int | None) -> Memory:
    """result.json's memory figures from the run's memory stages and steps (ftprof's loop and the integrations'
    callback alike): the allocator's peaks, fragmentation, the training peak and its breakdown."""
    out = Memory(host_peak_rss=host_peak_rss(), memory_stages=memory.stage_fields())
    if not memory.cuda:
        # The kernel's high-water mark (ru_maxrss) is updated lazily (per-thread RSS counters are folded in later),
        # so it can sit a little under an RSS read earlier in the run: the peak is the larger of all of them.
        out.host_peak_rss = metrics.run_peak([out.host_peak_rss, *(s.rss_after for s in memory.stages)],
                                             (s["mem_peak_allocated"] for s in steps))
    training_peak = None
    if memory.cuda:
        # The run's peaks: every stage's, every step's, and the counters left open when the run ended (an OOM).
        out.torch_peak_allocated = metrics.run_peak([s.peak_allocated for s in memory.stages]
                                                    + [memory.open_peak.get("allocated")],
                                                    (s["mem_peak_allocated"] for s in steps))
        out.torch_peak_reserved = metrics.run_peak([s.peak_reserved for s in memory.stages]
                                                   + [memory.open_peak.get("reserved")],
                                                   (s["mem_peak_reserved"] for s in steps))
        out.fragmentation = metrics.gap(out.torch_peak_reserved, out.torch_peak_allocated)
        training_peak = metrics.training_peak({s.stage: s.peak_allocated for s in memory.stages},
                                              (s["mem_peak_allocated"] for s in steps))
    breakdown = metrics.memory_breakdown(static, saved_activations, training_peak, logits_bytes)
    out.memory_breakdown = MemoryBreakdown.from_dict(breakdown) if breakdown else None
    return out


def _nvml(memory: Memory, nvml: NvmlTracker, steps: list[dict], notes: list[str]) -> NvmlSummary:
    """The NVML sampler's summary and energy; its peaks, and the overhead they show, into ``memory``."""
    if nvml.note:
        notes.append(nvml.note)
    if not nvml.ran:
        return NvmlSummary()
    summary = nvml.summary
    memory.nvml_device_used_peak = summary.get("device_used_peak")
    memory.nvml_process_used_peak = summary.get("process_used_peak")
    memory.non_torch_overhead = metrics.gap(memory.nvml_process_used_peak, memory.torch_peak_reserved)
    return NvmlSummary(summary, metrics.energy_per_token(summary.get("energy_j"), metrics.energy_steps(steps)))


def _failure(exc: BaseException) -> Failure:
    message = str(exc).strip()
    return Failure(error_type=type(exc).__name__,
                   error_message=message.splitlines()[0][:500] if message else type(exc).__name__,
                   error_tail="".join(traceback.format_exception(exc)[-8:])[-4000:])
