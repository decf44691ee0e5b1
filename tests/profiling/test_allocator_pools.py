"""profiling/allocator_pools.py: an allocator snapshot's segments summed by stream and pool, and the line a run gets
when other streams hold memory the compute stream cannot reach. Segments as torch.cuda.memory_snapshot() gives
them (the keys it has had since torch 2.1)."""

from ftprof.profiling import allocator_pools

MIB = 1 << 20
SIDE = 94_000_000_000  # a side stream's handle


def _segment(stream, total, blocks, kind="large"):
    return {"device": 0, "address": 0, "stream": stream, "segment_type": kind, "total_size": total,
            "allocated_size": sum(size for size, state in blocks if state == "active_allocated"),
            "blocks": [{"size": size, "state": state} for size, state in blocks]}


def _snapshot():
    return [
        _segment(0, 6 * 1024 * MIB, [(4 * 1024 * MIB, "active_allocated"), (2 * 1024 * MIB, "inactive")]),
        _segment(0, 2 * MIB, [(1 * MIB, "active_allocated"), (1 * MIB, "inactive")], kind="small"),
        _segment(SIDE, 1024 * MIB, [(128 * MIB, "active_pending_free"), (896 * MIB, "inactive")]),
        _segment(SIDE, 64 * MIB, [(64 * MIB, "inactive")]),
    ]


def test_segments_are_summed_by_stream_and_pool_the_largest_first():
    found = allocator_pools.pools(_snapshot())
    assert [(p.stream, p.kind) for p in found] == [(0, "large"), (SIDE, "large"), (0, "small")]
    main, side, small = found
    assert (main.reserved, main.allocated, main.segments) == (6 * 1024 * MIB, 4 * 1024 * MIB, 1)
    assert (side.reserved, side.allocated, side.segments, side.pending_free) == (1088 * MIB, 0, 2, 128 * MIB)
    assert small.reserved == 2 * MIB and small.allocated == MIB
    assert allocator_pools.COLUMNS == ["stream", "kind", "reserved", "allocated", "segments", "pending_free"]
    assert allocator_pools.rows(found)[1] == {"stream": SIDE, "kind": "large", "reserved": 1088 * MIB,
                                              "allocated": 0, "segments": 2, "pending_free": 128 * MIB}


def test_other_streams_idle_memory_gets_a_line_and_little_of_it_none():
    found = allocator_pools.pools(_snapshot())
    note = allocator_pools.side_pool_note(found, compute_stream=0)
    assert note is not None and "1.06 GiB" in note and "1 stream(s)" in note
    # the same pools seen from the side stream: the compute stream's 2 GiB of cache would be the other one's
    assert "2.00 GiB" in allocator_pools.side_pool_note(found, compute_stream=SIDE)
    small = allocator_pools.pools([_snapshot()[0], _segment(SIDE, 64 * MIB, [(64 * MIB, "inactive")])])
    assert allocator_pools.side_pool_note(small, compute_stream=0) is None
    assert allocator_pools.pools([]) == []
