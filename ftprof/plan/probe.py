"""What a model holds and saves, measured on a two-decoder-layer copy of it on the host CPU.

Memory scales with depth in two parts: what lives outside the decoder layers (embeddings, lm_head, the loss) and
what each identical layer adds. Both are measured, not modelled: the probe builds the model by the run's own method
(same code path as training: quantization, adapters, fused LoRA) with two layers, measures, then one layer, and
takes the difference. Random weights, the real vocabulary and widths; no backward runs.

- static parts (bytes): weights as stored (4-bit weights with their constants), the gradients and optimizer state
  the trainable parameters will have;
- activations (bytes per token) for each checkpointing policy: what autograd saves in one forward (the layers'
  inputs under full, matmul and attention outputs under selective), via the same meters a run uses;
- one layer's dequantized weights (what QLoRA keeps for a recomputed layer's backward).

The probe runs on the CPU whatever the target (saved-tensor sizes depend on shapes and dtypes, not on the device),
so a CPU machine can plan for a GPU; results are cached on disk by everything that changes them.
GPTQ-LoRA is probed as QLoRA (both save the adapted layer's input and the adapters' intermediates; quantizing a
GPTQ copy costs minutes on a CPU) with its weights sized by GPTQ's own layout (``gptq_weight_bytes``).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ftprof.config import RunConfig
from ftprof.plan.candidates import POLICIES

# Saved bytes are linear in tokens under SDPA's flash kernels: bytes(T) = fixed + T x per token. Two short forwards
# give the slope; one alone would count as per-token what is saved once per forward (the adapters' weights cast to
# bf16 under autocast: 35 KB per "token" per llama-8b layer at 64 tokens).
PROBE_TOKENS = (64, 128)
PROBE_VERSION = 10  # bump when what the probe measures changes: cached results are keyed by it


@dataclass(frozen=True)
class Parts:
    """Static bytes by kind, and activations per token by policy, of one slice of the model."""

    weights: int  # frozen and trainable, as stored
    gradients: int  # the trainable parameters' gradients (their dtype)
    optimizer_state: int  # AdamW's two moments (one byte each for 8-bit paged AdamW)
    activations: dict[str, float]  # bytes per token saved by the forward, per policy
    activations_fixed: dict[str, float]  # bytes saved once per forward whatever its length (adapter weights cast
    # to the run dtype under autocast, cached rotary tables), per policy
    matmul_trainable: int  # matmul weights that train (ftprof.metrics.count_params: the FLOP count's N_trainable)
    matmul_frozen: int  # and those that do not (N_frozen)
    matmul_recomputed: int  # matmul weights full checkpointing runs again (metrics.recomputed_params)
    matmul_recomputed_lean: int  # the same under --lean-recompute (the output projection's base matmul left out)
    matmul_recomputed_split: int  # and with --offload-checkpoints too (layers in two halves: the attention's output
    # projection left out as well, models/split_layer.py)
    loss_activations: float  # bytes per token the loss saves (the logits' fp32 upcast and log-softmax): none
    # where the kernel set fuses lm_head and the loss (Liger's fused linear cross entropy works in chunks)


@dataclass(frozen=True)
class ProbeResult:
    layers: int  # decoder layers of the real model
    outside: Parts  # embeddings, final norm, lm_head and the loss
    per_layer: Parts  # one decoder layer
    linear_shapes: list  # (in, out) of one layer's base linears: the ones QLoRA and GPTQ-LoRA store in 4 bits
    linear_bytes: int  # those linears' weights as the probe stored them (the run dtype)
    probed_as: str  # the method whose build was measured
    seconds: float  # the probe's own time (0 when read from the cache)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ProbeResult:
        return cls(data["layers"], Parts(**data["outside"]), Parts(**data["per_layer"]),
                   [tuple(x) for x in data["linear_shapes"]], data["linear_bytes"], data["probed_as"], 0.0)


def probe(cfg: RunConfig, source, dtype: str) -> ProbeResult:
    """The probe of ``cfg``'s model and method in ``dtype`` (the run's compute dtype), from the cache when there.
    One process measures at a time per cache entry: the ranks of a run started by torchrun or Slurm all plan
    before they load, and each probing llama-70b at once would hold several two-layer copies in host memory."""
    import fcntl

    cfg = _probe_config(cfg, dtype)
    path = _cache_dir() / f"probe-{cache_key(cfg, source, dtype)}.json"
    cached = _read_cached(path)
    if cached is not None:
        return cached
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes; waiting ranks then read the cache
        cached = _read_cached(path)
        if cached is not None:
            return cached
        started = time.perf_counter()
        result = _measure(cfg, source, dtype)
        result = dataclasses.replace(result, seconds=time.perf_counter() - started)
        _write_atomic(path, json.dumps(result.to_dict()))
    return result


def _read_cached(path: Path) -> ProbeResult | None:
    try:
        return ProbeResult.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged cache entry: measure again and overwrite it


def probed_method(method: str) -> str:
    """QLoRA and GPTQ-LoRA are probed as LoRA: they save the same tensors (measured on an H200, llama-8b
    4 x 2048: 49.08 GiB of activations for LoRA, QLoRA and GPTQ-LoRA alike without checkpointing, 6.04 GiB with),
    and their 4-bit weights are sized from their layouts (``nf4_bytes``, ``gptq_bytes``): quantizing the probe on a
    CPU and dequantizing it in every probe forward took 53 s for llama-8b on two cores, against 13 s for LoRA."""
    return "full" if method == "full" else "lora"


def cache_key(cfg: RunConfig, source, dtype: str) -> str:
    """Everything the probe's numbers depend on: the architecture, the method's settings that shape what is
    stored and saved, the dtype, the optimizer, torch's version."""
    import torch

    from ftprof.config import declarations

    # Every method option keys the cache except those the probe does not measure (declared so): a new option
    # makes a new probe, never a stale answer from a probe that did not have it.
    skip = declarations.probe_excluded()
    method = {k: v for k, v in dataclasses.asdict(cfg.method).items() if k not in skip}
    fields = {"arch": source.config.to_dict(), "method": method, "dtype": dtype,
              "optimizer": cfg.train.optimizer, "torch": torch.__version__, "probe": PROBE_VERSION,
              "attn": cfg.model.attn_implementation}
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _cache_dir() -> Path:
    from ftprof.models.gptq import cache_root

    return cache_root().parent / "plan"  # beside the GPTQ cache, under FTPROF_CACHE_DIR


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _measure(cfg: RunConfig, source, dtype: str) -> ProbeResult:
    """Two layers, then one (the difference is a layer). Each policy is measured on both depths before the next is
    switched on: enabling checkpointing leaves the model changed after it is disabled (PEFT's input-grad hook:
    +3% saved per token for none on the tiny preset), so none comes first, as in a run that never enables it."""
    from ftprof import metrics

    model, autocast = _build_probe_model(cfg, source, dtype)
    blocks = metrics.decoder_layers(model)
    two_layers = list(blocks)
    static = {}
    activations: dict[int, dict] = {2: {}, 1: {}}
    without_loss: dict[int, float] = {}
    for depth in (2, 1):  # static parts and the loss-free forward first, before any policy is enabled
        _keep_layers(model, two_layers[:depth])
        static[depth] = _static_parts(model, cfg)
        without_loss[depth] = _slope(*(_without_loss(model, autocast, t) for t in PROBE_TOKENS))
    for policy in POLICIES:
        for depth in (2, 1):
            _keep_layers(model, two_layers[:depth])
            activations[depth][policy] = _activations(model, autocast, cfg, policy)
    two, one = (_parts(static[d], activations[d], without_loss[d]) for d in (2, 1))
    per_layer = _difference(two, one)
    outside = _difference(one, per_layer)
    shapes, stored = _base_linears(blocks[0])
    return ProbeResult(source.config.num_hidden_layers, outside, per_layer, shapes, stored, cfg.method.method, 0.0)


