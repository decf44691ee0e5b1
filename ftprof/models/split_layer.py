"""``--lean-recompute`` with ``--offload-checkpoints``: each full-checkpointed decoder layer checkpointed as its two
halves, so that the recomputation leaves out both output projections' base matmuls, not only the MLP's.

A layer is ``h = x + attention(norm1(x))`` then ``y = h + mlp(norm2(h))``. Checkpointed whole, the recomputation
runs from x: the attention's output projection (o_proj) must run again, because h, which the MLP half's backward
reads (norm2's input), is computed from it. Checkpointed as two halves, h is the second half's saved input: the
first half's recomputation needs o_proj's output for nothing, and --lean-recompute's op skips that matmul as it
skips down_proj's (models/recompute.py). llama-8b: o_proj is 16.8M of a layer's 218M matmul weights, 7.7% of what
full checkpointing recomputed.

Measured on an H100 (llama-8b QLoRA 4 x 2048, full checkpointing, both host offloads, Liger, compiled; BENCHMARKS.md
round 28): 11,536 -> 11,887 tokens/s (+3.0%) and 7.66 -> 7.30 GiB peak allocated: backward recomputes one half at a
time, so both halves' recomputed activations are never live together.

What it costs: one more hidden-size tensor kept per layer (h: tokens x hidden x 2 bytes, 64 MiB at 4 x 2048 in
llama-8b). Under --offload-checkpoints it waits in pinned host memory like the layer input (each half's input is
offloaded by its own wrapper, models/offload.py), so the device holds what it held; the host link carries twice the
bytes. Without offloading it would cost device memory, so it is applied only with it.

The halves are the pre-norm residual layer of Llama, Mistral and Qwen (``metrics.SPLIT_CLASSES``; a CPU test checks each
against the layer's own forward); other layers stay checkpointed whole. The wrapper is the outermost checkpoint
function: offloading and compiling (engine/compiled_checkpoint.py, which compiles each half as the layer's function)
wrap what it calls.
"""

from __future__ import annotations

import functools

import torch

from ftprof import metrics


def attention_half(layer, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
    """The layer's first half: the residual stream after attention (kwargs: the layer's own, for self_attn)."""
    out, _ = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)
    return hidden_states + out


def mlp_half(layer, hidden_states: torch.Tensor) -> torch.Tensor:
    """The layer's second half: the layer's output."""
    return hidden_states + layer.mlp(layer.post_attention_layernorm(hidden_states))


class SplitCheckpoint:
    """A layer's ``_gradient_checkpointing_func``: the checkpoint function it had (``inner``) called once per half,
    with each half's input as the checkpointed input."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, function, *args, **kwargs):
        if not isinstance(function, functools.partial) or len(args) != 1 or kwargs or len(function.args) != 1:
            return self.inner(function, *args, **kwargs)  # not transformers' call: the layer whole
        layer = function.args[0]
        mid = self.inner(functools.partial(attention_half, layer, **function.keywords), args[0])
        return self.inner(functools.partial(mlp_half, layer), mid)


def splittable(block: torch.nn.Module) -> bool:
    return type(block).__name__ in metrics.SPLIT_CLASSES


def attach(model, layers: int | None = None) -> list[torch.nn.Module]:
    """Checkpoint each of the first ``layers`` (or all) full-checkpointed decoder layers that can be split as its
    two halves: call after offloading is attached. Returns the split layers."""
    split = []
    for block in metrics.decoder_layers(model)[:layers]:
        inner = getattr(block, "_gradient_checkpointing_func", None)
        if not getattr(block, "gradient_checkpointing", False) or inner is None or not splittable(block):
            continue
        if not isinstance(inner, SplitCheckpoint):
            block._gradient_checkpointing_func = SplitCheckpoint(inner)
        split.append(block)
    return split


def split_layers(model) -> list[torch.nn.Module]:
    """The decoder layers checkpointed as two halves."""
    return [block for block in metrics.decoder_layers(model) if getattr(block, "gradient_checkpointing", False)
            and isinstance(getattr(block, "_gradient_checkpointing_func", None), SplitCheckpoint)]


def unwrap(function):
    """A layer's checkpoint function without this wrapper."""
    return function.inner if isinstance(function, SplitCheckpoint) else function
