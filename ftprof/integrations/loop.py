"""``measure``: a plain PyTorch or accelerate training loop written as a standard ftprof run directory.

    with measure(model, run_dir="runs/my-loop", optimizer=opt) as m:
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            m.step()

A step starts at the first training-mode forward after the previous ``m.step()`` (or with ``m.begin()``), so
making the batch stays outside it, and ends at ``m.step()``, which synchronises the device. Tokens are counted
where the model is called (``input_ids`` and ``labels`` of its forward); the loss is the model output's own unless
``m.step(loss)`` passes one. With ``optimizer``, its step hooks size the first step's memory (weights, gradients,
optimizer state) and read the gradient norm the proof of training checks. ``profile=True`` (or a
ProfilingConfig) adds ``ftprof profile``'s profiler window: traces and their summary under <run dir>/profile.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from ftprof.integrations.assemble import finish
from ftprof.integrations.describe import Described, method_options, model_name, unwrap, weights_dtype
from ftprof.integrations.recorder import Recorder
from ftprof.integrations.window import ProfileWindow, profiling_config

UNKNOWN_STEPS = 10 ** 9  # no planned step count: the proof reads the norm on step 1 and every 25th


class Measurement:
    """What ``measure`` yields: ``step()`` after each optimizer step; ``begin()`` to start a step explicitly."""

    def __init__(self, recorder: Recorder, optimizer: torch.optim.Optimizer | None):
        self.recorder = recorder
        self.optimizer = optimizer
        self.result = None  # the RunResult, after the block
        self.batch_rows = 0
        self.micro_batches = 0

    def begin(self) -> None:
        if not self.recorder.in_step:
            groups = getattr(self.optimizer, "param_groups", None)
            self.recorder.begin_step(groups[0]["lr"] if groups else None)

    def _auto_begin(self, module, args, kwargs) -> None:
        if module.training and not self.recorder.in_step:
            self.begin()
        if self.recorder.index == 1 and self.recorder.in_step:  # the run's shape, from its first step
            ids = kwargs.get("input_ids", args[0] if args else None)
            if isinstance(ids, torch.Tensor) and ids.dim() >= 2:
                self.batch_rows = self.batch_rows or ids.shape[0]
            self.micro_batches += 1

    def step(self, loss: float | torch.Tensor | None = None):
        """End the step (device sync): its time, tokens, loss and memory go to steps.csv. Returns its record."""
        return self.recorder.end_step(loss.detach() if isinstance(loss, torch.Tensor) else loss)


@contextlib.contextmanager
def measure(model: torch.nn.Module, run_dir: str | Path, *, optimizer: torch.optim.Optimizer | None = None,
            max_steps: int | None = None, measure_warmup_steps: int = 2, name: str | None = None,
            seq_len: int | None = None, profile=None, **options):
    """Measure the steps run inside the block into ``run_dir``. ``max_steps``: the planned steps (the proof reads
    the last one's gradient norm); ``name``: the model name recorded; ``seq_len``: recorded when no step ran (the
    steps' own width otherwise); ``profile``: a profiler window as ``ftprof profile`` runs it (True for its
    defaults, a ProfilingConfig, or a mapping of its ``prof_*`` fields); ``options``: other ftprof options to
    record (``lr``, ``packing``, ``dataset``...)."""
    cfg = profiling_config(profile)
    window = ProfileWindow(cfg, _rank(), name) if cfg is not None else None
    rec = Recorder(run_dir, measure_warmup_steps=measure_warmup_steps, window=window)
    m = Measurement(rec, optimizer)
    hooks = [unwrap(model).register_forward_pre_hook(m._auto_begin, with_kwargs=True, prepend=True)]
    rec.start(unwrap(model), max_steps or UNKNOWN_STEPS)
    if optimizer is not None:
        hooks += [optimizer.register_step_pre_hook(lambda *_: rec.in_step and rec.before_optimizer_step()),
                  optimizer.register_step_post_hook(lambda opt, *_: rec.in_step and rec.after_optimizer_step(opt))]
    error: BaseException | None = None
    try:
        yield m
    except BaseException as exc:
        error = exc
        raise
    finally:
        for hook in hooks:
            hook.remove()
        rec.in_step = False  # a step the block left unfinished is no step
        described = _describe(rec, m, model, optimizer, max_steps, measure_warmup_steps, name, seq_len, options)
        m.result = finish(rec, unwrap(model), described, {"name": "loop"}, exc=error)


def _describe(rec: Recorder, m: Measurement, model, optimizer, max_steps, warmup, name, seq_len, options) -> Described:
    model = unwrap(model)
    dtype = weights_dtype(model)
    method = method_options(model, dtype)
    notes = list(method.notes)
    flat = {**method.flat, "model": name or model_name(model), "dtype": dtype,
            "seq_len": max(2, rec.seq_len() or seq_len or 0), "batch_size": max(1, rec.micro_rows or m.batch_rows),
            "grad_accum": max(1, m.micro_batches), "max_steps": max(1, max_steps or len(rec.steps.steps)),
            "measure_warmup_steps": warmup, "gc_interval": 0, "dataset": "loop-dataset",
            "checkpointing": "full" if getattr(model, "is_gradient_checkpointing", False) else "none",
            "output_dir": str(rec.run_dir.parent), "run_name": rec.run_dir.name,
            "device": "cuda" if rec.device.type == "cuda" else "cpu",
            "memory_logging": "nvml" if rec.device.type == "cuda" else "torch"}
    if optimizer is not None:
        flat["lr"] = float(optimizer.defaults.get("lr", 2e-4))
        flat["weight_decay"] = float(optimizer.defaults.get("weight_decay", 0.0))
        if "adam" not in type(optimizer).__name__.lower():
            notes.append(f"optimizer {type(optimizer).__name__}: recorded as adamw")
    else:
        notes.append("no optimizer given: the first step's weights, gradients and optimizer state were not sized "
                     "and the gradient norm was not checked")
    flat.update(rec.window.options())
    flat.update(options)
    if not rec.loss_seen:
        notes.append("no loss seen (the model's output carried none and m.step() was given none)")
    return Described(flat, notes)


def _rank() -> int:
    """This process's rank under torch.distributed (0 without it): the window runs on the ranks it names."""
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