def _probe_config(cfg: RunConfig, dtype: str) -> RunConfig:
    """The run's configuration as the probe builds it: on the CPU, in the run's dtype, LoRA for the 4-bit methods."""
    from ftprof.config import declarations

    method = cfg.method.for_method(probed_method(cfg.method.method), dtype, preset=True)
    # built without the unprobed options (--lean-activations, --lean-norms): the planner takes their saving off what
    # was measured (plan/memory.py)
    method = dataclasses.replace(method, **{d.name: d.default for d in declarations.DECLARED
                                            if d.unprobed and getattr(method, d.name, None) is not None})
    # eager and uncompiled: compile's own options back to their defaults too (a CUDA-graph mode without compile
    # is refused by the configuration)
    uncompiled = {d.name: d.default for d in declarations.DECLARED
                  if d.section == "model" and any(w.option == "compile" for w in d.needs)}
    model = dataclasses.replace(cfg.model, dtype=dtype, kernels="eager", compile=False, **uncompiled)
    return dataclasses.replace(cfg, method=method, model=model)


def _two_layer_source(source):
    """The model's architecture with two decoder layers, built from random weights like a preset."""
    from ftprof.models.source import ModelSource

    config = copy.deepcopy(source.config)
    config.num_hidden_layers = 2
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:2]
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config  # a GPTQ checkpoint's architecture, built unquantized
    return ModelSource("preset", f"{source.name} (2-layer probe)", config)


