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
import importlib
import importlib.util

from ftprof.errors import ConfigError

# model_type -> (transformers modeling module, Liger's apply function, the names Liger replaces in that module)
SUPPORTED = {
    "llama": ("transformers.models.llama.modeling_llama", "apply_liger_kernel_to_llama", "Llama"),
    "mistral": ("transformers.models.mistral.modeling_mistral", "apply_liger_kernel_to_mistral", "Mistral"),
}


def check_liger(model_type: str | None) -> None:
    """One line, before anything loads, for every reason ``--kernels liger`` cannot run on this CUDA device (the
    device itself: ``ftprof.checks.cuda_only_problem``)."""
    if model_type not in SUPPORTED:
        raise ConfigError(f"--kernels liger supports {', '.join(SUPPORTED)} models; this one is "
                          f"'{model_type}'; use --kernels eager")
    if importlib.util.find_spec("liger_kernel") is None:
        raise ConfigError("--kernels liger needs the 'liger-kernel' package: pip install 'ftprof[fast]'")


FUSED_LOSS = "fused_linear_cross_entropy"
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
    module_name, apply_name, prefix = SUPPORTED[model_type]
    module = importlib.import_module(module_name)
    causal_lm = getattr(module, f"{prefix}ForCausalLM")
    saved = {name: getattr(module, name) for name in ("apply_rotary_pos_emb", f"{prefix}RMSNorm", f"{prefix}MLP")}
    saved_forward = causal_lm.forward
    from liger_kernel import transformers as liger

    getattr(liger, apply_name)(rope=blocks, rms_norm=blocks, swiglu=blocks, cross_entropy=False,
                               fused_linear_cross_entropy=True)
    try:
        yield [*(BLOCK_KERNELS if blocks else ()), FUSED_LOSS]
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
        causal_lm.forward = saved_forward
