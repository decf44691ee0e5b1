"""What made runs of a kind faster after they were measured: the one list the planner's speed rows are checked
against (the local store's records and the shipped rows alike).

A calibration row measured before a change that applies to it timed code that no longer runs: the planner would
predict the configuration, and every configuration it is scaled to, at the old speed (round 23's FP8 cells under
compiled checkpointing ran 8% faster than the rows before them, and the plan ranked them by the old). Such a row is
left out of speed, host floors and measured ceilings; its memory stands (none of these changes moved a peak).

A record the store writes carries the epoch of the code that ran (``EPOCH``, records.run_record); a row without one
(the shipped CSVs' rows, records from before epochs) is dated by when it finished. Add a change here, newest last,
with the first time a run measured it; benchmarks/shipped_calibration.py reads the same list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ftprof.config.options import CUDA_GRAPH_MODES
from ftprof.plan.store import host_bound


@dataclass(frozen=True)
class SpeedChange:
    epoch: int  # a record of a lower epoch predates it
    since: str  # ISO 8601, UTC: the first run with it (dates the rows that carry no epoch)
    what: str
    applies: Callable[[dict], bool]  # whether a row's configuration is one the change made faster


def _compiled_fp8_without_graphs(row: dict) -> bool:
    knobs = row.get("knobs") or {}
    return (bool(knobs.get("fp8_base")) and bool(row.get("compile"))
            and knobs.get("compile_mode") not in CUDA_GRAPH_MODES)


def _fp8_under_compiled_checkpointing(row: dict) -> bool:
    return _compiled_fp8_without_graphs(row) and row.get("policy") not in (None, "none")


def _fp8_compiled_host_bound(row: dict) -> bool:
    """A compiled FP8 run without CUDA graphs whose GPU waited on its host (the host floors' rows among them)."""
    return _compiled_fp8_without_graphs(row) and host_bound(row)


def _selective_fixed(row: dict) -> bool:
    """Selective checkpointing compiled (each block now traced whole), or over ftprof's own GEMM ops (their outputs
    now saved, not recomputed)."""
    knobs = row.get("knobs") or {}
    return row.get("policy") == "selective" and (bool(row.get("compile")) or bool(knobs.get("fp8_base"))
                                                 or bool(knobs.get("lora_fused_projections")))


def _liger_loss_in_small_chunks(row: dict) -> bool:
    """A run of Liger's fused loss at 1,024-4,096 tokens a micro-batch, where Liger's own chunks were 32-512 tokens
    (llama-8b's and mistral-7b's vocabularies) and its head matmuls too small: ftprof's larger chunks made those
    faster. The host floors' runs (128 tokens) stay: 31 fewer loop turns of a few launches each, under 1% of their
    200-300 ms a micro-batch."""
    tokens = row.get("micro_batch_tokens") or 0
    return row.get("kernels") == "liger" and 1024 <= tokens <= 4096


CHANGES = (
    # llama-8b QLoRA 4 x 2048, full checkpointing, FP8, compiled: 13,573 -> 14,711 tokens/s (one call, H200); its
    # CUDA-graph rows moved under 1% and stay
    SpeedChange(1, "2026-12-04T15:31:00+00:00", "FP8's forward op traced into compiled code (round 23)",
                _fp8_under_compiled_checkpointing),
    # one Python op call less per linear backward: host-bound cells +2-9% (llama-8b 1 x 4 5,293 -> 5,751, mistral-7b
    # 4 x 1536 on 12 of 32 layers 18,210 -> 18,552, one call, H200); GPU-bound rows moved under 0.5% and stay
    SpeedChange(2, "2026-12-04T18:00:00+00:00", "FP8's backward traced into compiled code (round 24)",
                _fp8_compiled_host_bound),
    # llama-8b QLoRA selective 4 x 2048, compiled: 8,320 -> 15,549 tokens/s (eager kernels), 19,646 with FP8 (H200;
    # the rows before were measured with the block's graph broken by a side effect dynamo refused)
    SpeedChange(3, "2026-12-05T04:40:00+00:00", "selective checkpointing compiled whole; ftprof's GEMMs saved by it "
                "(round 26)", _selective_fixed),
    # llama-8b QLoRA no checkpointing, CUDA graphs: 1 x 4 12,188 -> 13,519 tokens/s (one call, H100); 2 x 2
    # 14,068 -> 14,983 (two calls); 4 x 1 +0.6%, under 1%: those rows stay
    SpeedChange(4, "2026-12-06T06:09:00+00:00", "Liger's fused loss in ftprof's chunks of up to 1,024-2,048 tokens "
                "(rounds 31-32)", _liger_loss_in_small_chunks),
)
EPOCH = CHANGES[-1].epoch


def stale(row: dict) -> SpeedChange | None:
    """The change that made ``row``'s configuration faster after it was measured, else None (also for a row that
    says neither its epoch nor when it finished)."""
    epoch, finished = row.get("epoch"), row.get("finished_at")
    for change in CHANGES:
        before = epoch < change.epoch if isinstance(epoch, int) else bool(finished) and str(finished) < change.since
        if before and change.applies(row):
            return change
    return None


def current(rows: list[dict]) -> list[dict]:
    """``rows`` less the stale ones."""
    return [r for r in rows if stale(r) is None]
