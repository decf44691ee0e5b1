"""The lean ops' elementwise work as Triton kernels on CUDA (``--lean-activations``: models/lean_mlp.py,
``--lean-norms``: models/lean_norm.py).

The ops are opaque to the compiler, so their elementwise work runs outside the compiled layer's fused kernels. As
torch ops it was a pass per operation, and more in backward: round 29 measured the product at -2.7% tokens/s and
the norms at -4.6% more on an H100 (llama-8b QLoRA, CUDA graphs). Here each op's forward is one kernel, and each
backward one kernel that adds the two incoming gradients (the projection's and the adapter's), forms the kept-less
tensor again for LoRA A's weight gradient and writes the inputs' gradients: one read of each input and one write of
each output.

The arithmetic is the torch ops', in fp32, rounded to the run's dtype wherever eager rounds an intermediate (silu
before the product, the summed gradient, mul's gradient; the norm's normalized value before the weight). The GPU
tests check the kernels against the torch ops (tests/gpu/test_gpu_lean_kernels.py), the CPU tests in Triton's
interpreter (tests/models/test_lean_kernels.py). Off CUDA the ops run their torch ops.

Measured on an H200 (llama-8b QLoRA 4 x 2048, Liger, CUDA graphs, no checkpointing; BENCHMARKS.md round 30): the
product costs 1.1% tokens/s with them, both options 2.3% (as torch ops on an H100, round 29: 2.7% and 7.2%; not
rerun as torch ops on the H200).
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch

from ftprof import runtime

# Whether the lean ops launch these kernels on CUDA (else their torch ops there too). On since their GPU checks
# passed on an H200 (round 30: tests/gpu/test_gpu_lean_kernels.py, and the lean cases of test_gpu_fast_paths.py with
# them on); FTPROF_LEAN_KERNELS=0 runs the torch ops instead (to compare, or to rule the kernels out).
ON_CUDA = os.environ.get("FTPROF_LEAN_KERNELS", "1") != "0"
ELEMENTS = 2048  # values a program of the elementwise kernels
WARPS = 8


@functools.cache  # (called at every launch: a hot path)
def _kernels():
    from ftprof.models import triton_kernels  # Triton only where a kernel launches

    return triton_kernels


def wanted(t: torch.Tensor) -> bool:
    """Whether an op on ``t`` launches the kernels (on CUDA where Triton is installed: else the torch ops)."""
    return ON_CUDA and t.is_cuda and runtime.triton_installed()


def _device(t: torch.Tensor):
    """``t``'s GPU as the current device: Triton launches there (off CUDA, Triton's interpreter in the tests)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _blocks(n: int) -> tuple[int]:
    return (-(-n // ELEMENTS),)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up (contiguous, of one shape and dtype)."""
    product = torch.empty_like(gate)
    if gate.numel():
        with _device(gate):
            _kernels().swiglu_forward_kernel[_blocks(gate.numel())](gate, up, product, gate.numel(), BLOCK=ELEMENTS,
                                                                   num_warps=WARPS)
    return product


# The backward launchers are custom ops of their own: the lean ops' autograd formulas (register_autograd) are traced
# with fake tensors under --compile, where a Triton launch cannot run. As plain functions they failed that trace
# (first GPU run, round 30: "Error detected in GeneratedBackwardFor_ftprof_swiglu_lora_a_defaultBackward"), and the
# compiled layers fell back to slower code: -21% tokens/s instead of the kernels' gain.
@torch.library.custom_op("ftprof::lean_swiglu_backward", mutates_args=())
def swiglu_backward(gate: torch.Tensor, up: torch.Tensor, grad: torch.Tensor,
                    grad2: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gate's gradient, up's gradient, the product) for the product's gradient ``grad`` (+ ``grad2``)."""
    grad_gate, grad_up, product = torch.empty_like(gate), torch.empty_like(up), torch.empty_like(gate)
    if gate.numel():
        with _device(gate):
            _kernels().swiglu_backward_kernel[_blocks(gate.numel())](
                gate, up, grad, grad if grad2 is None else grad2, grad_gate, grad_up, product, gate.numel(),
                TWO=grad2 is not None, BLOCK=ELEMENTS, num_warps=WARPS)
    return grad_gate, grad_up, product


@swiglu_backward.register_fake
def _(gate, up, grad, grad2):
    return torch.empty_like(gate), torch.empty_like(up), torch.empty_like(gate)


def _row_launch(x: torch.Tensor) -> dict:
    """One program a row of ``x``'s last dimension (a power of two wide block; wider rows, more warps)."""
    block = 1 << max(x.shape[-1] - 1, 1).bit_length()
    return {"BLOCK": block, "num_warps": min(16, max(1, block // 256))}


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """HF's RMSNorm of ``x`` (contiguous) times ``weight``, in ``dtype`` (x's and the weight's promoted)."""
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    columns = x.shape[-1]
    if x.numel():
        with _device(x):
            _kernels().rmsnorm_forward_kernel[(x.numel() // columns,)](x, weight, out, columns, eps, **_row_launch(x))
    return out


@torch.library.custom_op("ftprof::lean_rmsnorm_backward", mutates_args=())  # (a custom op: see swiglu_backward)
def rmsnorm_backward(x: torch.Tensor, weight: torch.Tensor, eps: float, grad: torch.Tensor,
                     grad2: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x's gradient, the norm's output formed again) for the output's gradient ``grad`` (+ ``grad2``)."""
    grad_x, out = torch.empty_like(x), torch.empty(x.shape, dtype=grad.dtype, device=x.device)
    columns = x.shape[-1]
    if x.numel():
        with _device(x):
            _kernels().rmsnorm_backward_kernel[(x.numel() // columns,)](
                x, weight, grad, grad if grad2 is None else grad2, grad_x, out, columns, eps, TWO=grad2 is not None,
                **_row_launch(x))
    return grad_x, out


@rmsnorm_backward.register_fake
def _(x, weight, eps, grad, grad2):
    return torch.empty_like(x), torch.empty(x.shape, dtype=grad.dtype, device=x.device)
