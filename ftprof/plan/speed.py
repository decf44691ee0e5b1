"""Tokens/s of a candidate: FLOPs per token (README "Definitions", from the probe's matmul counts) over the rate a
GPU achieves on that kind of run (ftprof/plan/calibration.py).

    tokens/s = rate x GPUs / (model FLOPs + recomputed FLOPs) per token

The rate is achieved FLOP/s per GPU counting recomputation (HFU's numerator), measured on runs of the same class
(method, checkpointing policy, kernels, compile) nearest in model size and micro-batch: recomputation is work the
GPU does at about the rate of the rest, so a policy's cost shows up through its FLOPs, and what FLOPs miss (the
elementwise recomputation of selective checkpointing, fused kernels, launch gaps) through its class's rate.

A micro-batch other than the one the rate was measured at: each micro-batch pays a fixed cost (launch gaps, the
optimizer's share, small GEMMs' lower efficiency), a share of the measured step taken from two H200 runs (llama-8b,
2 x 2048 x 2 against 4 x 2048): 5% compiled (QLoRA, no checkpointing, Liger: 14,682 tokens/s measured, 14,649
predicted), 35% eager (QLoRA, full checkpointing: 6,397 against 8,617 at 4 x 2048; eager kernels are short enough
at half the micro-batch for launches to show). The store replaces the assumption once it holds the class at that
micro-batch, and where it holds the class and model at two micro-batch sizes, their line gives the fixed share
instead (calibration._fixed_share: QLoRA's per-micro-batch dequantization made it 25% at 2,048 tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ftprof import metrics
from ftprof.plan.candidates import Candidate
from ftprof.plan.probe import ProbeResult

MICRO_BATCH_OVERHEAD = {True: 0.05, False: 0.35}  # compiled or not: the measured step's share paid per micro-batch


@dataclass(frozen=True)
class FlopsPerToken:
    model: float  # MFU's numerator per token
    recomputed: float  # what checkpointing runs again per token (HFU adds it)

    @property
    def executed(self) -> float:
        return self.model + self.recomputed


def flops_per_token(probe: ProbeResult, cand: Candidate, seq_len: int, attn_dim: int) -> FlopsPerToken:
    """The count a run records, by ftprof.metrics' own functions (the one owner of the formula), from the
    probe's matmul parameter counts; under full checkpointing, what the checkpointed layers recompute."""
    layers, out, per = probe.layers, probe.outside, probe.per_layer
    trainable = out.matmul_trainable + layers * per.matmul_trainable
    frozen = out.matmul_frozen + layers * per.matmul_frozen
    model = metrics.flops_per_token(metrics.ParamCounts(trainable, frozen, trainable, trainable + frozen), layers,
                                    attn_dim, seq_len)
    recomputed = 0.0
    if cand.checkpointing == "full":
        checkpointed = layers if cand.checkpoint_layers is None else cand.checkpoint_layers
        # one layer's recomputation (its share is the same in every identical layer), times the layers; under
        # --lean-recompute without the output projection's base matmul, with --offload-checkpoints too without the
        # attention's (the layers in two halves, models/split_layer.py)
        again = per.matmul_recomputed
        if cand.option("lean_recompute"):
            again = per.matmul_recomputed_split if cand.option("offload_checkpoints") else per.matmul_recomputed_lean
        one_layer = metrics.ParamCounts(again, 0, 0, again)
        recomputed = checkpointed * metrics.recompute_flops_per_token(one_layer, 1, attn_dim, seq_len)
    return FlopsPerToken(model, recomputed)


def tokens_per_s(flops: FlopsPerToken, rate_flops_per_s: float, world_size: int = 1) -> float:
    """Global tokens/s (summed over GPUs)."""
    return rate_flops_per_s * world_size / flops.executed


