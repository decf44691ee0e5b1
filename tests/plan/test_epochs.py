"""plan/epochs.py: a calibration row timed before a change that made its configuration faster is left out of speed
(local records and shipped rows alike), so that a store filled before an upgrade never pulls a prediction down."""

from __future__ import annotations

import pytest

from ftprof.plan import calibration, epochs, host
from ftprof.plan.calibration import ClassKey

H200 = "NVIDIA H200"
FP8_FULL = ClassKey("qlora", "full", "liger", True, (("fp8_base", True),))
CHANGE = epochs.CHANGES[0]  # FP8's forward op traced into compiled code
TRACED_BACKWARD = epochs.CHANGES[1]  # FP8's backward traced: host-bound rows only
BEFORE, AFTER = "2026-12-04T10:00:00+00:00", "2026-12-05T00:00:00+00:00"  # (AFTER: after every change)
BETWEEN = "2026-12-04T16:00:00+00:00"  # after the forward's change, before the backward's


def _row(knobs=None, policy="full", compile=True, **extra) -> dict:
    return {"device_name": H200, "model": "llama-8b", "method": "qlora", "policy": policy, "kernels": "liger",
            "compile": compile, "knobs": {"fp8_base": True, **(knobs or {})}, "flops_per_token": 3.35e10,
            "micro_batch_tokens": 8192, "flops_per_s": 2.0e14, "world_size": 1, "tokens_per_s": 6000.0, **extra}


@pytest.mark.parametrize("row, stale", [
    (_row(finished_at=BEFORE), True),  # FP8 under compiled full checkpointing, before the change
    (_row(policy="selective", finished_at=BEFORE), True),
    (_row(finished_at=AFTER), False),
    (_row(epoch=0, finished_at=AFTER), True),  # an older ftprof, whatever the clock said
    (_row(epoch=epochs.EPOCH, finished_at=BEFORE), False),
    (_row(policy="none", finished_at=BEFORE), False),  # no checkpointing: the change was measured under it
    (_row({"compile_mode": "reduce-overhead"}, finished_at=BEFORE), False),  # CUDA graphs moved under 1%
    (_row(compile=False, finished_at=BEFORE), False),  # eager FP8 runs its own op, unchanged
    (_row({"fp8_base": False}, finished_at=BEFORE), False),  # 16 bits
    (_row(), False),  # neither an epoch nor a finish time: nothing says it is old
])
def test_a_row_is_stale_only_where_a_change_applies_and_it_predates_it(row, stale):
    assert (epochs.stale(row) is CHANGE) is stale


@pytest.mark.parametrize("row, stale", [
    (_row(finished_at=BETWEEN, gpu_busy=0.7), True),  # host-bound: one op call less per linear backward
    (_row(policy="none", finished_at=BETWEEN, gpu_busy=0.7), True),  # (no checkpointing has a backward too)
    (_row(epoch=1, finished_at=AFTER, gpu_busy=0.7), True),
    (_row(finished_at=BETWEEN, gpu_busy=0.98), False),  # GPU-bound rows moved under 0.5%
    (_row(finished_at=BETWEEN), False),  # busy unknown: nothing says the host set its pace
    (_row({"compile_mode": "reduce-overhead"}, finished_at=BETWEEN, gpu_busy=0.7), False),  # graphs: no host calls
    (_row(compile=False, finished_at=BETWEEN, gpu_busy=0.7), False),  # eager FP8 keeps its op
    (_row(finished_at=AFTER, gpu_busy=0.7), False),
])
def test_the_traced_backward_makes_only_host_bound_fp8_rows_stale(row, stale):
    assert (epochs.stale(row) is TRACED_BACKWARD) is stale


LOSS_CHUNKS = epochs.CHANGES[3]  # Liger's fused loss in ftprof's chunks
BEFORE_CHUNKS, AFTER_CHUNKS = "2026-12-06T05:56:00+00:00", "2026-12-06T06:12:00+00:00"  # round 31's two calls


@pytest.mark.parametrize("row, stale", [
    (_row({"fp8_base": False}, policy="none", micro_batch_tokens=2048, finished_at=BEFORE_CHUNKS), True),  # 1 x 2048
    (_row(micro_batch_tokens=4096, finished_at=BEFORE_CHUNKS), True),  # 2 x 2048: chunks of 128
    (_row(micro_batch_tokens=2048, finished_at=AFTER_CHUNKS), False),
    (_row(micro_batch_tokens=2048, epoch=3, finished_at=AFTER_CHUNKS), True),  # an older ftprof
    (_row(micro_batch_tokens=8192, finished_at=BEFORE_CHUNKS), False),  # 4 x 2048: +0.6%, under 1%
    (_row(micro_batch_tokens=128, finished_at=BEFORE_CHUNKS), False),  # a host floor's run: launches, under 1%
    (_row(micro_batch_tokens=2048, kernels="eager", finished_at=BEFORE_CHUNKS), False),  # no fused loss
])
def test_liger_rows_at_small_micro_batches_before_the_loss_chunks_are_stale(row, stale):
    assert (epochs.stale(row) is LOSS_CHUNKS) is stale


def test_a_stale_local_run_leaves_the_speed_to_the_shipped_rows():
    """A store's FP8 run from before the change (a third of today's speed) would set the rate of its class, the
    configuration measured exactly; left out, the shipped rows answer, and a current run of the same figures is
    used."""
    shipped = calibration.speed_rate(H200, FP8_FULL, 3.35e10, 8192, records=[])
    assert shipped.source.startswith("shipped defaults") and shipped.flops_per_s > 5e14
    old = calibration.speed_rate(H200, FP8_FULL, 3.35e10, 8192, records=[_row(finished_at=BEFORE)])
    assert (old.flops_per_s, old.source) == (shipped.flops_per_s, shipped.source)
    new = calibration.speed_rate(H200, FP8_FULL, 3.35e10, 8192, records=[_row(finished_at=AFTER)])
    assert new.flops_per_s == 2.0e14 and new.source.startswith("local store")


def test_the_shipped_rows_hold_no_stale_row():
    data = calibration.shipped()
    assert [r for kind in ("speed", "host") for r in data[kind] if epochs.stale(r)] == []
    assert any(CHANGE.applies(r) for r in data["speed"])  # the change's own measurements are there


def test_a_stale_host_bound_run_sets_no_host_floor():
    """A host-bound run (NVML busy 70%) of the old code: its seconds per micro-batch are the old code's host time."""
    slow = _row(finished_at=BEFORE, gpu_busy=0.7, layers=32, seq_len=2048, batch_size=4, grad_accum=1)
    args = (H200, FP8_FULL, 32)
    assert host.host_floor(*args, [slow]) == host.host_floor(*args, [])
    fresh = {**slow, "finished_at": AFTER}
    assert host.host_floor(*args, [fresh]) != host.host_floor(*args, [])
