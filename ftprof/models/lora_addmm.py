"""LoRA's adapter output added inside its second matmul: ``addmm(base, x A^T, B^T, alpha=scale)``.

PEFT computes ``base + B(A(x)) * scale``: the B matmul writes a full-size output (tokens x out_features), then a
separate kernel reads it and the base output and writes their sum; in backward, the gradient is scaled over the
full size before the two B gradients read it. With one ``addmm`` the GEMM reads the base output as its C operand,
the scale rides on the rank-r side (``alpha``), and neither the full-size intermediate nor the full-size scaling
exists, forward or backward: about four passes over each projection's output per layer and step fewer. The sum
is also rounded once (fp32 accumulation, then 16 bits) rather than twice.

Applied to PEFT's LoRA linears (bf16/fp32, bitsandbytes 4-bit, GPTQ bases alike: only the adapter side changes).
Measured on an H200 (llama-8b, 4 x 2048, compiled blocks, one call): 1.3% slower for LoRA and 1.5% for QLoRA than
PEFT's add, which inductor fuses with what surrounds it; so it is off by default (``--lora-addmm`` turns it on),
kept as a measured option. Eager (not compiled), where PEFT's add and scale are separate kernels, it is not yet
measured. A call the fused form does not cover (adapters disabled or merged, several active adapters, DoRA and other
variants, a trained LoRA bias, extra arguments) runs PEFT's own forward.
"""

from __future__ import annotations

import types

import torch
from torch import nn


def fuse_adapters(model: nn.Module) -> int:
    """Give every PEFT LoRA linear of ``model`` the fused forward. Returns how many."""
    count = 0
    for module in model.modules():
        if is_lora_linear(module):
            module.forward = types.MethodType(_fused_forward(module.forward), module)
            count += 1
    return count


def is_lora_linear(module: nn.Module) -> bool:
    lora_a = getattr(module, "lora_A", None)
    return isinstance(lora_a, nn.ModuleDict) and hasattr(module, "base_layer") and hasattr(module, "scaling") \
        and all(isinstance(m, nn.Linear) for m in lora_a.values())


def _fused_forward(peft_forward):
    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        name = single_plain_adapter(self)
        if name is None or args or kwargs:
            return peft_forward(x, *args, **kwargs)
        result = self.base_layer(x)
        hidden = self.lora_A[name](self.lora_dropout[name](x))  # tokens x rank
        out = result.shape[-1]
        # In the base output's dtype (autocast's, where it runs): the casts touch rank-sized tensors only.
        fused = torch.addmm(result.reshape(-1, out), hidden.reshape(-1, hidden.shape[-1]).to(result.dtype),
                            self.lora_B[name].weight.t().to(result.dtype), alpha=self.scaling[name])
        return fused.view(result.shape)

    return forward


def single_plain_adapter(module) -> str | None:
    """The active adapter's name when the fused form computes exactly what PEFT would; None otherwise."""
    if module.disable_adapters or module.merged or len(module.active_adapters) != 1:
        return None
    name = module.active_adapters[0]
    if name not in module.lora_A or name in getattr(module, "lora_variant", {}):
        return None
    if module.lora_B[name].bias is not None:
        return None
    return name
