"""The e4m3 matmul of a frozen weight and its input gradient as torch custom ops (``--fp8-base``;
models/fp8_base.py says what they compute and why).

Eager, the ops are opaque (``ftprof::fp8_linear``, ``ftprof::fp8_linear_input_grad``), with every tensor they read
passed in, and their autograd is the op's: traced by inductor on the GPU, an autograd.Function of the same
arithmetic trained correctly as compiled blocks but lost its LoRA gradients under compiled children with
checkpointing and as CUDA graphs (H200, 2026-12-02; the CPU compiled it correctly). Inside an op the rows of an
activation or gradient are quantized by one Triton kernel on CUDA (each program one row: its absmax, its scale, its
e4m3 values), by torch ops elsewhere: the same arithmetic, IEEE divisions in both.

In compiled code the input's quantization is traced instead (``torch_quantize_rows``), and ``fp8_linear_quantized``
takes its e4m3 rows: inductor fuses it into the kernel that made the tensor (the norm, the SwiGLU product) and
quantizes an input that q, k and v (gate and up) share once. Under full checkpointing, where the host's launches
limited an H200, llama-8b QLoRA ran 13,012 tokens/s against 12,264 with the op quantizing (two calls, 2026-12-04);
as CUDA graphs, 1 x 4, 15,500 against 15,371 (one call). Compiled runs round where eager rounds
(engine/compile.eager_rounding), so the traced quantization reads the same bf16 values as the op.

The forward op compiled code calls (``fp8_linear_quantized``) is a ``triton_op``: the compiler sees into it, so a
4-bit weight's dequantization kernel launches from the compiled code and the GEMM is aten's ``_scaled_mm``, with no
Python op call per linear forward (two a step under full checkpointing: forward and recomputation). Under full
checkpointing on an H200 (llama-8b QLoRA 4 x 2048) that took FP8 from 13,573 to 14,711 tokens/s, NVML busy from
84-88% to 98% (one call, 2026-12-04). Its backward is traced the same way (``_traced_backward``): the eager op's
kernels launched from a ``triton_op`` (``fp8_linear_input_grad_traced``), the transposing dequantization tied to
the gradient, so that the partitioner cannot move it into the forward and keep its output. Eager runs keep one
opaque op per linear, forward and backward.

A weight is either dense (its e4m3 rows and their transpose, made once) or a bitsandbytes 4-bit weight (``quant``:
absmax, table, inverse row scales, then double quantization's absmax, table and offset), dequantized into e4m3 on
each use by models/dequant_kernels.py: rows forward, their transpose backward. Those are plain functions called
inside the ops (a nested op would pay the dispatcher again: each linear runs these ops three times a step under full
checkpointing, where the host's launch work already outlasted the GPU's).
"""

from __future__ import annotations

import contextlib

import torch

from ftprof.models import dequant_kernels, recompute

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
TINY = 1e-12  # an all-zero row's scale: its values stay zero


