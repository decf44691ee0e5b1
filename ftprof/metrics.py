"""The one place where every derived figure is computed: FLOPs per token, steady window, step-time statistics,
throughput, MFU/HFU, slow steps and their causes, run and training memory peaks, the memory breakdown, energy per
token and non-torch overhead.
The one-process run, the rank aggregation and the report all call these. torch is not imported here.

Conventions (README "Definitions"):
- model FLOPs per token = 6 * N_trainable + 4 * N_frozen + 12 * L * d * T, where N counts matmul weights only
  (embedding lookups excluded; a tied lm_head counts once, as a matmul), L layers, d = heads * head_dim, T = seq len.
  6N: forward 2N + weight-grad 2N + input-grad 2N; frozen weights need no weight-grad, hence 4N. The attention term
  is the full (non-causal) QK^T and AV cost, forward and backward.
- activation checkpointing recomputes the forward: not counted in MFU, counted in HFU (+2N per token + 4*L*d*T).
- peak: dense bf16 tensor-core rate of the device, from a table; unknown device -> MFU left empty, never guessed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

GIB = 1 << 30  # bytes in files, GiB in tables: the one spelling (``GIB``, ``gib``)

# What fits a memory budget, in the plan and the report alike: a peak at most the budget less this margin (8% of the
# budget, at least 1 GiB): fragmentation over a long run, kernels' workspaces, a card's usable memory below its
# nominal size, another driver's larger CUDA context, and a prediction's own error.
BUDGET_MARGIN_FRACTION = 0.08
BUDGET_MARGIN_MIN_BYTES = GIB
BUDGET_MARGIN_WORDS = "8% of the budget, at least 1 GiB"


def gib(nbytes: float | None) -> float | None:
    """Bytes as GiB (None stays None)."""
    return None if nbytes is None else nbytes / GIB


def budget_margin(budget_bytes: float) -> int:
    """The margin a peak must leave free of ``budget_bytes`` to fit it."""
    return max(int(BUDGET_MARGIN_FRACTION * budget_bytes), BUDGET_MARGIN_MIN_BYTES)


def fits_budget(peak_bytes: float, budget_bytes: float) -> bool:
    return peak_bytes <= budget_bytes - budget_margin(budget_bytes)

# Dense bf16 peak FLOP/s by device-name substring (first match wins; order matters: "H100 PCIe" before "H100").
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("GH200", 989e12), ("H800", 989e12),
    ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("A10G", 70e12), ("L4", 121e12), ("B200", 2250e12),
    ("RTX 4090", 165e12), ("RTX 3090", 71e12),  # dense bf16 with fp32 accumulation (what torch's matmuls use)
)


def peak_flops(device_name: str | None) -> float | None:
    if not device_name:
        return None
    for key, value in PEAK_BF16_FLOPS:
        if key in device_name:
            return value
    return None


@dataclass(frozen=True)
class ParamCounts:
    trainable_matmul: int  # N_trainable
    frozen_matmul: int  # N_frozen
    trainable_total: int  # every trainable parameter (for "x% trainable" displays)
    total: int  # logical parameter count (quantized weights counted as their unpacked size)


def _linear_shape(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) for nn.Linear and quantized linears (bitsandbytes Linear4bit, GPTQModel QuantLinear)."""
    fin, fout = getattr(module, "in_features", None), getattr(module, "out_features", None)
    if isinstance(fin, int) and isinstance(fout, int) and hasattr(module, "forward"):
        return fin, fout
    return None


def _is_leaf_linear(module: nn.Module) -> bool:
    # Containers such as PEFT LoRA layers look like linears too; their base and adapter linears are counted instead.
    return _linear_shape(module) is not None and not any(_linear_shape(c) for c in module.children())


def _matmul_size(module: nn.Module) -> tuple[int, bool]:
    """(weights of a leaf linear, whether they train). GPTQ QuantLinear has no `weight` (packed qweight): frozen."""
    fin, fout = _linear_shape(module)
    weight = getattr(module, "weight", None)
    return fin * fout, weight is not None and weight.requires_grad


