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


@functools.lru_cache(maxsize=65536)
def categorize(name: str) -> str:
    """Category of a kernel or operator name. Memoized: a trace repeats a few hundred names millions of times."""
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
