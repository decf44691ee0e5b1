"""One GEMM for each group of adapted projections that read the same input, with the adapters' B matmuls inside
it (``--lora-fused-projections``; LoRA and QLoRA).

In a decoder layer q_proj, k_proj and v_proj read the same normed hidden states, and so do gate_proj and up_proj.
PEFT runs, per projection, the base matmul, the rank-r B matmul writing a full-size output (tokens x out_features)
and an add reading both; in backward each B matmul reads the full-size output gradient twice more (for B's input
gradient and for B's gradient). Here a group is one matmul over its inputs and weights side by side:

    [x | s * x A^T] @ [[W_q, B_q, 0, 0], [W_k, 0, B_k, 0], [W_v, 0, 0, B_v]]^T

with A the group's concatenated down-projections (as ``--lora-fused-a``) and s the LoRA scale. The adapter's
output is accumulated inside the base GEMM (one rounding, fp32 accumulation), so no full-size B output or add
exists; backward's ``grad @ weight`` yields the input gradient and the adapters' rank-side gradient in one GEMM;
only B's own gradient reads the output gradient again. k_proj and v_proj (1,024 outputs on an 8B Llama) stop
running as small GEMMs that fill part of the GPU. The zero blocks add r x (members - 1) columns of work per row:
under 1% of the GEMM.

Where the joined weight comes from:

- **QLoRA**: each 4-bit weight is dequantized straight into its rows of the joined matrix (ftprof's Triton kernel
  writes rows with a stride; other dequantizers dequantize and concatenate), the B blocks written beside them, in
  forward and again in backward (nothing weight-sized saved), or kept for backward where ``--keep-dequantized``
  keeps the layer's weights (models/dequant.py's routing, followed per linear).
- **LoRA** (16/32-bit frozen base): the base weights are moved once into one joined buffer (their parameters
  become views of it: same memory) and the B blocks are copied in before a forward when they changed (after
  every optimizer step), so a forward reads the weight with no copy.

The outputs are handed to the siblings through an attribute, set by the first projection and cleared by the
sibling that reads it within one forward of the layer (as models/lora_fused_a.py does). A call the joined form
does not cover (adapters disabled or merged, another active adapter, dropout, variants, extra arguments) runs the
projection's previous forward. Not under FSDP (its shards are per parameter; the joined buffer is not one).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from ftprof.models import dequant_kernels
from ftprof.models.dequant import dequantize, is_4bit_linear
from ftprof.models.lora_addmm import is_lora_linear
from ftprof.models.lora_fused_a import GROUPS, _plain


def fuse(model: nn.Module, blocks: list[nn.Module]) -> list[Group]:
    """Join each eligible group of adapted projections in ``blocks`` (``model``'s decoder layers). Returns the
    groups."""
    groups = []
    for block in blocks:
        for parent_name, names in GROUPS:
            parent = getattr(block, parent_name, None)
            members = tuple(m for m in (getattr(parent, n, None) for n in names) if m is not None and is_lora_linear(m))
            kind = _kind(members)
            if kind is None:
                continue
            group = Group(members, kind)
            for index, member in enumerate(members):
                object.__setattr__(member, "_ftprof_joined", (group, index))  # not a submodule: PEFT's tree stays
                member._ftprof_out = None
                member.forward = types.MethodType(_member_forward(member.forward), member)
            groups.append(group)
    held = [g for g in groups if g.kind == "dense"]
    if held:
        # Before each forward of the model (not compiled: only its blocks are), B matrices that changed since the
        # last copy (an optimizer step, a loaded adapter: any in-place write bumps a tensor's version) are copied
        # into their joined weights. Reading the versions costs microseconds.
        model.register_forward_pre_hook(lambda *_: _follow(held))  # (a hook's return value would replace args)
    return groups


def _follow(groups: list[Group]) -> None:
    for group in groups:
        group.follow_adapters()


def _kind(members) -> str | None:
    """"4bit" (bitsandbytes bases), "dense" (plain linears) or None where the group cannot be joined."""
    if len(members) < 2 or len({m.base_layer.in_features for m in members}) != 1:
        return None
    names = {_plain(m) for m in members}
    if len(names) != 1 or None in names:
        return None
    bases = [m.base_layer for m in members]
    if any(b.bias is not None or any(p.requires_grad for p in b.parameters()) for b in bases):
        return None
    if all(is_4bit_linear(b) for b in bases):
        states = [b.weight.quant_state for b in bases]
        same = {(s.blocksize, s.nested, s.dtype, s.state2.blocksize if s.nested else 0) for s in states}
        return "4bit" if len(same) == 1 else None
    if all(type(b) is nn.Linear for b in bases) and len({(b.weight.dtype, b.weight.device) for b in bases}) == 1:
        return "dense"
    return None


class Group:
    """The projections of one group, joined."""

    def __init__(self, members, kind: str):
        self.members, self.kind = members, kind
        self.name = _plain(members[0])
        self.columns = members[0].base_layer.in_features
        self.rows = [m.base_layer.out_features for m in members]
        self.ranks = [m.lora_B[self.name].weight.shape[1] for m in members]
        self.joined: torch.Tensor | None = None
        self._copied: tuple[int, ...] = ()  # the B matrices' versions when last copied into ``joined``
        if kind == "dense":
            self._join_bases()

    def _join_bases(self) -> None:
        first = self.members[0].base_layer.weight
        joined = torch.zeros(sum(self.rows), self.columns + sum(self.ranks), dtype=first.dtype, device=first.device)
        start = 0
        for member, rows in zip(self.members, self.rows, strict=True):
            base = member.base_layer
            joined[start:start + rows, :self.columns] = base.weight.detach()
            base.weight = nn.Parameter(joined[start:start + rows, :self.columns], requires_grad=False)
            start += rows
        self.joined = joined
        self.copy_adapters()

    def follow_adapters(self) -> None:
        """Copy the B matrices into the joined weight (LoRA) if any changed since the last copy."""
        versions = tuple(m.lora_B[self.name].weight._version for m in self.members)
        if versions != self._copied:
            self.copy_adapters()

    @torch.no_grad()
    def copy_adapters(self) -> None:
        """The B matrices into the joined buffer's right columns (LoRA), each in its block."""
        self._copied = tuple(m.lora_B[self.name].weight._version for m in self.members)
        row, column = 0, self.columns
        for member, rows, rank in zip(self.members, self.rows, self.ranks, strict=True):
            self.joined[row:row + rows, column:column + rank] = member.lora_B[self.name].weight
            row, column = row + rows, column + rank

    def ready(self) -> bool:
        return all(_plain(m) == self.name for m in self.members)

    def keeps(self) -> bool:
        """Whether backward keeps the forward's weight (QLoRA routed to keep: --keep-dequantized)."""
        return self.kind == "4bit" and getattr(self.members[0].base_layer, "_ftprof_route", (False,))[0]

    def weight(self, adapters, dtype: torch.dtype, for_backward: bool) -> torch.Tensor:
        """The joined matrix (sum(rows), columns + sum(ranks)): base weights stacked, B blocks on the right."""
        if self.kind == "dense":
            return self.joined
        bases = [m.base_layer for m in self.members]
        dtype = bases[0].compute_dtype or dtype
        right = torch.block_diag(*[b.to(dtype) for b in adapters])
        dequantizer = getattr(bases[0], "_ftprof_route", (False, "bitsandbytes"))[1]
        whole = all(b.weight.quant_state.shape.numel() % b.weight.quant_state.blocksize == 0 for b in bases)
        if dequantizer == "triton" and whole:
            return dequant_kernels.triton_dequantize_rows(bases, self.columns, right, for_backward)
        left = torch.cat([dequantize(b, dequantizer, for_backward).to(dtype) for b in bases])
        return torch.cat([left, right], dim=1)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        name = self.name
        down_weight = torch.cat([m.lora_A[name].weight for m in self.members])
        down = nn.functional.linear(self.members[0]._cast_input_dtype(x, down_weight.dtype), down_weight)
        scales = [m.scaling[name] for m in self.members]
        if len(set(scales)) == 1:
            scaled = down * scales[0]
        else:
            scaled = down * torch.cat([down.new_full((r,), s) for r, s in zip(self.ranks, scales, strict=True)])
        adapters = [m.lora_B[name].weight for m in self.members]
        return _JoinedLinear.apply(x, scaled, self, *adapters).split(self.rows, dim=-1)


class _JoinedLinear(torch.autograd.Function):
    """``[x | scaled] @ joined^T`` with the B matrices' gradients (the joined weight itself does not train)."""

    @staticmethod
    def forward(ctx, x, scaled, group, *adapters):
        weight = group.weight(adapters, x.dtype, for_backward=False)
        joint_input = torch.cat([x.to(weight.dtype), scaled.to(weight.dtype)], dim=-1)
        out = nn.functional.linear(joint_input, weight)
        ctx.group, ctx.dtypes, ctx.kept = group, (x.dtype, out.dtype), group.keeps()
        ctx.save_for_backward(scaled, *adapters, *((weight,) if ctx.kept else ()))
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        group, (x_dtype, dtype) = ctx.group, ctx.dtypes
        scaled, *rest = ctx.saved_tensors
        adapters = rest[:len(group.members)]
        weight = rest[-1] if ctx.kept else group.weight(adapters, x_dtype, for_backward=True)
        grad = grad.to(dtype)
        joint = grad @ weight.to(dtype)  # the input's and the adapters' rank-side gradients, one GEMM
        flat_grad, flat_scaled = grad.reshape(-1, grad.shape[-1]), scaled.reshape(-1, scaled.shape[-1]).to(dtype)
        grads, row, column = [], 0, 0
        for i, (b, rows, rank) in enumerate(zip(adapters, group.rows, group.ranks, strict=True)):
            wanted = ctx.needs_input_grad[3 + i]
            grads.append((flat_grad[:, row:row + rows].t() @ flat_scaled[:, column:column + rank]).to(b.dtype)
                         if wanted else None)
            row, column = row + rows, column + rank
        return (joint[..., :group.columns].to(x_dtype), joint[..., group.columns:].to(scaled.dtype), None, *grads)


def _member_forward(previous):
    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        group, index = self._ftprof_joined
        handed, self._ftprof_out = self._ftprof_out, None
        if args or kwargs:
            return previous(x, *args, **kwargs)
        if index > 0 and handed is not None and handed[0] is x:
            return handed[1]
        if index == 0 and group.ready():
            outputs = group(x)
            for sibling, output in zip(group.members[1:], outputs[1:], strict=True):
                sibling._ftprof_out = (x, output)
            return outputs[0]
        return previous(x, *args, **kwargs)  # not handed an output: the projection computes its own

    return forward
