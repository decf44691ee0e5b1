"""The optional profiler window of ``FtprofCallback(profile=...)`` and ``measure(..., profile=...)``.

It is ``ftprof profile``'s: the same ProfilingConfig (the --prof-* options: wait, warm-up and active steps, cycles,
shapes, stacks, memory), ftprof's own TorchProfiler on that schedule (traces, key averages, stacks, memory timeline
and snapshot under <run dir>/profile), and the traces summarized by the code that summarizes ``ftprof profile``'s
(ftprof.engine.run.summarize_profile: summary.json/.md with the fine-tuning buckets, their TFLOP/s and the
diagnoses). The schedule counts optimizer steps from the run's first; each step's place in it is steps.csv's
``profiler_phase``, and the steady-state figures leave the profiled steps out, as in ftprof's profiled runs.

Forward, backward and the optimizer step carry ftprof's record_function labels, as in ftprof's loop: the forward
from the model's call to its return, the backward from there to the next micro-batch's forward or the optimizer's
step (a trainer's gradient clipping, which runs before it, included), the optimizer step from its pre- to its
post-step hook.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path

import torch
from torch.profiler import record_function

from ftprof import metrics
from ftprof.config import ProfilingConfig
from ftprof.engine.run import profile_dir, summarize_profile
from ftprof.integrations.assemble import flops
from ftprof.integrations.describe import method_options, model_name, unwrap, weights_dtype
from ftprof.integrations.recorder import Recorder
from ftprof.profiling.torch_profiler import TorchProfiler
from ftprof.results.schema import RunResult
from ftprof.results.status import Status

logger = logging.getLogger("ftprof.integrations")


def profiling_config(profile) -> ProfilingConfig | None:
    """The window asked for: None or False (none), True (``ftprof profile``'s defaults: wait 1, warm-up 1, active 2
    steps, one cycle), a ProfilingConfig, or a mapping of its fields (``{"prof_active_steps": 3}``)."""
    if profile is None or profile is False:
        return None
    if profile is True:
        return ProfilingConfig(profile=True)
    if isinstance(profile, ProfilingConfig):
        return dataclasses.replace(profile, profile=True)
    if isinstance(profile, Mapping):
        return ProfilingConfig(**{**profile, "profile": True})
    raise TypeError(f"profile: True, a ProfilingConfig or a mapping of its prof_* fields, not {type(profile).__name__}")


def window_notes(cfg: ProfilingConfig, steps: int) -> list[str]:
    """What a run of ``steps`` steps leaves out of the window (ftprof's own runs raise --max-steps instead)."""
    if steps >= cfg.total_steps:
        return []
    done = steps // cfg.cycle_steps
    return [f"the profiler window needs {cfg.total_steps} steps ({cfg.prof_repeat} cycle(s) of wait "
            f"{cfg.prof_wait_steps}, warm-up {cfg.prof_warmup_steps}, active {cfg.prof_active_steps}); the run took "
            f"{steps}: {done} cycle(s) traced" + ("" if done else ", no trace")]


class ProfileWindow:
    """torch.profiler over a run the integrations' Recorder measures. ``rank``: this process's (the window runs on
    the ranks ``prof_ranks`` names); ``name``: the model name for the trace's metadata."""

    enabled = True

    def __init__(self, cfg: ProfilingConfig, rank: int = 0, name: str | None = None):
        self.cfg = cfg
        self.rank = rank
        self.name = name
        self.profiler: TorchProfiler | None = None
        self.out_dir: Path | None = None
        self._open: record_function | None = None  # the stage label open now

    def options(self) -> dict:
        """config.json's profiling options (what ran)."""
        return dataclasses.asdict(self.cfg)

    # ---------------------------------------------------------------------------------------------- the run
    def start(self, model: torch.nn.Module, device: torch.device, run_dir: Path) -> None:
        """Before the first step: the profiler on its schedule (waiting, unless the schedule starts at once)."""
        self.out_dir = profile_dir(self.cfg, run_dir)
        if not self.cfg.profiles_rank(self.rank):
            return
        self.profiler = TorchProfiler(self.cfg, self.out_dir, device, rank=self.rank, log=logger.info,
                                      metadata=self._metadata(model))
        self.profiler.__enter__()

    def _metadata(self, model: torch.nn.Module) -> dict:
        """The trace's ftprof block, as ftprof's runs write it (the shape and FLOPs are added after the first step)."""
        model = unwrap(model)
        dtype = weights_dtype(model)
        method = method_options(model, dtype).flat
        return {"method": method["method"], "model": self.name or model_name(model), "dtype": dtype,
                "checkpointing": bool(getattr(model, "is_gradient_checkpointing", False)),
                "active_steps": self.cfg.prof_active_steps, "lora_r": method.get("lora_r"),
                "lora_fused_a": False}

    def stage(self, name: str | None) -> None:
        """Close the open stage label and open ``name``'s (None: none)."""
        if self.profiler is None:
            return
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None
        if name is not None:
            self._open = record_function(name)
            self._open.__enter__()

    def phase(self, index: int) -> str:
        return self.profiler.phase(index) if self.profiler is not None else ""

    def step(self, rec: Recorder) -> None:
        """After a step's record (outside its time): the first step's shape and FLOPs into the trace's metadata,
        then the profiler's step (which exports a cycle's artifacts at its end)."""
        if self.profiler is None:
            return
        self.stage(None)
        if rec.index == 1:
            model = unwrap(rec.model)
            count = flops(model, rec, "full" if getattr(model, "is_gradient_checkpointing", False) else "none", None)
            self.profiler.update_metadata({
                "seq_len": rec.seq_len(), "batch_size": rec.micro_rows, "grad_accum": max(1, rec.micro),
                "flops_per_token": count.flops_per_token, "recompute_flops_per_token": count.recompute_flops_per_token})
        self.profiler.step()

    def close(self) -> None:
        """Stop the profiler (an unfinished cycle is dropped, as in ftprof's runs)."""
        self.stage(None)
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)

    # ---------------------------------------------------------------------------------------------- the result
    def record(self, res: RunResult, steps: list[dict], taken: int) -> None:
        """result.json's profiling figures, notes and artifacts, as ftprof's profiled runs record them."""
        res.notes.extend(window_notes(self.cfg, taken))
        if self.profiler is None:
            return
        res.profiling = {**res.profiling, **self.profiler.resolved(), **metrics.profiler_overhead(steps)}
        res.notes.extend(self.profiler.settings.notes)
        res.artifacts.update(self.profiler.artifacts())

    def summarize(self, res: RunResult, run_dir: Path, run_config: dict) -> None:
        """Every trace of the window summarized into profile/, as ``ftprof profile`` does (a run that failed or did
        not train is not summarized, as there)."""
        if self.profiler is None or res.status != Status.OK.value:
            return
        summary = summarize_profile(self.out_dir, run_dir, run_config, res)
        if summary is not None:
            logger.info("ftprof: profile summary %s (%s)", self.out_dir / "summary.md", summary.verdict)
