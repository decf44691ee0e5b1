"""bitsandbytes' blockwise 4-bit dequantization, as torch ops and as one Triton kernel (QLoRA,
``--dequant-kernel triton``).

Profiled on an H200 (llama-8b QLoRA, compiled blocks, 4 x 2048), bitsandbytes' ``kDequantizeBlockwise`` took 3.8% of
the step: 448 dequantizations of 31M-parameter weights on average, 42 us each, about 1.9 TB/s of the H200's 4.8
(it reads half a byte per value and writes two). Under double quantization bitsandbytes also runs two more
kernels per weight first (the 8-bit absmax dequantized, then the offset added). This kernel does all of it in one
pass, each program writing a contiguous run of 16-bit values.

The arithmetic is bitsandbytes': the block's absmax in fp32 (``code2[q] * absmax2[group] + offset`` under double
quantization, with the multiply and add rounded apart: the launch turns off Triton's fused multiply-add, which
would round once), times the 4-bit code's table value in fp32, rounded once to the weight dtype. The same bits
(tested against bitsandbytes on the GPU, nf4 and fp4, with and without double quantization).

The kernel is a torch custom op (``ftprof::dequantize_4bit``), so that compiled blocks see one opaque node. Off CUDA
the op runs the same arithmetic as torch ops (``blockwise``, also what ``--compile-dequant`` traces into compiled
blocks), which is what the CPU tests exercise.
"""

from __future__ import annotations

import functools

import torch

BYTES = 1024  # packed bytes per program: 2048 16-bit values written
WARPS = 4


@functools.cache  # (called at every launch: a hot path)
def _kernels():
    from ftprof.models import triton_kernels  # Triton only where a kernel launches

    return triton_kernels


def launcher(kernel, traced: bool):
    """``kernel`` as launched eagerly, or wrapped so that a ``triton_op``'s body traces into compiled code (the
    launch then comes from inductor's generated code, not from Python at each call)."""
    return torch.library.wrap_triton(kernel) if traced else kernel


@torch.library.custom_op("ftprof::dequantize_4bit", mutates_args=())
def dequantize_4bit(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, absmax2: torch.Tensor | None,
                    code2: torch.Tensor | None, offset: torch.Tensor | None, blocksize: int, blocksize2: int,
                    shape: list[int], dtype: torch.dtype, for_backward: bool) -> torch.Tensor:
    """The weight of ``shape`` in ``dtype``. ``absmax2``, ``code2``, ``offset`` (with ``blocksize2``) are double
    quantization's, None without it. ``for_backward`` changes nothing computed: a compiled graph would otherwise
    see the forward's and the backward's dequantization of one weight as one expression, merge them, and keep the
    16-bit weight from forward to backward (every layer's: the memory QLoRA exists to save)."""
    data = packed.reshape(-1).view(torch.uint8)
    if packed.device.type != "cuda":
        return blockwise(data, absmax, code, absmax2, code2, offset, blocksize, blocksize2, shape, dtype)
    out = torch.empty(shape, dtype=dtype, device=packed.device)
    with torch.cuda.device(packed.device):
        launch(data, absmax, code, absmax2, code2, offset, blocksize, blocksize2, out)
    return out


