"""The training loop: forward and backward over the micro-batches of a step, the optimizer step, and the steps.

Forward, backward and the optimizer step run inside ``torch.profiler.record_function`` labels
(``ftprof/forward``, ``ftprof/backward``, ``ftprof/optimizer_step``) so traces show them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.profiler import record_function

from ftprof.config import RunConfig
from ftprof.engine.build import Built
from ftprof.engine.evaluate import Evaluator
from ftprof.engine.feed import BatchFeed
from ftprof.engine.gc_policy import GcPolicy
from ftprof.engine.proof import NotTrainedError, TrainingCheck, grad_norm
from ftprof.engine.schedule import current_lr
from ftprof.engine.trackers import FirstStepMemory, StepLog
from ftprof.profiling.memory import MemoryTracker
from ftprof.results.schema import StepRecord


def run_steps(cfg: RunConfig, built: Built, device: torch.device, memory: MemoryTracker, log: StepLog,
              first: FirstStepMemory, profiler, on_step: Callable[[StepRecord], None],
              check: TrainingCheck | None = None, stop_early: bool = False, start: int = 0,
              checkpoint: Callable[[int], None] | None = None) -> None:
    """The run's steps; ``check`` watches each one (engine/proof.py). ``stop_early``: leave at the first loss that
    is not finite (one process only: ranks of several must run the same steps). ``start``: the steps a resumed
    run's checkpoint had taken (this run's steps are numbered on from it; its first step is still this process's
    first: its memory stages, measurement warm-up and profiler schedule count from there). ``checkpoint(step)``
    after every --save-steps step, outside the step's time."""
    feed = BatchFeed(built.batches, device, built.host_embedding)
    evaluator = Evaluator(cfg, built.eval_batches, device)
    every = cfg.save.save_steps
    with GcPolicy(cfg.train.gc_interval) as collector:
        for index in range(1, cfg.train.max_steps - start + 1):
            _run_step(cfg, built, device, memory, log, first, profiler, on_step, feed, evaluator, index, check,
                      start)
            collector.between_steps(index)  # after the step's figures, before the next timer: outside step time
            if stop_early and check is not None and check.failed_early:
                break
            if checkpoint is not None and every and (start + index) % every == 0:
                checkpoint(start + index)


def _run_step(cfg: RunConfig, built: Built, device: torch.device, memory: MemoryTracker, log: StepLog,
              first: FirstStepMemory, profiler, on_step: Callable[[StepRecord], None], feed: BatchFeed,
              evaluator: Evaluator, index: int, check: TrainingCheck | None = None, start: int = 0) -> None:
    """One step (``index``: this process's count; ``start + index`` the run's step number): its timed forward,
    backward and optimizer step, then (untimed) its figures, an evaluation when due, the step's record and the
    profiler's step."""
    phase = profiler.phase(index)
    lr = current_lr(built.optimizer)  # a float the scheduler set: no device work
    started = log.begin(index)
    loaded = feed.load_s
    loss, tokens, real = train_step(cfg, built, device, memory, first, index == 1, feed)
    norm = optimizer_step(cfg, built, memory, first, index == 1, check is not None and check.wants_grad_norm(index))
    if cfg.data.prefetch and start + index < cfg.train.max_steps:
        feed.prefetch()  # host work while the step's kernels run, before the timer's sync
    seconds = log.timer.stop()
    causes = log.causes()
    mem = memory.current()
    # after the step's sync and its figures, before the next step's timer: outside every step's time
    evaluated = evaluator.run(built) if evaluator.due(start + index) else None
    record = StepRecord(step=start + index, loss=float(loss), step_time_s=seconds, tokens=tokens, real_tokens=real,
                        lr=lr, warmup=index <= cfg.train.measure_warmup_steps, profiler_phase=phase,
                        started_unix=started, mem_allocated=mem["allocated"],
                        mem_peak_allocated=mem["peak_allocated"], mem_reserved=mem["reserved"],
                        mem_peak_reserved=mem["peak_reserved"], data_s=feed.load_s - loaded, **causes,
                        eval_loss=evaluated.loss if evaluated else None,
                        eval_s=evaluated.seconds if evaluated else None)
    log.end(record)
    if check is not None:  # after the timer's sync: the loss is a float already, reading the norm waits for nothing
        check.observe(index, record.loss, norm)
    profiler.step()
    on_step(record)


