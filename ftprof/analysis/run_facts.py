"""What the profiled run was: its run config when one is at hand (a run directory's config.json), else ftprof's
block of the trace's metadata (traces ftprof wrote carry it). Resolved once, read by the buckets and the diagnoses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ftprof.analysis.read import ftprof_metadata


@dataclass(frozen=True)
class RunFacts:
    """Each value may be unknown (None), e.g. for a trace ftprof did not write."""

    method: str | None = None  # "full", "lora", "qlora", ...
    lora_r: int | None = None  # None for full fine-tuning
    lora_fused_a: bool = False  # one A matmul per input that several adapted projections read (--lora-fused-a)
    dtype: str | None = None
    checkpointing: bool | None = None
    hfu_flops_per_step: float | None = None  # the run's HFU count per optimizer step
    device: str | None = None  # the GPU's name, from the trace's deviceProperties


def run_facts(meta: dict[str, Any], run_config: dict | None) -> RunFacts:
    """``meta``: the trace's top-level metadata (read.read_metadata)."""
    config = run_config or {}
    ftmeta = ftprof_metadata(meta)
    method_cfg = config.get("method", {})
    method = method_cfg.get("method") or ftmeta.get("method")
    lora_r = method_cfg.get("lora_r") or ftmeta.get("lora_r")
    return RunFacts(
        method=method, lora_r=None if method == "full" else lora_r,
        lora_fused_a=bool(method_cfg.get("lora_fused_a", ftmeta.get("lora_fused_a"))),
        dtype=config.get("model", {}).get("dtype") or ftmeta.get("dtype"),
        checkpointing=_recomputed(config.get("model", {}), ftmeta),
        hfu_flops_per_step=_hfu_flops(config, ftmeta), device=device_name(meta))


def _recomputed(model_config: dict, ftmeta: dict) -> bool | None:
    """Whether layers were recomputed: what ran (ftprof's trace metadata, auto's choice included), else the
    configuration's policy. Under --checkpointing auto the configuration's yes/no is None (auto chooses at run
    time), so it alone would leave the recomputation diagnosis out of every auto run."""
    ran = ftmeta.get("checkpointing")
    if ran is not None:
        return bool(ran)
    policy = model_config.get("checkpointing")
    if policy in ("none", "full", "selective"):
        return policy != "none"
    return model_config.get("gradient_checkpointing")


def _hfu_flops(run_config: dict, ftmeta: dict) -> float | None:
    """The run's HFU FLOPs per optimizer step (model + recompute FLOPs per token, times tokens per step)."""
    per_token = ftmeta.get("flops_per_token")
    if not per_token:
        return None
    data = run_config.get("data", {})
    batch = data.get("batch_size") or ftmeta.get("batch_size")
    seq = data.get("seq_len") or ftmeta.get("seq_len")
    accum = run_config.get("train", {}).get("grad_accum") or ftmeta.get("grad_accum") or 1
    if not (batch and seq):
        return None
    return (per_token + (ftmeta.get("recompute_flops_per_token") or 0.0)) * batch * seq * accum


def device_name(meta: dict) -> str | None:
    props = meta.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        return props[0].get("name")
    return None