def launch(data, absmax, code, absmax2, code2, offset, blocksize: int, blocksize2: int, out: torch.Tensor,
           bytes_per_program: int | None = None, warps: int | None = None, columns: int = 0,
           inverse: torch.Tensor | None = None, traced: bool = False) -> None:
    """The kernel over ``data`` (packed bytes, two values each) into ``out``: ``data.numel() * 2`` values, or, with
    ``columns``, rows of that many values written into the left columns of ``out`` (a 2-D view, unit column stride).
    ``inverse`` (one fp32 factor per row of ``columns`` values) scales each row before the rounding to ``out``'s
    dtype (e4m3 rows for --fp8-base). ``traced``: launched from a ``triton_op`` (see ``launcher``)."""
    nested = absmax2 is not None
    size = bytes_per_program or BYTES
    strided = bool(columns) and out.stride(0) != columns
    one_row = inverse is not None and not strided and columns % (2 * size) == 0  # (the kernel's ONE_ROW)
    launcher(_kernels().dequantize_4bit_kernel, traced)[(-(-data.numel() // size),)](  # programs: ceil(bytes / size)
        data, absmax, code, absmax2 if nested else absmax, code2 if nested else code, offset if nested else absmax,
        out, data.numel(), columns or 1, out.stride(0) if strided else 1, inverse if inverse is not None else absmax,
        BLOCKSIZE=blocksize, BLOCKSIZE2=blocksize2 if nested else 1, NESTED=nested, BYTES=size, STRIDED=strided,
        ROW_SCALED=inverse is not None, ONE_ROW=one_row, num_warps=warps or WARPS, **_unfused(traced))


def _unfused(traced: bool) -> dict:
    """bitsandbytes rounds the nested absmax's multiply and add apart: eager launches turn off Triton's fused
    multiply-add. A traced launch is not given the option (inductor's launcher takes backend options only in later
    torch versions), so there the nested absmax may round once: an e4m3 weight (--fp8-base's compiled forward and
    backward, the only traced uses) may move by one step, rarely. The GPU tests bound compiled FP8 against eager FP8."""
    return {} if traced else {"enable_fp_fusion": False}


@dequantize_4bit.register_fake
def _(packed, absmax, code, absmax2, code2, offset, blocksize, blocksize2, shape, dtype, for_backward):
    return packed.new_empty(shape, dtype=dtype)


def blockwise(data: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, absmax2: torch.Tensor | None,
              code2: torch.Tensor | None, offset: torch.Tensor | None, blocksize: int, blocksize2: int,
              shape, dtype: torch.dtype) -> torch.Tensor:
    """The dequantization as torch ops, from the packed bytes (``data``, uint8): bitsandbytes' arithmetic (fp32
    product, one rounding to ``dtype``), for a whole number of blocks."""
    codes = torch.stack((data >> 4, data & 0xF), dim=-1).reshape(-1)  # the high nibble is the first value
    values = code[codes.long()]  # the 16-value table (nf4 or fp4), fp32
    scaled = values.view(-1, blocksize) * block_absmax(absmax, absmax2, code2, offset, blocksize2).view(-1, 1)
    return scaled.reshape(shape).to(dtype)


# The transposing kernel's program: rows of the weight, packed bytes of a row (two columns each), warps.
TRANSPOSED_TILE = (64, 64, 8)


def dequantize_fp8_transposed(data: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                              absmax2: torch.Tensor | None, code2: torch.Tensor | None, offset: torch.Tensor | None,
                              blocksize: int, blocksize2: int, shape: list[int], inverse: torch.Tensor,
                              after: torch.Tensor | None = None) -> torch.Tensor:
    """``fp8_rows_transposed`` on CUDA: one tiled Triton kernel, the same bits as the rows'. A row must hold whole
    bytes (an even number of columns). ``after`` (a traced backward's quantized gradient) is passed to the kernel
    unread and makes the launch traced (see ``launcher``): it ties the launch to the gradient, without which the
    compiler's partitioner, which recomputes no user kernel, runs it in the forward and keeps its output, every
    layer's e4m3 weight, until the backward."""
    rows, columns = shape
    assert columns % 2 == 0, shape
    nested = absmax2 is not None
    traced = after is not None
    out = torch.empty(columns, rows, dtype=torch.float8_e4m3fn, device=data.device)
    tile_rows, pairs, warps = TRANSPOSED_TILE
    grid = (-(-rows // tile_rows), -(-(columns // 2) // pairs))
    launcher(_kernels().dequantize_4bit_transposed_kernel, traced)[grid](
        data, absmax, code, absmax2 if nested else absmax, code2 if nested else code, offset if nested else absmax,
        inverse, out, rows, columns, after if traced else inverse, BLOCKSIZE=blocksize,
        BLOCKSIZE2=blocksize2 if nested else 1, NESTED=nested, ROWS=tile_rows, PAIRS=pairs, num_warps=warps,
        **_unfused(traced))
    return out


def fp8_rows(data: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, absmax2: torch.Tensor | None,
             code2: torch.Tensor | None, offset: torch.Tensor | None, blocksize: int, blocksize2: int,
             shape: list[int], inverse: torch.Tensor, traced: bool = False) -> torch.Tensor:
    """The weight of ``shape`` (rows x columns) from its packed bytes (``data``, uint8) as e4m3: each row's values
    times its ``inverse`` scale (fp32), one rounding to e4m3 (--fp8-base; models/fp8_base.py). A plain function,
    called inside the FP8 ops (models/fp8_kernels.py): the Triton kernel on CUDA, torch ops elsewhere."""
    if data.device.type != "cuda":
        values = blockwise(data, absmax, code, absmax2, code2, offset, blocksize, blocksize2, shape, torch.float32)
        return (values * inverse.view(-1, 1)).to(torch.float8_e4m3fn)
    out = torch.empty(shape, dtype=torch.float8_e4m3fn, device=data.device)
    launch(data, absmax, code, absmax2, code2, offset, blocksize, blocksize2, out, columns=shape[1], inverse=inverse,
           traced=traced)
    return out


def fp8_rows_transposed(data: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, absmax2: torch.Tensor | None,
                        code2: torch.Tensor | None, offset: torch.Tensor | None, blocksize: int, blocksize2: int,
                        shape: list[int], inverse: torch.Tensor, after: torch.Tensor | None = None) -> torch.Tensor:
    """The transpose (columns x rows, contiguous) of ``fp8_rows``: the input-gradient GEMM's operand
    (models/fp8_kernels.py). On CUDA one tiled kernel writes it straight from the packed bytes (a transposing
    copy of the rows took ~40 ms a step for llama-8b QLoRA on an H200); elsewhere the rows' transposing copy.
    ``after``: see ``dequantize_fp8_transposed``; off CUDA the torch ops are tied to it by arithmetic (a factor
    of exactly 1 unless ``after`` holds a NaN), as the partitioner would otherwise hoist them too."""
    if data.device.type != "cuda" or shape[1] % 2:
        if after is not None:
            inverse = inverse * (after.reshape(-1)[:1].float() * 0 + 1)
        return fp8_rows(data, absmax, code, absmax2, code2, offset, blocksize, blocksize2, shape, inverse) \
            .t().contiguous()
    return dequantize_fp8_transposed(data, absmax, code, absmax2, code2, offset, blocksize, blocksize2, shape,
                                     inverse, after)


def dequantize_fp8(packed: torch.Tensor, state, inverse: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """A bitsandbytes 4-bit weight as e4m3 rows, each scaled by its ``inverse`` (models/fp8_base.py), or their
    transpose."""
    rows = fp8_rows_transposed if transposed else fp8_rows
    return rows(packed.reshape(-1).view(torch.uint8), *state_args(state), list(state.shape), inverse)


def block_absmax(absmax: torch.Tensor, absmax2: torch.Tensor | None, code2: torch.Tensor | None,
                 offset: torch.Tensor | None, blocksize2: int) -> torch.Tensor:
    """Each block's absmax in fp32: as stored, or under double quantization (``absmax2`` given) an 8-bit code
    scaled per group of ``blocksize2`` blocks, plus an offset (bitsandbytes' arithmetic)."""
    if absmax2 is not None:
        group = torch.arange(absmax.numel(), device=absmax.device) // blocksize2
        absmax = code2[absmax.long()] * absmax2[group] + offset
    return absmax.float()


def state_args(state) -> tuple:
    """A QuantState as the op's arguments after the packed weight."""
    if not state.nested:
        return state.absmax, state.code, None, None, None, state.blocksize, 0
    inner = state.state2
    return state.absmax, state.code, inner.absmax, inner.code, state.offset, state.blocksize, inner.blocksize


def triton_dequantize(packed: torch.Tensor, state, for_backward: bool = False) -> torch.Tensor:
    """A bitsandbytes 4-bit weight (its packed tensor and QuantState), dequantized by the Triton kernel."""
    return torch.ops.ftprof.dequantize_4bit(packed, *state_args(state), list(state.shape), state.dtype,
                                            for_backward)


def torch_dequantize(packed: torch.Tensor, state) -> torch.Tensor:
    """The same, as torch ops."""
    return blockwise(packed.reshape(-1).view(torch.uint8), *state_args(state), state.shape, state.dtype)


def packed_columns(packed: torch.Tensor, rows: int) -> int:
    """The input features of a 4-bit weight of ``rows`` output features: two values per packed byte."""
    return packed.numel() * packed.element_size() * 2 // rows


def dequantize_rows(packed: list[torch.Tensor], absmax: list[torch.Tensor], code: list[torch.Tensor],
                    absmax2: list[torch.Tensor], code2: list[torch.Tensor], offset: list[torch.Tensor],
                    blocksize: int, blocksize2: int, rows: list[int], right: torch.Tensor) -> torch.Tensor:
    """Several 4-bit weights stacked by rows (``rows``: each one's output features), with ``right`` (sum(rows) x
    k, the output dtype) beside them: one (sum(rows), in_features + k) matrix, each weight dequantized straight
    into its place (models/fused_projections.py): the Triton kernel on CUDA, the same arithmetic as torch ops
    elsewhere. Double quantization's lists are empty without it. Every weight is a whole number of blocks."""
    nested = bool(absmax2)
    columns = packed_columns(packed[0], rows[0])
    out = torch.empty(sum(rows), columns + right.shape[1], dtype=right.dtype, device=right.device)
    start = 0
    for i, count in enumerate(rows):
        data = packed[i].reshape(-1).view(torch.uint8)
        inner = (absmax2[i], code2[i], offset[i]) if nested else (None, None, None)
        block = out[start:start + count, :columns]
        if data.device.type != "cuda":
            block.copy_(blockwise(data, absmax[i], code[i], *inner, blocksize, blocksize2, (count, columns),
                                  right.dtype))
        else:
            with torch.cuda.device(data.device):
                launch(data, absmax[i], code[i], *inner, blocksize, blocksize2, block, columns=columns)
        start += count
    out[:, columns:] = right
    return out


def quant_args(modules) -> tuple:
    """The packed weights and quantization states of bitsandbytes linears (with the same blocksizes), as
    ``dequantize_rows`` takes them after ``packed``: (absmax, code, absmax2, code2, offset, blocksize,
    blocksize2), the lists of double quantization empty without it."""
    states = [m.weight.quant_state for m in modules]
    args = [state_args(s) for s in states]
    nested = states[0].nested
    return ([a[0] for a in args], [a[1] for a in args], [a[2] for a in args] if nested else [],
            [a[3] for a in args] if nested else [], [a[4] for a in args] if nested else [], args[0][5], args[0][6])
