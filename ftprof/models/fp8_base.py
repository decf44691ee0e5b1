"""FP8 matmuls for the frozen base weights of LoRA and QLoRA (``--fp8-base``).

A LoRA step multiplies by each frozen base weight twice: forward (``y = x W^T``) and for the input gradient
(``dx = dy W``); the weight itself gets no gradient. Those GEMMs were 62% of the fastest QLoRA step on an H200, at
73% of the bf16 tensor-core peak. Hopper and Ada run e4m3 GEMMs at twice the bf16 rate, and a frozen weight is
quantized once (LoRA) or dequantized straight into e4m3 (QLoRA), so only the activations pay a quantization.

Scaling is rowwise, as ``torch._scaled_mm`` takes it on Hopper:

- forward: each token's row of ``x`` by its own absmax (``scale_a``, tokens x 1); each output row of ``W`` by its
  absmax (``scale_b``, 1 x out). For a 4-bit weight that absmax is known without dequantizing: the largest of the
  row's blocks' absmax times the table's largest value, fixed at setup.
- input gradient: ``dy W = (dy * s_W) Wq`` where ``Wq = W / s_W`` row by row: the weight's row scale is folded
  into the gradient before the gradient's rows are quantized (reduction runs over the weight's rows, so its scale
  cannot ride on the output side). The GEMM needs ``Wq`` with the reduction dimension contiguous: its transpose.
  LoRA keeps that transpose (one byte a parameter, twice: ~14 GB for llama-8b's decoder linears); QLoRA makes it
  from the e4m3 weight that backward dequantizes again (one transposing copy, one byte a value).

Everything else stays in the run dtype: the adapters (A, B and their gradients), attention, norms, the loss and
lm_head. The numerics are FP8's: each run is checked against eager 16-bit on the GPU (loss per step, gradients).
MFU stays model FLOPs over the bf16 dense peak (DESIGN.md), so it is comparable with 16-bit runs' and may pass
what a 16-bit run could reach. Off CUDA ``torch._scaled_mm`` runs on the CPU (what the CPU tests exercise).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from ftprof.models import dequant_kernels

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
_TINY = 1e-12  # an all-zero row's scale: its values stay zero


def quantize_rows(t: torch.Tensor, column_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A 2-D tensor (times ``column_scale`` along its columns, if given) as e4m3 values and fp32 row scales
    (rows x 1): ``t * column_scale ~= values * scale``. Under --compile inductor makes one or two kernels of it."""
    t = t.float()
    if column_scale is not None:
        t = t * column_scale
    scale = t.abs().amax(dim=-1, keepdim=True).clamp(min=_TINY) / E4M3_MAX
    return (t / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def eligible(module: nn.Module) -> bool:
    """A frozen linear whose shapes ``torch._scaled_mm`` takes (both dimensions multiples of 16)."""
    if any(p.requires_grad for p in module.parameters(recurse=False)):
        return False
    out_features, in_features = getattr(module, "out_features", 0), getattr(module, "in_features", 0)
    return bool(out_features) and out_features % 16 == 0 and in_features % 16 == 0


def convert(blocks: list[nn.Module]) -> int:
    """Give every frozen base linear in ``blocks`` (decoder layers) FP8 matmuls: plain linears get their e4m3
    weight and its transpose now, bitsandbytes 4-bit linears their row scales. Returns how many linears."""
    from ftprof.models.dequant import is_4bit_linear

    count = 0
    for block in blocks:
        for module in block.modules():
            if getattr(module, "_ftprof_in_joined_group", False) or not eligible(module):
                continue
            if type(module) is nn.Linear:
                weight, scale = quantize_rows(module.weight.detach())
                module._ftprof_fp8 = _Dense(weight, weight.t().contiguous(), scale.view(1, -1))
            elif is_4bit_linear(module) and _whole_blocks(module):
                scale = _row_absmax(module) / E4M3_MAX
                module._ftprof_fp8 = _Packed(scale.view(1, -1), module.in_features)
            else:
                continue
            module.forward = types.MethodType(_forward, module)
            count += 1
    return count


class _Dense:
    """A 16-bit frozen weight in e4m3: rows (out x in), its transpose (in x out, contiguous), row scales (1 x out)."""

    def __init__(self, weight, transposed, scale):
        self.weight, self.transposed, self.scale = weight, transposed, scale
        self.ones = torch.ones(1, weight.shape[1], device=weight.device)  # the input gradient's output scale

    def rows(self, module, for_backward: bool = False) -> torch.Tensor:
        return self.weight

    def columns(self, module) -> torch.Tensor:
        return self.transposed


class _Packed:
    """A 4-bit frozen weight: its e4m3 rows dequantized on each use, with row scales (1 x out) and their inverses."""

    def __init__(self, scale, in_features: int):
        self.scale, self.inverse = scale, (1.0 / scale).view(-1).contiguous()
        self.ones = torch.ones(1, in_features, device=scale.device)

    def rows(self, module, for_backward: bool = False) -> torch.Tensor:
        state = module.weight.quant_state
        return dequant_kernels.dequantize_fp8(module.weight, state, self.inverse, for_backward)

    def columns(self, module) -> torch.Tensor:
        return self.rows(module, for_backward=True).t().contiguous()


def _forward(self, x: torch.Tensor) -> torch.Tensor:
    out = _Fp8Matmul.apply(x, self)
    if self.bias is not None:
        out = out + self.bias.to(out.dtype)
    return out


class _Fp8Matmul(torch.autograd.Function):
    """``x @ W^T`` and its input gradient as rowwise-scaled e4m3 GEMMs, nothing saved but the module. The GEMMs
    write bf16 (what rowwise scaling takes on Hopper), cast to the input's or gradient's dtype."""

    @staticmethod
    def forward(ctx, x, module):
        ctx.module = module
        fp8 = module._ftprof_fp8
        values, scale = quantize_rows(x.reshape(-1, x.shape[-1]))
        out = torch._scaled_mm(values, fp8.rows(module).t(), scale_a=scale, scale_b=fp8.scale,
                               out_dtype=torch.bfloat16)
        return out.view(*x.shape[:-1], out.shape[-1]).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        module = ctx.module
        fp8 = module._ftprof_fp8
        # dy W = (dy * s_W) Wq: the weight's row scale is folded into the gradient before its rows are quantized
        values, scale = quantize_rows(grad.reshape(-1, grad.shape[-1]), column_scale=fp8.scale)
        transposed = fp8.columns(module)  # in x out, contiguous: its .t() is the column-major operand
        grad_in = torch._scaled_mm(values, transposed.t(), scale_a=scale, scale_b=fp8.ones, out_dtype=torch.bfloat16)
        return grad_in.view(*grad.shape[:-1], grad_in.shape[-1]).to(grad.dtype), None


def _whole_blocks(module: nn.Module) -> bool:
    """The 4-bit weight is a whole number of quantization blocks (what the dequantization kernels take)."""
    state = module.weight.quant_state
    return len(state.shape) == 2 and state.shape.numel() % state.blocksize == 0


def _row_absmax(module: nn.Module) -> torch.Tensor:
    """The largest |value| each row of a 4-bit weight can hold, from its blocks' absmax and its 16-value table
    (fp32): a row's own largest value where its blocks are its own; where a block straddles two rows, the larger
    of the two rows' bounds. Computed once, at setup (one fp32 value per weight element, briefly)."""
    state = module.weight.quant_state
    absmax = state.absmax
    if state.nested:  # 8-bit codes, scaled per group of blocks, plus an offset (bitsandbytes' arithmetic)
        inner = state.state2
        group = torch.arange(absmax.numel(), device=absmax.device) // inner.blocksize
        absmax = inner.code[absmax.long()] * inner.absmax[group] + state.offset
    per_value = absmax.float().repeat_interleave(state.blocksize).view(state.shape)
    return per_value.amax(dim=1) * state.code.abs().max().float()
