"""The lean ops' Triton kernels (models/lean_kernels.py) on a real GPU: each op (``ftprof::swiglu_lora_a``,
``ftprof::rmsnorm_lora_a``), which launches them on CUDA, against autograd on the eager computation it replaces,
at llama-8b's widths. bf16: nearly every value the same bits (the kernels round where eager rounds; exp and rsqrt may
differ in the last fp32 bit), none further than a bf16 step of the largest; fp32: within 1e-5 of the largest.
Run with ``pytest -m gpu``."""

import pytest
import torch
import torch.nn.functional as F

from ftprof.models import lean_kernels, lean_mlp, lean_norm

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _kernels_on(monkeypatch):
    """The kernels whether or not the ops launch them by default (lean_kernels.ON_CUDA)."""
    monkeypatch.setattr(lean_kernels, "ON_CUDA", True)

TOKENS, HIDDEN, INTERMEDIATE, RANK = 2 * 1000, 4096, 14336, 16  # 1000: rows that no power of two divides


def _mlp_inputs(dtype):
    gate, up = (torch.randn(TOKENS, INTERMEDIATE, device="cuda", dtype=dtype) * 3 for _ in range(2))
    return gate, up, torch.randn(RANK, INTERMEDIATE, device="cuda", dtype=dtype) / 64


def _norm_inputs(dtype):
    x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=dtype) * 3
    weight = torch.rand(HIDDEN, device="cuda", dtype=dtype) + 0.5
    return x, weight, torch.randn(3 * RANK, HIDDEN, device="cuda", dtype=dtype) / 64


def _eager_mlp(gate, up, lora_a):
    product = F.silu(gate) * up
    return product, F.linear(product, lora_a)


def _eager_norm(x, weight, lora_a, eps=1e-5):
    wide = x.to(torch.float32)
    out = weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return out, F.linear(out, lora_a)


def _outputs_and_grads(fn, inputs, trained):
    """The op's two outputs and the trained inputs' gradients, for a loss reading both outputs (the base consumer's
    gradient and the adapter's, summed inside the op's backward)."""
    leaves = [t.clone().requires_grad_(i in trained) for i, t in enumerate(inputs)]
    out, low = fn(*leaves)
    torch.manual_seed(1)
    grad_out, grad_low = torch.randn_like(out), torch.randn_like(low)
    grads = torch.autograd.grad([out, low], [leaves[i] for i in trained], [grad_out, grad_low])
    return (out, low, *grads)


def _check(got, want, dtype):
    """Close relative to each tensor's scale: the sums (A's gradient over 2,000 tokens, the norm's row sums) add in
    another order than eager's, and a value near zero in a tensor of hundreds is off by the others' rounding (first
    GPU run: 3e-5 in fp32 beside values of 80, one bf16 step of a value of 40)."""
    for g, w in zip(got, want, strict=True):
        scale = w.abs().max().item()
        if dtype == torch.float32:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * scale)
            continue
        torch.testing.assert_close(g, w, rtol=1.6e-2, atol=4e-3 * scale)  # within a bf16 step of the largest
        same = (g.view(torch.int16) == w.view(torch.int16)).float().mean().item()
        assert same >= 0.99, same  # a rounding left out would differ in a third or more


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_swiglu_kernels_are_eagers_product_and_gradients(dtype):
    torch.manual_seed(0)
    inputs = _mlp_inputs(dtype)
    got = _outputs_and_grads(lean_mlp.swiglu_lora_a, inputs, (0, 1, 2))
    _check(got, _outputs_and_grads(_eager_mlp, inputs, (0, 1, 2)), dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_rmsnorm_kernels_are_eagers_norm_and_gradients(dtype):
    torch.manual_seed(0)
    x, weight, lora_a = _norm_inputs(dtype)
    got = _outputs_and_grads(lambda x, w, a: lean_norm.rmsnorm_lora_a(x, w, 1e-5, a), (x, weight, lora_a), (0, 2))
    _check(got, _outputs_and_grads(_eager_norm, (x, weight, lora_a), (0, 2)), dtype)
