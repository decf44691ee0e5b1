"""FLOPs of one recorded operator from its input shapes (the trace's "Input Dims", recorded with record_shapes).

Only the operators that carry the FLOPs of fine-tuning are counted: the leaf matmuls (mm, addmm, bmm, baddbmm) and
the fused attention operators. Counting follows ftprof/metrics.py, so the two reconcile: a matmul [M,K]x[K,N] is
2*M*K*N; attention is the full (non-causal) QK^T and AV cost, 4*B*H*T*S*D forward and twice that backward.
"""

from __future__ import annotations

import math
import re

LEAF_MATMULS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
# Fused attention, forward and backward, as the dispatcher names them (CPU flash, CUDA flash / efficient / cuDNN).
# The public aten::scaled_dot_product_attention is left out: when it falls back to the math path, its bmm children
# carry the FLOPs.
ATTENTION_OP = re.compile(r"^aten::_(scaled_dot_product_\w*attention\w*|flash_attention_\w+|efficient_attention_\w+|"
                          r"cudnn_attention_\w+)$")
# Operators whose shapes tell ftprof the vocabulary size (the lm_head GEMMs and the loss have it as a dimension).
VOCAB_OPS = frozenset({"aten::embedding", "aten::log_softmax", "aten::_log_softmax", "aten::cross_entropy_loss"})


def is_flop_op(name: str) -> bool:
    return name in LEAF_MATMULS or bool(ATTENTION_OP.match(name))


def keeps_dims(name: str) -> bool:
    """Whether the summary keeps this operator's input shapes (a few kinds of operators only: memory stays bounded)."""
    return is_flop_op(name) or name in VOCAB_OPS


def matmul_mkn(name: str, dims: list) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of a leaf matmul, or None when the shapes are missing or odd."""
    try:
        if name == "aten::mm":
            (m, k), (_, n) = dims[0], dims[1]
            return 1, m, k, n
        if name == "aten::addmm":
            (m, k), (_, n) = dims[1], dims[2]
            return 1, m, k, n
        if name == "aten::bmm":
            (b, m, k), (_, _, n) = dims[0], dims[1]
            return b, m, k, n
        if name == "aten::baddbmm":
            (b, m, k), (_, _, n) = dims[1], dims[2]
            return b, m, k, n
    except (IndexError, TypeError, ValueError):
        return None
    return None


def attention_flops(name: str, dims: list) -> float:
    """Forward: 4*B*H*T*S*D (QK^T and AV); backward ops (name ends in _backward): twice that."""
    backward = name.endswith("_backward")
    q_at = 1 if backward else 0  # backward operators take grad_out (shaped like q) first, then q, k, v
    try:
        q, k = dims[q_at], dims[q_at + 1]
        if len(q) != 4 or len(k) != 4:
            return 0.0
        if name.startswith(("aten::_flash_attention", "aten::_efficient_attention")):
            (b, t, h, d), s = q, k[1]  # the inner kernels' operators take [B, T, H, D]
        else:
            (b, h, t, d), s = q, k[2]  # the sdpa operators take [B, H, T, D]
    except (IndexError, TypeError, ValueError):
        return 0.0
    return (8.0 if backward else 4.0) * b * h * t * s * d


def op_flops(name: str, dims: list) -> float:
    if name in LEAF_MATMULS:
        mkn = matmul_mkn(name, dims)
        return 2.0 * math.prod(mkn) if mkn else 0.0
    if ATTENTION_OP.match(name):
        return attention_flops(name, dims)
    return 0.0
