"""The CUDA caching allocator's memory by stream and pool, from an allocator snapshot's segments
(``torch.cuda.memory_snapshot()``, or a dumped snapshot's ``"segments"``): where reserved memory sits above
allocated memory.

Two things keep reserved memory from the compute stream. Memory that a second CUDA stream allocates stays in that
stream's own pool. A block marked with ``record_stream`` is reused only once the host sees the other stream's work
done ("pending free" here), and that lags while the host runs ahead of the GPU. Measured in round 33
(BENCHMARKS.md): the host offload's side stream held 1.07 GiB of the 8 GiB cell in its own pool, none of it
allocated."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

GIB = 1 << 30
SIDE_POOL_NOTE_BYTES = 256 << 20  # other streams' reserved memory worth a line: a few layer inputs of a 7-8B model


@dataclass(frozen=True)
class Pool:
    """One stream's pool of one kind (large or small blocks), in bytes."""

    stream: int  # the CUDA stream's handle; 0 is the default stream
    kind: str  # "large" or "small"
    reserved: int
    allocated: int
    segments: int
    pending_free: int  # freed, waiting for another stream's recorded work before it can be reused


COLUMNS = [f.name for f in fields(Pool)]  # the CSV's header, in the dataclass's order


def pools(segments: list[dict]) -> list[Pool]:
    """Segments grouped by stream and pool kind, the most reserved first."""
    sums: dict[tuple[int, str], list[int]] = {}
    for seg in segments:
        key = (int(seg.get("stream", 0)), str(seg.get("segment_type", "large")))
        row = sums.setdefault(key, [0, 0, 0, 0])
        row[0] += int(seg["total_size"])
        row[1] += int(seg["allocated_size"])
        row[2] += 1
        row[3] += sum(int(b["size"]) for b in seg.get("blocks", ()) if b.get("state") == "active_pending_free")
    out = [Pool(stream, kind, *row) for (stream, kind), row in sums.items()]
    return sorted(out, key=lambda p: (-p.reserved, p.stream, p.kind))


def rows(found: list[Pool]) -> list[dict]:
    """One dict per pool (a CSV row)."""
    return [asdict(p) for p in found]


def side_pool_note(found: list[Pool], compute_stream: int) -> str | None:
    """A line when streams other than the compute stream hold at least SIDE_POOL_NOTE_BYTES that they do not use."""
    idle = sum(p.reserved - p.allocated for p in found if p.stream != compute_stream)
    if idle < SIDE_POOL_NOTE_BYTES:
        return None
    streams = len({p.stream for p in found if p.stream != compute_stream})
    return (f"allocator: {idle / GIB:.2f} GiB reserved and unused in the pools of {streams} stream(s) other than the "
            "compute stream, out of the compute stream's reach (memory a side stream allocates stays in its pool)")
