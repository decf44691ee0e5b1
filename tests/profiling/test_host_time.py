"""HostTime measures garbage collection and torch.compile from their own callbacks, per lap, and only while
entered."""

import gc

import torch

from ftprof.profiling.host_time import HostTime


def _garbage(n=200_000):
    """Many container objects in reference cycles, so that a full collection has work to do."""
    nodes = [[] for _ in range(n)]
    for a, b in zip(nodes, nodes[1:] + nodes[:1], strict=True):
        a.append(b)
    return nodes


def test_a_collection_counts_in_its_lap_only():
    with HostTime() as host:
        junk = _garbage()
        del junk
        gc.collect()
        first = host.lap()
        second = host.lap()
    assert first["gc_s"] > 0 and first["compile_s"] == 0
    assert second == {"gc_s": 0.0, "compile_s": 0.0}


def test_compiles_and_recompiles_count_and_cached_calls_do_not():
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.sin(x) * 2 + x, backend="eager", dynamic=False)
    with HostTime() as host:
        fn(torch.ones(4))
        compiled = host.lap()["compile_s"]
        fn(torch.ones(4))
        cached = host.lap()["compile_s"]
        fn(torch.ones(4, 3))  # a new shape fails the guards: dynamo compiles again
        recompiled = host.lap()["compile_s"]
    assert compiled > 0 and recompiled > 0 and cached == 0


def test_nothing_is_counted_outside_the_context():
    host = HostTime()
    with host:
        pass
    gc.collect()
    torch._dynamo.reset()
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    assert host.lap() == {"gc_s": 0.0, "compile_s": 0.0}
    assert host._on_gc not in gc.callbacks


def test_a_dynamo_reset_inside_the_context_is_survived():
    """torch._dynamo.reset() drops every compile callback: leaving the context must not fail on the missing ones."""
    with HostTime():
        torch._dynamo.reset()
    torch._dynamo.reset()
