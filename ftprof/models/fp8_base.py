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
  LoRA keeps that transpose (one byte a parameter, twice: 13.0 GiB for llama-8b's decoder linears); QLoRA's
  backward dequantizes the 4-bit weight straight into it (one tiled kernel on CUDA; a transposing copy of the e4m3
  rows took ~40 ms a step for llama-8b on an H200).

Everything else stays in the run dtype: the adapters (A, B and their gradients), attention, norms, the loss and
lm_head. The numerics are FP8's, checked on the GPU (tests/gpu/test_gpu_fast_paths.py): eager FP8 within 2% of
eager bf16's loss at every step of 30, its compiled and CUDA-graph paths within 1% of eager FP8. MFU stays model
FLOPs over the bf16 dense peak (DESIGN.md), so it is comparable with 16-bit runs' and may pass what a 16-bit run
could reach. Off CUDA ``torch._scaled_mm`` runs on the CPU (what the CPU tests exercise).

Measured on an H200 (llama-8b, 4 x 2048, BENCHMARKS.md): QLoRA 20,917 tokens/s as CUDA graphs (16-bit 16,582),
LoRA 21,580 (16-bit 16,959), QLoRA under full checkpointing 13,317 (16-bit 11,490 on the same machine; there each
4-bit weight is dequantized three times a step, and before the transposing kernel the host's dispatch outlasted
the GPU's work). Off by default: it changes the arithmetic.

The matmuls are torch custom ops (models/fp8_kernels.py); this module converts the linears and routes their forward.
The e4m3 tensors are the linears' non-persistent buffers (not saved, moved with the module, static addresses for
CUDA graphs).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from ftprof.models import dequant, dequant_kernels, fp8_kernels, recompute
from ftprof.models.fp8_kernels import E4M3_MAX, quantize_rows

OWNER = "fp8"  # a converted linear's owner (models/dequant.py): the routing leaves it alone


def eligible(module: nn.Module) -> bool:
    """A frozen linear whose shapes ``torch._scaled_mm`` takes (both dimensions multiples of 16)."""
    if any(p.requires_grad for p in module.parameters(recurse=False)):
        return False
    out_features, in_features = getattr(module, "out_features", 0), getattr(module, "in_features", 0)
    return bool(out_features) and out_features % 16 == 0 and in_features % 16 == 0


def convert(blocks: list[nn.Module]) -> int:
    """Give every frozen base linear in ``blocks`` (decoder layers) FP8 matmuls: plain linears get their e4m3
    weight and its transpose now, bitsandbytes 4-bit linears their row scales. Returns how many linears."""
    count = 0
    for block in blocks:
        for module in block.modules():
            if dequant.owner(module) is not None or not eligible(module):
                continue
            if type(module) is nn.Linear:
                weight, scale = quantize_rows(module.weight.detach())
                _buffers(module, scale.view(1, -1), weight=weight, transposed=weight.t().contiguous())
            elif dequant.is_4bit_linear(module) and _whole_blocks(module):
                scale = (_row_absmax(module) / E4M3_MAX).view(1, -1)
                _buffers(module, scale, inverse=(1.0 / scale).view(-1).contiguous())
            else:
                continue
            module.forward = types.MethodType(_forward, module)
            count += 1
    return count


def converted(module: nn.Module) -> bool:
    return dequant.owner(module) == OWNER


def _buffers(module: nn.Module, scale: torch.Tensor, **tensors: torch.Tensor) -> None:
    """The e4m3 tensors as ``fp8_*`` buffers: a dense weight's ``fp8_weight`` and ``fp8_transposed``, or a 4-bit
    weight's ``fp8_inverse``; both, ``fp8_scale`` and ``fp8_ones``."""
    dequant.claim(module, OWNER)
    tensors.update(scale=scale, ones=torch.ones(1, module.in_features, device=scale.device))
    for name, tensor in tensors.items():
        module.register_buffer(f"fp8_{name}", tensor, persistent=False)


def buffer_names(model: nn.Module) -> list[str]:
    """The qualified names of the e4m3 weights and scales that ``convert`` gave ``model``'s linears."""
    return [f"{name}.{buffer}" for name, module in model.named_modules() if converted(module)
            for buffer, _ in module.named_buffers(recurse=False) if buffer.startswith("fp8_")]


def rows(module: nn.Module) -> torch.Tensor:
    """A converted linear's weight as e4m3 rows (out x in), as its matmuls read it."""
    weight, _, _, _, *packing = _weight_args(module)
    return fp8_kernels.rows(weight, *packing)


def _weight_args(module: nn.Module) -> tuple:
    """The op's arguments after the input: weight, transposed, scale, ones, quant, blocksize, blocksize2, shape."""
    if hasattr(module, "fp8_weight"):  # dense: its e4m3 rows made once
        weight = module.fp8_weight
        return weight, module.fp8_transposed, module.fp8_scale, module.fp8_ones, [], 0, 0, list(weight.shape)
    state = module.weight.quant_state
    absmax, code, absmax2, code2, offset, blocksize, blocksize2 = dequant_kernels.state_args(state)
    quant = [absmax, code, module.fp8_inverse] + ([absmax2, code2, offset] if state.nested else [])
    return module.weight, None, module.fp8_scale, module.fp8_ones, quant, blocksize, blocksize2, list(state.shape)


def _forward(self, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)  # (autograd casts the gradient back to x's dtype)
    if recompute.marked(self):  # --lean-recompute's output projection: its recomputation skips the matmul
        out = torch.ops.ftprof.fp8_output_linear(flat, *_weight_args(self))
    elif torch.compiler.is_compiling():
        # traced: the input's quantization in torch ops, which inductor fuses into the kernel that made the input
        # (the norm, the SwiGLU product) and computes once for the projections of one input (q, k, v; gate, up);
        # eager, one op quantizes and multiplies (one dispatch, one Triton kernel)
        values, x_scale = fp8_kernels.torch_quantize_rows(flat.detach())
        out = torch.ops.ftprof.fp8_linear_quantized(flat, values, x_scale, *_weight_args(self))
    else:
        out = torch.ops.ftprof.fp8_linear(flat, *_weight_args(self))
    out = out.view(*x.shape[:-1], out.shape[-1])
    if self.bias is not None:
        out = out + self.bias.to(out.dtype)
    return out.to(x.dtype)


def _whole_blocks(module: nn.Module) -> bool:
    """The 4-bit weight is a whole number of quantization blocks (what the dequantization kernels take)."""
    state = module.weight.quant_state
    return len(state.shape) == 2 and state.shape.numel() % state.blocksize == 0


def _row_absmax(module: nn.Module) -> torch.Tensor:
    """The largest |value| each row of a 4-bit weight can hold, from its blocks' absmax and its 16-value table
    (fp32): a row's own largest value where its blocks are its own; where a block straddles two rows, the larger
    of the two rows' bounds. Computed once, at setup (one fp32 value per weight element, briefly)."""
    state = module.weight.quant_state
    absmax, _, absmax2, code2, offset, _, blocksize2 = dequant_kernels.state_args(state)
    per_value = dequant_kernels.block_absmax(absmax, absmax2, code2, offset, blocksize2) \
        .repeat_interleave(state.blocksize).view(state.shape)
    return per_value.amax(dim=1) * state.code.abs().max().float()
