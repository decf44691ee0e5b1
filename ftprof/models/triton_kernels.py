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


@triton.jit
def _rounded(value, like):
    """``value`` (fp32) rounded to ``like``'s dtype and widened again: where eager rounds an intermediate."""
    return value.to(like.dtype).to(tl.float32)


@triton.jit
def _silu(gate):
    """torch's SiLU in fp32: x / (1 + exp(-x)) (its formula, not x * sigmoid(x), which rounds differently)."""
    return gate / (1.0 + tl.exp(-gate))


@triton.jit
def swiglu_forward_kernel(gate, up, product, n, BLOCK: tl.constexpr):
    """silu(gate) * up over ``n`` values, rounded where eager rounds: silu to the dtype, then the product
    (models/lean_kernels.py)."""
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = index < n
    g = tl.load(gate + index, mask=inside, other=0.0)
    u = tl.load(up + index, mask=inside, other=0.0)
    silu = _rounded(_silu(g.to(tl.float32)), g)
    tl.store(product + index, (silu * u.to(tl.float32)).to(product.dtype.element_ty), mask=inside)


@triton.jit
def swiglu_backward_kernel(gate, up, grad, grad2, grad_gate, grad_up, product, n, TWO: tl.constexpr,
                           BLOCK: tl.constexpr):
    """One pass of the SwiGLU product's backward: the incoming gradient (``grad``, plus ``grad2`` if TWO, added
    and rounded as eager adds them), then mul's and silu's backward, and the product formed again (for LoRA A's
    weight gradient), each rounded where eager rounds (models/lean_kernels.py)."""
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = index < n
    g = tl.load(gate + index, mask=inside, other=0.0)
    wide = g.to(tl.float32)
    u = tl.load(up + index, mask=inside, other=0.0).to(tl.float32)
    dy = tl.load(grad + index, mask=inside, other=0.0).to(tl.float32)
    if TWO:
        dy = _rounded(dy + tl.load(grad2 + index, mask=inside, other=0.0).to(tl.float32), g)
    sigmoid = 1.0 / (1.0 + tl.exp(-wide))
    silu = _rounded(_silu(wide), g)
    d_silu = _rounded(dy * u, g)  # mul's backward: the gradient times the other factor, rounded
    d_gate = d_silu * sigmoid * (1.0 + wide * (1.0 - sigmoid))  # silu_backward's formula
    tl.store(grad_gate + index, d_gate.to(grad_gate.dtype.element_ty), mask=inside)
    tl.store(grad_up + index, (dy * silu).to(grad_up.dtype.element_ty), mask=inside)
    tl.store(product + index, (silu * u).to(product.dtype.element_ty), mask=inside)


@triton.jit
def _rms_row(x, weight, row, columns, eps, BLOCK: tl.constexpr):
    """A row of HF's RMSNorm: (x in fp32, its reciprocal RMS, the output in fp32 before its rounding, the weight in
    fp32, the mask)."""
    offsets = tl.arange(0, BLOCK)
    inside = offsets < columns
    raw = tl.load(x + row * columns + offsets, mask=inside, other=0.0)
    wide = raw.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(wide * wide, axis=0) / columns + eps)  # torch.rsqrt's (approximate) rsqrt
    w = tl.load(weight + offsets, mask=inside, other=0.0).to(tl.float32)
    return wide, rstd, w * _rounded(wide * rstd, raw), w, inside


@triton.jit
def rmsnorm_forward_kernel(x, weight, out, columns, eps, BLOCK: tl.constexpr):
    """Each program one row: weight * (x * rsqrt(mean(x^2) + eps)) rounded to x's dtype, in fp32 statistics
    (models/lean_kernels.py)."""
    row = tl.program_id(0).to(tl.int64)
    _, _, normed, _, inside = _rms_row(x, weight, row, columns, eps, BLOCK)
    tl.store(out + row * columns + tl.arange(0, BLOCK), normed.to(out.dtype.element_ty), mask=inside)


@triton.jit
def rmsnorm_backward_kernel(x, weight, grad, grad2, grad_x, out, columns, eps, TWO: tl.constexpr,
                            BLOCK: tl.constexpr):
    """Each program one row of the norm's backward: the incoming gradient (``grad``, plus ``grad2`` if TWO,
    rounded as eager adds them), the chain through HF's formula as autograd forms it, and the output formed
    again (for LoRA A's weight gradient) (models/lean_kernels.py)."""
    row = tl.program_id(0).to(tl.int64)
    wide, rstd, normed, w, inside = _rms_row(x, weight, row, columns, eps, BLOCK)
    offsets = row * columns + tl.arange(0, BLOCK)
    tl.store(out + offsets, normed.to(out.dtype.element_ty), mask=inside)
    dy = tl.load(grad + offsets, mask=inside, other=0.0)
    wide_dy = dy.to(tl.float32)
    if TWO:
        wide_dy = _rounded(wide_dy + tl.load(grad2 + offsets, mask=inside, other=0.0).to(tl.float32), dy)
    scaled = _rounded(wide_dy * w, dy)  # weight * y's gradient in the output's dtype, then to fp32
    grad_rstd = tl.sum(scaled * wide, axis=0)
    grad_mean = -0.5 * grad_rstd * (rstd * rstd * rstd)
    d_wide = scaled * rstd + (grad_mean / columns) * (2.0 * wide)
    tl.store(grad_x + offsets, d_wide.to(grad_x.dtype.element_ty), mask=inside)
