"""What stands out in a TraceSummary: the verdict (GPU- or CPU-bound) and the diagnoses, each with its evidence
and the ftprof option that addresses it."""

from __future__ import annotations

from ftprof.analysis.rules import categorize
from ftprof.analysis.summary import Diagnosis, TraceSummary
from ftprof.config import declarations

LORA_GEMM_SHARE = 0.04  # LoRA GEMMs above this share of the step get a diagnosis (7.4% for llama-8b QLoRA, H200)
# Above this share of GPU kernel time, unfused elementwise work is worth a line (measured on an H200: 28% for
# llama-8b LoRA and QLoRA with checkpointing, where GEMMs took 56%).
ELEMENTWISE_SHARE = 0.2


def verdict(s: TraceSummary) -> str:
    if s.device_kind == "cpu":
        return "CPU run: all compute on the host"
    if s.idle_share is not None and s.idle_share > 0.3:
        return f"CPU-bound: the GPU is idle {100 * s.idle_share:.0f}% of the recorded window"
    return f"GPU-bound: the GPU is busy {100 * (1 - (s.idle_share or 0)):.0f}% of the recorded window"


def diagnose(s: TraceSummary, dtype: str | None = None, checkpointing: bool | None = None,
             fused_a: bool | None = None) -> list[Diagnosis]:
    """Every diagnosis of the summary, in a fixed order. ``dtype``, ``checkpointing``, ``fused_a``: the run's
    (RunFacts), when known."""
    total = sum(s.categories_us.values()) or 1.0
    of_time = "of GPU kernel time" if s.device_kind == "gpu" else "of CPU operator time"
    out = _fp32_gemm(s, total, of_time, dtype) + _dequantization(s, total, of_time) + _lora_gemms(s, fused_a)
    out += _cuda_graphs(s, total, of_time) + _gpu_idle(s) + _host_device_copies(s)
    out += _elementwise(s, total) + _logits(s, total)
    if checkpointing:
        out += _recomputation(s)
    return out


def _fp32_gemm(s: TraceSummary, total: float, of_time: str, dtype: str | None) -> list[Diagnosis]:
    if not (s.fp32_gemm_us > 0 and (dtype in (None, "bfloat16", "float16"))):
        return []
    share = s.fp32_gemm_us / total
    return [Diagnosis("fp32_gemm", "warning" if share > 0.02 else "info",
                      f"fp32 GEMMs take {100 * share:.1f}% {of_time} in a {dtype or 'low-precision'} run: something "
                      "was upcast (lm_head, adapters or embeddings, e.g. by prepare_model_for_kbit_training) or runs "
                      "outside autocast",
                      {"fp32_gemm_us": s.fp32_gemm_us, "gemm_us": s.gemm_us, "share": share})]


def _dequantization(s: TraceSummary, total: float, of_time: str) -> list[Diagnosis]:
    deq = s.categories_us.get("quantize/dequantize", 0.0)
    if not deq > 0:
        return []
    share = deq / total
    # advice a CPU run can act on: the Triton kernel is CUDA's only
    fix = ("for QLoRA, --dequant-kernel triton (the default on CUDA) dequantizes each weight in one pass, 1.8x "
           "faster than bitsandbytes' kernels on an H200" if s.device_kind == "gpu" else
           "on the CPU bitsandbytes' reference dequantizes every weight at each use; a GPU run uses a one-pass kernel")
    return [Diagnosis("dequantization", "warning" if share > 0.15 else "info",
                      f"quantize/dequantize work takes {100 * share:.1f}% {of_time}; {fix}",
                      {"us": deq, "share": share})]


def _lora_gemms(s: TraceSummary, fused_a: bool | None) -> list[Diagnosis]:
    lora = ((s.breakdown or {}).get("buckets") or {}).get("lora_gemm") or {}
    if not (lora.get("share") or 0) > LORA_GEMM_SHARE:
        return []
    fix = ("the A matmuls already run once per shared input (--lora-fused-a); the rest are the B matmuls and "
           "their gradients" if fused_a else "--lora-fused-a (on by default) applies one A matmul to each input "
           "that several adapted projections read (q, k, v; gate, up)")
    return [Diagnosis("lora_gemms", "info",
                      f"LoRA's low-rank GEMMs take {100 * lora['share']:.1f}% of the step, memory-bound at "
                      f"a few percent of peak: {fix}",
                      {"ms_per_step": lora.get("ms_per_step"), "share": lora["share"]})]


def _cuda_graphs(s: TraceSummary, total: float, of_time: str) -> list[Diagnosis]:
    if not s.graph_replay_us > 0:
        return []
    share = s.graph_replay_us / total
    return [Diagnosis("cuda_graphs", "info",
                      f"{100 * share:.1f}% {of_time} ran from CUDA graph replays (--compile-mode "
                      "reduce-overhead or max-autotune): those kernels have no operator or shapes behind "
                      "them, so the fine-tuning buckets place them by kernel name only (no LoRA/base GEMM "
                      "split, no FLOPs); profile with --compile-mode default for the full split",
                      {"us": s.graph_replay_us, "share": share})]


def _gpu_idle(s: TraceSummary) -> list[Diagnosis]:
    if not (s.idle_share is not None and s.idle_share > 0.1):
        return []
    return [Diagnosis("gpu_idle", "warning" if s.idle_share > 0.3 else "info",
                      f"the GPU is idle {100 * s.idle_share:.1f}% of the recorded window: launch overhead, "
                      f"host work or synchronisation between kernels{_idle_where(s)}",
                      {"idle_us": s.window_us - s.busy_us, "window_us": s.window_us,
                       "by_stage": s.idle_by_stage_us})]


