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
  writing rows with a stride; the same arithmetic as torch ops off CUDA: bitsandbytes' bits either way), the B
  blocks written beside them, in forward and again in backward: nothing weight-sized is saved, under full
  checkpointing too (``--keep-dequantized`` does not apply to joined groups).
- **LoRA** (16/32-bit frozen base): the base weights are moved once into one joined buffer (their parameters
  become views of it: same memory) and the B blocks are copied in after every optimizer step, and before a
  forward where they changed otherwise, so a forward reads the weight with no copy.

The matmul and its backward are two torch custom ops (``ftprof::joined_linear`` and its backward), opaque to
torch.compile: the compiled blocks fuse around them, and the gradient is the one written here, with the B
matrices' gradient routed through ``block_diag`` (whose backward takes the diagonal blocks).

The outputs are handed to the siblings through an attribute, set by the first projection and cleared by the
sibling that reads it within one forward of the layer (as models/lora_fused_a.py does). A call the joined form
does not cover (adapters disabled or merged, another active adapter, dropout, variants, extra arguments) runs the
projection's previous forward. Not under FSDP (its shards are per parameter; the joined buffer is not one).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from ftprof.models import dequant, dequant_kernels
from ftprof.models.dequant import is_4bit_linear
from ftprof.models.lora_fused_a import adapted_groups, plain_adapter


def fuse(model: nn.Module, blocks: list[nn.Module]) -> list[Group]:
    """Join each eligible group of adapted projections in ``blocks`` (``model``'s decoder layers). Returns the
    groups."""
    groups = []
    for parent, members in adapted_groups(blocks):
        kind = _kind(members)
        if kind is None:
            continue
        # SDPA saves v as it gets it, while q and k are saved after rotary (new tensors): a view of the joined
        # output would keep the whole q/k/v output alive until backward (+80 MB a layer on llama-8b at 4 x 2048;
        # +2.5 GiB measured). v is copied out (16 MB).
        copied = {i for i, m in enumerate(members) if m is getattr(parent, "v_proj", None)}
        group = Group(members, kind, copied)
        for index, member in enumerate(members):
            object.__setattr__(member, "_ftprof_joined", (group, index))  # not a submodule: PEFT's tree stays
            dequant.claim(member.base_layer, "joined group")
            member._ftprof_out = None
            member.forward = types.MethodType(_member_forward(member.forward), member)
        groups.append(group)
    held = [g for g in groups if g.kind == "dense"]
    if held:
        # Before each forward of the model (not compiled: only its blocks are), B matrices written in place since
        # the last copy (a loaded adapter, a test) are copied into their joined weights; reading the versions costs
        # microseconds. Fused optimizers do not bump versions: ``follow`` copies after each optimizer step.
        model.register_forward_pre_hook(lambda *_: _follow(held))  # (a hook's return value would replace args)
    return groups


def follow(optimizer: torch.optim.Optimizer, groups: list[Group]) -> None:
    """Copy the LoRA groups' B matrices into their joined weights after each step of ``optimizer``."""
    held = [g for g in groups if g.kind == "dense"]
    if held:
        optimizer.register_step_post_hook(lambda *_: _copy_adapters(held))


def _follow(groups: list[Group]) -> None:
    for group in groups:
        group.follow_adapters()


def _copy_adapters(groups: list[Group]) -> None:
    for group in groups:
        group.copy_adapters()


def _kind(members) -> str | None:
    """"4bit" (bitsandbytes bases), "dense" (plain linears) or None where the group cannot be joined."""
    names = {plain_adapter(m) for m in members}
    if len(names) != 1 or None in names:
        return None
    bases = [m.base_layer for m in members]
    if any(b.bias is not None or any(p.requires_grad for p in b.parameters()) for b in bases):
        return None
    if all(is_4bit_linear(b) for b in bases):
        states = [b.weight.quant_state for b in bases]
        same = {(s.blocksize, s.nested, s.dtype, s.state2.blocksize if s.nested else 0) for s in states}
        whole = all(s.shape.numel() % s.blocksize == 0 for s in states)
        return "4bit" if len(same) == 1 and whole else None
    if all(type(b) is nn.Linear for b in bases) and len({(b.weight.dtype, b.weight.device) for b in bases}) == 1:
        return "dense"
    return None


