"""The four fine-tuning methods: one strategy each, one registry, one training loop for all.

A strategy does two things: ``load`` builds the base model (quantized where the method says so) and ``apply``
decides what trains (all parameters, or LoRA adapters on a frozen base). QLoRA and GPTQ-LoRA are LoRA with a
different ``load``.

What we deliberately do NOT do for QLoRA: PEFT's ``prepare_model_for_kbit_training`` upcasts lm_head, embeddings and
norms to fp32. On an H200 without activation checkpointing that made a 1.1B QLoRA run 3x slower than full
fine-tuning with 1.8x its memory (fp32 GEMMs took 27% of GPU time). Here the non-quantized parameters stay in the
run dtype, adapters are kept in fp32 (master weights) and the forward runs under autocast in the run dtype.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ftprof import metrics, ranks
from ftprof.config import RunConfig
from ftprof.models import lora_addmm, lora_fused_a
from ftprof.models.materialize import build_random_model
from ftprof.models.source import ModelSource
from ftprof.runtime import import_peft, quiet_import, torch_dtype


@dataclass
class LoadContext:
    """What a strategy needs to build a model, resolved by the trainer."""

    cfg: RunConfig
    source: ModelSource
    device: torch.device
    dtype: torch.dtype
    tokenizer: object
    calibration: Callable[[], list[torch.Tensor]]  # token sequences for GPTQ calibration (lazy)
    log: Callable[[str], None] = print
    defer_init: bool = False  # presets only: leave parameters on meta (FSDP shards them, then each rank fills its own)
    policy: str = "none"  # the checkpointing policy that runs (ResolvedRun.policy: auto's choice under auto)
    init_weights: bool = True  # a preset's random values (False: allocated only, for the planner's probe)


def _from_pretrained(ctx: LoadContext, **kwargs) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        ctx.source.name, dtype=ctx.dtype, device_map={"": str(ctx.device)},
        attn_implementation=ctx.cfg.model.attn_implementation, **kwargs)


def _build(ctx: LoadContext, **kwargs) -> nn.Module:
    if ctx.source.kind == "preset" and ctx.defer_init:
        from ftprof.models.materialize import empty_model

        return empty_model(ctx.source.config, ctx.dtype, ctx.cfg.model.attn_implementation)
    if ctx.source.kind == "preset":
        return build_random_model(ctx.source.config, ctx.device, ctx.dtype, seed=ctx.cfg.train.seed,
                                  attn_implementation=ctx.cfg.model.attn_implementation, init=ctx.init_weights,
                                  **kwargs)
    return _from_pretrained(ctx)


class FullFineTune:
    name = "full"
    uses_lora = False
    can_defer_init = True  # a preset can be sharded before its weights exist

    def load(self, ctx: LoadContext) -> nn.Module:
        return _build(ctx)

    def apply(self, model: nn.Module, cfg: RunConfig) -> nn.Module:
        model.requires_grad_(True)
        return model


class LoRA:
    name = "lora"
    uses_lora = True
    can_defer_init = True

    def load(self, ctx: LoadContext) -> nn.Module:
        return _build(ctx)

    def apply(self, model: nn.Module, cfg: RunConfig) -> nn.Module:
        peft = import_peft()
        m = cfg.method
        targets = "all-linear" if m.lora_targets == ("all-linear",) else list(m.lora_targets)
        lora_cfg = peft.LoraConfig(r=m.lora_r, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout,
                                   target_modules=targets, task_type="CAUSAL_LM", bias="none")
        model.requires_grad_(False)
        if m.kbit_prepare:
            # The textbook QLoRA recipe, kept for comparison only (see the module docstring for its cost).
            model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        # autocast_adapter_dtype=True (default) keeps adapters in fp32: master weights for the optimizer.
        # The matmuls still run in the run dtype because the forward runs under autocast (engine/trainer.py).
        try:
            # get_peft_model imports gptqmodel lazily (to dispatch GPTQ layers): guard the environment again.
            with quiet_import():
                model = peft.get_peft_model(model, lora_cfg)
        except ValueError as exc:
            from ftprof.errors import ConfigError

            raise ConfigError(f"--lora-targets: {str(exc).splitlines()[0]}") from None
        if m.lora_addmm:
            lora_addmm.fuse_adapters(model)
        if m.lora_fused_a:
            lora_fused_a.fuse_groups(metrics.decoder_layers(model))
        return model


class QLoRA(LoRA):
    name = "qlora"
    can_defer_init = False  # quantizing needs the weights: each rank builds the (4-bit) model, then FSDP shards it

    def load(self, ctx: LoadContext) -> nn.Module:
        m = ctx.cfg.method
        compute, storage = torch_dtype(m.compute_dtype), torch_dtype(m.quant_storage)
        if ctx.device.type == "cpu":
            from ftprof.models.bnb_cpu import fix_cpu_dequantize

            if fix_cpu_dequantize():
                ctx.log("note: on this CPU, 4-bit weights are dequantized by bitsandbytes' exact pure-torch "
                        "reference (its native CPU kernel rounds rows that are not whole blocks differently)")
        if ctx.source.kind != "preset":
            from transformers import BitsAndBytesConfig

            bnb_cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=m.quant_type,
                                         bnb_4bit_use_double_quant=m.double_quant, bnb_4bit_compute_dtype=compute,
                                         bnb_4bit_quant_storage=storage)
            return _from_pretrained(ctx, quantization_config=bnb_cfg)
        return _build(ctx, replace_linear=lambda name, lin: self._quantize_linear(name, lin, ctx, compute, storage))

    @staticmethod
    def _quantize_linear(name: str, linear: nn.Linear, ctx: LoadContext, compute: torch.dtype,
                         storage: torch.dtype) -> nn.Module | None:
        """Swap one freshly initialised decoder linear for a bitsandbytes 4-bit one (lm_head stays unquantized)."""
        if ".layers." not in f".{name}":
            return None
        import bitsandbytes as bnb

        m = ctx.cfg.method
        q = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                              compute_dtype=compute, compress_statistics=m.double_quant, quant_type=m.quant_type,
                              quant_storage=storage, device="meta")
        # Params4bit quantizes on its first move to a real device; the 16-bit weight is freed right after.
        # module=q keeps the quant state on the module too: FSDP2 all-gathers the packed weight into a plain tensor
        # and bitsandbytes restores its quant state from there (needs a floating quant_storage, e.g. bf16).
        q.weight = bnb.nn.Params4bit(linear.weight.data, requires_grad=False, quant_type=m.quant_type,
                                     compress_statistics=m.double_quant, quant_storage=storage, module=q)
        if linear.bias is not None:
            q.bias = nn.Parameter(linear.bias.data, requires_grad=False)
        q = q.to(ctx.device)
        return q


class GPTQLoRA(LoRA):
    name = "gptq-lora"
    can_defer_init = False

    def load(self, ctx: LoadContext) -> nn.Module:
        from ftprof.models import gptq

        m = ctx.cfg.method
        path = ctx.source.name if ctx.source.is_gptq_checkpoint else self._quantized_checkpoint(ctx)
        model = gptq.load_gptq(path, m.gptq_backend, ctx.device)
        # gptq_torch dequantizes inside torch autograd, which keeps each dequantized weight until backward. Without
        # checkpointing that is every layer at once (llama-8b on an H200: 76.7 -> 63.8 GiB peak with lean_backward,
        # 4.5% slower); with it only the layer being recomputed, so there the extra dequantization buys nothing.
        if m.gptq_backend == "gptq_torch" and ctx.policy == "none":
            gptq.lean_backward(model)
        # GPTQModel loads non-quantized parts in fp16; bring them to the run dtype so no op runs in mixed dtypes.
        cast_frozen_parameters(model, ctx.dtype)
        return model

    @staticmethod
    def _quantized_checkpoint(ctx: LoadContext):
        """Quantize a preset or a 16-bit checkpoint once; later runs reuse the cached GPTQ checkpoint."""
        from ftprof.models import gptq

        m = ctx.cfg.method
        key = gptq.cache_key(ctx.source.config, m, ctx.cfg.train.seed, ctx.cfg.data.seq_len)
        label = ctx.source.name if ctx.source.kind == "preset" else ctx.source.name.strip("/").replace("/", "--")
        fp_dtype = torch.float16 if ctx.device.type == "cuda" else torch.float32
        build = lambda: _build(dataclasses.replace(ctx, dtype=fp_dtype))  # noqa: E731
        # Several ranks: rank 0 quantizes, the others wait and then read the cache (never two writers, and never
        # two GPTQModel quantizers competing for the same GPUs).
        info = ranks.env_info()
        if info.enabled and not info.is_main:
            ranks.barrier()
        path = gptq.ensure_quantized(build, ctx.tokenizer, label, key, m, ctx.calibration, ctx.device, ctx.log)
        if info.enabled and info.is_main:
            ranks.barrier()
        return path


def cast_frozen_parameters(model: nn.Module, dtype: torch.dtype) -> None:
    """Replace each floating-point parameter not in ``dtype`` by a frozen copy in ``dtype``, once per parameter:
    a parameter two modules share (tied input embeddings and lm_head) stays shared. Cast per module, the two got
    a copy each: on an H200, gptq-lora's llama-1b held a second 0.5 GB embedding matrix (load memory 1.56 GB
    against 1.0 for QLoRA)."""
    cast: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}  # id -> (original, kept alive so ids stay unique; copy)
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.is_floating_point() or p.dtype == dtype:
                continue
            if id(p) not in cast:
                cast[id(p)] = (p, nn.Parameter(p.data.to(dtype), requires_grad=False))
            module._parameters[name] = cast[id(p)][1]


STRATEGIES = {s.name: s for s in (FullFineTune(), LoRA(), QLoRA(), GPTQLoRA())}


def get_strategy(method: str):
    return STRATEGIES[method]