def _idle_where(s: TraceSummary) -> str:
    """'; most of it before backward kernels (...)': where the largest share of the idle time falls."""
    if not s.idle_by_stage_us:
        return ""
    total = sum(row["idle_us"] for row in s.idle_by_stage_us.values()) or 1.0
    stage, row = next(iter(s.idle_by_stage_us.items()))
    where = f"at {stage}" if " -> " in stage else f"in {stage}"
    long_share = row["long_gaps_us"] / row["idle_us"] if row["idle_us"] else 0.0
    # The remedy each kind has in ftprof: the host's batch work out of the step's critical path (measured on an
    # H200: 42 ms/step outside the stages, +3.2% tokens/s with prefetching), or blocks replayed as CUDA graphs.
    kind = ("mostly gaps of 1 ms or more: host work or a sync (--prefetch, on by default, makes the next batch "
            "while the GPU runs)" if long_share >= 0.5
            else "mostly short gaps: launch overhead (--compile --compile-mode reduce-overhead replays blocks as "
            "CUDA graphs)")
    return f"; {100 * row['idle_us'] / total:.0f}% of it {where}, {int(row['gaps'])} gaps, {kind}"


def _host_device_copies(s: TraceSummary) -> list[Diagnosis]:
    copies = s.host_device_copies
    n_copies = sum(v["count"] for v in copies.values())
    if not n_copies:
        return []
    dtoh = copies.get("DtoH", {}).get("count", 0)
    return [Diagnosis("host_device_copies", "warning" if dtoh > 2 * max(1, _steps(s)) else "info",
                      f"{n_copies} host-device copies inside the recorded steps ({dtoh} device-to-host: "
                      "each one can synchronise the host with the GPU)", copies)]


def _elementwise(s: TraceSummary, total: float) -> list[Diagnosis]:
    if s.device_kind != "gpu":
        return []
    us = s.categories_us.get("elementwise", 0.0) + s.categories_us.get("normalization", 0.0)
    share = us / total
    if share <= ELEMENTWISE_SHARE:
        return []
    top = [k for k in s.top_kernels if categorize(k["name"]) in ("elementwise", "normalization")][:3]
    return [Diagnosis("elementwise", "warning" if share > 0.3 else "info",
                      f"elementwise and normalization kernels take {100 * share:.1f}% of GPU kernel time (unfused "
                      "RMSNorm in fp32, activations, rotary embeddings, residual and LoRA adds): fusing them is the "
                      "lever: --compile (each decoder block compiled) or --kernels liger (fused RMSNorm, SwiGLU, "
                      "RoPE)",
                      {"us": us, "share": share, "top_kernels": top})]


def _recomputation(s: TraceSummary) -> list[Diagnosis]:
    """Time: the recomputed forward as the buckets measured it, else estimated as one more forward; FLOPs: exact,
    when ftprof wrote the trace."""
    fwd, bwd = s.stages_us.get("ftprof/forward", 0.0), s.stages_us.get("ftprof/backward", 0.0)
    if fwd + bwd <= 0:
        return []
    share = fwd / (fwd + bwd + s.stages_us.get("ftprof/optimizer_step", 0.0))
    evidence = {"forward_us": fwd, "backward_us": bwd, "time_share": share}
    meta = s.metadata.get("ftprof") if isinstance(s.metadata.get("ftprof"), dict) else {}
    flops, extra = meta.get("flops_per_token"), meta.get("recompute_flops_per_token")
    measured = ((s.breakdown or {}).get("buckets") or {}).get("recompute") or {}
    if measured.get("share"):  # the fine-tuning buckets timed the recomputed forward itself (a trace with shapes)
        evidence["measured_share"] = measured["share"]
        text = f"{100 * measured['share']:.0f}% of step time (the recomputed forward, measured)"
    else:
        text = f"about {100 * share:.0f}% of step time (estimated as one more forward)"
    if flops and extra:
        evidence["flops_share"] = extra / (flops + extra)
        text += f"; {100 * evidence['flops_share']:.0f}% of the FLOPs executed"
    levers = ["--lean-recompute leaves the output projection's matmul out"] if _lean_would_help(meta) else []
    if not meta.get("selective_rest"):
        levers.append("--checkpointing selective saves the matmul outputs instead (--selective-rest on the layers "
                      "--checkpoint-layers leaves out)")
    return [Diagnosis("recomputation", "info", "activation checkpointing recomputes the forward in backward: " + text
                      + "".join(f"; {lever}" for lever in levers) + "; --checkpointing auto picks the fastest "
                      "policy that fits the GPU's memory", evidence)]


def _lean_would_help(meta: dict) -> bool:
    """Whether a run without --lean-recompute is one its declaration applies to and the planner would try it for
    (config/declarations.py: LoRA and QLoRA, not beside --fp8-base, measured no faster there)."""
    lean = declarations.BY_NAME["lean_recompute"]
    values = {"method": meta.get("method"), "checkpointing": meta.get("checkpointing_policy") or "full",
              "compile": bool(meta.get("compile")), "fp8_base": bool(meta.get("fp8_base"))}
    return not meta.get("lean_recompute") and lean.applies(values) and not lean.avoided(True, values)


def _logits(s: TraceSummary, total: float) -> list[Diagnosis]:
    if s.device_kind != "gpu":
        return []
    us = s.logits_softmax_us
    if not us:
        return []
    return [Diagnosis("logits", "info",
                      f"the loss materializes the logits and their fp32 softmax ({100 * us / total:.1f}% of GPU "
                      "kernel time; in backward two fp32 logit-sized gradients are held at once): --kernels liger's "
                      "fused linear cross entropy computes the loss in chunks without them",
                      {"us": us, "share": us / total})]


def _steps(s: TraceSummary) -> int:
    meta = s.metadata.get("ftprof")
    return int(meta.get("active_steps", 1)) if isinstance(meta, dict) else 1