class Group:
    """The projections of one group, joined."""

    def __init__(self, members, kind: str, copied: set[int] = frozenset()):
        self.members, self.kind, self.copied = members, kind, copied  # copied: outputs handed out as copies
        self.name = plain_adapter(members[0])
        self.columns = members[0].base_layer.in_features
        self.rows = [m.base_layer.out_features for m in members]
        self.ranks = [m.lora_B[self.name].weight.shape[1] for m in members]
        self.joined: torch.Tensor | None = None
        self._versions_copied: tuple[int, ...] = ()  # the B matrices' versions when last copied into ``joined``
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
        if versions != self._versions_copied:
            self.copy_adapters()

    @torch.no_grad()
    def copy_adapters(self) -> None:
        """The B matrices into the joined buffer's right columns (LoRA), each in its block."""
        self._versions_copied = tuple(m.lora_B[self.name].weight._version for m in self.members)
        row, column = 0, self.columns
        for member, rows, rank in zip(self.members, self.rows, self.ranks, strict=True):
            self.joined[row:row + rows, column:column + rank] = member.lora_B[self.name].weight
            row, column = row + rows, column + rank

    def ready(self) -> bool:
        return all(plain_adapter(m) == self.name for m in self.members)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        name = self.name
        down_weight = torch.cat([m.lora_A[name].weight for m in self.members])
        down = nn.functional.linear(self.members[0]._cast_input_dtype(x, down_weight.dtype), down_weight)
        scales = [m.scaling[name] for m in self.members]
        if len(set(scales)) == 1:
            scaled = down * scales[0]
        else:
            scaled = down * torch.cat([down.new_full((r,), s) for r, s in zip(self.ranks, scales, strict=True)])
        bases = [m.base_layer for m in self.members]
        if self.kind == "dense":
            dtype, joined, quant = self.joined.dtype, self.joined, ([], [], [], [], [], [], 0, 0)
        else:
            dtype, joined = bases[0].compute_dtype or x.dtype, None
            quant = ([b.weight for b in bases], *dequant_kernels.quant_args(bases))
        # The B blocks on the right of the joined weight; their gradient comes back through block_diag's backward.
        right = torch.block_diag(*[m.lora_B[name].weight for m in self.members]).to(dtype)
        out = torch.ops.ftprof.joined_linear(x.to(dtype), scaled.to(dtype), right, joined, *quant, self.rows)
        parts = out.to(x.dtype).split(self.rows, dim=-1)
        return tuple(p.contiguous() if i in self.copied else p for i, p in enumerate(parts))


@torch.library.custom_op("ftprof::joined_linear", mutates_args=())
def joined_linear(x: torch.Tensor, scaled: torch.Tensor, right: torch.Tensor, joined: torch.Tensor | None,
                  packed: list[torch.Tensor], absmax: list[torch.Tensor], code: list[torch.Tensor],
                  absmax2: list[torch.Tensor], code2: list[torch.Tensor], offset: list[torch.Tensor], blocksize: int,
                  blocksize2: int, rows: list[int]) -> torch.Tensor:
    """``[x | scaled] @ W^T`` with W the joined weight: ``joined`` (LoRA, B blocks already in it) or the 4-bit
    weights of ``packed`` dequantized with ``right`` (the B blocks) beside them."""
    weight = _weight(right, joined, packed, absmax, code, absmax2, code2, offset, blocksize, blocksize2, rows)
    return nn.functional.linear(torch.cat([x, scaled], dim=-1), weight)


@joined_linear.register_fake
def _(x, scaled, right, joined, packed, absmax, code, absmax2, code2, offset, blocksize, blocksize2, rows):
    return x.new_empty((*x.shape[:-1], sum(rows)))


@torch.library.custom_op("ftprof::joined_linear_backward", mutates_args=())
def joined_linear_backward(grad: torch.Tensor, scaled: torch.Tensor, right: torch.Tensor,
                           joined: torch.Tensor | None, packed: list[torch.Tensor], absmax: list[torch.Tensor],
                           code: list[torch.Tensor], absmax2: list[torch.Tensor], code2: list[torch.Tensor],
                           offset: list[torch.Tensor], blocksize: int, blocksize2: int,
                           rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the gradient of ``[x | scaled]``, the gradient of ``right``): the first one GEMM, the second ``grad^T @
    scaled`` over the whole right block (its off-diagonal blocks are dropped by block_diag's backward; they cost a
    GEMM of rank-sized output, which reads ``grad`` once as the diagonal blocks alone would)."""
    weight = _weight(right, joined, packed, absmax, code, absmax2, code2, offset, blocksize, blocksize2, rows)
    flat = grad.reshape(-1, grad.shape[-1])
    return grad @ weight, flat.t() @ scaled.reshape(-1, scaled.shape[-1])


@joined_linear_backward.register_fake
def _(grad, scaled, right, joined, packed, absmax, code, absmax2, code2, offset, blocksize, blocksize2, rows):
    columns = (joined.shape[1] - right.shape[1]) if joined is not None else \
        dequant_kernels.packed_columns(packed[0], rows[0])
    return grad.new_empty((*grad.shape[:-1], columns + right.shape[1])), right.new_empty(right.shape)


def _weight(right, joined, packed, absmax, code, absmax2, code2, offset, blocksize, blocksize2, rows):
    if joined is not None:
        return joined
    return dequant_kernels.dequantize_rows(packed, absmax, code, absmax2, code2, offset, blocksize, blocksize2, rows,
                                           right)


def _setup_context(ctx, inputs, output):
    x, scaled, right, joined, packed, absmax, code, absmax2, code2, offset, blocksize, blocksize2, rows = inputs
    lists = (packed, absmax, code, absmax2, code2, offset)
    ctx.sizes, ctx.columns = [len(t) for t in lists], x.shape[-1]
    ctx.ints, ctx.dense = (blocksize, blocksize2, rows), joined is not None
    ctx.save_for_backward(scaled, right, *((joined,) if joined is not None else ()), *(t for ts in lists for t in ts))


def _backward(ctx, grad):
    scaled, right, *rest = ctx.saved_tensors
    joined = rest.pop(0) if ctx.dense else None
    lists, start = [], 0
    for size in ctx.sizes:
        lists.append(rest[start:start + size])
        start += size
    joint, grad_right = torch.ops.ftprof.joined_linear_backward(grad, scaled, right, joined, *lists, *ctx.ints)
    none_lists = tuple([None] * size for size in ctx.sizes)  # the structure of the inputs: lists stay lists
    return (joint[..., :ctx.columns], joint[..., ctx.columns:], grad_right, None, *none_lists, None, None, None)


joined_linear.register_autograd(_backward, setup_context=_setup_context)


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
