"""A full-checkpointed decoder layer compiled whole, inside its checkpoint (``--compile`` under full checkpointing).

transformers (5.x) checkpoints a layer by wrapping its ``forward``: the layer calls
``layer._gradient_checkpointing_func(partial(forward, layer, **kwargs), hidden_states)``. Compiling the layer
(``Module.compile``) would put that checkpoint inside the compiled graph, where the partitioner, not torch's
checkpoint, decides what is kept for backward (llama-8b QLoRA on an H200: 29 GiB against eager checkpointing's 9.4).
So the checkpoint function is wrapped instead: it receives the layer's own forward and runs a compiled copy of it.
torch's checkpoint stays outside compiled code, keeping only the layer's input, and its recomputation replays the
compiled forward.

Before this, the layer's children (attention, MLP, the two norms) were compiled one by one: four compiled regions a
layer pass instead of one, each with its guard check and its autograd function on the host, and the residual adds
and norms outside any fusion (llama-8b FP8 QLoRA under full checkpointing on an H200 was host-bound: the GPU idle
47% of a profiled step, 2026-12-04).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ftprof import metrics
from ftprof.models import checkpointing, offload, split_layer


class CompiledForward:
    """A checkpoint function (``inner``: torch's non-reentrant checkpoint with its arguments) that runs the layer's
    forward it is given as one compiled function, shared by every layer of the same class."""

    def __init__(self, inner: Callable, compiled: dict[Callable, Callable], compile_kwargs: dict):
        self.inner, self.compiled, self.compile_kwargs = inner, compiled, compile_kwargs

    def __call__(self, function, *args, **kwargs):
        if not isinstance(function, functools.partial):  # not transformers' call: leave it as it is
            return self.inner(function, *args, **kwargs)
        forward = function.func
        if forward not in self.compiled:
            self.compiled[forward] = torch.compile(forward, **self.compile_kwargs)
        compiled = functools.partial(self.compiled[forward], *function.args, **function.keywords)
        return self.inner(compiled, *args, **kwargs)


def checkpointed(block: torch.nn.Module) -> bool:
    """Whether full checkpointing applies to ``block`` (transformers' flag, read at each call; a selective layer's
    checkpoint stays inside its compiled block, engine/compile.py)."""
    function = _checkpoint(block)
    return bool(getattr(block, "gradient_checkpointing", False)) and function is not None and \
        not checkpointing.is_selective(function)


def attach(model, compile_kwargs: dict) -> list[torch.nn.Module]:
    """Compile each full-checkpointed layer of ``model`` inside its checkpoint (under the split and offload
    wrappers, which keep their places outside: split, each half is compiled as the layer's function). Returns the
    layers."""
    compiled: dict[Callable, Callable] = {}  # one compiled forward per layer class
    layers = [block for block in metrics.decoder_layers(model) if checkpointed(block)]
    for block in layers:
        _set_checkpoint(block, CompiledForward(_checkpoint(block), compiled, compile_kwargs))
    return layers


def detach(model) -> None:
    """Put every layer ``attach`` compiled back to its eager forward."""
    for block in metrics.decoder_layers(model):
        if isinstance(_checkpoint(block), CompiledForward):
            _set_checkpoint(block, _checkpoint(block).inner)


_WRAPPERS = (split_layer.SplitCheckpoint, offload.OffloadedCheckpoint)  # outermost first, each holding ``inner``


def _checkpoint(block: torch.nn.Module):
    """The layer's torch checkpoint function: its own, or the one inside the split and offload wrappers."""
    return _holder(block)[1]


def _holder(block: torch.nn.Module) -> tuple:
    """(the innermost wrapper, or None where there is none; the checkpoint function it holds)."""
    holder, function = None, getattr(block, "_gradient_checkpointing_func", None)
    while isinstance(function, _WRAPPERS):
        holder, function = function, function.inner
    return holder, function


def _set_checkpoint(block: torch.nn.Module, function: Callable) -> None:
    holder = _holder(block)[0]
    if holder is not None:
        holder.inner = function
    else:
        block._gradient_checkpointing_func = function
