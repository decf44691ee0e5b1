"""ftprof's Triton 4-bit dequantization against bitsandbytes' on the GPU: the same bits, and the time per weight for
llama-8b's projection shapes (double-quantized NF4, bf16 out), for a few launch shapes of the kernel.

    python benchmarks/dequant_kernel.py            # prints a Markdown table; exit 1 if any result differs
"""

from __future__ import annotations

import sys

import torch

SHAPES = {"q/o_proj": (4096, 4096), "k/v_proj": (1024, 4096), "gate/up_proj": (14336, 4096),
          "down_proj": (4096, 14336)}
LAUNCHES = [(512, 4), (1024, 4), (1024, 8), (2048, 8), (4096, 8)]  # (bytes per program, warps)


def time_us(fn, repeat: int = 50) -> float:
    """GPU microseconds per call of ``fn`` (CUDA events over ``repeat`` calls, after 5 warm-up calls)."""
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    end.synchronize()  # sync point: the kernels must finish before reading the events
    return start.elapsed_time(end) * 1000 / repeat


def _row(name: str, shape: tuple[int, int]) -> bool:
    """Print one weight's row; returns whether the kernel gave bitsandbytes' bits (this NF4 weight, and FP4)."""
    import bitsandbytes.functional as bf

    from ftprof.models import dequant_kernels as dk

    weight = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    packed, state = bf.quantize_4bit(weight, blocksize=64, compress_statistics=True, quant_type="nf4",
                                     quant_storage=torch.bfloat16)
    same = torch.equal(dk.triton_dequantize(packed, state), bf.dequantize_4bit(packed, state))
    plain, plain_state = bf.quantize_4bit(weight, blocksize=64, compress_statistics=False, quant_type="fp4")
    same &= torch.equal(dk.triton_dequantize(plain, plain_state), bf.dequantize_4bit(plain, plain_state))
    bnb_us = time_us(lambda: bf.dequantize_4bit(packed, state))
    args, data = dk.state_args(state), packed.reshape(-1).view(torch.uint8)
    out = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    ours = [time_us(lambda b=b, w=w: dk.launch(data, *args, out, bytes_per_program=b, warps=w))
            for b, w in LAUNCHES]
    moved = shape[0] * shape[1] * 2.5  # bytes: half a byte read and two written per value
    print(f"| {name} | {shape[0]} x {shape[1]} | {bnb_us:.1f} | " + " | ".join(f"{t:.1f}" for t in ours)
          + f" | {bnb_us / min(ours):.2f}x | {moved / bnb_us / 1e3:.0f} | {moved / min(ours) / 1e3:.0f} | {same} |")
    return bool(same)


def main() -> int:
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| weight | shape | bitsandbytes us | " + " | ".join(f"ftprof {b}B/{w}w us" for b, w in LAUNCHES)
          + " | best speed-up | bitsandbytes GB/s | ftprof GB/s | same bits |")
    print("| --- | --- | ---: | " + " | ".join("---:" for _ in LAUNCHES) + " | ---: | ---: | ---: | --- |")
    same = [_row(name, shape) for name, shape in SHAPES.items()]
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
