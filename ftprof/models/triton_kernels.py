"""ftprof's Triton kernels, in one module that imports Triton at the top: models/dequant_kernels.py and
models/fp8_kernels.py import it only where a kernel launches (on CUDA, or under Triton's interpreter in the CPU
tests), so that the rest of ftprof imports without Triton. Those modules say what each kernel is for and how its
bits were checked; the arithmetic shared by the two 4-bit kernels is one function here (``_pair``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _pair(packed, absmax, code, absmax2, code2, offset, index, inside, BLOCKSIZE: tl.constexpr,
          BLOCKSIZE2: tl.constexpr, NESTED: tl.constexpr):
    """The two fp32 values of each packed byte at ``index`` (any shape), the first and the second apart:
    bitsandbytes' arithmetic (the 4-bit code's table value times its block's absmax)."""
    byte = tl.load(packed + index, mask=inside, other=0).to(tl.int32)
    first = tl.load(code + (byte >> 4), mask=inside, other=0.0)  # the high nibble holds the first value
    second = tl.load(code + (byte & 0xF), mask=inside, other=0.0)
    block = index // (BLOCKSIZE // 2)  # a block's values never straddle a byte
    if NESTED:  # the block's absmax is an 8-bit code, scaled per group of BLOCKSIZE2 blocks, plus an offset
        q = tl.load(absmax + block, mask=inside, other=0).to(tl.int32)
        scale = tl.load(code2 + q, mask=inside, other=0.0) * tl.load(absmax2 + block // BLOCKSIZE2, mask=inside,
                                                                     other=0.0)
        scale = scale + tl.load(offset)
    else:
        scale = tl.load(absmax + block, mask=inside, other=0.0)
    return first * scale, second * scale


@triton.jit
def _values(packed, absmax, code, absmax2, code2, offset, index, inside, BLOCKSIZE: tl.constexpr,
            BLOCKSIZE2: tl.constexpr, NESTED: tl.constexpr):
    """``_pair``'s two values interleaved along the last dimension (the weight's order)."""
    first, second = _pair(packed, absmax, code, absmax2, code2, offset, index, inside, BLOCKSIZE, BLOCKSIZE2, NESTED)
    return tl.interleave(first, second)


@triton.jit
def dequantize_4bit_kernel(packed, absmax, code, absmax2, code2, offset, out, n_bytes, columns, row_stride, inverse,
                           BLOCKSIZE: tl.constexpr, BLOCKSIZE2: tl.constexpr, NESTED: tl.constexpr,
                           BYTES: tl.constexpr, STRIDED: tl.constexpr, ROW_SCALED: tl.constexpr,
                           ONE_ROW: tl.constexpr):
    """Each program a run of BYTES packed bytes into 2 x BYTES contiguous values of ``out``. ONE_ROW: each
    program's values lie in one row (``columns`` a multiple of 2 x BYTES), whose ROW_SCALED factor is then one
    scalar load, not an int64 division and a gather per value."""
    index = tl.program_id(0).to(tl.int64) * BYTES + tl.arange(0, BYTES)
    values = _values(packed, absmax, code, absmax2, code2, offset, index, index < n_bytes, BLOCKSIZE, BLOCKSIZE2,
                     NESTED)
    where = tl.program_id(0).to(tl.int64) * (2 * BYTES) + tl.arange(0, 2 * BYTES)
    inside = where < 2 * n_bytes
    if ROW_SCALED and ONE_ROW:  # e4m3 rows (--fp8-base): each value times its row's inverse scale, in fp32
        values = values * tl.load(inverse + tl.program_id(0).to(tl.int64) * (2 * BYTES) // columns)
    elif ROW_SCALED:
        values = values * tl.load(inverse + where // columns, mask=inside, other=0.0)
    values = values.to(out.dtype.element_ty)
    if STRIDED:  # the weight's rows land ``row_stride`` apart: the left columns of a wider matrix
        where = (where // columns) * row_stride + where % columns
    tl.store(out + where, values, mask=inside)


@triton.jit
def dequantize_4bit_transposed_kernel(packed, absmax, code, absmax2, code2, offset, inverse, out, rows, columns,
                                      after, BLOCKSIZE: tl.constexpr, BLOCKSIZE2: tl.constexpr,
                                      NESTED: tl.constexpr, ROWS: tl.constexpr, PAIRS: tl.constexpr):
    """Each program ROWS rows x PAIRS packed bytes of the weight (rows x columns), written as its transpose (columns
    x rows): dequantize_4bit_kernel's ROW_SCALED values (e4m3). The tile is indexed in the output's orientation
    (bytes x rows) and each byte's two values are stored as two output rows: no interleave and no explicit
    transpose, Triton's layout conversion moves the tile through shared memory once per store. ``after`` is not
    read: a tensor the launch must wait for in a traced graph (see dequant_kernels.dequantize_fp8_transposed)."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    pair = tl.program_id(1).to(tl.int64) * PAIRS + tl.arange(0, PAIRS)  # byte columns of a row
    inside = (pair[:, None] < columns // 2) & (row[None, :] < rows)
    index = row[None, :] * (columns // 2) + pair[:, None]  # the packed byte (rows hold whole bytes)
    first, second = _pair(packed, absmax, code, absmax2, code2, offset, index, inside, BLOCKSIZE, BLOCKSIZE2, NESTED)
    factor = tl.load(inverse + row, mask=row < rows, other=0.0)[None, :]
    where = (2 * pair[:, None]) * rows + row[None, :]  # the first value's output row, then the second's
    tl.store(out + where, (first * factor).to(out.dtype.element_ty), mask=inside)
    tl.store(out + where + rows, (second * factor).to(out.dtype.element_ty), mask=inside)


@triton.jit
def quantize_rows_kernel(src, column_scale, values, scales, columns, stride, SCALED: tl.constexpr,
                         BLOCK: tl.constexpr, TINY: tl.constexpr, E4M3_MAX: tl.constexpr):
    """Each program one row: its absmax (times ``column_scale`` if SCALED), its scale, its e4m3 values; IEEE
    divisions, as the torch ops."""
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK)
    inside = offsets < columns
    t = tl.load(src + row * stride + offsets, mask=inside, other=0.0).to(tl.float32)
    if SCALED:
        t = t * tl.load(column_scale + offsets, mask=inside, other=0.0)
    scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(t), axis=0), TINY), E4M3_MAX)
    quantized = tl.minimum(tl.maximum(tl.math.div_rn(t, scale), -E4M3_MAX), E4M3_MAX)
    tl.store(values + row * columns + offsets, quantized.to(values.dtype.element_ty), mask=inside)
    tl.store(scales + row, scale)
