"""How QLoRA's frozen 4-bit base weights are dequantized for their matmuls, forward and backward.

bitsandbytes' 4-bit matmul saves only the packed weight for backward and dequantizes it again there. Three changes,
each a run option, routed here per linear:

- **Kept under full checkpointing** (``--keep-dequantized``). Without checkpointing, dequantizing again in backward
  is right: keeping every layer's 16-bit weight until backward would hold the whole model in 16 bits again. Under
  full checkpointing a layer's forward runs twice, and its weights are dequantized three times per step: forward,
  recomputation, backward. A checkpointed layer's linears here compute ``x @ dequantize(W).T`` with plain
  autograd, so the weight the recomputation dequantized is the one backward uses (the first forward's saved
  tensors are dropped by the checkpoint, as every activation is): one layer's 16-bit weights held from its
  recomputation through its backward. GPTQ-LoRA's torch kernel already works this way under checkpointing.
- **Dequantized by torch ops under --compile** (``--compile-dequant``). bitsandbytes' dequantization is an opaque
  op to the compiler; written as torch ops (unpack the two 4-bit codes of each byte, look them up in the 16-value
  table, scale by the block's absmax, itself dequantized from 8 bits under double quantization), inductor makes
  one kernel of it inside the compiled block. The arithmetic is bitsandbytes' own (fp32 product, then one
  rounding to the compute dtype): the same bits. Eager, those ops would be several kernels: this route is only
  taken for compiled blocks, and undone if they fall back to eager. Measured on an H200 (llama-8b QLoRA, 4 x
  2048): without checkpointing the compiler's partitioner saves each dequantized weight for backward rather than
  redo the fused kernel (+13 GiB, +0.8% tokens/s, what keeping every layer's weights would do); under full
  checkpointing it ran 4.4% slower. Off by default, kept as a measured option.
- **Dequantized by ftprof's Triton kernel** (``--dequant-kernel triton``; models/dequant_kernels.py): the same bits
  as bitsandbytes' kernel in one pass at a higher share of memory bandwidth, eager or compiled (an opaque op, so
  the partitioner cannot trade it for a saved weight), forward, backward and kept alike.
"""

from __future__ import annotations

import sys
import types

import torch
from torch import nn

from ftprof.models import dequant_kernels, recompute


def keeps_weights(method) -> bool:
    """Whether a run's method config keeps QLoRA's dequantized weights for backward under full checkpointing."""
    return method.method == "qlora" and bool(method.keep_dequantized)


def is_4bit_linear(module: nn.Module) -> bool:
    bnb = sys.modules.get("bitsandbytes")  # a model without 4-bit layers never imports it
    return bnb is not None and isinstance(module, bnb.nn.Linear4bit)


# A frozen base linear whose matmul another module computes (a joined group of projections, --fp8-base) carries
# its owner's name here: the routing below leaves it alone, and no second owner takes it.
OWNER = "_ftprof_base_owner"


def claim(module: nn.Module, owner: str) -> None:
    setattr(module, OWNER, owner)


def owner(module: nn.Module) -> str | None:
    return getattr(module, OWNER, None)


# Who dequantizes a 4-bit weight: bitsandbytes' kernel, torch ops (traced into compiled blocks: --compile-dequant) or
# ftprof's Triton kernel (--dequant-kernel triton; models/dequant_kernels.py).
DEQUANTIZERS = ("bitsandbytes", "torch", "triton")


def route(blocks: list[nn.Module], kept: int, dequantizer: str = "bitsandbytes") -> tuple[int, int]:
    """Set how each frozen 4-bit linear of ``blocks`` (the decoder layers, in order) dequantizes: the first
    ``kept`` blocks keep the weight for backward; ``dequantizer`` (one of DEQUANTIZERS) does the dequantizing. A
    linear left with neither runs bitsandbytes' own forward. Linears whose weight or bias trains are left alone.
    Returns (linears that keep, linears that another dequantizer than bitsandbytes serves)."""
    assert dequantizer in DEQUANTIZERS, dequantizer
    keeping = rerouted = 0
    for index, block in enumerate(blocks):
        for module in block.modules():
            if not is_4bit_linear(module) or any(p.requires_grad for p in module.parameters(recurse=False)) \
                    or owner(module) is not None:
                continue
            keep = index < kept
            module.__dict__.pop("forward", None)  # back to Linear4bit.forward before choosing again
            other = dequantizer != "bitsandbytes" and (keep or module.bias is None)  # (biased, not kept: bnb's)
            if keep or other or recompute.marked(module):  # (--lean-recompute's output projection: its own op)
                module.forward = types.MethodType(_forward(keep, dequantizer), module)
            keeping += keep
            rerouted += other
    return keeping, rerouted


def _forward(keep: bool, dequantizer: str):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.compute_dtype or x.dtype
        if keep:  # plain autograd saves the dequantized weight for the input gradient
            bias = None if self.bias is None else self.bias.to(dtype)
            weight = dequantize(self, dequantizer).to(dtype)
            # (--lean-recompute's output projection through its own op: the same saved weight)
            return recompute.linear(self, x.to(dtype), weight, bias).to(x.dtype)
        if self.bias is not None:  # (decoder linears of the supported models have none)
            return type(self).forward(self, x)
        return _DequantizeAgain.apply(x.to(dtype), self, dequantizer).to(x.dtype)

    return forward


class _DequantizeAgain(torch.autograd.Function):
    """``x @ dequantize(W).T`` saving nothing weight-sized: backward dequantizes again."""

    @staticmethod
    def forward(ctx, x, module, dequantizer):
        ctx.module, ctx.dequantizer = module, dequantizer
        # --lean-recompute's output projection goes through its own op, which selective does not save and the
        # recomputation skips (the same ops in the same order: selective replays them by count)
        return recompute.linear(module, x, dequantize(module, dequantizer).to(x.dtype))

    @staticmethod
    def backward(ctx, grad_out):
        weight = dequantize(ctx.module, ctx.dequantizer, for_backward=True)
        return grad_out @ weight.to(grad_out.dtype), None, None


def dequantize(module: nn.Module, dequantizer: str, for_backward: bool = False) -> torch.Tensor:
    """The 4-bit linear's weight, (out_features, in_features), in its quantization dtype. ``for_backward``: the
    dequantization that backward does (the Triton op keeps it apart from the forward's; see its docstring)."""
    import bitsandbytes as bnb
    from bitsandbytes.nn.modules import fix_4bit_weight_quant_state_from_module

    fix_4bit_weight_quant_state_from_module(module)  # FSDP2 all-gathers the packed weight without its quant state
    state = module.weight.quant_state
    if dequantizer == "bitsandbytes" or state.shape.numel() % state.blocksize:
        return bnb.functional.dequantize_4bit(module.weight, state)
    if dequantizer == "triton":
        return dequant_kernels.triton_dequantize(module.weight, state, for_backward)
    return dequant_kernels.torch_dequantize(module.weight, state)
