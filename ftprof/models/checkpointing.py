"""Activation checkpointing policies applied to a model (``--checkpointing none|full|selective``), and what each
policy saves, measured on a probe forward. The run (ftprof/engine/checkpointing.py) and the planner's probe
(ftprof/plan/probe.py) both apply and measure policies through this module.

- ``full``: each decoder layer's forward runs again in backward (torch's non-reentrant checkpoint per layer).
- ``selective``: per layer too, but the outputs of matmuls and attention are saved during the forward (torch's
  selective activation checkpointing, op by op, as torchtitan does); only the cheap ops between them (norms,
  activations, rotary, residual adds) are recomputed.
- ``layers`` (``--checkpoint-layers N``, with full or selective): only the first N decoder layers are checkpointed;
  the others keep their activations. Recomputation, and its cost, scale with N.
- ``selective_rest`` (``--selective-rest``, with full on N layers): the other layers are selective-checkpointed
  instead of keeping their activations. Selective costs little speed per GiB it saves and full much (llama-8b QLoRA
  compiled on an H200: selective 93% of none's speed in 75% of its memory, full 68% in 23%), so in a budget
  between full's and selective's, full on the fewest layers with selective on the rest beats full with none.
  Full goes on the first layers: backward reaches the last ones first, and by the time it recomputes a full layer
  the selective layers' saved tensors are freed.
- ``offload`` (``--offload-checkpoints``, with full): the full-checkpointed layers' inputs wait for backward in
  pinned host memory (ftprof/models/offload.py); with ``lean`` too, each of those layers is checkpointed as its two
  halves, whose recomputation leaves out the attention's output projection as well (ftprof/models/split_layer.py).
"""

from __future__ import annotations

import functools
import inspect

import torch

from ftprof import metrics
from ftprof.models import offload as offloading
from ftprof.models import recompute, split_layer
from ftprof.profiling.memory import SavedActivations

SPEED_ORDER = ("none", "selective", "full")  # fastest first: less recomputation


def _saved_ops() -> set:
    aten = torch.ops.aten
    ops = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
    # QLoRA's base matmul is bitsandbytes' own op (dequantize + GEMM in one), not an aten matmul: measured on an
    # H200, a policy of aten ops alone saved almost nothing for QLoRA (11.4 GiB peak against 9.4 with full).
    bnb = getattr(torch.ops, "bitsandbytes", None)
    if bnb is not None and hasattr(bnb, "gemm_4bit"):
        ops.add(bnb.gemm_4bit.default)
    for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"):
        if hasattr(aten, name):
            ops.add(getattr(aten, name).default)
    return ops | set(_own_matmuls())


@functools.cache
def _own_matmuls() -> dict:
    """ftprof's own base-matmul ops -> their output's (rows-of-this-arg, columns) reader: --fp8-base's e4m3 GEMM
    and --lora-fused-projections' joined GEMM. Left out, selective recomputed them in backward, a whole base
    forward again (and their outputs are what the backward's LoRA and attention read)."""
    from ftprof.models import fp8_kernels, fused_projections  # noqa: F401 - registers the ops

    ops = torch.ops.ftprof
    return {ops.fp8_linear.default: lambda args: (args[0], args[3].shape[1]),  # (x, ..., scale: 1 x out, ...)
            ops.fp8_linear_quantized.default: lambda args: (args[0], args[5].shape[1]),
            ops.joined_linear.default: lambda args: (args[0], sum(args[-1]))}  # (x, ..., rows)


class SelectivePolicy:
    """Save matmul and attention outputs, recompute the rest; count the bytes saved between ``start_counting`` and
    ``stop_counting``.

    ``context_fn`` is a ``functools.partial`` of torch's ``create_selective_checkpoint_contexts`` over a plain
    function whose state is a dict, the form torch.compile can trace (a callable object is refused: measured on an
    H200 with --compile, "checkpoint not implemented for ... context_fn"). Under --compile the policy runs while
    the graph is traced, so nothing is counted then."""

    def __init__(self, lora_rank: int = 0):
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        saved_ops = _saved_ops()
        state = self.state = {"counting": False, "bytes": 0}

        def policy(ctx, op, *args, **kwargs):
            if op in saved_ops and not _low_rank(op, args, lora_rank):
                if state["counting"] and not ctx.is_recompute:
                    state["bytes"] += _output_bytes(op, args)
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE

        self.context_fn = functools.partial(create_selective_checkpoint_contexts, policy)

    def start_counting(self) -> None:
        self.state.update(counting=True, bytes=0)

    def stop_counting(self) -> int:
        """Bytes saved since ``start_counting``."""
        self.state["counting"] = False
        return self.state["bytes"]


def _low_rank(op, args, rank: int) -> bool:
    """A matmul whose inner dimension is the LoRA rank (LoRA's B: rank r in, a full projection out) costs little to
    redo and its output is as large as the projection's: recompute it rather than save a second such tensor."""
    if "attention" in op.__name__ or "gemm_4bit" in op.__name__ or op in _own_matmuls():
        return False
    return rank > 0 and args[-2].shape[-1] == rank


