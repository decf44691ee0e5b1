"""A model's precision in training: the forward's autocast context for the run dtype."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch


def precision(model, device_type: str, dtype: torch.dtype, autocasts: bool) -> Callable:
    """The forward's autocast context (a factory). ``autocasts``: whether the method keeps fp32 adapters that run
    in the run dtype under autocast (the LoRA methods, except the textbook recipe --kbit-prepare, which runs
    without autocast, as it was written to: its fp32 upcasts then cost what they cost)."""
    if not autocasts or dtype == torch.float32:
        return contextlib.nullcontext
    # PEFT casts each adapter's input to the adapter dtype (fp32) and autocast casts it straight back to bf16 for
    # the matmul: two full activation copies per adapted projection (measured on an H200: 20% of QLoRA's kernel
    # time in copy kernels). Under autocast the cast is pointless; switch it off.
    for module in model.modules():
        if hasattr(module, "cast_input_dtype_enabled"):
            module.cast_input_dtype_enabled = False
    return lambda: torch.autocast(device_type, dtype=dtype)
