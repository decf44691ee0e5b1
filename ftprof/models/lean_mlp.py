"""The SwiGLU product computed again in backward instead of kept (``--lean-activations``; the norms' outputs:
models/lean_norm.py).

A Llama-style MLP is ``down_proj(silu(gate) * up)``. A layer that keeps its activations (no checkpointing, or the
layers past ``--checkpoint-layers``) keeps, per token, gate and up (the product's own backward reads them) and the
product itself, which the down projection's adapter keeps for its weight gradient (LoRA's A: ``dA = dlow^T x``):
intermediate_size values each. In llama-8b that product is 28 KiB a token and layer in bf16, a fifth of what a
LoRA/QLoRA layer keeps (3.5 GiB at 4 x 2048 tokens). The frozen base matmul keeps nothing of its input: its weight
does not train.

Here the product and A's matmul are one op, ``ftprof::swiglu_lora_a``, that keeps gate, up and A, and forms the
product again in backward (one elementwise pass over tokens x intermediate_size) for A's gradient. Its backward
applies the formulas autograd applies to the eager MLP, in the same order (mul's, silu's, the two matmuls'), so the
gradients are the same bits (CPU tests, fp32). As an opaque op, a compiled layer keeps what the op keeps: the
partitioner cannot choose to save the product instead.

What it costs: the elementwise pass in backward, and under --compile the product is no longer fused into the
kernels around it (the FP8 input quantization of the down projection reads it from memory). The op's
elementwise work as one Triton kernel each way on CUDA: models/lean_kernels.py. The MLP is PEFT's
computation otherwise: ``base(x) + B(A(x)) * scale`` with the base layer's own forward (bitsandbytes, FP8,
--lean-recompute's op), so it composes with the options that change the base.

Applied to the MLPs of decoder layers with gate, up and down projections, a SiLU activation and a LoRA-adapted down
projection (Llama, Mistral, Qwen2, Qwen3 and alike; HF's MLP or Liger's). A call the op does not cover (adapters
disabled or merged, several active adapters, dropout, DoRA and other variants) runs the MLP's own forward.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from ftprof.models import lean_kernels
from ftprof.models.lora_addmm import is_lora_linear
from ftprof.models.lora_fused_a import plain_adapter

MARK = "_ftprof_lean_mlp"


@torch.library.custom_op("ftprof::swiglu_lora_a", mutates_args=())
def swiglu_lora_a(gate: torch.Tensor, up: torch.Tensor, lora_a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(silu(gate) * up, that product @ lora_a.T): the down projection's input and its adapter's rank-r side."""
    product = lean_kernels.swiglu(gate.contiguous(), up.contiguous()) if _on_kernels(gate, up) else F.silu(gate) * up
    return product, F.linear(product, lora_a)


def _on_kernels(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """The Triton kernels (models/lean_kernels.py) on CUDA, for operands of one shape and dtype."""
    return lean_kernels.wanted(gate) and gate.shape == up.shape and gate.dtype == up.dtype


@swiglu_lora_a.register_fake
def _(gate, up, lora_a):
    return torch.empty_like(gate), gate.new_empty((*gate.shape[:-1], lora_a.shape[0]))


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)  # gate, up, A: the product is not kept


def _backward(ctx, grad_product, grad_low):
    gate, up, lora_a = ctx.saved_tensors
    grad = grad_low.matmul(lora_a)  # the adapter's share of the product's gradient
    if _on_kernels(gate, up):  # one kernel: the sum, both gradients and the product again
        grad_gate, grad_up, product = lean_kernels.swiglu_backward(
            gate.contiguous(), up.contiguous(), grad, None if grad_product is None else grad_product.contiguous())
    else:
        silu = F.silu(gate)
        product = silu * up  # again: A's weight gradient reads it
        if grad_product is not None:
            grad = grad_product + grad
        # mul's backward (silu * up), then silu's
        grad_gate, grad_up = torch.ops.aten.silu_backward(grad * up, gate), grad * silu
    flat_low = grad_low.reshape(-1, grad_low.shape[-1])
    # A's gradient as autograd forms a linear's weight gradient: grad^T @ input
    grad_a = flat_low.t().mm(product.reshape(-1, product.shape[-1]))
    return grad_gate, grad_up, grad_a


swiglu_lora_a.register_autograd(_backward, setup_context=_setup_context)


def attach(blocks: list[nn.Module]) -> int:
    """Give the MLP of each of ``blocks`` (decoder layers) that qualifies the lean forward. Returns how many."""
    count = 0
    for block in blocks:
        mlp = getattr(block, "mlp", None)
        if mlp is not None and eligible(mlp) and not getattr(mlp, MARK, False):
            mlp.forward = types.MethodType(_lean_forward(mlp.forward), mlp)
            setattr(mlp, MARK, True)
            count += 1
    return count


def eligible(mlp: nn.Module) -> bool:
    """Gate, up and down projections, the down one LoRA-adapted, and a SiLU gate (HF's act_fn, or Liger's SwiGLU
    MLP, which takes only SiLU)."""
    if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")) or not is_lora_linear(mlp.down_proj):
        return False
    act = getattr(mlp, "act_fn", None)
    if act is None:
        return "SwiGLU" in type(mlp).__name__
    return isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU")


def _lean_forward(own_forward):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        down = self.down_proj
        name = plain_adapter(down)
        if name is None:
            return own_forward(x)
        gate, up = self.gate_proj(x), self.up_proj(x)  # in this order, as the MLP calls them (fused A reads it)
        # A in the product's dtype: what autocast hands the adapter's matmul (the op runs outside autocast)
        product, low = swiglu_lora_a(gate, up, down.lora_A[name].weight.to(gate.dtype))
        result = down.base_layer(product)
        return (result + down.lora_B[name](low) * down.scaling[name]).to(result.dtype)

    return forward
