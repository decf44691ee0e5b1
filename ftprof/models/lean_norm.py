"""A norm's output computed again in backward instead of kept (``--lean-norms``; the SwiGLU product:
models/lean_mlp.py).

In a Llama-style layer each RMSNorm's output feeds a group of adapted projections (input_layernorm: q, k, v;
post_attention_layernorm: gate, up). Their frozen base matmuls keep nothing of it, but their adapters' shared A
matmul (models/lora_fused_a.py) keeps it for A's weight gradient: hidden_size values a token, twice a layer (8 KiB
each in llama-8b in bf16), beside the norm's own input, which its backward reads anyway.

Here the norm and the group's A matmul are one op, ``ftprof::rmsnorm_lora_a``: it keeps the norm's input, its weight
and A, and forms the norm's output again in backward for A's gradient (one pass over tokens x hidden). The norm is
HF's RMSNorm formula (Llama, Mistral, Qwen2, Qwen3: fp32 statistics, the run dtype's output times the weight) and
the backward is autograd's formulas for it in autograd's order: the same bits on the CPU (tests). One Triton kernel
each way on CUDA: models/lean_kernels.py. The group's A
outputs are handed to its projections as fused A hands them between siblings, so the projections run as before.

Applied where the group shares one A matmul (--lora-fused-a, on by default) and its projections are not joined
(--lora-fused-projections keeps its own input for its A); the norm's weight does not train (LoRA methods). A call the
op does not cover (adapters off, several adapters, dropout) runs the norm's own forward.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from ftprof.models import lean_kernels
from ftprof.models.lora_fused_a import GROUPS, plain_adapter

MARK = "_ftprof_lean_norm"
NORMS = {"self_attn": "input_layernorm", "mlp": "post_attention_layernorm"}  # the group's parent -> its norm


def _normalized(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
    """(the norm's output, x in fp32, its reciprocal RMS): HF's RMSNorm, op for op."""
    wide = x.to(torch.float32)
    rstd = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (wide * rstd).to(x.dtype), wide, rstd


@torch.library.custom_op("ftprof::rmsnorm_lora_a", mutates_args=())
def rmsnorm_lora_a(x: torch.Tensor, weight: torch.Tensor, eps: float,
                   lora_a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x) * weight, that output @ lora_a.T): the projections' input and their adapters' rank side."""
    if _on_kernels(x, weight):
        out = lean_kernels.rmsnorm(x.contiguous(), weight, eps, torch.promote_types(x.dtype, weight.dtype))
    else:
        out = _normalized(x, weight, eps)[0]
    return out, F.linear(out, lora_a)


def _on_kernels(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The Triton kernels (models/lean_kernels.py) on CUDA, for a contiguous weight as wide as x's rows."""
    return lean_kernels.wanted(x) and weight.dim() == 1 and weight.is_contiguous() and weight.shape[0] == x.shape[-1]


@rmsnorm_lora_a.register_fake
def _(x, weight, eps, lora_a):
    return torch.empty_like(x, dtype=torch.promote_types(x.dtype, weight.dtype)), \
        x.new_empty((*x.shape[:-1], lora_a.shape[0]))


def _setup_context(ctx, inputs, output) -> None:
    x, weight, eps, lora_a = inputs
    ctx.eps = eps
    ctx.save_for_backward(x, weight, lora_a)  # the output is not kept


def _backward(ctx, grad_out, grad_low):
    x, weight, lora_a = ctx.saved_tensors
    grad = grad_low.matmul(lora_a)
    if _on_kernels(x, weight):  # one kernel: the sum, x's gradient and the output again
        grad_x, out = lean_kernels.rmsnorm_backward(
            x.contiguous(), weight, ctx.eps, grad, None if grad_out is None else grad_out.contiguous())
    else:
        out, grad_x = _torch_backward(x, weight, ctx.eps, grad if grad_out is None else grad_out + grad)
    flat_low = grad_low.reshape(-1, grad_low.shape[-1])
    grad_a = flat_low.t().mm(out.reshape(-1, out.shape[-1]))
    return grad_x, None, None, grad_a


def _torch_backward(x, weight, eps: float, grad) -> tuple[torch.Tensor, torch.Tensor]:
    """(the output formed again: A's weight gradient reads it, x's gradient) as torch ops."""
    out, wide, rstd = _normalized(x, weight, eps)
    # autograd's chain through HF's norm: weight * y (y's share), y = scaled in x's dtype, scaled = wide * rstd,
    # rstd = rsqrt(mean(wide^2) + eps), wide = x in fp32
    grad_scaled = (grad * weight).to(torch.float32)
    grad_rstd = (grad_scaled * wide).sum(-1, keepdim=True)
    grad_mean = -0.5 * grad_rstd * rstd.pow(3)
    grad_square = grad_mean.expand_as(wide) / wide.shape[-1]
    grad_wide = grad_scaled * rstd + grad_square * (2.0 * wide)
    return out, grad_wide.to(x.dtype)


rmsnorm_lora_a.register_autograd(_backward, setup_context=_setup_context)


def attach(blocks: list[nn.Module]) -> int:
    """Give each norm of ``blocks`` (decoder layers) whose group qualifies the lean forward. Returns how many."""
    count = 0
    for block in blocks:
        for parent_name, names in GROUPS:
            norm = getattr(block, NORMS[parent_name], None)
            members = _members(getattr(block, parent_name, None), names)
            if norm is None or not members or not _is_rmsnorm(norm) or getattr(norm, MARK, False):
                continue
            object.__setattr__(norm, "_ftprof_members", members)  # (not registered: they stay where PEFT put them)
            norm.forward = types.MethodType(_lean_forward(norm.forward), norm)
            setattr(norm, MARK, True)
            count += 1
    return count


def _members(parent, names) -> tuple:
    """The group's projections when they share fused A's matmul and none is joined, else ()."""
    members = tuple(getattr(parent, n, None) for n in names) if parent is not None else ()
    if len(members) < 2 or any(m is None or not hasattr(m, "_ftprof_group") for m in members):
        return ()
    if any(hasattr(m, "_ftprof_joined") or m._ftprof_group[0] != members for m in members):
        return ()
    return members


def _is_rmsnorm(norm: nn.Module) -> bool:
    """HF's RMSNorm of these families (a weight and variance_epsilon; Gemma's 1 + weight is another formula), or
    Liger's in its Llama casting mode without an offset (--kernels liger: the same formula, fp32 statistics, the
    output cast before the weight's product)."""
    name = type(norm).__name__
    hf = name in ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
    liger = name == "LigerRMSNorm" and getattr(norm, "offset", None) == 0.0 \
        and getattr(norm, "casting_mode", None) == "llama"
    return (hf or liger) and isinstance(getattr(norm, "weight", None), torch.Tensor) and not norm.weight.requires_grad


def _lean_forward(own_forward):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        members = self._ftprof_members
        name = plain_adapter(members[0])
        if name is None or any(plain_adapter(m) != name for m in members):
            return own_forward(x)
        weights = [m.lora_A[name].weight for m in members]
        # A in the output's dtype: what autocast hands the adapters' matmul (the op runs outside autocast)
        out, low = rmsnorm_lora_a(x, self.weight, float(self.variance_epsilon),
                                  torch.cat(weights).to(torch.promote_types(x.dtype, self.weight.dtype)))
        for member, part in zip(members, low.split([w.shape[0] for w in weights], dim=-1), strict=True):
            member._ftprof_slice = (out, part)
        return out

    return forward
