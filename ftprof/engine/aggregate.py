"""A distributed run's figures: per-step aggregation over ranks and the run's aggregate result (rank 0)."""

from __future__ import annotations

from ftprof import metrics
from ftprof.engine.result import record_steady_state
from ftprof.results.parts import Distributed, NvmlSummary
from ftprof.results.schema import RunResult

RANK_FIELDS = ("tokens_per_s", "step_time_p50_s", "step_time_p90_s", "torch_peak_allocated", "torch_peak_reserved",
               "nvml_process_used_peak", "nvml_device_used_peak", "steady_steps", "device_name", "status")


def aggregate_steps(per_rank: list[list[dict]]) -> list[dict]:
    """Per step: the slowest rank's time (the step is done when every rank is), tokens summed over ranks, the loss
    over every rank's tokens, the largest memory and host causes."""
    rows = []
    for group in zip(*per_rank, strict=False):
        row = dict(group[0])
        row["step_time_s"] = max(r["step_time_s"] for r in group)
        row["tokens"] = sum(r["tokens"] for r in group)
        row["real_tokens"] = sum(r["real_tokens"] for r in group)
        row["loss"] = global_loss(group)
        # A rank held up on the host holds every rank up at the next collective: the worst rank's causes.
        for key in ("mem_allocated", "mem_peak_allocated", "mem_reserved", "mem_peak_reserved", *metrics.HOST_CAUSES,
                    "alloc_retries"):
            row[key] = max(r[key] for r in group)
        rows.append(row)
    return rows


def global_loss(group: tuple[dict, ...]) -> float | None:
    """The step's loss over the whole global batch: each rank's loss is the mean over its own shard's real tokens,
    so their mean weighted by those tokens (equal weights where a rank counted none). Rank 0's alone is a shard's."""
    losses = [(r.get("loss"), r.get("real_tokens") or 0) for r in group]
    if any(loss is None for loss, _ in losses):
        return group[0].get("loss")
    weight = sum(w for _, w in losses)
    if not weight:
        return sum(loss for loss, _ in losses) / len(losses)
    return sum(loss * w for loss, w in losses) / weight


def rank_summary(res: RunResult) -> dict:
    """What a rank sends rank 0 about itself: its RANK_FIELDS, as result.json names them."""
    flat = res.to_dict()
    return {key: flat[key] for key in RANK_FIELDS}


def aggregate_result(res: RunResult, gathered: list[dict], rows: list[dict], parallel: str) -> RunResult:
    world = len(gathered)
    res.run.world_size, res.run.parallel = world, parallel
    res.throughput.tokens_per_step = rows[-1]["tokens"] if rows else 0
    if rows:  # the global batch's, not rank 0's shard's
        res.throughput.loss_first, res.throughput.loss_last = rows[0]["loss"], rows[-1]["loss"]
    steady, _ = metrics.steady_window(rows)
    record_steady_state(res, rows, steady, world)
    p50s = [g["summary"]["step_time_p50_s"] for g in gathered if g["summary"]["step_time_p50_s"]]
    peaks = [g["summary"]["torch_peak_allocated"] for g in gathered if g["summary"]["torch_peak_allocated"]]
    res.distributed = Distributed(per_rank={str(g["rank"]): g["summary"] for g in gathered},
                                  step_time_skew=max(p50s) / min(p50s) - 1 if p50s else None,
                                  memory_skew=max(peaks) / min(peaks) - 1 if peaks else None)
    memory = res.memory
    if peaks:
        memory.torch_peak_allocated = max(peaks)
        memory.torch_peak_reserved = metrics.max_present(g["summary"]["torch_peak_reserved"] for g in gathered)
        memory.fragmentation = metrics.gap(memory.torch_peak_reserved, memory.torch_peak_allocated)
    nvml = [g["nvml"] for g in gathered if g["nvml"]]
    if nvml:
        memory.nvml_device_used_peak = metrics.max_present(n.get("device_used_peak") for n in nvml)
        memory.nvml_process_used_peak = metrics.max_present(n.get("process_used_peak") for n in nvml)
        # Each rank measured its energy over the same steps (metrics.energy_steps of its own rows): sum of the
        # ranks' energy over those steps' tokens, summed over ranks in the aggregated rows.
        energies = [n["energy_j"] for n in nvml if n.get("energy_j") is not None]
        energy = sum(energies) if energies else None
        summary = {"ranks": len(nvml), "energy_j": energy, "device_used_peak": memory.nvml_device_used_peak}
        res.nvml = NvmlSummary(summary, metrics.energy_per_token(energy, metrics.energy_steps(rows)))
        memory.non_torch_overhead = metrics.gap(memory.nvml_process_used_peak, memory.torch_peak_reserved)
    return res