def _build_probe_model(cfg: RunConfig, source, dtype: str):
    import torch

    from ftprof.models.methods import LoadContext, get_strategy
    from ftprof.models.precision import precision
    from ftprof.runtime import torch_dtype

    pcfg = cfg
    small = _two_layer_source(source)
    device, tdtype = torch.device("cpu"), torch_dtype(dtype)
    strategy = get_strategy(pcfg.method.method)
    torch.manual_seed(pcfg.train.seed)
    # sizes only: the weights' values change nothing the probe measures, so they are not drawn
    model = strategy.load(LoadContext(pcfg, small, device, tdtype, None, list, log=lambda _: None,
                                      init_weights=False))
    model = strategy.apply(model, pcfg)
    autocast = precision(model, device.type, tdtype, strategy.uses_lora and not pcfg.method.kbit_prepare)
    if hasattr(model, "config"):
        model.config.use_cache = False
    model.train()  # checkpointing does nothing in eval mode
    return model, autocast


def _static_parts(model, cfg: RunConfig) -> dict:
    """Weights as stored, gradients and optimizer state (bytes), and the matmul weights the FLOP count sees."""
    import torch

    from ftprof import metrics
    from ftprof.profiling.memory import static_breakdown

    static = static_breakdown(model, torch.optim.SGD([torch.zeros(1)]))
    trainable = [p for p in model.parameters() if p.requires_grad]
    grads = sum(p.numel() * p.element_size() for p in trainable)
    moment = 1 if cfg.train.optimizer == "paged_adamw_8bit" else None  # bytes per value of each moment
    state = sum(p.numel() * 2 * (moment or p.element_size()) for p in trainable)
    if moment is None:
        state += 4 * len(trainable)  # torch's AdamW keeps each parameter's step count as an fp32 scalar tensor
    counts, again = metrics.count_params(model), metrics.recomputed_params(model)
    lean = metrics.recomputed_params(model, lean=True)
    split = metrics.recomputed_params(model, lean=True, split=True)
    return {"weights": static["weights_frozen"] + static["weights_trainable"], "gradients": grads,
            "optimizer_state": state, "matmul_trainable": counts.trainable_matmul,
            "matmul_frozen": counts.frozen_matmul,
            "matmul_recomputed": again.trainable_matmul + again.frozen_matmul,
            "matmul_recomputed_lean": lean.trainable_matmul + lean.frozen_matmul,
            "matmul_recomputed_split": split.trainable_matmul + split.frozen_matmul}


def _activations(model, autocast, cfg: RunConfig, policy: str) -> tuple[float, float]:
    """(bytes per token, bytes once per forward) the policy saves: the line through the two probe lengths."""
    import torch

    from ftprof.models.checkpointing import measure_activations

    short, long = (measure_activations(model, autocast, model.config.vocab_size, torch.device("cpu"),
                                                     tokens, cfg.method.lora_r or 0, (policy,))[policy]
                   for tokens in PROBE_TOKENS)
    per_token = _slope(short, long)
    return per_token, short * PROBE_TOKENS[0] - per_token * PROBE_TOKENS[0]