def quantize_rows(t: torch.Tensor, column_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A 2-D tensor (times ``column_scale``, one factor per column, if given) as e4m3 values and fp32 row scales
    (rows x 1): ``t * column_scale ~= values * scale``, each row's largest value at e4m3's largest, 448."""
    with _device(t):
        return _quantize_rows(t, column_scale)


def _quantize_rows(t: torch.Tensor, column_scale: torch.Tensor | None,
                   traced: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows`` inside an op, which has made ``t``'s device the current one (``traced``: a ``triton_op``,
    whose kernel launches from compiled code)."""
    if t.device.type == "cuda":
        return _triton_quantize_rows(t, column_scale, traced)
    return torch_quantize_rows(t, column_scale)


def torch_quantize_rows(t: torch.Tensor, column_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows`` in torch ops: off CUDA, and in compiled code, where inductor fuses them into the kernel
    that made ``t`` and computes them once for every projection of the same input."""
    t = t.float()
    if column_scale is not None:
        t = t * column_scale.view(1, -1)
    scale = t.abs().amax(dim=-1, keepdim=True).clamp(min=TINY) / E4M3_MAX
    return (t / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def _triton_quantize_rows(t: torch.Tensor, column_scale: torch.Tensor | None,
                          traced: bool) -> tuple[torch.Tensor, torch.Tensor]:
    import triton

    from ftprof.models.triton_kernels import quantize_rows_kernel  # Triton only where a kernel launches

    assert t.dim() == 2 and t.stride(1) == 1, t.stride()
    rows, columns = t.shape
    values = torch.empty(rows, columns, dtype=E4M3, device=t.device)
    scales = torch.empty(rows, 1, dtype=torch.float32, device=t.device)
    block = triton.next_power_of_2(columns)
    scaled = column_scale is not None
    dequant_kernels.launcher(quantize_rows_kernel, traced)[(rows,)](
        t, column_scale.reshape(-1) if scaled else scales, values, scales, columns, t.stride(0), SCALED=scaled,
        BLOCK=block, TINY=TINY, E4M3_MAX=E4M3_MAX, num_warps=16 if block >= 8192 else 8 if block >= 2048 else 4)
    return values, scales


def rows(weight: torch.Tensor, quant: list[torch.Tensor], blocksize: int, blocksize2: int, shape: list[int],
         transposed: bool = False, traced: bool = False, after: torch.Tensor | None = None) -> torch.Tensor:
    """The weight's e4m3 rows (out x in), or with ``transposed`` their transpose (in x out, contiguous),
    dequantized from its 4-bit packing, each row scaled by its inverse scale; ``weight`` itself when dense
    (``quant`` empty, rows only). ``traced``: inside a ``triton_op``; the transpose's traced launch is tied to
    ``after`` (dequant_kernels.dequantize_fp8_transposed says why)."""
    if not quant:
        return weight
    absmax, code, inverse, *inner = quant
    absmax2, code2, offset = inner or (None, None, None)
    data = weight.reshape(-1).view(torch.uint8)
    if transposed:
        return dequant_kernels.fp8_rows_transposed(data, absmax, code, absmax2, code2, offset, blocksize, blocksize2,
                                                   shape, inverse, after)
    return dequant_kernels.fp8_rows(data, absmax, code, absmax2, code2, offset, blocksize, blocksize2, shape, inverse,
                                    traced=traced)


def _device(t: torch.Tensor):
    """The op's device as the current one, where its Triton kernels launch (once per op, not per kernel)."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


@torch.library.custom_op("ftprof::fp8_linear", mutates_args=())
def fp8_linear(x: torch.Tensor, weight: torch.Tensor, transposed: torch.Tensor | None, scale: torch.Tensor,
               ones: torch.Tensor, quant: list[torch.Tensor], blocksize: int, blocksize2: int,
               shape: list[int]) -> torch.Tensor:
    """``x @ W^T`` in bf16 from rowwise-scaled e4m3 operands: ``x`` (tokens x in) quantized by rows, W's rows
    (``scale``: 1 x out). ``transposed`` and ``ones`` serve the backward (see ``fp8_linear_input_grad``)."""
    return _fp8_matmul(x, weight, scale, quant, blocksize, blocksize2, shape)


def _fp8_matmul(x, weight, scale, quant, blocksize: int, blocksize2: int, shape: list[int]) -> torch.Tensor:
    with _device(x):
        values, x_scale = _quantize_rows(x, None)
        weight_rows = rows(weight, quant, blocksize, blocksize2, shape)
        return torch._scaled_mm(values, weight_rows.t(), scale_a=x_scale, scale_b=scale, out_dtype=torch.bfloat16)


@fp8_linear.register_fake
def _fake_linear(x, weight, transposed, scale, ones, quant, blocksize, blocksize2, shape):
    return x.new_empty((x.shape[0], scale.shape[1]), dtype=torch.bfloat16)


@torch.library.custom_op("ftprof::fp8_output_linear", mutates_args=())
def fp8_output_linear(x: torch.Tensor, weight: torch.Tensor, transposed: torch.Tensor | None, scale: torch.Tensor,
                      ones: torch.Tensor, quant: list[torch.Tensor], blocksize: int, blocksize2: int,
                      shape: list[int]) -> torch.Tensor:
    """``fp8_linear`` for a layer's output projection under --lean-recompute: opaque to compiled code as well, so
    that the recomputation (the same compiled code) skips the matmul at run time (models/recompute.py)."""
    if recompute.skips(x):
        return recompute.skipped(x, scale.shape[1], torch.bfloat16)
    return _fp8_matmul(x, weight, scale, quant, blocksize, blocksize2, shape)


fp8_output_linear.register_fake(_fake_linear)


@torch.library.custom_op("ftprof::fp8_linear_input_grad", mutates_args=())
def fp8_linear_input_grad(grad: torch.Tensor, weight: torch.Tensor, transposed: torch.Tensor | None,
                          scale: torch.Tensor, ones: torch.Tensor, quant: list[torch.Tensor], blocksize: int,
                          blocksize2: int, shape: list[int]) -> torch.Tensor:
    """``dy W`` in bf16 as ``(dy * s_W) Wq``: the weight's row scale folded into the gradient before its rows are
    quantized (the GEMM reduces over W's rows, so their scale cannot ride on the output side), times the e4m3
    rows, whose transpose (in x out, contiguous) is the column-major operand; ``ones``: 1 x in."""
    return _input_grad(grad, weight, transposed, scale, ones, quant, blocksize, blocksize2, shape, traced=False)


def _input_grad(grad, weight, transposed, scale, ones, quant, blocksize, blocksize2, shape, traced: bool):
    """The input-gradient ops' body; ``traced``: inside a ``triton_op``."""
    with _device(grad):
        values, grad_scale = _quantize_rows(grad, scale, traced)
        return _input_grad_mm(values, grad_scale, weight, transposed, ones, quant, blocksize, blocksize2, shape,
                              traced)


def _input_grad_mm(values, grad_scale, weight, transposed, ones, quant, blocksize, blocksize2, shape,
                   traced: bool = False) -> torch.Tensor:
    """The input gradient's GEMM from the quantized gradient: its rows times the weight's e4m3 rows, whose
    transpose is the column-major operand (kept, or dequantized from 4 bits here; ``traced``: inside a
    ``triton_op``, the dequantization tied to the gradient)."""
    if transposed is None:
        tie = values if traced else None
        transposed = rows(weight, quant, blocksize, blocksize2, shape, transposed=True, after=tie)
    return torch._scaled_mm(values, transposed.t(), scale_a=grad_scale, scale_b=ones, out_dtype=torch.bfloat16)


@fp8_linear_input_grad.register_fake
def _(grad, weight, transposed, scale, ones, quant, blocksize, blocksize2, shape):
    return grad.new_empty((grad.shape[0], ones.shape[1]), dtype=torch.bfloat16)


@torch.library.triton_op("ftprof::fp8_linear_quantized", mutates_args=())
def fp8_linear_quantized(x: torch.Tensor, values: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                         transposed: torch.Tensor | None, scale: torch.Tensor, ones: torch.Tensor,
                         quant: list[torch.Tensor], blocksize: int, blocksize2: int, shape: list[int]) -> torch.Tensor:
    """``fp8_linear`` with its input already quantized (``values`` and ``x_scale``, as ``torch_quantize_rows``
    makes them in compiled code): ``x`` itself is not read, it is there to receive the input gradient. A
    ``triton_op``: compiled code sees into it (see the module's docstring)."""
    with _device(values):
        weight_rows = rows(weight, quant, blocksize, blocksize2, shape, traced=True)
        return torch._scaled_mm(values, weight_rows.t(), scale_a=x_scale, scale_b=scale, out_dtype=torch.bfloat16)


@torch.library.triton_op("ftprof::fp8_linear_input_grad_traced", mutates_args=())
def fp8_linear_input_grad_traced(grad: torch.Tensor, weight: torch.Tensor, transposed: torch.Tensor | None,
                                 scale: torch.Tensor, ones: torch.Tensor, quant: list[torch.Tensor], blocksize: int,
                                 blocksize2: int, shape: list[int]) -> torch.Tensor:
    """``fp8_linear_input_grad`` as a ``triton_op``: the same kernels (the gradient's rows quantized in one pass,
    the 4-bit weight's transposing dequantization, the GEMM), launched from the compiled code that calls it."""
    return _input_grad(grad, weight, transposed, scale, ones, quant, blocksize, blocksize2, shape, traced=True)


# the ops' arguments after the input: weight, transposed, scale, ones, quant, blocksize, blocksize2, shape
WEIGHT_ARGS = 8


def _setup_context(ctx, inputs, output):
    weight, transposed, scale, ones, quant, blocksize, blocksize2, shape = inputs[-WEIGHT_ARGS:]
    ctx.leading = len(inputs) - WEIGHT_ARGS  # x, or x, values and x_scale
    ctx.dense, ctx.quant_count = transposed is not None, len(quant)
    ctx.blocksize, ctx.blocksize2, ctx.shape = blocksize, blocksize2, shape
    ctx.save_for_backward(weight, scale, ones, *([transposed] if transposed is not None else []), *quant)


def _saved(ctx) -> tuple:
    weight, scale, ones, *rest = ctx.saved_tensors
    transposed = rest.pop(0) if ctx.dense else None
    return weight, transposed, scale, ones, rest


def _gradients(ctx, grad_in) -> tuple:
    """The op's input gradient in the structure of its inputs: the tensor list stays a list (``shape`` is never
    empty: one leaf)."""
    return grad_in, *[None] * (ctx.leading - 1), None, None, None, None, [None] * ctx.quant_count, None, None, None


def _backward(ctx, grad):
    """Eager: one opaque op (one dispatch; the gradient quantized by a Triton kernel inside it)."""
    weight, transposed, scale, ones, quant = _saved(ctx)
    return _gradients(ctx, torch.ops.ftprof.fp8_linear_input_grad(grad, weight, transposed, scale, ones, quant,
                                                                  ctx.blocksize, ctx.blocksize2, ctx.shape))


def _traced_backward(ctx, grad):
    """Compiled (the backward of ``fp8_linear_quantized``, which only compiled code calls): the eager op's kernels
    from a ``triton_op``, with no Python op call per linear (torch 2.11 traces an op's backward where
    ``torch.compiler.is_compiling()`` is False: the choice is made by which op the forward called, not by that
    flag). The gradient is quantized by the Triton kernel, not by traced torch ops: on an H200 inductor's form of
    it held a gradient-sized fp32 temporary (+0.88 GiB at the peak, llama-8b 4 x 2048 under full checkpointing)
    and ran micro-batch 1 5% slower (one call, 2026-12-04)."""
    weight, transposed, scale, ones, quant = _saved(ctx)
    return _gradients(ctx, torch.ops.ftprof.fp8_linear_input_grad_traced(grad, weight, transposed, scale, ones, quant,
                                                                         ctx.blocksize, ctx.blocksize2, ctx.shape))


fp8_linear.register_autograd(_backward, setup_context=_setup_context)
fp8_output_linear.register_autograd(_backward, setup_context=_setup_context)
fp8_linear_quantized.register_autograd(_traced_backward, setup_context=_setup_context)
