"""The result of summarizing one trace (what summary.json holds): TraceSummary, and its Diagnoses."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Diagnosis:
    code: str
    severity: str  # "warning" | "info"
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class TraceSummary:
    trace: str
    device_kind: str  # "gpu" or "cpu": which timeline the categories are measured on
    window_us: float  # span of the recorded activity
    busy_us: float  # union of kernel intervals (GPU) or thread busy time (CPU)
    idle_share: float | None
    categories_us: dict[str, float]
    stages_us: dict[str, float]
    stage_source: str
    top_kernels: list[dict[str, Any]]
    top_operators: list[dict[str, Any]]
    host_device_copies: dict[str, Any]
    fp32_gemm_us: float
    gemm_us: float
    verdict: str
    diagnoses: list[Diagnosis]
    metadata: dict[str, Any]
    profiler_overhead: float | None = None
    breakdown: dict[str, Any] | None = None  # fine-tuning buckets per active step (Breakdown.to_dict())
    rank: int | None = None
    logits_softmax_us: float = 0.0  # the loss's softmax over the vocabulary (absent under a fused linear loss)
    idle_by_stage_us: dict[str, dict[str, float]] = field(default_factory=dict)  # GPU gaps by the stage they end in
    graph_replay_us: float = 0.0  # GPU kernel time launched by CUDA graph replays (no operator, no shapes behind it)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