def _parts(static: dict, activations: dict, without_loss: float) -> Parts:
    per_token = {p: a[0] for p, a in activations.items()}
    fixed = {p: a[1] for p, a in activations.items()}
    return Parts(static["weights"], static["gradients"], static["optimizer_state"], per_token, fixed,
                 static["matmul_trainable"], static["matmul_frozen"], static["matmul_recomputed"],
                 static["matmul_recomputed_lean"], static["matmul_recomputed_split"],
                 per_token["none"] - without_loss)


def _slope(short: float, long: float) -> float:
    """Bytes per token from the per-token figures of the two probe lengths (each bytes / its tokens)."""
    (t1, t2) = PROBE_TOKENS
    return (long * t2 - short * t1) / (t2 - t1)


def _without_loss(model, autocast, tokens: int) -> float:
    """Bytes per token saved by a forward without labels (no checkpointing): the model without its loss."""
    import torch

    from ftprof.models.checkpointing import apply_policy
    from ftprof.profiling.memory import SavedActivations

    apply_policy(model, "none")
    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    with SavedActivations(model) as meter, autocast():
        logits = model(input_ids=ids).logits
    del logits
    return meter.bytes / tokens


def _difference(a: Parts, b: Parts) -> Parts:
    return Parts(a.weights - b.weights, a.gradients - b.gradients, a.optimizer_state - b.optimizer_state,
                 {p: a.activations[p] - b.activations[p] for p in a.activations},
                 {p: a.activations_fixed[p] - b.activations_fixed[p] for p in a.activations_fixed},
                 a.matmul_trainable - b.matmul_trainable, a.matmul_frozen - b.matmul_frozen,
                 a.matmul_recomputed - b.matmul_recomputed, a.matmul_recomputed_lean - b.matmul_recomputed_lean,
                 a.matmul_recomputed_split - b.matmul_recomputed_split,
                 a.loss_activations - b.loss_activations)


def _keep_layers(model, layers: list) -> None:
    """Run ``model`` with these decoder layers only, in place (the layers' ModuleList and the config both say how
    many layers the forward runs); called again with all of them, it restores the model."""
    import torch

    first = layers[0]
    for module in model.modules():
        for name, child in module.named_children():
            if isinstance(child, torch.nn.ModuleList) and len(child) and child[0] is first:
                setattr(module, name, torch.nn.ModuleList(layers))
    seen = set()
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and id(config) not in seen and hasattr(config, "num_hidden_layers"):
            seen.add(id(config))
            config.num_hidden_layers = len(layers)
            if isinstance(getattr(config, "layer_types", None), list):
                if not hasattr(config, "_probe_layer_types"):  # the two-layer list, kept to restore from
                    config._probe_layer_types = list(config.layer_types)
                config.layer_types = config._probe_layer_types[:len(layers)]


def _base_linears(block) -> tuple[list[tuple[int, int]], int]:
    """(in, out) of each frozen base linear of a decoder layer (adapters excluded), and their weights' bytes."""
    import torch

    shapes, stored = [], 0
    for name, module in block.named_modules():
        if type(module) is torch.nn.Linear and "lora_" not in name:
            shapes.append((module.in_features, module.out_features))
            stored += module.weight.numel() * module.weight.element_size()
    return shapes, stored


def nf4_bytes(in_features: int, out_features: int, double_quant: bool = True, blocksize: int = 64) -> int:
    """A bitsandbytes 4-bit linear as stored: two values a byte, one absmax per block (a byte with double
    quantization, plus an fp32 absmax per 256 blocks; else fp32) and the 16-value fp32 code. Checked against
    bitsandbytes' own tensors in tests/plan/test_probe.py."""
    n = in_features * out_features
    blocks = -(-n // blocksize)
    absmax = blocks + 4 * -(-blocks // 256) if double_quant else 4 * blocks
    return n // 2 + absmax + 16 * 4


def gptq_bytes(in_features: int, out_features: int, bits: int, group_size: int) -> int:
    """A GPTQ linear as stored: packed weights, fp16 scales and packed zeros per group, and int32 g_idx."""
    groups = -(-in_features // group_size) if group_size > 0 else 1
    return (in_features * out_features * bits // 8 + groups * out_features * 2 + groups * out_features * bits // 8
            + in_features * 4)
