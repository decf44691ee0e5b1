"""One LoRA down-projection (A) matmul for the adapted projections that read the same input (``--lora-fused-a``).

In a decoder layer q_proj, k_proj and v_proj read the same normed hidden states, and so do gate_proj and up_proj.
PEFT applies each adapter's A on its own: three (two) rank-16 matmuls, each reading the whole input (tokens x
hidden, 64 MB for llama-8b at 4 x 2048 in bf16), and in backward three (two) input-gradient matmuls, each writing a
full-size gradient that is then summed, and three (two) A-gradient matmuls, each reading the input again. Here the
first projection of a group applies the concatenated A matrices once (rank 48 or 32 instead of 16) and hands each
sibling its slice: the input is read once instead of three (two) times, in forward and for the A gradients, and one
input gradient is written instead of three (two). The LoRA weights stay PEFT's own parameters (the concatenation
is taken in each forward, a few hundred KB), so optimizer, checkpoints and gradients are unchanged.

The slice is handed over through an attribute of the sibling module, set by the first projection (or, under
--lean-norms, by the norm before them all: models/lean_norm.py) and cleared by the sibling that reads it,
within one forward of the layer (so a compiled block sees it empty on entry: one graph serves every layer). A
sibling whose slice is missing, or was made from another input, applies its own A. A call
the fused form does not cover (adapters disabled or merged, several active adapters, dropout, DoRA and other
variants, a LoRA bias, extra arguments) runs PEFT's own forward; the siblings then apply their own A.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from ftprof.models.lora_addmm import is_lora_linear, single_plain_adapter

# (parent module, projections that read the parent's input) in Llama-style decoder layers (Llama, Mistral, Qwen2).
GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


def fuse_groups(blocks: list[nn.Module]) -> int:
    """Give the adapted projections of each group in ``blocks`` (the decoder layers) the shared A matmul. Returns
    how many projections take part."""
    count = 0
    for _, members in adapted_groups(blocks):
        for index, member in enumerate(members):
            # Not registered as submodules (object.__setattr__): the siblings stay where PEFT put them.
            object.__setattr__(member, "_ftprof_group", (members, index))
            member._ftprof_slice = None
            member.forward = types.MethodType(_group_forward(member.forward), member)
        count += len(members)
    return count


def adapted_groups(blocks: list[nn.Module]):
    """(parent, members) for each GROUPS entry of ``blocks`` with at least two PEFT LoRA linears that read inputs
    of one width (models/fused_projections.py joins the same groups)."""
    for block in blocks:
        for parent_name, names in GROUPS:
            parent = getattr(block, parent_name, None)
            members = tuple(m for m in (getattr(parent, n, None) for n in names) if m is not None and is_lora_linear(m))
            if len(members) >= 2 and len({m.base_layer.in_features for m in members}) == 1:
                yield parent, members


def plain_adapter(module: nn.Module) -> str | None:
    """The active adapter's name when the shared form computes what PEFT would (no dropout); else None."""
    name = single_plain_adapter(module)
    return name if name is not None and isinstance(module.lora_dropout[name], nn.Identity) else None


def _group_forward(peft_forward):
    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        members, index = self._ftprof_group
        handed, self._ftprof_slice = self._ftprof_slice, None
        name = plain_adapter(self)
        if name is None or args or kwargs:
            return peft_forward(x, *args, **kwargs)
        result = self.base_layer(x)
        lora_x = self._cast_input_dtype(x, self.lora_A[name].weight.dtype)  # as PEFT does (a no-op under autocast)
        if handed is not None and handed[0] is x:  # from a sibling, or from the norm (models/lean_norm.py)
            down = handed[1]
        elif index == 0 and all(plain_adapter(m) == name for m in members):
            weights = [m.lora_A[name].weight for m in members]
            slices = nn.functional.linear(lora_x, torch.cat(weights)).split([w.shape[0] for w in weights], dim=-1)
            for sibling, part in zip(members[1:], slices[1:], strict=True):
                sibling._ftprof_slice = (x, part)
            down = slices[0]
        else:  # no slice handed over (the first projection was not called first, or on another input)
            down = self.lora_A[name](lora_x)
        return (result + self.lora_B[name](down) * self.scaling[name]).to(result.dtype)

    return forward
