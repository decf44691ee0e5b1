"""Liger's fused linear cross entropy on one GPU at llama-8b's widths (hidden 4096, vocabulary 128,256, the head
frozen as in LoRA), forward and backward, for each transient-logits budget (``chunk_mem_const``: the chunk is
next_pow2(tokens / ceil(vocab / (budget x hidden))) tokens; Liger's default budget 1 gives 64-token chunks at
micro-batch 1 x 2048): milliseconds per micro-batch and per 8,192-token step, and the peak memory each call adds.

    python3 benchmarks/liger_loss_chunks.py [--tokens 2048 8192] [--repeats 10]
"""

from __future__ import annotations

import argparse

import torch
from dequant_kernel import time_us  # (benchmarks/ is the script's path)

from ftprof.models import kernels

HIDDEN, VOCAB, STEP_TOKENS = 4096, 128256, 8192


def _call(tokens: int, budget: int):
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    hidden = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    head = torch.randn(VOCAB, HIDDEN, device="cuda", dtype=torch.bfloat16) / HIDDEN ** 0.5
    target = torch.randint(0, VOCAB, (tokens,), device="cuda")
    return lambda: liger_fused_linear_cross_entropy(hidden, head, target, chunk_mem_const=budget).backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, hidden {HIDDEN}, vocabulary {VOCAB}, bf16")
    for tokens in args.tokens:
        for budget in (1, 2, 4, 8, 16, 32):
            chunk = kernels.loss_chunk_tokens(tokens, VOCAB, HIDDEN, budget)
            call = _call(tokens, budget)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            ms = time_us(call, args.repeats) / 1000
            added = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
            print(f"{tokens:5d} tokens  budget {budget:2d}  chunk {chunk:5d}  {ms:7.2f} ms a micro-batch  "
                  f"{ms * STEP_TOKENS / tokens:7.2f} ms a step  +{added:7.1f} MiB")
            del call
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