def count_params(model: nn.Module) -> ParamCounts:
    trainable_mm = frozen_mm = other = 0
    seen: set[int] = set()  # tied parameters (lm_head <-> embeddings) count once, as the matmul
    modules = list(model.modules())
    for module in filter(_is_leaf_linear, modules):
        weight = getattr(module, "weight", None)
        key = id(weight) if weight is not None else id(module)
        if key in seen:
            continue
        seen.add(key)
        size, trains = _matmul_size(module)
        if trains:
            trainable_mm += size
        else:
            frozen_mm += size
    for module in modules:
        if _linear_shape(module) is None:
            for p in module.parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    other += p.numel()
        host = getattr(module, "host_weight", None)  # a table kept in host memory (models/host_embedding.py)
        if host is not None:
            other += host.numel()
    trainable_total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return ParamCounts(trainable_mm, frozen_mm, trainable_total, trainable_mm + frozen_mm + other)


def attention_dims(config) -> tuple[int, int]:
    """(layers, heads * head_dim) from a transformers config."""
    layers = config.num_hidden_layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return layers, heads * head_dim


def flops_per_token(params: ParamCounts, layers: int, attn_dim: int, seq_len: int) -> float:
    return 6.0 * params.trainable_matmul + 4.0 * params.frozen_matmul + 12.0 * layers * attn_dim * seq_len


