"""A workaround for bitsandbytes' native CPU 4-bit dequantization, checked on the machine before it is used.

Measured with bitsandbytes 0.50.2 on an x86-64 CPU with AVX-512: its native CPU kernel dequantizes some weights
whose rows are not a whole number of quantization blocks to wrong values (a 64 x 96 or 64 x 176 NF4 weight, block
64: errors of about 2 on unit-scale weights, against about 0.5 for correct 4-bit values), while 96 x 640 is right.
The tiny preset's down_proj (64 x 176) is such a weight, so QLoRA on those CPUs trained on wrong base weights, and
every comparison of ftprof's own dequantization with bitsandbytes' failed there. bitsandbytes' pure-torch reference
implementation gives the right values; where the native kernel is found wrong, the reference replaces it for
``bitsandbytes::dequantize_4bit`` on CPU (GPU kernels are not touched).
"""

from __future__ import annotations

import functools

import torch

# Row lengths that are not a multiple of the block: the case the native kernel got wrong.
_PROBE_SHAPE = (64, 96)
_BLOCKSIZE = 64
# Right values agree with the reference to the last bit (the same fp32 product); wrong ones were off by ~2.
_WRONG_ABOVE = 1e-4


def _reference_dequantize(A: torch.Tensor, absmax: torch.Tensor, blocksize: int, quant_type: str,
                          shape, dtype: torch.dtype) -> torch.Tensor:
    """bitsandbytes' own pure-torch dequantization (its default backend), with the CPU kernel's signature."""
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code

    if A.dtype != torch.uint8:
        A = A.view(torch.uint8)
    code = _get_4bit_code(quant_type, A.device)
    # Its eager form: bitsandbytes wraps it in torch.compile(dynamic=False), which compiles once per weight shape
    # (seconds each on a 2-core CPU) and warns at dynamo's recompile limit after eight shapes.
    eager = getattr(_dequantize_4bit_compute, "__wrapped__", _dequantize_4bit_compute)
    return eager(A.reshape(-1), absmax.float(), code, blocksize, shape, dtype)


def native_dequantize_error() -> float:
    """The largest difference between bitsandbytes' CPU dequantization and its reference on a probe weight whose
    rows are not whole blocks (0.0 where the native kernel is right). Run once per process: it quantizes a
    6,144-value weight."""
    import bitsandbytes.functional as bf

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(_PROBE_SHAPE, generator=generator)
    worst = 0.0
    for quant_type in ("nf4", "fp4"):
        packed, state = bf.quantize_4bit(weight, blocksize=_BLOCKSIZE, quant_type=quant_type,
                                         quant_storage=torch.uint8)
        theirs = bf.dequantize_4bit(packed, state)
        reference = _reference_dequantize(packed, state.absmax, _BLOCKSIZE, quant_type, state.shape, state.dtype)
        worst = max(worst, (theirs - reference).abs().max().item())
    return worst


@functools.cache
def fix_cpu_dequantize() -> bool:
    """Check bitsandbytes' CPU dequantization once per process; where it is wrong, register the reference as the
    CPU kernel. Returns whether the reference replaced the native kernel."""
    if native_dequantize_error() <= _WRONG_ABOVE:
        return False
    torch.library.register_kernel("bitsandbytes::dequantize_4bit", "cpu", _reference_dequantize)
    return True
