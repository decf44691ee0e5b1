"""The host side of a step: what launching a micro-batch's kernels costs the CPU, and when that, not the GPU, sets the
step time.

A micro-batch takes the longer of its GPU time and its host floor: the Python, dispatch and launch work of every
kernel of every decoder layer, forward and backward (recomputation included), whatever the tokens. Small
micro-batches shrink the GPU time and leave the floor: measured on an H200, llama-8b QLoRA (full checkpointing on 1
of 32 layers, Liger, compiled) ran 1 x 2048 tokens per micro-batch at 0.272 s, 2 x 2048 at 0.296 s: the host, not
the GPU, set both (issue 38's 1 x 4 plan row, predicted +95% without this model).

    seconds per micro-batch = max(micro-batch tokens / GPU tokens/s, floor per layer x layers)

The floor per layer is calibrated per GPU and class (method, policy, kernels, compile, speed-class options) from:
- the local store's runs whose GPU was mostly idle (NVML busy below ``HOST_BOUND_BUSY``): their micro-batch time is
  the floor;
- the shipped host rows: runs of a few tokens per micro-batch on the GPU ftprof ships defaults for (H200), where
  every micro-batch is host-bound (benchmarks/sweeps/host-floor.yaml).
Elsewhere there is no floor: the GPU model alone answers, and the prediction's error band says how far its
micro-batch is from a calibrated one.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ftprof.plan import calibration

HOST_BOUND_BUSY = 0.85  # NVML's busy fraction below which a run's GPU waited on its host


@dataclass(frozen=True)
class Floor:
    seconds: float  # host seconds per micro-batch for the model's layers
    per_layer_s: float
    source: str
    runs: int


def micro_batch_seconds(record: dict) -> float | None:
    """A record's measured seconds per micro-batch (on one GPU)."""
    tokens, rate, world = record.get("micro_batch_tokens"), record.get("tokens_per_s"), record.get("world_size") or 1
    try:
        return float(tokens) / (float(rate) / float(world)) if tokens and rate else None
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def _per_layer(record: dict) -> float | None:
    seconds, layers = record.get("host_floor_s") or micro_batch_seconds(record), record.get("layers")
    try:
        return float(seconds) / int(layers) if seconds and layers and int(layers) > 0 else None
    except (TypeError, ValueError):
        return None


def _host_bound(record: dict) -> bool:
    busy = record.get("gpu_busy")
    return isinstance(busy, (int, float)) and busy < HOST_BOUND_BUSY


def host_floor(device_name: str, key: calibration.ClassKey, layers: int, records: list[dict]) -> Floor | None:
    """The host floor per micro-batch of a run of class ``key`` with ``layers`` decoder layers on ``device_name``:
    from the local store's host-bound runs, else the shipped host rows; None where neither has the class."""
    local = [r for r in records if r.get("device_name") == device_name and _host_bound(r)
             and calibration.class_key(r) == key and _per_layer(r)]
    if local:
        per = statistics.median(_per_layer(r) for r in local)
        return Floor(per * layers, per, f"host floor {per * 1e3:.2f} ms/layer from {len(local)} host-bound local "
                                        f"run(s)", len(local))
    shipped = [r for r in calibration.shipped().get("host", []) if r.get("device_name") == device_name
               and calibration.class_key(r) == key and _per_layer(r)]
    if shipped:
        per = statistics.median(_per_layer(r) for r in shipped)
        return Floor(per * layers, per, f"host floor {per * 1e3:.2f} ms/layer (shipped, {len(shipped)} run(s) of a "
                                        "few tokens per micro-batch)", len(shipped))
    return None


def tokens_per_s(gpu_tokens_per_s: float, floor: Floor | None, micro_batch_tokens: int, world_size: int) -> float:
    """Global tokens/s once the host floor is taken into account: each GPU's micro-batch takes the longer of its
    GPU time and the floor."""
    if floor is None:
        return gpu_tokens_per_s
    gpu_s = micro_batch_tokens * world_size / gpu_tokens_per_s
    return micro_batch_tokens * world_size / max(gpu_s, floor.seconds)