def _stage(memory: MemoryTracker, name: str, on: bool):
    return memory.stage(name) if on else contextlib.nullcontext()


def train_step(cfg: RunConfig, built: Built, device: torch.device, memory: MemoryTracker, first: FirstStepMemory,
               is_first: bool, feed: BatchFeed | None = None) -> tuple[torch.Tensor, int, int]:
    """Forward and backward over grad_accum micro-batches. Returns (mean loss tensor, tokens, real tokens)."""
    feed = feed or BatchFeed(built.batches, device, built.host_embedding)
    accum = cfg.train.grad_accum
    loss_sum = torch.zeros((), device=device)
    tokens = real = 0
    if _keeps_gradients(cfg, built):
        _own_gradients(built.params)
    for micro in range(accum):
        batch, n, r = feed.take()
        tokens, real = tokens + n, real + r
        measured = is_first and micro == 0
        if built.compiled is not None and built.compiled.cudagraphs:
            # CUDA graph trees reuse their output buffers once a new step begins; each micro-batch's forward and
            # backward are done with the previous one's outputs (only the detached loss is kept).
            torch.compiler.cudagraph_mark_step_begin()
        meter = first.forward_meter(built.model, measured, built.selective)
        with _stage(memory, "first_forward", measured), record_function("ftprof/forward"), built.autocast(), meter:
            loss = built.model(**batch).loss
        first.after_forward(meter, built.selective)
        if not loss.requires_grad:  # an attribute of the graph, no device work
            raise NotTrainedError("the loss depends on no trainable parameter (every one is frozen)")
        with _stage(memory, "first_backward", measured), record_function("ftprof/backward"):
            (loss / accum).backward()
        loss_sum += loss.detach()
        if cfg.data.prefetch and micro + 1 < accum:
            # the step's next micro-batch, pinned and its copy queued behind this backward's kernels: from pageable
            # memory the copy would first wait for them (a stream sync), and the GPU would idle while the host made
            # the batch and launched its first kernels
            feed.prefetch()
    return loss_sum / accum, tokens, real


def optimizer_step(cfg: RunConfig, built: Built, memory: MemoryTracker, first: FirstStepMemory,
                   is_first: bool, measure_norm: bool = False) -> torch.Tensor | None:
    """Clip, step, schedule, zero the gradients. With ``measure_norm``, returns the gradients' total norm (a device
    tensor, not read here): clipping's own, else one fused norm over the gradients before they are zeroed."""
    norm = None
    with _stage(memory, "first_optimizer_step", is_first), record_function("ftprof/optimizer_step"):
        if cfg.train.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(built.params, cfg.train.max_grad_norm)
        elif measure_norm:
            norm = grad_norm(built.params)
        built.optimizer.step()
        if built.scheduler is not None:
            built.scheduler.step()  # sets each parameter group's lr for the next step (Python floats)
        if is_first:  # gradients and optimizer state both exist now: the one moment to size them
            first.after_optimizer_step(built.model, built.optimizer)
        built.optimizer.zero_grad(set_to_none=not _keeps_gradients(cfg, built))
    return norm if measure_norm else None


def _keeps_gradients(cfg: RunConfig, built: Built) -> bool:
    """Whether the gradients keep buffers of their own across steps (_own_gradients): CUDA graphs replayed for
    micro-batches that accumulate."""
    return cfg.train.grad_accum > 1 and built.compiled is not None and built.compiled.cudagraphs


def _own_gradients(params) -> None:
    """Give every trainable parameter a gradient buffer of its own before a step's first backward.

    Autograd's AccumulateGrad *adopts* the first gradient it receives as ``.grad`` when none exists. Under CUDA
    graphs that tensor is a graph output, and the next micro-batch's replay overwrites it ("accessing tensor output
    of CUDAGraphs that has been overwritten by a subsequent run"). With a buffer in place every micro-batch adds into
    it instead, and the optimizer step zeroes it rather than freeing it. Once per run: the buffers are kept."""
    for p in params:
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)

