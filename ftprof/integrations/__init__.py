"""Measure the training people already run, into a standard ftprof run directory (config.json, steps.csv,
result.json, env.json) that ``ftprof report`` and ``--baseline`` read:

- ``FtprofCallback``: a ``transformers.TrainerCallback`` for the HF Trainer, TRL's SFTTrainer and subclasses;
- ``measure``: a context manager for a plain PyTorch or accelerate loop.

Either takes ``profile=`` (True, a ProfilingConfig, or its ``prof_*`` fields) for ``ftprof profile``'s profiler
window: traces, the summary's buckets, TFLOP/s and diagnoses under <run dir>/profile. docs/integrations.md
describes both, what they record and what measuring costs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftprof.integrations.loop import Measurement, measure

if TYPE_CHECKING:
    from ftprof.integrations.hf_trainer import FtprofCallback


def __getattr__(name: str):
    if name == "FtprofCallback":  # imports transformers' Trainer machinery: only when asked for
        from ftprof.integrations.hf_trainer import FtprofCallback

        return FtprofCallback
    raise AttributeError(f"module 'ftprof.integrations' has no attribute '{name}'")


__all__ = ["FtprofCallback", "Measurement", "measure"]