def recompute_flops_per_token(recomputed: ParamCounts, layers: int, attn_dim: int, seq_len: int) -> float:
    """Extra FLOPs of activation checkpointing: the decoder layers' forward again (``recomputed_params``: lm_head
    and each block's last projection are not recomputed) plus attention's forward."""
    return 2.0 * (recomputed.trainable_matmul + recomputed.frozen_matmul) + 4.0 * layers * attn_dim * seq_len


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks (checkpointing and FSDP units), found by class name for any HF causal LM."""
    return [m for m in model.modules() if type(m).__name__.endswith(("DecoderLayer", "Block"))
            and any(p.numel() for p in m.parameters())]


def some_layers_keep(policy: str, checkpointed: int | None, selective_rest: bool = False) -> bool:
    """Whether any decoder layer keeps its activations: under none every one; under partial checkpointing (full or
    selective on the first ``checkpointed``) the rest, unless --selective-rest (with full) runs them selective."""
    return policy == "none" or (checkpointed is not None and not (selective_rest and policy == "full"))


def keeping_layers(count: int, policy: str, checkpointed: int | None, selective_rest: bool = False) -> range:
    """Which of ``count`` decoder layers keep their activations (``some_layers_keep``). The lean options
    (--lean-activations, --lean-norms) trim what these keep and are applied to these alone (engine/build.py); the
    planner prices them on these (plan/memory.kept_layers) and tries them only where there are some
    (config/declarations.py's ``kept_layers_only``)."""
    if not some_layers_keep(policy, checkpointed, selective_rest):
        return range(0)
    return range(count) if policy == "none" else range(min(checkpointed, count), count)


# A decoder layer's output projection, by the names of the supported architectures (Llama, Mistral, Qwen: down_proj):
# its output only joins the residual stream, which no tensor saved for backward depends on (--lean-recompute)
OUTPUT_PROJECTIONS = ("down_proj", "w2", "fc2", "dense_4h_to_h")


def is_output_projection(name: str) -> bool:
    """Whether a decoder layer's module of this qualified name (``mlp.down_proj``) is its output projection."""
    return name.rsplit(".", 1)[-1] in OUTPUT_PROJECTIONS


# Decoder layers that are two pre-norm residual halves, x + self_attn(input_layernorm(x)) then
# h + mlp(post_attention_layernorm(h)), and their attention's output projection: checkpointed as two halves
# (--lean-recompute with --offload-checkpoints, ftprof/models/split_layer.py), that projection is not recomputed
SPLIT_CLASSES = frozenset({"LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"})
ATTENTION_OUTPUTS = ("o_proj",)


def is_attention_output(name: str) -> bool:
    """Whether a decoder layer's module of this qualified name (``self_attn.o_proj``) is its attention's output
    projection."""
    return name.rsplit(".", 1)[-1] in ATTENTION_OUTPUTS


def _lean_skips(layer: nn.Module, name: str, lean: bool, split: bool) -> bool:
    """Whether a lean recomputation leaves out this frozen matmul of ``layer`` (``split``: layers checkpointed as
    two halves, where the attention's output projection is left out too)."""
    name = name.removesuffix(".base_layer")
    return lean and (is_output_projection(name)
                     or (split and type(layer).__name__ in SPLIT_CLASSES and is_attention_output(name)))


def recomputed_params(model: nn.Module, lean: bool = False, split: bool = False) -> ParamCounts:
    """Matmul parameters that activation checkpointing runs again in backward.

    torch's non-reentrant checkpointing stops recomputing once every tensor backward needs is back. A block's last
    matmul (down_proj in Llama/Mistral; with LoRA on it, that projection's lora_B, which runs after the base
    matmul and lora_A) produces only the block output, which nothing saves: it is not recomputed. lm_head is
    outside the blocks and not recomputed either. (Checked against FlopCounterMode with and without LoRA.)
    ``lean`` (--lean-recompute): the output projection's frozen base matmul is not recomputed either; ``split``
    (with --offload-checkpoints: layers checkpointed as two halves), nor the attention's."""
    trainable = frozen = 0
    for layer in decoder_layers(model):
        leaves = [(n, m) for n, m in layer.named_modules() if _is_leaf_linear(m)]
        for name, module in leaves[:-1]:  # registration order is execution order for HF blocks and PEFT wrappers
            size, trains = _matmul_size(module)
            if trains:
                trainable += size
            elif not _lean_skips(layer, name, lean, split):
                frozen += size
    return ParamCounts(trainable, frozen, 0, trainable + frozen)


@dataclass(frozen=True)
class StepStats:
    median: float
    p90: float
    mean: float
    stdev: float
    count: int


def step_stats(times: list[float]) -> StepStats | None:
    if not times:
        return None
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
    stdev = statistics.stdev(ordered) if len(ordered) > 1 else 0.0
    return StepStats(statistics.median(ordered), p90, statistics.fmean(ordered), stdev, len(ordered))


def steady_window(steps: list[dict]) -> tuple[list[dict], int]:
    """The steps headline figures come from: warm-up steps excluded, and steps the profiler recorded (or warmed up
    on) too, when unprofiled ones exist (they run slower). Returns (steps, number of profiled steps left out)."""
    steady = [s for s in steps if not s["warmup"]]
    unprofiled = [s for s in steady if s["profiler_phase"] in ("", "wait")]
    if unprofiled and len(unprofiled) < len(steady):
        return unprofiled, len(steady) - len(unprofiled)
    return steady, 0


def steady_window_note(steady: list[dict], left_out: int) -> str | None:
    """What a run's notes say of its steady window (``steady_window``'s two results): profiled steps left out, or
    every steady step profiled (its figures then carry the profiler's cost); None when no step was profiled."""
    if left_out:
        return f"steady-state figures from {len(steady)} unprofiled steps ({left_out} profiled steps left out)"
    if steady and all(s["profiler_phase"] not in ("", "wait") for s in steady):
        return (f"steady-state figures from {len(steady)} profiled step(s): no unprofiled step was left to time, so "
                "they carry the profiler's cost (more --max-steps leave unprofiled ones)")
    return None


def steady_figures(steps: list[dict], world_size: int, flops_per_token: float | None,
                   recompute_flops_per_token: float | None, peak: float | None) -> dict | None:
    """Step-time statistics, throughput and MFU/HFU of a steady window (RunResult field names).

    ``steps`` carry the tokens of all ranks (for one process, its own): throughput is total tokens over total time
    (robust to uneven steps), per GPU divided by ``world_size``. None when the window is empty."""
    stats = step_stats([s["step_time_s"] for s in steps])
    if stats is None:
        return None
    secs = sum(s["step_time_s"] for s in steps)
    tokens, real = (sum(s[k] for s in steps) / world_size for k in ("tokens", "real_tokens"))
    out = {"steady_steps": stats.count, "step_time_p50_s": stats.median, "step_time_p90_s": stats.p90,
           "step_time_mean_s": stats.mean, "step_time_std_s": stats.stdev}
    out["tokens_per_s"], out["tokens_per_s_per_gpu"] = throughput(tokens, secs, world_size)
    out["real_tokens_per_s"], out["real_tokens_per_s_per_gpu"] = throughput(real, secs, world_size)
    out["mfu"] = utilization(flops_per_token, out["tokens_per_s_per_gpu"], peak) if flops_per_token else None
    out["hfu"] = utilization((flops_per_token or 0) + (recompute_flops_per_token or 0), out["tokens_per_s_per_gpu"],
                             peak) if flops_per_token else None
    return out


# ---------------------------------------------------------------------------------------------------- slow steps
SLOW_STEP_RATIO = 1.2  # a steady step this many times the median step is slow
SLOW_STEP_MIN_EXTRA_S = 0.01  # and at least this much over it: below, a host's scheduling jitter
SLOW_STEPS_MIN = 3  # fewer steady steps than this have no meaningful median
# The host causes a step records (StepRecord), in the words people read them in.
HOST_CAUSES = {"compile_s": "torch.compile", "gc_s": "Python garbage collection", "data_s": "making the batch"}
CAUSE_SHARE = 0.5  # a host cause explains a slow step when it took at least this share of the extra time
UNEXPLAINED = "not data, GC or compile (ftprof profile shows where the time went)"
ALLOC_RETRIES = "allocator retries"


def host_time(steps: list[dict]) -> dict[str, float] | None:
    """Seconds per host cause summed over ``steps`` (the steady window), with the steps' own total and the
    allocator's retries. None for rows from before ftprof recorded causes."""
    if not steps or any(k not in s for s in steps for k in HOST_CAUSES):
        return None
    out = {k: float(sum(s[k] for s in steps)) for k in HOST_CAUSES}
    out["alloc_retries"] = int(sum(s.get("alloc_retries") or 0 for s in steps))
    out["steps_s"] = float(sum(s["step_time_s"] for s in steps))
    return out


def slow_steps(steps: list[dict]) -> list[dict]:
    """Steps at least SLOW_STEP_RATIO times the steady window's median (and SLOW_STEP_MIN_EXTRA_S over it), each
    with what most likely made it slow: the largest host cause when it took at least CAUSE_SHARE of the extra time,
    else allocator retries when the step had any, else UNEXPLAINED (GPU-side: clocks, another process, a collective
    waiting for a slower rank). Warm-up steps that a host cause explains are included (flagged); profiled steps,
    slow by the profiler's doing, are not."""
    steady, _ = steady_window(steps)
    if len(steady) < SLOW_STEPS_MIN:
        return []
    median = statistics.median(s["step_time_s"] for s in steady)
    kept = {s["step"] for s in steady}
    slow = [_slow_step(s, s["step_time_s"] - median) for s in steps
            if (s["warmup"] or s["step"] in kept) and s["step_time_s"] >= SLOW_STEP_RATIO * median
            and s["step_time_s"] - median >= SLOW_STEP_MIN_EXTRA_S]
    # Warm-up steps are slow by nature (first-touch allocation, lazy initialisation, the first step's
    # measurements): one is worth a line only when a host cause explains it.
    return [s for s in slow if not s["warmup"] or s["cause_s"] is not None]


def _slow_step(step: dict, extra: float) -> dict:
    out = {"step": step["step"], "warmup": bool(step["warmup"]), "step_time_s": step["step_time_s"],
           "extra_s": extra, "cause": UNEXPLAINED, "cause_s": None}
    host = {k: float(step.get(k) or 0.0) for k in HOST_CAUSES}
    largest = max(host, key=host.get)
    if host[largest] >= CAUSE_SHARE * extra:
        return out | {"cause": HOST_CAUSES[largest], "cause_s": host[largest]}
    if step.get("alloc_retries"):
        return out | {"cause": f"{ALLOC_RETRIES} ({step['alloc_retries']})"}
    return out


def throughput(tokens_per_step: float, step_time_s: float, world_size: int = 1) -> tuple[float, float]:
    """(global tokens/s, per-GPU tokens/s) for a step of ``tokens_per_step`` tokens on each of ``world_size`` ranks."""
    per_rank = tokens_per_step / step_time_s
    return per_rank * world_size, per_rank


def utilization(flops_token: float, tokens_per_s_per_device: float, peak: float | None) -> float | None:
    """Fraction of peak (0..1): MFU with model FLOPs, HFU with model + recompute FLOPs."""
    if peak is None:
        return None
    return flops_token * tokens_per_s_per_device / peak


# ---------------------------------------------------------------------------------------------------- memory
# Stages whose allocator peaks belong to training (loading and quantizing a model can peak higher, once).
TRAINING_STAGES = ("first_forward", "first_backward", "first_optimizer_step", "steady_state")


def max_present(values: Iterable[Any]) -> Any:
    """The largest of the values that are known (None and "" are unknown), or None."""
    present = [v for v in values if v is not None and v != ""]
    return max(present) if present else None


def run_peak(stage_peaks: Iterable[int | None], step_peaks: Iterable[int | None]) -> int | None:
    """A run's peak: the max over every stage and every step (each step's counter is reset at its start, so a peak
    in any middle step is seen however the stages are cut)."""
    return max_present([*stage_peaks, *step_peaks])


def training_peak(stages: dict[str, int | None], step_peaks: Iterable[int | None]) -> int | None:
    """The peak of training alone (loading excluded): training stages' peaks and every step's."""
    return run_peak((stages.get(s) for s in TRAINING_STAGES), step_peaks)


def logits_gradient_bytes(tokens: int, vocab: int) -> int:
    """Estimated transient of the loss's backward: the causal-LM loss upcasts the logits to fp32, and backward
    holds two fp32 logit-sized gradients at once (of the log-softmax output and of its input) before casting back
    to the run dtype. Checked on an H200 (llama-8b, 4 x 2048 tokens, vocab 128,256): 7.83 GiB estimated, 7.74 GiB
    measured as the peak above every other part, with and without checkpointing, for LoRA and QLoRA alike."""
    return 2 * 4 * tokens * vocab


def memory_breakdown(static: dict | None, activations: int | None, peak: int | None,
                     logits_gradients: int | None = None) -> dict:
    """Where the training peak went: the exact static parts, the activations saved by one micro-batch's forward,
    the estimated logits gradients, and the rest ("transients": backward temporaries, recomputed layers,
    dequantized weights, allocator rounding; never below 0: the logits estimate is capped at what the peak leaves).
    ``explained`` = parts / peak (CUDA only); ``peak`` is the training
    peak (loading excluded), kept as ``training_peak``. ``offloaded`` (host bytes under --fsdp-cpu-offload) is kept
    beside the parts, outside the peak."""
    if not static:
        return {}
    out = dict(static)
    if activations is not None:
        out["activations_saved"] = activations
    if logits_gradients:
        out["logits_gradients"] = logits_gradients
    if peak:
        known = sum(v for k, v in out.items() if k not in ("offloaded", "logits_gradients"))  # offloaded: host
        if logits_gradients:
            # an estimate, and an upper bound: a fused or compiled loss never holds the fp32 gradients (Unsloth's
            # and a compiled loss held 0.8-1.9 GiB of them where 7.83 were estimated, llama-8b 4 x 2048, H200), so
            # it is at most what the measured peak leaves beside the exact parts: transients never go negative
            out["logits_gradients"] = max(0, min(logits_gradients, peak - known))
        parts = known + out.get("logits_gradients", 0)
        out["transients"] = peak - parts
        out["explained"] = parts / peak
        out["training_peak"] = peak
    return out


def gap(larger: int | None, smaller: int | None) -> int | None:
    """A derived memory gap (non-torch overhead = NVML process peak - torch reserved peak; fragmentation =
    reserved - allocated), or None when either side is unknown."""
    return None if larger is None or smaller is None else larger - smaller


# ---------------------------------------------------------------------------------------------------- energy
def last_contiguous(steps: list[dict]) -> list[dict]:
    """The last run of consecutive step numbers (a profiled stretch in the middle splits the steady window)."""
    tail: list[dict] = []
    for s in steps:
        if tail and s["step"] != tail[-1]["step"] + 1:
            tail = []
        tail.append(s)
    return tail


def energy_steps(steps: list[dict]) -> list[dict]:
    """The steps whose energy is measured: the last unbroken stretch of the steady window, so the energy of
    profiled steps (and of the trace export between them) stays out, as it does from throughput."""
    return last_contiguous(steady_window(steps)[0])


def wall_window(steps: list[dict]) -> tuple[float, float] | None:
    """(start, end) wall-clock seconds of consecutive steps, to cut the NVML samples that belong to them."""
    if not steps:
        return None
    return steps[0]["started_unix"], steps[-1]["started_unix"] + steps[-1]["step_time_s"]


def energy_per_token(energy_j: float | None, steps: list[dict]) -> float | None:
    """Joules per token over ``steps`` (energy_steps), tokens of every rank when the rows are aggregated."""
    tokens = sum(s["tokens"] for s in steps)
    return energy_j / tokens if energy_j is not None and tokens else None


# ---------------------------------------------------------------------------------------------------- profiler
def profiler_overhead(steps: list[dict]) -> dict[str, float | None]:
    """Median active-step time against median unprofiled steady step (same run): the profiler's cost."""
    active = [s["step_time_s"] for s in steps if s["profiler_phase"] == "active" and not s["warmup"]]
    plain = [s["step_time_s"] for s in steps if s["profiler_phase"] in ("", "wait") and not s["warmup"]]
    a, p = step_stats(active), step_stats(plain)
    return {"active_step_p50_s": a and a.median, "unprofiled_step_p50_s": p and p.median,
            "profiler_overhead": a.median / p.median - 1.0 if a and p else None}
