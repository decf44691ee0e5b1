"""The lean ops' Triton kernels (models/lean_kernels.py) on the CPU, through Triton's interpreter (TRITON_INTERPRET=1,
set before Triton is imported: a child process), against the torch ops they replace on CUDA: fp32, where the
interpreter rounds as torch does (its bf16 rounding truncates; the GPU tests check bf16 on a GPU)."""

import textwrap

import pytest

from tests.requires import requires
from tests.triton_interpreter import run_in_interpreter

CHILD = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from ftprof.models import lean_kernels as lk

    def close(got, want, what):
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6, msg=lambda m: f"{what}: {m}")

    def autograd(fn, inputs, grad):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = fn(*leaves)
        return (out, *torch.autograd.grad(out, leaves, grad))

    def norm(x, weight, eps=1e-5):
        wide = x.to(torch.float32)
        return weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    torch.manual_seed(0)
    for n in (700, 4096 + 5):  # a partial program, and several programs
        gate, up, grad, grad2 = (torch.randn(3, n) * 4 for _ in range(4))
        close(lk.swiglu(gate, up), F.silu(gate) * up, "product")
        for second in (grad2, None):
            total = grad if second is None else grad + second
            product, d_gate, d_up = autograd(lambda g, u: F.silu(g) * u, (gate, up), total)
            got_gate, got_up, got_product = lk.swiglu_backward(gate, up, grad, second)
            for got, want, what in ((got_gate, d_gate, "gate"), (got_up, d_up, "up"), (got_product, product, "again")):
                close(got, want, what)
    for columns in (96, 100):  # a row of a power of two, and one the block pads
        x, grad, grad2 = (torch.randn(2, 5, columns) * 3 for _ in range(3))
        weight = torch.rand(columns) + 0.5
        close(lk.rmsnorm(x, weight, 1e-5, torch.float32), norm(x, weight), "norm")
        for second in (grad2, None):
            total = grad if second is None else grad + second
            out, d_x = autograd(lambda t: norm(t, weight), (x,), total)
            got_x, got_out = lk.rmsnorm_backward(x, weight, 1e-5, grad, second)
            close(got_x, d_x, "x")
            close(got_out, out, "norm again")
    print("close")
''')


@pytest.mark.slow
@requires("triton")
def test_the_kernels_are_the_torch_ops_in_tritons_interpreter():
    done = run_in_interpreter(CHILD)
    assert done.returncode == 0 and "close" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("op", ["swiglu", "rmsnorm"])
def test_the_ops_backward_traces_with_fake_cuda_tensors_when_the_kernels_are_on(op, monkeypatch):
    """--compile traces the lean ops' autograd formulas with fake tensors: with the kernels on, their launches must
    be ops with a fake implementation (a Triton launch on fake tensors failed that trace on the GPU, and the compiled
    layers fell back to slower code). Fake CUDA tensors need no GPU; the formula is called as the trace calls it."""
    from types import SimpleNamespace

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ftprof import runtime
    from ftprof.models import lean_kernels, lean_mlp, lean_norm

    monkeypatch.setattr(lean_kernels, "ON_CUDA", True)
    monkeypatch.setattr(runtime, "triton_installed", lambda: True)  # (the launch is never reached: a fake op)
    with FakeTensorMode():
        cuda = {"device": "cuda", "dtype": torch.bfloat16}
        if op == "swiglu":
            saved = (torch.empty(2, 8, 64, **cuda), torch.empty(2, 8, 64, **cuda), torch.empty(4, 64, **cuda))
            ctx, backward = SimpleNamespace(saved_tensors=saved), lean_mlp._backward
        else:
            saved = (torch.empty(2, 8, 64, **cuda), torch.empty(64, **cuda), torch.empty(12, 64, **cuda))
            ctx, backward = SimpleNamespace(saved_tensors=saved, eps=1e-5), lean_norm._backward
        grads = backward(ctx, torch.empty(2, 8, 64, **cuda), torch.empty(2, 8, saved[-1].shape[0], **cuda))
    wanted = [saved[0].shape, saved[1].shape, saved[2].shape] if op == "swiglu" else [saved[0].shape, None, None,
                                                                                       saved[2].shape]
    assert [None if g is None else g.shape for g in grads] == wanted


def test_without_triton_the_ops_run_their_torch_ops_on_cuda(monkeypatch):
    """A CUDA machine without Triton (it is torch's dependency on Linux x86, not everywhere): the torch ops."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ftprof import runtime
    from ftprof.models import lean_kernels

    monkeypatch.setattr(lean_kernels, "ON_CUDA", True)
    with FakeTensorMode():
        cuda = torch.empty(2, 4, device="cuda")
    monkeypatch.setattr(runtime, "triton_installed", lambda: False)
    assert not lean_kernels.wanted(cuda)
    monkeypatch.setattr(runtime, "triton_installed", lambda: True)
    assert lean_kernels.wanted(cuda) and not lean_kernels.wanted(torch.empty(2, 4))
