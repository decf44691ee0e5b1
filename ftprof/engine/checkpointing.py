"""Activation checkpointing policies (``--checkpointing none|full|selective|auto``).

- ``full``: each decoder layer's forward runs again in backward (torch's non-reentrant checkpoint per layer).
- ``selective``: per layer too, but the outputs of matmuls and attention are saved during the forward (torch's
  selective activation checkpointing, op by op, as torchtitan does); only the cheap ops between them (norms,
  activations, rotary, residual adds) are recomputed.
- ``--checkpoint-layers N`` (with full or selective): only the first N decoder layers are checkpointed; the others
  keep their activations. Recomputation, and its cost, scale with N.
- ``auto``: the first of none > selective > full on the N fewest layers > full on every layer whose estimated
  peak fits the memory this process can have, with a margin. The estimate is the memory model the run records:
  exact static parts (weights, gradients, optimizer state) plus activations per token measured for each policy on
  a short probe sequence (what autograd saves, and what selective checkpointing caches), plus the loss backward's
  logits gradients. Checkpointing N of L layers is estimated between the two: full's activations plus (L - N) / L
  of what checkpointing saves. Selective comes first because it recomputes no matmul; when it does not fit,
  checkpointing only as many layers as needed recomputes less than checkpointing all of them.
"""

from __future__ import annotations

import functools
import inspect

import torch

from ftprof import metrics
from ftprof.models import dequant, kernels
from ftprof.preflight import RunPlan
from ftprof.profiling.memory import SavedActivations
from ftprof.results.parts import AutoChoice  # what auto chose, as result.json records it
from ftprof.runtime import torch_dtype

SPEED_ORDER = ("none", "selective", "full")  # fastest first: less recomputation
PROBE_TOKENS = 256  # activations scale linearly with tokens under SDPA/flash attention: a short probe suffices
MARGIN_FRACTION, MARGIN_MIN = 0.08, 1 << 30  # headroom for fragmentation and kernels' workspaces


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
    return ops


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
    if "attention" in op.__name__ or "gemm_4bit" in op.__name__:
        return False
    return rank > 0 and args[-2].shape[-1] == rank


