"""bitsandbytes' CPU 4-bit dequantization as ftprof runs it (models/bnb_cpu.py): checked on this machine, and where
the native kernel is wrong the reference replaces it, so a CPU QLoRA run trains on the right base weights."""

import pytest
import torch

from ftprof.models import bnb_cpu

# The largest gap between neighbouring 4-bit values, as a fraction of the block's absmax: NF4 0.304 (-1.0 ->
# -0.696), FP4 0.333 (0.667 -> 1.0). A right dequantization is within half of it of the weight it quantized; the
# wrong one was off by up to 2 on these unit-scale weights.
HALF_GAP = {"nf4": 0.304 / 2, "fp4": 0.334 / 2}


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("shape", [(64, 176), (64, 96), (96, 640), (32, 100)])
def test_cpu_dequantization_is_right_after_the_check(shape, quant_type):
    import bitsandbytes.functional as bf

    bnb_cpu.fix_cpu_dequantize()
    assert bnb_cpu.native_dequantize_error() == 0.0
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    packed, state = bf.quantize_4bit(weight, blocksize=64, quant_type=quant_type)
    values = bf.dequantize_4bit(packed, state)
    per_block = weight.flatten().abs().reshape(-1, 64).amax(dim=1)  # every shape here is whole blocks in all
    bound = (HALF_GAP[quant_type] * per_block).repeat_interleave(64).reshape(shape) + 1e-6
    assert ((values - weight).abs() <= bound).all()


def test_the_probe_tells_a_wrong_kernel_from_a_right_one(monkeypatch):
    """The check compares with the reference: a kernel that is off fails it (here, one that adds 1 to every
    value), and the reference passes it. The kernel in use is checked first: the check may not have run in this
    process yet (a test worker that ran none of the others), and a native kernel that is wrong here would add its
    own error to the one made below."""
    bnb_cpu.fix_cpu_dequantize()
    reference = bnb_cpu._reference_dequantize
    monkeypatch.setattr(bnb_cpu, "_reference_dequantize", lambda *a: reference(*a) + 1.0)
    assert bnb_cpu.native_dequantize_error() == pytest.approx(1.0)
