"""Fused kernels as a run option (``--kernels liger``): Liger-Kernel's RMSNorm, SwiGLU, RoPE and fused linear cross
entropy for the Llama and Mistral architectures.

With ``--compile`` too, only the fused linear cross entropy is applied: it lives outside the decoder blocks (the
loss never materializes fp32 logits), while torch.compile fuses the norms, SwiGLU and rotary inside each block itself
(compiling blocks that call Liger's Triton kernels gained nothing on an H200: the compiler cannot trace them).

Liger patches transformers' modeling module (classes and the rotary function), so it must be applied before the
model is built (measured on an H200 with ftprof's loop: loss identical to eager over 12 steps). ``patched`` does that
and puts the module back as it was when the run is done, so a later eager run in the same process stays eager.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os

from ftprof.errors import ConfigError

# model_type -> (transformers modeling module, Liger's apply function, the names Liger replaces in that module,
# Liger's module whose forward calls its causal-LM loss: where ftprof sizes the loss's chunks)
SUPPORTED = {
    "llama": ("transformers.models.llama.modeling_llama", "apply_liger_kernel_to_llama", "Llama",
              "liger_kernel.transformers.model.llama"),
    "mistral": ("transformers.models.mistral.modeling_mistral", "apply_liger_kernel_to_mistral", "Mistral",
                "liger_kernel.transformers.model.mistral"),
}


def check_liger(model_type: str | None) -> None:
    """One line, before anything loads, for every reason ``--kernels liger`` cannot run on this CUDA device (the
    device itself: ``ftprof.checks.cuda_only_problem``)."""
    if model_type not in SUPPORTED:
        raise ConfigError(f"--kernels liger supports {', '.join(SUPPORTED)} models; this one is "
                          f"'{model_type}'; use --kernels eager")
    if importlib.util.find_spec("liger_kernel") is None:
        raise ConfigError("--kernels liger needs the 'liger-kernel' package: pip install 'ftprof[fast]'")
    if _chunk_setting(os.environ.get(CHUNK_SWITCH)) is None:
        raise ConfigError(f"{CHUNK_SWITCH}={os.environ[CHUNK_SWITCH]!r}: give the most tokens a chunk of Liger's fused "
                          f"loss may hold, a whole number (0: Liger's own chunks)")


FUSED_LOSS = "fused_linear_cross_entropy"
# Liger's fused loss runs the head's matmul over chunks of tokens, sized so that one chunk's logits take about
# chunk_mem_const x tokens x hidden values: by default (1) 64-token chunks at llama-8b's vocabulary and micro-batch
# 1 x 2048, small matmuls: 100 ms of loss a step against 26-28 ms in chunks of 1,024-2,048 tokens (H100,
# benchmarks/liger_loss_chunks.py). ftprof asks for chunks of up to LOSS_CHUNK_TOKENS tokens instead: llama-8b QLoRA
# 1 x 4, CUDA graphs, 12,188 -> 13,519 tokens/s (BENCHMARKS.md round 31). 1,024 rather than 2,048: the same speed in
# that run (13,558 against 13,578 tokens/s, one H100, one call) with 0.25 GiB less at its peak (a chunk's bf16 logits,
# 1,024 x 128,256 x 2 bytes, round 32); at 4 x 2048 the loss alone took 28.1 against 26.7 ms a step.
# FTPROF_LOSS_CHUNK_TOKENS=0 keeps Liger's sizing (env.json and result.json record which ran).
CHUNK_SWITCH, DEFAULT_LOSS_CHUNK_TOKENS = "FTPROF_LOSS_CHUNK_TOKENS", 1024


def _chunk_setting(text: str | None) -> int | None:
    """The switch's tokens (its default where unset); None where it is not a whole number >= 0 (check_liger
    refuses that before a run)."""
    try:
        value = DEFAULT_LOSS_CHUNK_TOKENS if text is None else int(text)
    except ValueError:
        return None
    return value if value >= 0 else None


_SETTING = _chunk_setting(os.environ.get(CHUNK_SWITCH))
LOSS_CHUNK_TOKENS = DEFAULT_LOSS_CHUNK_TOKENS if _SETTING is None else _SETTING
BLOCK_KERNELS = ("rms_norm", "swiglu", "rope")


def fuses_loss(kernels: str) -> bool:
    """Whether the kernel set computes the loss without materializing the logits: Liger's fused linear cross
    entropy, applied with or without --compile (``patched``)."""
    return kernels == "liger"


@contextlib.contextmanager
def patched(kernels: str, model_type: str | None, compiled_blocks: bool = False):
    """Apply the kernel set to transformers' modeling module for the duration of a run; yields the names of the
    kernels applied (none for eager; only the fused loss when the blocks are compiled)."""
    if kernels != "liger":
        yield []
        return
    blocks = not compiled_blocks
    module_name, apply_name, prefix, loss_module_name = SUPPORTED[model_type]
    module = importlib.import_module(module_name)
    causal_lm = getattr(module, f"{prefix}ForCausalLM")
    saved = {name: getattr(module, name) for name in ("apply_rotary_pos_emb", f"{prefix}RMSNorm", f"{prefix}MLP")}
    saved_forward = causal_lm.forward
    from liger_kernel import transformers as liger

    getattr(liger, apply_name)(rope=blocks, rms_norm=blocks, swiglu=blocks, cross_entropy=False,
                               fused_linear_cross_entropy=True)
    loss_module = importlib.import_module(loss_module_name)
    saved_loss = loss_module.LigerForCausalLMLoss
    if LOSS_CHUNK_TOKENS > 0:
        loss_module.LigerForCausalLMLoss = functools.partial(_chunked_loss, saved_loss)
    try:
        yield [*(BLOCK_KERNELS if blocks else ()), FUSED_LOSS]
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
        causal_lm.forward = saved_forward
        loss_module.LigerForCausalLMLoss = saved_loss


def _chunked_loss(liger_loss, *args, hidden_states, lm_head_weight, hidden_size: int, **kwargs):
    """Liger's causal-LM loss with the transient-logits budget that gives chunks of up to LOSS_CHUNK_TOKENS."""
    tokens = hidden_states.numel() // hidden_size
    kwargs.setdefault("chunk_mem_const",
                      loss_budget(tokens, lm_head_weight.shape[0], hidden_size, LOSS_CHUNK_TOKENS))
    return liger_loss(*args, hidden_states=hidden_states, lm_head_weight=lm_head_weight, hidden_size=hidden_size,
                      **kwargs)


def loss_chunk_tokens(tokens: int, vocab: int, hidden: int, budget: int) -> int:
    """The tokens in each chunk of Liger's fused loss for ``budget`` (its chunk_mem_const; Liger 0.8.5's formula:
    the next power of two of tokens / ceil(vocab / (budget x hidden)), at most ``tokens``)."""
    parts = -(-vocab // (budget * hidden))
    return min(1 << (max(1, -(-tokens // parts)) - 1).bit_length(), tokens)


@functools.cache  # asked once per micro-batch by _chunked_loss, always for the run's few shapes
def loss_budget(tokens: int, vocab: int, hidden: int, most_tokens: int) -> int:
    """The largest budget (chunk_mem_const) whose chunks hold at most ``most_tokens`` tokens (1 if none does)."""
    budget, whole = 1, -(-vocab // hidden)  # at ``whole`` one chunk would hold every token
    while budget < whole and loss_chunk_tokens(tokens, vocab, hidden, budget + 1) <= most_tokens:
        budget += 1
    return budget
