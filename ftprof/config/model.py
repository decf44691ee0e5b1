"""The model section: what to load, its dtype, checkpointing, kernels and compilation."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from ftprof.config import declarations
from ftprof.config.options import (
    CHECKPOINTING,
    COMPILE_MODES,
    DTYPES,
    KERNELS,
    SDPA_BACKENDS,
    check_types,
    one_of,
    option,
    require,
)
from ftprof.errors import ConfigError


@dataclass
class ModelConfig:
    model: str = option("tiny", "built-in preset name, local checkpoint directory, or hub id", metavar="NAME|DIR|ID")
    dtype: str = option("auto", "parameter/compute dtype; auto = float32 on CPU, bfloat16 on CUDA", choices=DTYPES)
    checkpointing: Optional[str] = option(
        None, "activation checkpointing: none; full (each decoder layer's forward recomputed in backward); "
        "selective (matmul and attention outputs saved, the cheap ops between them recomputed); auto (the fastest "
        "of these whose estimated peak fits the device's memory with a margin; result.json says which and why) "
        "(default none)", choices=CHECKPOINTING)
    checkpoint_layers: Optional[int] = option(
        None, "with --checkpointing full or selective: checkpoint only the first N decoder layers; the others keep "
        "their activations (faster, more memory). Default: all. auto picks N itself when selective does not fit")
    selective_rest: bool = option(
        False, "with --checkpointing full --checkpoint-layers N: the other layers are selective-checkpointed (their "
        "matmul and attention outputs saved, the cheap ops between them recomputed) instead of keeping every "
        "activation: less memory than none per layer at a few percent of its speed, so fewer layers need full "
        "recomputation in the same memory; full on the first N layers, selective on the rest")
    lean_recompute: bool = option(
        False, "with --checkpointing full: the recomputation skips each full-checkpointed layer's output projection "
        "(down_proj), whose output no tensor saved for backward depends on: 27% of a llama-8b layer's matmul FLOPs "
        "recomputed less; with --offload-checkpoints too, each layer is checkpointed as its two halves and the "
        "attention's output projection (o_proj) is skipped as well, its mid-layer input offloaded beside the layer's "
        "(Llama, Mistral, Qwen); with selective, uncompiled: that output is no longer kept. The same gradients (LoRA "
        "and QLoRA, in 16 bits or with --fp8-base)")
    offload_checkpoints: bool = option(
        False, "with --checkpointing full: the checkpointed decoder layers' inputs (all full checkpointing keeps) "
        "wait for backward in pinned host memory, copied off and back on a side CUDA stream that overlaps compute, "
        "each brought back one layer ahead of its recomputation (Unsloth's offloaded checkpointing): layers x "
        "tokens x hidden x 2 bytes less device memory in 16 bits; not under FSDP or CUDA graphs")
    offload_embeddings: bool = option(
        False, "LoRA methods: the frozen input embedding table stays in host memory and each micro-batch's rows are "
        "gathered there and copied over with the batch (overlapping the previous step where the batch is "
        "prefetched): vocab x hidden x 2 bytes less device memory in 16 bits (llama-8b: 1.0 GiB); nothing to save "
        "where the output layer shares the table (tied embeddings); one process only")
    gradient_checkpointing: Optional[bool] = option(None, "the HF spelling: --gradient-checkpointing = "
                                                    "--checkpointing full, --no-gradient-checkpointing = none")
    kernels: str = option("eager", "eager (PyTorch/transformers ops), or liger: Liger-Kernel's fused RMSNorm, "
                          "SwiGLU, RoPE and fused linear cross entropy (Llama and Mistral; CUDA)", choices=KERNELS)
    compile: bool = option(False, "torch.compile each decoder block (not the whole model); a block that does not "
                           "compile runs eager, with a note; compile time is reported apart from step time")
    compile_loss: bool = option(True, "with --compile: compile transformers' loss too (the fp32 upcast of the "
                                "logits and cross entropy, forward and backward); not when --kernels liger computes "
                                "the loss")
    compile_dequant: bool = option(False, "with --compile: QLoRA's 4-bit weights are dequantized by torch ops that "
                                   "inductor fuses inside the compiled block instead of by bitsandbytes' kernel "
                                   "(same bits). Measured on an H200: the compiler then keeps every layer's 16-bit "
                                   "weights for backward (+13 GiB, +0.8% tokens/s without checkpointing; -4.4% "
                                   "under full checkpointing); off by default")
    compile_tuning: bool = option(False, "with --compile: inductor tunes each Triton kernel it generates (block "
                                  "sizes, warps) by coordinate descent, timing candidates on the device: what "
                                  "max-autotune adds besides its GEMM templates (GEMMs stay cuBLAS); longer "
                                  "compile. Changes nothing on CPU")
    compile_mode: str = option("default", "with --compile: torch.compile's mode. max-autotune-no-cudagraphs "
                               "benchmarks Triton GEMM templates (with fused epilogues) against cuBLAS for each "
                               "matmul shape (slower to compile); reduce-overhead and max-autotune also replay "
                               "each block as a CUDA graph", choices=COMPILE_MODES)
    attn_implementation: str = option("sdpa", "attention kernel passed to transformers",
                                      choices=("sdpa", "eager", "flash_attention_2"))
    sdpa_backend: str = option("auto", "the kernel behind --attn-implementation sdpa: auto (PyTorch's own "
                               "order), or flash, efficient, cudnn put first (CUDA only); result.json's "
                               "sdpa_backend_used says which one ran", choices=SDPA_BACKENDS)

    def __post_init__(self) -> None:
        check_types(self)
        require(bool(self.model), "--model must not be empty")
        one_of("--dtype", self.dtype, DTYPES)
        one_of("--kernels", self.kernels, KERNELS)
        one_of("--sdpa-backend", self.sdpa_backend, SDPA_BACKENDS)
        one_of("--compile-mode", self.compile_mode, COMPILE_MODES)
        require(self.sdpa_backend == "auto" or self.attn_implementation == "sdpa",
                f"--sdpa-backend {self.sdpa_backend} applies to --attn-implementation sdpa, not "
                f"{self.attn_implementation}")
        if self.checkpointing is not None:
            one_of("--checkpointing", self.checkpointing, CHECKPOINTING)
        # One policy, two spellings: gradient_checkpointing is kept as the derived yes/no (None while auto decides).
        if self.gradient_checkpointing is not None:
            implied = "full" if self.gradient_checkpointing else "none"
            given = self.checkpointing
            require(given in (None, implied) or (self.gradient_checkpointing and given == "selective"),
                     f"--{'no-' if not self.gradient_checkpointing else ''}gradient-checkpointing contradicts "
                     f"--checkpointing {given}")
            self.checkpointing = given or implied
        self.checkpointing = self.checkpointing or "none"
        self.gradient_checkpointing = None if self.checkpointing == "auto" else self.checkpointing != "none"
        # after the policy's two spellings are one: --gradient-checkpointing is --checkpointing full to them
        for problem in declarations.problems(dataclasses.asdict(self), sections=("model",)):
            raise ConfigError(problem)
        if self.checkpoint_layers is not None:
            require(self.checkpoint_layers >= 1, f"--checkpoint-layers must be at least 1, got "
                     f"{self.checkpoint_layers} (--checkpointing none checkpoints no layer)")
            require(self.checkpointing in ("full", "selective"), "--checkpoint-layers applies to --checkpointing "
                     f"full or selective, not {self.checkpointing}" + (" (auto picks the count itself)"
                                                                       if self.checkpointing == "auto" else ""))
