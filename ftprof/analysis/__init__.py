"""Offline analysis of torch.profiler traces: where a fine-tuning step's time and FLOPs went, and what changed.

A one-way pipeline; each module imports only modules listed before it:

- rules, op_flops, intervals: what names and shapes mean (kernel and operator categories, the FLOPs of an
  operator) and interval arithmetic. They import nothing of ftprof; the reader consults them while it streams,
  to keep only what later stages need (a large trace must not become gigabytes of Python objects).
- read: stream a trace file into compact per-event arrays (TraceEvents) and read its metadata.
- run_facts: what the run was (method, LoRA rank, dtype, checkpointing...), from its run config or the trace.
- buckets, op_walk, breakdown: the fine-tuning buckets of every active step (the Breakdown).
- measure: whole-trace measurements (busy time, categories, stage times, GPU idle by stage, GEMM split).
- summary: the result records (TraceSummary, Diagnosis); diagnoses: what stands out in a TraceSummary.
- pipeline: ``summarize(trace)``, the driver of the stages above.
- summary_output: a TraceSummary as summary.json / summary.md and as rich tables.
- diff, diff_output: A/B comparison of summaries, and how it is shown.

Outside this package it imports only ftprof.profiling.layout (the trace files' names and metadata, which the
capture side writes), ftprof.results.store (atomic writes) and, lazily, ftprof.metrics (the GPUs' peak FLOP/s):
never the capture code, the engine, the models or the CLI (tests/test_imports.py checks it).
"""
