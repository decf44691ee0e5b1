"""--fp8-base's two e4m3 dequantization kernels against their round-24 forms and other launch shapes, on the GPU:
the forward's rows (models/triton_kernels.dequantize_4bit_kernel, ROW_SCALED) and the backward's transposed operand
(dequantize_4bit_transposed_kernel), for llama-8b's projection shapes (double-quantized NF4). Every candidate's
output is compared bit for bit with round 24's kernel; times are GPU time per weight, from CUDA graphs of 20
launches each (an eager launch from Python costs ~30 us, more than the small weights' kernels).

    python benchmarks/fp8_dequant_tiles.py      # two Markdown tables; exit 1 if a candidate's bits differ

Round 25's changes, each against its round-24 form kept here:
- transposed, "split" (shipped): the tile is indexed in the output's orientation (packed bytes x rows) and each
  byte's two values are stored as two output rows, with no interleave and no explicit transpose; round 24
  ("interleaved") transposed a TILE x TILE tile of interleaved values;
- rows, "one row" (shipped where a row is a whole number of programs): the row's scale is one scalar load, where
  round 24 divided each value's index by the column count (an int64 division and a gather per value).
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from ftprof.models import triton_kernels as tk

SHAPES = {"q/o_proj": (4096, 4096), "k/v_proj": (1024, 4096), "gate/up_proj": (14336, 4096),
          "down_proj": (4096, 14336)}
PER_LAYER = {"q/o_proj": 2, "k/v_proj": 2, "gate/up_proj": 2, "down_proj": 1}  # llama-8b's seven projections
LAYERS = 32


@triton.jit
def interleaved_transposed_kernel(packed, absmax, code, absmax2, code2, offset, inverse, out, rows, columns,
                                  BLOCKSIZE: tl.constexpr, BLOCKSIZE2: tl.constexpr, NESTED: tl.constexpr,
                                  TILE: tl.constexpr):
    """Round 24's transposing kernel: a TILE x TILE tile of the weight, interleaved values, transposed."""
    row = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    pair = tl.program_id(1).to(tl.int64) * (TILE // 2) + tl.arange(0, TILE // 2)
    inside = (row[:, None] < rows) & (pair[None, :] < columns // 2)
    index = row[:, None] * (columns // 2) + pair[None, :]
    values = tk._values(packed, absmax, code, absmax2, code2, offset, index, inside, BLOCKSIZE, BLOCKSIZE2, NESTED)
    values = values * tl.load(inverse + row, mask=row < rows, other=0.0)[:, None]
    values = tl.trans(values.to(out.dtype.element_ty))
    column = tl.program_id(1).to(tl.int64) * TILE + tl.arange(0, TILE)
    inside = (column[:, None] < columns) & (row[None, :] < rows)
    tl.store(out + column[:, None] * rows + row[None, :], values, mask=inside)


def gpu_us(fn, launches: int = 20, replays: int = 5) -> float:
    """GPU microseconds per call of ``fn``: ``launches`` calls captured in one CUDA graph, replayed."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()  # sync point: the replays must finish before reading the events
    return start.elapsed_time(end) * 1000 / (replays * launches)


def _weight(shape):
    import bitsandbytes.functional as bf

    from ftprof.models import dequant_kernels as dk

    weight = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    packed, state = bf.quantize_4bit(weight, blocksize=64, compress_statistics=True, quant_type="nf4",
                                     quant_storage=torch.bfloat16)
    data, args = packed.reshape(-1).view(torch.uint8), dk.state_args(state)
    inverse = 448.0 / dk.blockwise(data, *args, state.shape, torch.float32).abs().amax(dim=1)
    return data, args, inverse


def _constants(args):
    absmax, code, absmax2, code2, offset, blocksize, blocksize2 = args
    return (absmax, code, absmax2, code2, offset), dict(BLOCKSIZE=blocksize, BLOCKSIZE2=blocksize2, NESTED=True)


TRANSPOSED = [("interleaved", 128, 128, 8), ("interleaved", 64, 64, 4)] + [
    ("split", rows, pairs, warps) for rows in (64, 128, 256) for pairs in (16, 32, 64) for warps in (4, 8)
    if rows * pairs * 2 <= 32768]


def _transposed_row(name, shape) -> tuple[list[float], bool]:
    data, args, inverse = _weight(shape)
    tensors, constants = _constants(args)
    rows, columns = shape
    out = torch.empty(columns, rows, dtype=torch.float8_e4m3fn, device="cuda")
    grid = (-(-rows // 128), -(-columns // 128))
    interleaved_transposed_kernel[grid](data, *tensors, inverse, out, rows, columns, TILE=128, num_warps=8,
                                        enable_fp_fusion=False, **constants)
    reference = out.clone()
    times, same = [], True
    for style, tile_rows, tile_cols, warps in TRANSPOSED:
        if style == "interleaved":
            grid = (-(-rows // tile_rows), -(-columns // tile_cols))

            def go(grid=grid, tile=tile_rows, warps=warps):
                interleaved_transposed_kernel[grid](data, *tensors, inverse, out, rows, columns, TILE=tile,
                                                    num_warps=warps, enable_fp_fusion=False, **constants)
        else:
            grid = (-(-rows // tile_rows), -(-(columns // 2) // tile_cols))

            def go(grid=grid, r=tile_rows, p=tile_cols, warps=warps):
                tk.dequantize_4bit_transposed_kernel[grid](data, *tensors, inverse, out, rows, columns, inverse,
                                                           ROWS=r, PAIRS=p, num_warps=warps,
                                                           enable_fp_fusion=False, **constants)
        out.zero_()
        go()
        same &= torch.equal(out.view(torch.uint8), reference.view(torch.uint8))
        times.append(gpu_us(go))
    return times, bool(same)


ROWS = [("per value", 1024, 4), ("per value", 2048, 8), ("one row", 1024, 4), ("one row", 1024, 8),
        ("one row", 2048, 8), ("one row", 512, 4)]


def _rows_row(name, shape) -> tuple[list[float], bool]:
    data, args, inverse = _weight(shape)
    tensors, constants = _constants(args)
    out = torch.empty(shape, dtype=torch.float8_e4m3fn, device="cuda")
    times, same, reference = [], True, None
    for style, size, warps in ROWS:
        if style == "one row" and shape[1] % (2 * size):  # a row is not whole programs: the shipped launch's
            times.append(float("nan"))                    # per-value scale serves it
            continue

        def go(size=size, warps=warps, one_row=style == "one row"):
            tk.dequantize_4bit_kernel[(data.numel() // size,)](
                data, *tensors, out, data.numel(), shape[1], 1, inverse, BYTES=size, STRIDED=False, ROW_SCALED=True,
                ONE_ROW=one_row, num_warps=warps, enable_fp_fusion=False, **constants)
        out.zero_()
        go()
        reference = out.clone() if reference is None else reference
        same &= torch.equal(out.view(torch.uint8), reference.view(torch.uint8))
        times.append(gpu_us(go))
    return times, bool(same)


def _cells(values: list[float], digits: int) -> str:
    return " | ".join("-" if x != x else f"{x:.{digits}f}" for x in values)  # (x != x: NaN, a launch not made)


def _table(title, candidates, label, measure) -> bool:
    print(f"\n{title}\n")
    print("| weight | " + " | ".join(label(c) for c in candidates) + " | same bits |")
    print("| --- | " + " | ".join("---:" for _ in candidates) + " | --- |")
    total = [0.0] * len(candidates)
    all_same = True
    for name, shape in SHAPES.items():
        times, same = measure(name, shape)
        all_same &= same
        total = [t + PER_LAYER[name] * LAYERS * x / 1000 for t, x in zip(total, times, strict=True)]
        print(f"| {name} {shape[0]} x {shape[1]} (us) | " + _cells(times, 1) + f" | {same} |")
    print("| llama-8b, all 224 weights (ms) | " + _cells(total, 2) + " | |")
    return all_same


def main() -> int:
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    same = _table("The backward's transposed e4m3 operand (rows x packed bytes per tile, warps)", TRANSPOSED,
                  lambda c: f"{c[0]} {c[1]}x{c[2]}/{c[3]}w", _transposed_row)
    same &= _table("The forward's e4m3 rows (bytes per program, warps)", ROWS, lambda c: f"{c[0]} {c[1]}B/{c[2]}w",
                   _rows_row)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
