"""What kernel and operator names mean: the categories of the summary and the meanings the buckets read.

Pure name rules (regular expressions, memoized): no trace, no state.
"""

from __future__ import annotations

import functools
import re

# Kernel (or CPU operator) name -> category. First match wins; order matters.
CATEGORIES: tuple[tuple[str, re.Pattern], ...] = tuple((name, re.compile(rx, re.I)) for name, rx in (
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|broadcast"),
    ("quantize/dequantize", r"dequant|quantize|kDequantize|kQuantize|gemv_4bit|4bit|nf4|gptq|marlin|exllama|"
                            r"machete|awq|int4|unpack"),
    # the loss's log-softmax and NLL over the vocabulary, before attention's softmax takes them (with a 128k
    # vocabulary they outweigh attention's own softmax)
    ("loss", r"log_?softmax|LogSoftMax|nll_loss|cross_?entropy"),
    ("attention", r"flash|fmha|attention|sdpa|scaled_dot_product|softmax|cudnn.*mha"),
    ("gemm", r"gemm|nvjet|cutlass|xmma|cublas|matmul|aten::mm$|aten::addmm|aten::bmm|aten::baddbmm|wgmma|splitk|"
             r"mkldnn|aten::linear$"),
    ("optimizer", r"adam|multi_tensor_apply|fused_adam|_foreach|optimizer|sgd"),
    ("normalization", r"rms_?norm|layer_?norm|group_?norm|batch_?norm|aten::norm"),
    ("memory copy", r"memcpy|memset|copy_|aten::to$|aten::_to_copy|contiguous|cat_?kernel|aten::cat"),
    ("elementwise", r"elementwise|vectorized|unrolled|reduce|silu|gelu|mul|add|where|fill|index|embedding|"
                    r"aten::"),
))
# fp32 GEMM kernels by name (cuBLAS/cuBLASLt/CUTLASS conventions) when operator dtypes are not in the trace.
# cuBLASLt's nvjet kernels name their types after the architecture: nvjet_sm90_tst_... is bf16 in and out ('t'),
# fp32 accumulate ('s'); nvjet_..._sss_... is fp32 throughout.
FP32_GEMM = re.compile(r"sgemm|f32f32|s1688|s16816gemm|tf32|nvjet_(sm\d+_)?sss|gemm_fp32|_fp32_|"
                       r"cutlass_80_simt", re.I)
# The loss's NLL and fp32 softmax over the vocabulary: their presence means the logits (and their fp32 gradients,
# 2 x 4 bytes x tokens x vocab in backward) are materialized; a fused linear cross entropy never builds them.
LOGITS_KERNELS = ("nll_loss", "SoftMaxForward", "SoftMaxBackward")

# Names (of an operator or of an ancestor, autograd nodes included) that say which fine-tuning bucket the work
# belongs to, whatever kernels it launches.
MEANINGS: tuple[tuple[str, re.Pattern], ...] = tuple((key, re.compile(rx, re.I)) for key, rx in (
    ("dequant", r"dequant|quantize|4bit|nf4|gptq|marlin|exllama|machete|awq|MatMul4Bit"),
    ("loss", r"log_softmax|nll_loss|cross_entropy|LogSoftmaxBackward|NllLossBackward"),
    ("attention", r"attention|sdpa|flash|fmha|softmax"),
    ("norm_act", r"rms_?norm|layer_?norm|group_?norm|rsqrt|aten::pow$|PowBackward|silu|gelu|relu|sigmoid|tanh|"
                 r"softplus|swiglu|geglu|mish|elu"),
    ("optimizer", r"Optimizer\.|adam|_foreach|multi_tensor|sgd"),
))


# Inductor names the kernels it generates after the operators they fuse (triton_red_fused__to_copy_add_mean_..._0).
# A cast or copy among them is no memory copy when the kernel also computes: a compiled FP8 run's norm-and-quantize
# kernels (triton_red_fused__scaled_mm__to_copy__unsafe_view_abs_add_amax_...) put 13% of its GPU time under
# "memory copy" (H200, 2026-12-04). Such a name is read without its casts and views; one of nothing else stays a copy.
INDUCTOR_FUSED = re.compile(r"^triton_(?:poi|red|per|tem)_fused_", re.I)
CASTS = frozenset({"to", "copy", "clone", "contiguous"})
MOVES = frozenset({"view", "unsafe", "reshape", "transpose", "permute", "expand", "slice", "select", "squeeze",
                   "unsqueeze", "t", "cat", "split", "alias", "as", "strided", "default"})


@functools.lru_cache(maxsize=65536)
def categorize(name: str) -> str:
    """Category of a kernel or operator name. Memoized: a trace repeats a few hundred names millions of times."""
    fused = INDUCTOR_FUSED.match(name)
    if fused:
        ops = [t for t in name[fused.end():].split("_") if t and not t.isdigit() and t.lower() not in CASTS]
        if all(t.lower() in MOVES for t in ops):
            return "memory copy"
        if name.lower().startswith("triton_tem_") and "attention" not in name.lower():
            return "gemm"  # a template kernel (max-autotune's GEMMs), its epilogue fused
        name = "_".join(ops)  # what it computes
    for cat, rx in CATEGORIES:
        if rx.search(name):
            return cat
    return "other"


@functools.lru_cache(maxsize=65536)
def meaning(name: str) -> str | None:
    """The bucket an operator's (or an ancestor's) name puts its work in, if the name says."""
    for key, rx in MEANINGS:
        if rx.search(name):
            return key
    return None


def is_logits_kernel(name: str) -> bool:
    return any(k in name for k in LOGITS_KERNELS)