# How wrong a tokens/s prediction can be (a relative half-width), by where its rate came from. Measured anchors
# (H200, BENCHMARKS.md's plan accuracy): predictions from the plan's own GPU at the calibrated shape were within
# 0.7-1.8% (shipped) and rates scaled from another GPU's peak carry that GPU's efficiency, not this one's; the worst
# errors came from micro-batches 2-4x smaller than any calibrated (+11%, +95% host-bound) and from another policy's
# rate standing in. Each further unit of log-distance (a factor e) in model size or micro-batch adds BAND_PER_LOG.
BAND_BASE = {"local": 0.03, "shipped": 0.05, "scaled": 0.15}
BAND_PER_LOG = 0.10
# none's rate for full or full's for none: on an H200 (llama-8b QLoRA, eager, compiled, fp8, 4 x 1, 2026-12-03) three
# such rows were predicted 17.8%, 18.7% and 26.5% above what they ran, beyond the 0.10 this was before
BAND_STAND_IN = 0.22
BAND_UNMATCHED = 0.05  # the candidate's own options (compile mode, fused projections) had no calibrated run
# A row the host floor sets: the host's pace varies from step to step and from machine to machine (H200, FP8 under
# full checkpointing at 1,024 tokens per sequence: p90/p50 1.11-1.28 and +10% to +30% errors, GPU-bound rows of the
# same plans 1.00-1.02 and within 5%, 2026-12-04)
BAND_HOST_BOUND = 0.10
CONFIDENCE = ((0.06, "high"), (0.15, "medium"))  # band at most this -> that word; wider: low


def error_band(rate, micro_batch_tokens: int) -> float:
    """The relative half-width of a prediction made from ``rate`` (calibration.Rate) at ``micro_batch_tokens``."""
    band = BAND_BASE.get(rate.origin, BAND_BASE["scaled"]) + BAND_PER_LOG * rate.distance
    if rate.micro_batch_tokens and micro_batch_tokens:
        band += BAND_PER_LOG * abs(math.log(rate.micro_batch_tokens / micro_batch_tokens))
    if rate.stand_in:
        band += BAND_STAND_IN
    if not rate.knobs_matched:
        band += BAND_UNMATCHED
    if rate.host_bound:
        band += BAND_HOST_BOUND
    return band + rate.scatter


def spread(rate, micro_batch_tokens: int) -> float:
    """The part of ``error_band`` that differs between rows predicted for one GPU: every row on a GPU calibrated
    from another GPU's peak shares that scaling's error, which moves them together and so cannot reorder them."""
    return error_band(rate, micro_batch_tokens) - BAND_BASE.get(rate.origin, BAND_BASE["scaled"]) + BAND_BASE["local"]


def confidence(band: float) -> str:
    return next((word for limit, word in CONFIDENCE if band <= limit + 1e-9), "low")


# The most of a GPU's dense bf16 peak a rate may reach (model + recomputed FLOPs per second): no run came near it
# (on an H200 the fastest 16-bit runs reached 61-62%, FP8 base matmuls 70%), and a rate scaled to a micro-batch far
# larger than any calibrated one went past the peak itself (a llama-1b full fine-tune at 131,072 tokens per
# micro-batch: 123% of it). FP8's base matmuls run at twice the bf16 rate; the rest of the step does not.
PEAK_SHARE_CAP = {False: 0.8, True: 1.0}  # keyed by whether the base matmuls run in FP8


def capped(rate, peak_flops: float | None, fp8: bool):
    """``rate`` no higher than PEAK_SHARE_CAP of the GPU's dense bf16 peak, saying so where it was lowered."""
    if rate is None or not peak_flops:
        return rate
    cap = PEAK_SHARE_CAP[bool(fp8)] * peak_flops
    if rate.flops_per_s <= cap:
        return rate
    return replace(rate, flops_per_s=cap, source=f"{rate.source}; capped at {PEAK_SHARE_CAP[bool(fp8)]:.0%} of "
                                                 f"the GPU's bf16 peak ({peak_flops / 1e12:,.0f} TFLOP/s)")


def at_micro_batch(rate, micro_batch_tokens: int, compiled: bool):
    """The calibration's Rate moved to ``micro_batch_tokens`` (ftprof.plan.calibration.Rate; unchanged when it was
    measured there)."""
    ref = rate.micro_batch_tokens
    if not ref or ref == micro_batch_tokens:
        return rate
    measured = rate.fixed_share is not None
    overhead = rate.fixed_share if measured else MICRO_BATCH_OVERHEAD[bool(compiled)]
    scale = 1.0 / ((1 - overhead) + overhead * ref / micro_batch_tokens)
    why = "this class measured at two sizes" if measured else f"{'compiled' if compiled else 'eager'}, two H200 runs"
    note = f"; at {micro_batch_tokens:,} tokens/micro-batch x{scale:.2f} ({overhead:.0%} of a micro-batch fixed: {why})"
    return replace(rate, flops_per_s=rate.flops_per_s * scale, source=rate.source + note)
