"""ftprof's Triton 4-bit dequantization kernel (models/dequant_kernels.py) on the CPU, through Triton's interpreter
(TRITON_INTERPRET=1, set before Triton is imported: a child process). The GPU tests check the same bits on a GPU."""

import textwrap

import pytest

from tests.requires import requires
from tests.triton_interpreter import run_in_interpreter

CHILD = textwrap.dedent('''
    import torch, bitsandbytes.functional as bf
    from ftprof.models import dequant_kernels as dk

    torch.manual_seed(0)
    for quant_type in ("nf4", "fp4"):
        for nested in (True, False):
            for dtype in (torch.float16, torch.float32, torch.bfloat16):
                for shape in ((96, 640), (33, 192)):  # whole programs of 256 bytes, and a partial last one
                    weight = (torch.randn(*shape) * torch.logspace(-3, 1, shape[1])).to(dtype)
                    packed, state = bf.quantize_4bit(weight, blocksize=64, compress_statistics=nested,
                                                     quant_type=quant_type, quant_storage=torch.bfloat16)
                    data, args = packed.reshape(-1).view(torch.uint8), dk.state_args(state)
                    expected = bf.dequantize_4bit(packed, state)
                    if dtype == torch.bfloat16:  # the interpreter rounds to bf16 by truncation (a GPU: to nearest)
                        exact = dk.blockwise(data, *args, state.shape, torch.float32)
                        expected = (exact.view(torch.int32) & ~0xFFFF).view(torch.float32).bfloat16()
                    out = torch.empty(list(state.shape), dtype=dtype)
                    dk.launch(data, *args, out, bytes_per_program=256)
                    assert torch.equal(out, expected), (quant_type, nested, dtype, shape)
    print("same bits")
''')


@pytest.mark.slow
@requires("triton")
def test_the_kernel_gives_bitsandbytes_bits_in_tritons_interpreter():
    done = run_in_interpreter(CHILD)
    assert done.returncode == 0 and "same bits" in done.stdout, done.stderr[-3000:]


TRANSPOSED_CHILD = textwrap.dedent('''
    import torch, bitsandbytes.functional as bf
    from ftprof.models import dequant_kernels as dk

    torch.manual_seed(0)
    for nested in (True, False):
        # whole tiles, partial tiles, blocks straddling rows (96 columns); rows of whole programs (1024 columns:
        # the rows kernel's one-row scale)
        for shape in ((256, 384), (96, 640), (33, 192), (34, 96), (64, 1024)):
            weight = torch.randn(*shape) * torch.logspace(-3, 1, shape[0])[:, None]
            packed, state = bf.quantize_4bit(weight.bfloat16(), blocksize=64, compress_statistics=nested,
                                             quant_type="nf4", quant_storage=torch.bfloat16)
            data, args = packed.reshape(-1).view(torch.uint8), dk.state_args(state)
            inverse = 448.0 / dk.blockwise(data, *args, state.shape, torch.float32).abs().amax(dim=1)
            rows = torch.empty(list(state.shape), dtype=torch.float8_e4m3fn)
            dk.launch(data, *args, rows, columns=shape[1], inverse=inverse, bytes_per_program=256)
            transposed = dk.dequantize_fp8_transposed(data, *args, list(state.shape), inverse)
            assert transposed.shape == (shape[1], shape[0]) and transposed.is_contiguous(), transposed.shape
            assert torch.equal(transposed.view(torch.uint8), rows.t().view(torch.uint8)), (nested, shape)
    print("same bits")
''')


@pytest.mark.slow
@requires("triton")
def test_the_transposing_e4m3_kernel_gives_the_rows_kernels_bits_transposed():
    """--fp8-base's backward operand, written transposed by its own tiled kernel, against the e4m3 rows kernel's
    output transposed, both in Triton's interpreter (whose e4m3 rounding differs from a GPU's; the GPU tests check
    both kernels against the torch ops)."""
    done = run_in_interpreter(TRANSPOSED_CHILD)
    assert done.returncode == 0 and "same bits" in done.stdout, done.stderr[-3000:]
