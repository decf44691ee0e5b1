"""Learning-rate schedules under the HF Trainer's names and meanings (transformers.get_scheduler's closed forms),
as a ``torch.optim.lr_scheduler.LambdaLR``.

Step ``s`` (0-based: the number of optimizer steps taken) runs at ``lr x factor(s)``; the warm-up rises linearly
from 0 (the first step of a warm-up runs at lr 0, as in transformers), then:

- linear: ``(total - s) / (total - warmup)``, down to 0 after the last step;
- cosine: ``0.5 (1 + cos(pi x progress))``, progress = ``(s - warmup) / (total - warmup)``;
- constant: 1 (no warm-up: transformers' ``constant`` ignores one, so the config refuses it);
- constant_with_warmup: 1 after the warm-up.

``scheduler.step()`` after each optimizer step only sets each parameter group's ``lr`` (a float): no device work.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def lr_factor(kind: str, warmup: int, total: int) -> Callable[[int], float]:
    """The multiplier of the peak learning rate at 0-based step ``s``, for a run of ``total`` steps."""

    def factor(step: int) -> float:
        if kind == "constant":
            return 1.0
        if step < warmup:
            return step / max(1, warmup)
        if kind == "constant_with_warmup":
            return 1.0
        progress = (step - warmup) / max(1, total - warmup)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        if kind == "cosine":
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
        raise ValueError(f"unknown learning-rate schedule {kind!r}")

    return factor


def make_scheduler(optimizer: torch.optim.Optimizer, kind: str, warmup: int,
                   total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The run's scheduler; constructing it sets the first step's learning rate."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(kind, warmup, total))


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate the next optimizer step uses (the first parameter group's)."""
    return float(optimizer.param_groups[0]["lr"])