def _output_bytes(op, args) -> int:
    """Size of a saved op's output from its inputs: (m, k) @ (k, n) -> m n; attention -> the query's shape with
    the value's head size (plus a float logsumexp per query and head)."""
    if "gemm_4bit" in op.__name__:  # (A, packed B, [N, K], ...): A's rows times N outputs
        a, n = args[0], args[2][0]
        return a.numel() // a.shape[-1] * n * a.element_size()
    own = _own_matmuls().get(op)
    if own is not None:  # bf16 out (the FP8 ops), or the input's dtype (the joined GEMM)
        a, n = own(args)
        return a.numel() // a.shape[-1] * n * (2 if "fp8" in op.__name__ else a.element_size())
    a, b = args[-2], args[-1]
    if "attention" in op.__name__:
        q, v = args[0], args[2]
        out = q.numel() // q.shape[-1] * v.shape[-1]
        return out * q.element_size() + (q.numel() // q.shape[-1]) * 4
    rows = a.numel() // a.shape[-1]
    return rows * b.shape[-1] * a.element_size()


def apply_policy(model, policy: str, selective: SelectivePolicy | None = None, layers: int | None = None,
                 offload: bool = False, selective_rest: bool = False, lean: bool = False,
                 compiled: bool = False) -> None:
    """Set ``model``'s checkpointing to ``policy`` (none, full or selective), on HF models and PEFT wrappers; with
    ``layers``, on the first ``layers`` decoder layers only, the others keeping their activations or, with
    ``selective_rest`` (full only), selective-checkpointed by ``selective``; with ``offload`` (full only), the
    full-checkpointed layers' inputs are kept in host memory; with ``lean``, the checkpointed layers' output
    projection is neither recomputed nor, under selective, saved (models/recompute.py; ``compiled``: the blocks
    are to be compiled, whose selective checkpoints the compiler traces with selective's own contexts)."""
    if offload and policy != "full":
        raise ValueError(f"offloading checkpointed layer inputs needs full checkpointing, not {policy}")
    if lean and policy == "none":
        raise ValueError("a lean recomputation needs checkpointing")
    if selective_rest and (policy != "full" or layers is None):
        raise ValueError(f"a selective rest needs full checkpointing on part of the layers, not {policy} on {layers}")
    enabled = getattr(model, "is_activation_checkpointing", None) or getattr(model, "is_gradient_checkpointing",
                                                                            False)
    if policy == "none":
        if enabled:
            disable = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
            disable()
        return
    kwargs = _checkpoint_kwargs(policy, selective, lean, compiled)
    # transformers 5.24 renamed the method; PEFT wrappers forward either name to the base model.
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if layers is not None:
        rest = functools.partial(torch.utils.checkpoint.checkpoint, **_checkpoint_kwargs(
            "selective", selective, lean, compiled)) if selective_rest else None
        for block in metrics.decoder_layers(model)[layers:]:
            if rest is None:
                block.gradient_checkpointing = False  # the flag transformers' layer wrapper reads at each call
            else:
                block._gradient_checkpointing_func = rest  # the function it calls the layer's forward through
    if lean:  # the checkpointed layers: the first ``layers``, or all of them (a selective rest included)
        recompute.attach(model, None if selective_rest else layers)
    if offload:
        offloading.attach(model, layers)  # after the layers' checkpoint function is set (enabling sets it anew)
    if offload and lean:  # each layer's two halves checkpointed, the second's input offloaded as the first's
        for block in split_layer.attach(model, layers):
            recompute.mark(block, metrics.is_attention_output)


def _checkpoint_kwargs(policy: str, selective: SelectivePolicy | None, lean: bool = False,
                       compiled: bool = False) -> dict:
    """torch checkpoint's arguments for a full or selective layer. Non-reentrant checkpointing needs no input-grad
    trick for frozen embeddings (LoRA methods). ``lean``: the recomputation's context says when the output
    projection may skip its matmul (models/recompute.py): full's own, or added to selective's where the blocks run
    eager (``compiled``: the compiler traces selective's contexts as they are)."""
    kwargs: dict = {"use_reentrant": False}
    if policy == "full" and lean:
        kwargs["context_fn"] = recompute.context_fn
    if policy == "selective":
        kwargs["context_fn"] = (selective or SelectivePolicy()).context_fn
        if lean and not compiled:
            kwargs["context_fn"] = functools.partial(recompute.selective_contexts, kwargs["context_fn"])
        if "respect_saved_tensors_hooks" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters:
            # torch >= 2.14 asks: SAC's cache stays out of saved-tensor hooks (SelectivePolicy counts it instead)
            kwargs["respect_saved_tensors_hooks"] = False
    return kwargs


def is_selective(function) -> bool:
    """Whether a layer's checkpoint function (``_gradient_checkpointing_func``) is selective checkpointing's:
    torch's checkpoint with a policy's contexts (``_checkpoint_kwargs``; full checkpointing's context under
    --lean-recompute is another)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    context = function.keywords.get("context_fn") if isinstance(function, functools.partial) else None
    return isinstance(context, functools.partial) and context.func in (create_selective_checkpoint_contexts,
                                                                       recompute.selective_contexts)


def selective_layers(model) -> int:
    """How many decoder layers run under selective checkpointing (all of them under --checkpointing selective, the
    rest under --selective-rest)."""
    return sum(1 for block in metrics.decoder_layers(model) if getattr(block, "gradient_checkpointing", False)
               and is_selective(getattr(block, "_gradient_checkpointing_func", None)))


def measure_activations(model, autocast, vocab: int, device: torch.device, tokens: int,
                        lora_rank: int = 0, policies: tuple[str, ...] = SPEED_ORDER) -> dict[str, float]:
    """Bytes per token each policy keeps for backward, measured on one probe sequence (no backward is run)."""
    ids = torch.randint(0, vocab, (1, tokens), device=device)
    per_token: dict[str, float] = {}
    for policy in policies:
        selective = SelectivePolicy(lora_rank)
        apply_policy(model, policy, selective)
        selective.start_counting()
        with SavedActivations(model) as meter, autocast():
            loss = model(input_ids=ids, labels=ids).loss
        per_token[policy] = (meter.bytes + selective.stop_counting()) / tokens
        del loss  # frees the graph and the selective cache
    return per_token
