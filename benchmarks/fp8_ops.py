"""--fp8-base's ops on the GPU for llama-8b's 4-bit projection shapes (double-quantized NF4): the GPU time of the
e4m3 dequantization kernels per weight, and the host's time per call of each custom op, where the GPU work is
small (16 tokens) so that the host's dispatch and launches are what a call costs.

    python benchmarks/fp8_ops.py      # prints two Markdown tables
"""

from __future__ import annotations

import time

import torch
from dequant_kernel import time_us as _gpu_us  # (benchmarks/ is the script's path)

SHAPES = {"q/o_proj": (4096, 4096), "k/v_proj": (1024, 4096), "gate/up_proj": (14336, 4096),
          "down_proj": (4096, 14336)}


def _host_us(fn, repeat: int = 100) -> float:
    """Wall time per call on the host while the GPU keeps up (each call's GPU work is a few microseconds)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host * 1e6 / repeat


def _linear(shape: tuple[int, int]):
    import bitsandbytes as bnb

    from ftprof.models import fp8_base

    out_features, in_features = shape
    layer = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=torch.bfloat16,
                              compress_statistics=True, quant_type="nf4", quant_storage=torch.bfloat16)
    layer.weight.requires_grad_(False)
    layer = layer.to(torch.bfloat16).cuda()  # quantized on the move: a bf16 weight (the 16-bit path's dtype)
    assert fp8_base.convert([torch.nn.Sequential(layer)]) == 1
    return layer


def _measure(name: str, shape: tuple[int, int]) -> tuple[float, float, float]:
    """Print the weight's kernel row; return the host's microseconds per call of the forward op, the input-gradient
    op and the 16-bit path (Triton dequantization and a linear)."""
    from ftprof.models import dequant_kernels as dk
    from ftprof.models import fp8_base

    layer = _linear(shape)
    packed, state, inverse = layer.weight, layer.weight.quant_state, layer.fp8_inverse
    rows = _gpu_us(lambda: dk.dequantize_fp8(packed, state, inverse))
    copied = _gpu_us(lambda: dk.dequantize_fp8(packed, state, inverse).t().contiguous())
    try:
        transposed = f"{_gpu_us(lambda: dk.dequantize_fp8(packed, state, inverse, transposed=True)):.1f}"
    except TypeError:  # a checkout without the transposing kernel
        transposed = "-"
    print(f"| {name} {shape[0]} x {shape[1]} | {rows:.1f} | {copied:.1f} | {transposed} |")
    x = torch.randn(16, shape[1], device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(16, shape[0], device="cuda", dtype=torch.bfloat16)
    args = fp8_base._weight_args(layer)
    return (_host_us(lambda: torch.ops.ftprof.fp8_linear(x, *args)),
            _host_us(lambda: torch.ops.ftprof.fp8_linear_input_grad(grad, *args)),
            _host_us(lambda: torch.nn.functional.linear(x, dk.triton_dequantize(packed, state))))


def main() -> None:
    print("| weight | e4m3 rows (us) | rows + transposing copy (us) | transposed kernel (us) |")
    print("| --- | ---: | ---: | ---: |")
    host = {name: _measure(name, shape) for name, shape in SHAPES.items()}
    print("\n| weight | fp8_linear host us/call | fp8_linear_input_grad | 16-bit: Triton dequant + linear |")
    print("| --- | ---: | ---: | ---: |")
    for name, (forward, backward, sixteen) in host.items():
        print(f"| {name} | {forward:.1f} | {backward:.1f} | {sixteen:.1f} |")
    print(f"\ntorch {torch.__version__}, {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
