"""What full checkpointing's recomputation leaves out (``--lean-recompute``): the output projection's base matmul.

Under full checkpointing each layer's forward runs again in backward, only to bring back the tensors backward
reads. The output projection (down_proj in Llama, Mistral and Qwen) writes the layer's output, which only joins the
residual stream: no tensor saved for backward is computed from it. Its base matmul (4,096 x 14,336 weights in
llama-8b: 27% of a layer's matmul FLOPs) is still recomputed: eagerly because PEFT runs the base matmul before the
adapter whose saved input is the last tensor backward needs (torch's checkpoint stops after that), compiled
because a compiled layer recomputes its whole forward (the checkpoint cannot stop inside it).

Here the frozen base matmul of that projection goes through one op, ``ftprof::output_linear``, that saves what a
linear saves for the input gradient (the weight), and during recomputation returns an uninitialised tensor of the
output's shape instead of multiplying: the checkpoint's recomputation context (``context_fn``) says when. The
tensors backward reads are the same ones, so the gradients are the same bits (CPU tests, eager and compiled). As
an opaque op, compiled layers call it at run time: the compiled graph is the same for the forward and the
recomputation, and so are the tensors it saves. A CUDA graph captures whatever ran at capture: under capture the
op always multiplies.

LoRA and QLoRA bases: nn.Linear, QLoRA's routed 4-bit linears (models/dequant.py calls ``output_linear`` where a
module is marked here) and --fp8-base's e4m3 matmul (``ftprof::fp8_output_linear``, kept opaque to compiled code
for that projection alone, where the others' ops trace into it).
"""

from __future__ import annotations

import contextlib
import threading
import types

import torch
from torch import nn

from ftprof import metrics

MARK = "_ftprof_lean_recompute"  # on a base linear whose matmul the recomputation skips
_STATE = threading.local()  # autograd's backward runs on its own thread per device: the flag is per thread


def recomputing() -> bool:
    """Whether the current thread is inside full checkpointing's recomputation of a layer marked lean."""
    return getattr(_STATE, "recomputing", False)


@contextlib.contextmanager
def _recomputation():
    before = recomputing()
    _STATE.recomputing = True
    try:
        yield
    finally:
        _STATE.recomputing = before


def context_fn():
    """torch checkpoint's ``context_fn`` for full checkpointing: (the forward's context, the recomputation's)."""
    return contextlib.nullcontext(), _recomputation()


def selective_contexts(selective_fn):
    """Selective checkpointing's contexts (``selective_fn()``) with the recomputation's flag added to its
    recomputation: eager runs only (the compiler traces selective's own ``context_fn``, and under it no output
    projection is recomputed anyway: it is not saved, and nothing backward reads is computed from it)."""
    forward, recomputation = selective_fn()
    return forward, _both(recomputation, _recomputation())


@contextlib.contextmanager
def _both(first, second):
    with first, second:
        yield


def _multiply(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return nn.functional.linear(x, weight)


def skips(x: torch.Tensor) -> bool:
    """Whether an output projection's op skips its matmul here: in the recomputation, unless a CUDA graph is being
    captured (a graph would replay the skip in the forward too)."""
    return recomputing() and not (x.is_cuda and torch.cuda.is_current_stream_capturing())


def skipped(x: torch.Tensor, out_features: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """What a skipped matmul returns: an uninitialised tensor of its output's shape (nothing reads it)."""
    return x.new_empty((*x.shape[:-1], out_features), dtype=dtype or x.dtype)


@torch.library.custom_op("ftprof::output_linear", mutates_args=())
def output_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T``, except in the recomputation, where nothing reads it."""
    return skipped(x, weight.shape[0]) if skips(x) else _multiply(x, weight)


@output_linear.register_fake
def _(x, weight):
    return skipped(x, weight.shape[0])


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[1])  # the frozen weight, for the input gradient: what a linear keeps


def _backward(ctx, grad_out):
    (weight,) = ctx.saved_tensors
    return grad_out @ weight.to(grad_out.dtype), None


output_linear.register_autograd(_backward, setup_context=_setup_context)


def linear(module: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``module``'s matmul: through ``output_linear`` where it is marked, else a plain linear."""
    if not marked(module):
        return nn.functional.linear(x, weight, bias)
    out = output_linear(x, weight)
    return out if bias is None else out + bias


def _plain_forward(self, x: torch.Tensor) -> torch.Tensor:
    """A frozen nn.Linear's forward, marked: through ``output_linear``."""
    return linear(self, x, self.weight, self.bias)


def attach(model, layers: int | None = None) -> int:
    """Mark the frozen base linear of the output projection of each of the first ``layers`` decoder layers (all by
    default: the checkpointed ones), routing a plain linear's forward through ``output_linear`` (QLoRA's 4-bit
    linears and FP8's read the mark in models/dequant.py and models/fp8_base.py). Under eager selective
    checkpointing an op of its own is not one selective saves (models/checkpointing.py saves aten's and ftprof's
    other matmuls): the projection's output, which backward never reads, is no longer kept (compiled, the
    partitioner never kept it). Returns how many were marked."""
    return sum(mark(block, metrics.is_output_projection) for block in metrics.decoder_layers(model)[:layers])


def mark(block: nn.Module, is_projection) -> int:
    """Mark the frozen base linears of ``block`` whose qualified names ``is_projection`` accepts (the output
    projection; under split checkpointing the attention's too, models/split_layer.py). Returns how many."""
    marked = 0
    for name, module in block.named_modules():
        if not is_projection(name):
            continue
        base = getattr(module, "base_layer", module)
        if any(p.requires_grad for p in base.parameters(recurse=False)):
            continue  # a trained weight: its gradient needs the input, and a full fine-tune is not lean here
        setattr(base, MARK, True)
        if type(base) is nn.Linear and "forward" not in vars(base):  # (FP8's forward reads the mark itself)
            base.forward = types.MethodType(_plain_forward, base)
        marked += 1
    return marked


def marked(module: nn.Module) -> bool:
    return bool(getattr(module, MARK, False))
