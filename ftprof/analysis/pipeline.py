"""``summarize``: one trace file in, its TraceSummary out (where the time went, the fine-tuning buckets and the
diagnoses). The driver of the analysis stages: read -> run facts -> breakdown and measurements -> diagnoses."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from ftprof.analysis import breakdown, measure
from ftprof.analysis.diagnoses import diagnose, verdict
from ftprof.analysis.read import STAGES, TraceEvents, read_events, read_metadata
from ftprof.analysis.run_facts import run_facts
from ftprof.analysis.summary import TraceSummary


def summarize(path: str | Path, run_config: dict | None = None) -> TraceSummary:
    """The summary of one trace. ``run_config``: the run's resolved config (RunConfig.to_dict()) when at hand; the
    trace's own ftprof metadata stands in for it otherwise."""
    path = Path(path)
    events = read_events(path)
    meta = read_metadata(path)
    facts = run_facts(meta, run_config)
    summary = _measured(path, events, meta)
    summary.graph_replay_us = measure.graph_replay_us(events)
    summary.logits_softmax_us = measure.logits_softmax_us(events)
    summary.breakdown = breakdown.from_trace(events, facts).to_dict()
    info = meta.get("distributedInfo")
    summary.rank = int(info["rank"]) if isinstance(info, dict) and "rank" in info else None
    summary.verdict = verdict(summary)
    summary.diagnoses = diagnose(summary, dtype=facts.dtype, checkpointing=facts.checkpointing,
                                 fused_a=facts.lora_fused_a)
    return summary


def _measured(path: Path, events: TraceEvents, meta: dict) -> TraceSummary:
    """The summary's whole-trace measurements; verdict, diagnoses and buckets still empty."""
    gpu = events.gpu
    line = measure.timeline(events)
    kernel_stages, stage_names = measure.kernel_stages(events) if gpu else (np.empty(0, dtype=np.int64), [])
    gpu_stages = measure.gpu_stage_times(events, kernel_stages, stage_names) if gpu else Counter()
    stages = gpu_stages or events.cpu_stage
    gemm_us, fp32_us = measure.gemm_split(events, line.times)
    return TraceSummary(
        trace=str(path), device_kind="gpu" if gpu else "cpu", window_us=line.window_us, busy_us=line.busy_us,
        idle_share=(1 - line.busy_us / line.window_us) if gpu and line.window_us > 0 else None,
        categories_us=dict(line.categories.most_common()), stages_us={k: stages[k] for k in STAGES if k in stages},
        stage_source="GPU kernels by launch range" if gpu_stages else "CPU ranges (user_annotation)",
        top_kernels=[{"name": n, "us": t, "count": events.kernel_count[n]}
                     for n, t in events.kernel_time.most_common(15)],
        top_operators=[{"name": n, "self_us" if not gpu else "inclusive_us": t, "count": events.op_count[n]}
                       for n, t in (line.times if not gpu else events.op_time).most_common(15)],
        host_device_copies={k: {"count": events.copies[k], "us": events.copy_us[k], "bytes": events.copy_bytes[k]}
                            for k in events.copies},
        fp32_gemm_us=fp32_us, gemm_us=gemm_us, verdict="", diagnoses=[], metadata=meta,
        idle_by_stage_us=measure.idle_by_stage(events, kernel_stages, stage_names) if gpu else {})