def _output_bytes(op, args) -> int:
    """Size of a saved op's output from its inputs: (m, k) @ (k, n) -> m n; attention -> the query's shape with
    the value's head size (plus a float logsumexp per query and head)."""
    if "gemm_4bit" in op.__name__:  # (A, packed B, [N, K], ...): A's rows times N outputs
        a, n = args[0], args[2][0]
        return a.numel() // a.shape[-1] * n * a.element_size()
    a, b = args[-2], args[-1]
    if "attention" in op.__name__:
        q, v = args[0], args[2]
        out = q.numel() // q.shape[-1] * v.shape[-1]
        return out * q.element_size() + (q.numel() // q.shape[-1]) * 4
    rows = a.numel() // a.shape[-1]
    return rows * b.shape[-1] * a.element_size()


def apply_policy(model, policy: str, selective: SelectivePolicy | None = None, layers: int | None = None) -> None:
    """Set ``model``'s checkpointing to ``policy`` (none, full or selective), on HF models and PEFT wrappers; with
    ``layers``, on the first ``layers`` decoder layers only."""
    enabled = getattr(model, "is_activation_checkpointing", None) or getattr(model, "is_gradient_checkpointing",
                                                                            False)
    if policy == "none":
        if enabled:
            disable = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
            disable()
        return
    # Non-reentrant checkpointing needs no input-grad trick for frozen embeddings (LoRA methods).
    kwargs: dict = {"use_reentrant": False}
    if policy == "selective":
        kwargs["context_fn"] = (selective or SelectivePolicy()).context_fn
        if "respect_saved_tensors_hooks" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters:
            # torch >= 2.14 asks: SAC's cache stays out of saved-tensor hooks (SelectivePolicy counts it instead)
            kwargs["respect_saved_tensors_hooks"] = False
    # transformers 5.24 renamed the method; PEFT wrappers forward either name to the base model.
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if layers is not None:
        for block in metrics.decoder_layers(model)[layers:]:
            block.gradient_checkpointing = False  # the flag transformers' layer wrapper reads at each call


def choose(estimated_peak: dict[str, int], available: int, layer_count: int = 0,
           recompute_extra: int = 0) -> tuple[str, int | None, int, str]:
    """(policy, checkpointed layers or None for all, margin, reason): the first of none, selective, full on the
    fewest of ``layer_count`` layers, full on all, whose estimate fits ``available`` less the margin; full when none
    fits (the least memory there is: the run may still fail, and the reason says so). ``recompute_extra``: what
    any full checkpointing adds once, however many layers it covers (already in the full estimate)."""
    margin = max(int(MARGIN_FRACTION * available), MARGIN_MIN)
    budget = available - margin
    gib = metrics.GIB
    fits = (f"fits {budget / gib:.1f} GiB ({available / gib:.1f} GiB available less a {margin / gib:.1f} GiB "
            "margin)")
    for policy in ("none", "selective"):
        if estimated_peak[policy] <= budget:
            return policy, None, margin, (f"{policy}: estimated peak {estimated_peak[policy] / gib:.1f} GiB {fits}"
                                          + ("" if policy == "none" else "; no checkpointing did not"))
    none, full = estimated_peak["none"], estimated_peak["full"] - recompute_extra
    layers = fewest_layers(none, full, layer_count, budget - recompute_extra)
    if layers is not None:
        peak = partial_peak(none, full, layer_count, layers) + recompute_extra
        return "full", layers, margin, (f"full on {layers} of {layer_count} layers: estimated peak "
                                        f"{peak / gib:.1f} GiB {fits}; none and selective did not")
    if estimated_peak["full"] <= budget:
        return "full", None, margin, (f"full: estimated peak {estimated_peak['full'] / gib:.1f} GiB {fits}; "
                                      "faster policies did not")
    return "full", None, margin, (f"full: no policy's estimate fits {budget / gib:.1f} GiB; full needs the "
                                  "least memory")


def partial_peak(none: int, full: int, layer_count: int, layers: int) -> int:
    """Estimated peak with ``layers`` of ``layer_count`` layers checkpointed: full's, plus what each layer left
    unchecked keeps beyond its checkpointed input (an equal share of none - full)."""
    return int(full + (none - full) * (layer_count - layers) / layer_count)


def fewest_layers(none: int, full: int, layer_count: int, budget: int) -> int | None:
    """The fewest checkpointed layers (1 .. layer_count - 1) whose estimate fits ``budget``; None if none does."""
    for layers in range(1, layer_count):
        if partial_peak(none, full, layer_count, layers) <= budget:
            return layers
    return None


def static_bytes(model, optimizer_name: str) -> int:
    """Weights (as stored), gradients and optimizer state of a model about to train: exact weights, gradients of
    the trainable parameters in their dtype, AdamW's two moments (one byte each for 8-bit paged AdamW)."""
    weights = sum(t.numel() * t.element_size() for t in {id(p): p for p in model.parameters()}.values())
    weights += sum(b.numel() * b.element_size() for b in model.buffers())
    trainable = [p for p in model.parameters() if p.requires_grad]
    grads = sum(p.numel() * p.element_size() for p in trainable)
    state_bytes = 2 if optimizer_name == "paged_adamw_8bit" else None
    state = sum(p.numel() * (state_bytes or 2 * p.element_size()) for p in trainable)
    return weights + grads + state


def measure_activations(model, autocast, vocab: int, device: torch.device, tokens: int,
                        lora_rank: int = 0) -> dict[str, float]:
    """Bytes per token each policy keeps for backward, measured on one probe sequence (no backward is run)."""
    ids = torch.randint(0, vocab, (1, tokens), device=device)
    per_token: dict[str, float] = {}
    for policy in SPEED_ORDER:
        selective = SelectivePolicy(lora_rank)
        apply_policy(model, policy, selective)
        selective.start_counting()
        with SavedActivations(model) as meter, autocast():
            loss = model(input_ids=ids, labels=ids).loss
        per_token[policy] = (meter.bytes + selective.stop_counting()) / tokens
        del loss  # frees the graph and the selective cache
    return per_token


def available_memory(device: torch.device, cap_gib: float | None = None) -> int:
    """Bytes this process can use for training now: free device memory plus what torch already holds (CUDA; at
    most ``cap_gib``, --memory-limit-gib), or available host memory (CPU)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        usable = free + torch.cuda.memory_reserved(device)
        return usable if cap_gib is None else min(usable, int(cap_gib * (1 << 30)))
    import psutil

    return psutil.virtual_memory().available + psutil.Process().memory_info().rss


def loss_transient_bytes(kernel_set: str, tokens: int, vocab: int) -> int:
    """The loss backward's fp32 logits gradients, or nothing when the kernel set fuses the loss (Liger's fused
    linear cross entropy works in chunks: counting them anyway made auto's estimate 8.7 GiB too high on an H200,
    llama-8b 4 x 2048, where they would be 7.8 GiB)."""
    return 0 if kernels.fuses_loss(kernel_set) else metrics.logits_gradient_bytes(tokens, vocab)


def choose_auto(model, autocast, plan: RunPlan, optimizer_name: str) -> AutoChoice:
    cfg = plan.config
    tokens_per_micro = cfg.data.batch_size * cfg.data.seq_len
    vocab = plan.source.config.vocab_size
    probe = min(PROBE_TOKENS, cfg.data.seq_len)
    per_token = measure_activations(model, autocast, vocab, plan.device, probe, cfg.method.lora_r or 0)
    static = static_bytes(model, optimizer_name)
    logits = loss_transient_bytes(cfg.model.kernels, tokens_per_micro, vocab)
    estimates = {p: int(static + per_token[p] * tokens_per_micro + logits) for p in SPEED_ORDER}
    kept = kept_weight_bytes(model, plan)
    estimates["full"] += kept
    available = available_memory(plan.device, cfg.output.memory_limit_gib)
    policy, layers, margin, reason = choose(estimates, available, len(metrics.decoder_layers(model)), kept)
    return AutoChoice(policy, reason, layers, estimates, per_token, static, available, margin, kept)


def kept_weight_bytes(model, plan: RunPlan) -> int:
    """What QLoRA's recomputation keeps for backward under full checkpointing: one layer's dequantized weights
    (models/dequant.py), or nothing."""
    m = plan.config.method
    if not dequant.keeps_weights(m):
        return 0
    return dequant.largest_layer_bytes(metrics.decoder_layers(model), torch_dtype(m.compute_dtype or plan.dtype))


def resolve_policy(model, autocast, plan: RunPlan, optimizer_name: str) -> tuple[str, int | None, AutoChoice | None,
                                                                                SelectivePolicy | None]:
    """Apply the configured policy (choosing it first under auto). Returns (policy, how many layers are
    checkpointed or None for all, the auto choice or None, the selective policy object, whose counter sizes what
    selective checkpointing caches, or None)."""
    policy = plan.config.model.checkpointing
    layers = plan.config.model.checkpoint_layers
    choice = None
    if policy == "auto":
        choice = choose_auto(model, autocast, plan, optimizer_name)
        policy, layers = choice.policy, choice.layers
    selective = SelectivePolicy(plan.config.method.lora_r or 0) if policy == "selective" else None
    apply_policy(model, policy, selective, layers)
    return policy, layers, choice, selective
