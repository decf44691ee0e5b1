"""QLoRA's 4-bit base weights under activation checkpointing: dequantize once per recomputation, not twice.

bitsandbytes' 4-bit matmul saves only the packed weight for backward and dequantizes it again there, which is
right without checkpointing (keeping every layer's 16-bit weight until backward would hold the whole model in 16
bits again). Under full checkpointing a layer's forward runs twice, and its weights are dequantized three times
per step: forward, recomputation, backward. A checkpointed layer's linears here compute ``x @ dequantize(W).T``
with plain autograd, so the weight dequantized by the recomputation is the one backward uses: two
dequantizations, at the cost of one layer's 16-bit weights held from its recomputation through its backward (the
first forward's saved tensors are dropped by the checkpoint, as every activation is). GPTQ-LoRA's torch kernel
already works this way under checkpointing.
"""

from __future__ import annotations

import types

import torch
from torch import nn


def is_4bit_linear(module: nn.Module) -> bool:
    import sys

    bnb = sys.modules.get("bitsandbytes")  # a model without 4-bit layers never imports it
    return bnb is not None and isinstance(module, bnb.nn.Linear4bit)


def _keep_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Linear4bit.forward for a frozen base weight, with the dequantized weight saved for backward by autograd."""
    import bitsandbytes as bnb
    from bitsandbytes.nn.modules import fix_4bit_weight_quant_state_from_module

    fix_4bit_weight_quant_state_from_module(self)  # FSDP2 all-gathers the packed weight without its quant state
    weight = bnb.functional.dequantize_4bit(self.weight, self.weight.quant_state)
    dtype = self.compute_dtype or x.dtype
    bias = None if self.bias is None else self.bias.to(dtype)
    return nn.functional.linear(x.to(dtype), weight.to(dtype), bias).to(x.dtype)


def keep_dequantized(blocks: list[nn.Module]) -> int:
    """Route the frozen 4-bit linears of ``blocks`` (the checkpointed decoder layers) through ``_keep_forward``.
    Returns how many. A linear whose weight or bias trains is left to bitsandbytes."""
    count = 0
    for block in blocks:
        for module in block.modules():
            if not is_4bit_linear(module) or any(p.requires_grad for p in module.parameters(recurse=False)):
                continue
            module.forward = types.MethodType(_keep_forward, module)
            count += 1
    return count


def largest_layer_bytes(blocks: list[nn.Module], dtype: torch.dtype) -> int:
    """The 16-bit (``dtype``) size of the largest block's 4-bit weights: what keeping them adds at the peak, the
    recomputed layer's weights held through its backward."""
    size = torch.empty((), dtype=dtype).element_size()
    per_block = [sum(m.weight.quant_state.shape.numel() * size for m in b.modules() if is_4bit_linear(m))
                 for b in blocks]
    return max(per_block, default=0)
