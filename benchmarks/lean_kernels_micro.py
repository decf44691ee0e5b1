"""The lean ops' forward and backward on one GPU, their Triton kernels (models/lean_kernels.py) against their torch
ops, at llama-8b's widths (4 x 2048 tokens, bf16): milliseconds per call and per step (32 layers: one MLP product and
two norms each), each side timed with CUDA events over the same inputs (dequant_kernel.time_us).

    python3 benchmarks/lean_kernels_micro.py [--tokens 8192] [--repeats 20]
"""

from __future__ import annotations

import argparse

import torch
from dequant_kernel import time_us  # (benchmarks/ is the script's path)

from ftprof.models import lean_kernels, lean_mlp, lean_norm

HIDDEN, INTERMEDIATE, RANK, LAYERS = 4096, 14336, 16, 32


def _mlp_call(tokens: int):
    gate, up = (torch.randn(tokens, INTERMEDIATE, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(2))
    lora_a = torch.randn(RANK, INTERMEDIATE, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grads = torch.randn(tokens, INTERMEDIATE, device="cuda", dtype=torch.bfloat16), \
        torch.randn(tokens, RANK, device="cuda", dtype=torch.bfloat16)
    return lambda: torch.autograd.backward(lean_mlp.swiglu_lora_a(gate, up, lora_a), grads)


def _norm_call(tokens: int):
    x = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.rand(HIDDEN, device="cuda", dtype=torch.bfloat16) + 0.5
    lora_a = torch.randn(3 * RANK, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grads = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16), \
        torch.randn(tokens, 3 * RANK, device="cuda", dtype=torch.bfloat16)
    return lambda: torch.autograd.backward(lean_norm.rmsnorm_lora_a(x, weight, 1e-5, lora_a), grads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.tokens} tokens, bf16")
    per_step = {}
    for name, make, per_layer in (("swiglu_lora_a", _mlp_call, 1), ("rmsnorm_lora_a", _norm_call, 2)):
        call = make(args.tokens)
        for on in (False, True):
            lean_kernels.ON_CUDA = on
            ms = time_us(call, args.repeats) / 1000
            side = "triton" if on else "torch"
            per_step[side] = per_step.get(side, 0.0) + ms * per_layer * LAYERS
            print(f"{name:15s} {side:6s} {ms:8.3f} ms a call (forward + backward), {ms * per_layer * LAYERS:8.1f} ms a "
                  f"step ({per_layer} a layer x {LAYERS} layers)")
    print(f"both options, a step: torch ops {per_step['torch']:.1f} ms, kernels {per_step['triton']:.1f} ms")


if __name__ == "__main__":
    main()
