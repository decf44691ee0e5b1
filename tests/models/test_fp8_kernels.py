"""Rows of activations and gradients quantized into e4m3 (models/fp8_kernels.py): within one e4m3 rounding, each
row's largest value at e4m3's largest, zero rows kept zero, a column factor folded in. (The Triton kernel's bits
against these torch ops: tests/gpu/test_gpu_fast_paths.py.)"""

import torch

from ftprof.models.fp8_kernels import E4M3_MAX, quantize_rows

E4M3_ROUNDING = 2.0 ** -4  # e4m3 keeps 3 mantissa bits: one rounding is within 2**-4 of a value (relative)


def test_quantized_rows_are_within_one_e4m3_rounding():
    t = torch.randn(8, 64) * torch.logspace(-3, 2, 8).view(-1, 1)
    t[3] = 0.0  # an all-zero row stays zero
    values, scale = quantize_rows(t)
    assert values.dtype == torch.float8_e4m3fn and scale.shape == (8, 1)
    assert float(values.float().abs().amax()) == E4M3_MAX  # each row's largest value uses the range
    back = values.float() * scale
    assert torch.all((back - t).abs() <= E4M3_ROUNDING * t.abs() + 1e-3 * scale)  # (+ e4m3's subnormal step)
    assert torch.equal(back[3], torch.zeros(64))
    columns = torch.linspace(0.5, 2.0, 64)
    folded, folded_scale = quantize_rows(t, column_scale=columns)
    assert torch.allclose(folded.float() * folded_scale, t * columns, rtol=E4M3_ROUNDING, atol=1e-2)
