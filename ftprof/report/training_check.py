"""Runs that did not train like the others on the same data, which "which should I pick?" leaves out.

A fast path that computes the wrong thing is often faster: a lost gradient is work not done. Measured on an H200
(2026-12-02), a first version of --fp8-base ran 39% faster than 16 bits and ended 12 steps at a loss of 8.08, where
every correct run of the same data ended at 0.84-0.86. Runs that read the same data for as many steps with the same
learning setup (one *stream*) should end near each other whatever kernels, compilation, checkpointing or matmul
precision they use. A run whose last loss stays above the stream's lowest by more than half of that best run's drop
(its first loss to its last) did not train like it: it is flagged, not judged (the best run could be the wrong one;
the report says which runs disagree and by how much). A stream needs two runs, and a drop worth the name: the best
run lost at least a tenth of its first loss.
"""

from __future__ import annotations

import math

import pandas as pd

# What a run's loss curve depends on beyond how it is computed: the model and method, the data, the steps and the
# learning setup. Options missing from the rows (older result folders) are left out of the key.
STREAM = ("model", "method", "dtype", "dataset", "dataset_config", "dataset_split", "data_format", "seq_len",
          "batch_size", "packing", "grad_accum", "world_size", "max_steps", "lr", "lr_scheduler_type", "warmup_steps",
          "warmup_ratio", "weight_decay", "max_grad_norm", "optimizer", "seed", "lora_r", "lora_alpha",
          "lora_dropout", "lora_targets", "quant_type", "double_quant", "gptq_bits", "gptq_group_size")
LAGGING = 0.5  # flagged above the best run's last loss by more than this share of its drop
MEANINGFUL_DROP = 0.1  # a stream is judged only when its best run lost this share of its first loss


def lagging_runs(ok: pd.DataFrame) -> dict[object, str]:
    """Row index -> one line saying why, for the successful runs (``ok``) that trained far less than the best run of
    their stream."""
    if not {"loss_first", "loss_last"} <= set(ok.columns) or ok.empty:
        return {}
    first = pd.to_numeric(ok["loss_first"], errors="coerce")
    last = pd.to_numeric(ok["loss_last"], errors="coerce")
    key = [c for c in STREAM if c in ok.columns]
    streams = ok.groupby([ok[c].map(str) for c in key], sort=False).groups if key else {"": ok.index}
    out = {}
    for index in streams.values():
        out.update(_lagging(first[index], last[index]))
    return out


def _lagging(first: pd.Series, last: pd.Series) -> dict[object, str]:
    finite = last[last.map(lambda v: math.isfinite(v))]
    if len(last) < 2 or finite.empty:
        return {}
    best = finite.idxmin()
    drop = first[best] - last[best]
    if not (math.isfinite(drop) and drop >= MEANINGFUL_DROP * abs(first[best])):
        return {}
    limit = last[best] + LAGGING * drop
    return {i: (f"its loss after the last step, {_loss(last[i])}, stays far above {_loss(last[best])}, where the best "
                f"run of the same data and steps ended (from {_loss(first[best])}): it did not train like it; check "
                "its numerics")
            for i in last.index if not (math.isfinite(last[i]) and last[i] <= limit)}


def _loss(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else str(value)


def lagging_lines(rows: list[dict], name: str = "experiment") -> list[str]:
    """One line per successful run of ``rows`` (result rows, each named by its ``name`` field) that did not train
    like the best run of its data: what ``ftprof bench`` says under its end-of-sweep table."""
    ok = pd.DataFrame([r for r in rows if r.get("status") == "ok"])
    return [f"did not train like the others: {ok.loc[i, name] if name in ok else i}: {why}"
            for i, why in lagging_runs(ok).items()]
