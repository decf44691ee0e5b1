"""What ran, told by the model and the trainer's arguments: the method (recognised from the PEFT and quantization
configs), its LoRA settings, and the training settings, as a RunConfig, so that a run measured inside someone
else's loop compares with ftprof's own runs under the same option names.

Settings ftprof's config cannot spell (another scheduler or optimizer, a non-LoRA adapter) keep ftprof's nearest
spelling in the RunConfig and a note; the trainer's own arguments are kept as they are beside it (config.json's
``trainer`` section).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from ftprof.config import DTYPES, LR_SCHEDULERS, OPTIMIZERS, RunConfig
from ftprof.errors import ConfigError


def unwrap(model):
    """The model under DDP / accelerate / torch.compile wrappers (``.module``, ``._orig_mod``)."""
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            break
        model = inner
    return model


def base_config(model):
    """The transformers config of the model under any PEFT wrapper (None for a plain nn.Module)."""
    model = unwrap(model)
    for candidate in (model, getattr(model, "base_model", None), getattr(getattr(model, "base_model", None),
                                                                         "model", None)):
        config = getattr(candidate, "config", None)
        if config is not None and hasattr(config, "num_hidden_layers"):
            return config
    return getattr(model, "config", None)


def model_name(model) -> str:
    """The model's name or path as it was loaded; its class name when it was built in memory."""
    config = base_config(model)
    name = getattr(config, "_name_or_path", "") or getattr(unwrap(model), "name_or_path", "")
    if name:
        return str(name)
    inner = unwrap(model)
    base = getattr(getattr(inner, "base_model", None), "model", None)
    return type(base if base is not None and hasattr(inner, "peft_config") else inner).__name__


def _dtype_name(dtype) -> str | None:
    name = str(dtype).removeprefix("torch.") if dtype is not None else None
    return name if name in DTYPES else None


def weights_dtype(model) -> str:
    """The dtype most floating-point parameter elements are stored in (float32 for a model without any)."""
    counts: dict[str, int] = {}
    for p in unwrap(model).parameters():
        if p.is_floating_point():
            name = _dtype_name(p.dtype) or "float32"
            counts[name] = counts.get(name, 0) + p.numel()
    return max(counts, key=counts.get) if counts else "float32"


@dataclass
class Described:
    """A measured run's RunConfig as flat options, and what ftprof's options could not say (notes)."""

    flat: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def config(self) -> RunConfig:
        """The RunConfig; options ftprof's config refuses (a learning rate of 0, say) are left at their defaults,
        each with a note, so that a run is always recorded."""
        flat = dict(self.flat)
        while True:
            try:
                return RunConfig.from_flat(flat)
            except ConfigError as exc:
                key = next((k for k in flat if k not in ESSENTIAL and _refused(flat, k)), None)
                key = key or next((k for k in flat if k not in ESSENTIAL), None)
                if key is None:
                    raise
                self.notes.append(f"{key}={flat.pop(key)!r} recorded as ftprof's default ({exc})")


ESSENTIAL = ("method", "model", "seq_len")


def _refused(flat: dict[str, Any], key: str) -> bool:
    """Whether leaving ``key`` out makes the options valid."""
    try:
        RunConfig.from_flat({k: v for k, v in flat.items() if k != key})
        return True
    except ConfigError:
        return False


def _quantization(model) -> dict[str, Any]:
    config = base_config(model)
    quant = getattr(config, "quantization_config", None)
    if quant is None:
        return {}
    return quant if isinstance(quant, dict) else quant.to_dict()


def _quantized_modules(model) -> set[str]:
    names = {type(m).__name__ for m in unwrap(model).modules()}
    return {n for n in names if n in ("Linear4bit", "Linear8bitLt") or "QuantLinear" in n}


def method_options(model, run_dtype: str) -> Described:
    """method and its options, recognised from the model: full, lora, qlora (bitsandbytes 4-bit) or gptq-lora."""
    out = Described()
    inner = unwrap(model)
    peft = getattr(inner, "peft_config", None)
    adapter = next(iter(peft.values())) if isinstance(peft, dict) and peft else None
    quant = _quantization(model)
    modules = _quantized_modules(model)
    if quant.get("quant_method") == "gptq" or any("QuantLinear" in n for n in modules):
        method = "gptq-lora"
    elif quant.get("load_in_4bit") or "Linear4bit" in modules:
        method = "qlora"
    else:
        method = "lora" if adapter is not None else "full"
    if quant.get("load_in_8bit") or "Linear8bitLt" in modules:
        out.notes.append("8-bit bitsandbytes weights: not one of ftprof's methods; recorded as "
                         f"{'lora' if adapter is not None else 'full'}")
        method = "lora" if adapter is not None else "full"
    if method != "full" and adapter is None:
        out.notes.append(f"{method.split('-')[0]} weights without a LoRA adapter: recorded as {method}")
    out.flat["method"] = method
    if method == "full":
        return out
    out.flat.update(_lora_options(adapter, out.notes))
    out.flat.update(lora_addmm=False, lora_fused_a=False)  # PEFT's own adapter forward ran
    if method in ("lora", "qlora"):
        out.flat.update(lora_fused_projections=False, fp8_base=False)
    if method == "qlora":
        out.flat.update(_bnb_options(quant, run_dtype))
    if method in ("qlora", "gptq-lora"):
        # the 4-bit matmuls' dtype, not the run's: the textbook recipe upcasts everything else to float32
        out.flat["kbit_prepare"] = _kbit_prepared(inner, out.flat.get("compute_dtype") or run_dtype)
    if method == "gptq-lora":
        out.flat.update(gptq_bits=quant.get("bits") or 4, gptq_group_size=quant.get("group_size") or 128)
    return out


def _lora_options(adapter, notes: list[str]) -> dict[str, Any]:
    if adapter is None:
        return {}
    kind = str(getattr(adapter, "peft_type", "LORA")).rsplit(".", 1)[-1]
    if kind != "LORA":
        notes.append(f"PEFT adapter type {kind}: ftprof's methods are LoRA ones; recorded as LoRA")
    if getattr(adapter, "use_dora", False):
        notes.append("DoRA adapters (use_dora): recorded as LoRA")
    targets = getattr(adapter, "target_modules", None)
    targets = (targets,) if isinstance(targets, str) else tuple(sorted(targets or ()))
    r = getattr(adapter, "r", None)
    return {"lora_r": int(r) if r else None, "lora_alpha": float(getattr(adapter, "lora_alpha", 2 * (r or 8))),
            "lora_dropout": float(getattr(adapter, "lora_dropout", 0.0) or 0.0), "lora_targets": targets or None}


def _bnb_options(quant: dict[str, Any], run_dtype: str) -> dict[str, Any]:
    storage = _dtype_name(quant.get("bnb_4bit_quant_storage")) or \
        ("uint8" if str(quant.get("bnb_4bit_quant_storage", "uint8")).endswith("uint8") else run_dtype)
    return {"quant_type": quant.get("bnb_4bit_quant_type") or "nf4",
            "double_quant": bool(quant.get("bnb_4bit_use_double_quant", False)),
            "compute_dtype": _dtype_name(quant.get("bnb_4bit_compute_dtype")) or "float32",
            "quant_storage": storage, "keep_dequantized": False, "dequant_kernel": "bitsandbytes"}


def _kbit_prepared(model, compute_dtype: str) -> bool:
    """PEFT's prepare_model_for_kbit_training upcasts the norms to float32: seen when a norm is float32 while the
    4-bit matmuls compute in 16 bits."""
    if compute_dtype == "float32":
        return False
    import torch

    for name, p in model.named_parameters():
        if "norm" in name and p.dtype == torch.float32:
            return True
    return False


# ---------------------------------------------------------------------------------------------------- trainer
def _value(v):
    return v.value if isinstance(v, enum.Enum) else v


def training_args_dict(args) -> dict[str, Any]:
    """The TrainingArguments (or SFTConfig) as JSON values: what the trainer was told, as it was told."""
    raw = args.to_dict() if hasattr(args, "to_dict") else dict(vars(args))
    out = {}
    for key, value in raw.items():
        value = _value(value)
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = str(value)
        out[key] = value
    return out


def train_options(args, max_steps: int, world_size: int) -> Described:
    """ftprof's train/data options from TrainingArguments, with notes where ftprof's spelling differs."""
    out = Described()
    schedule = str(_value(args.lr_scheduler_type))
    warmup = int(args.get_warmup_steps(max_steps)) if hasattr(args, "get_warmup_steps") else 0
    if schedule not in LR_SCHEDULERS:
        out.notes.append(f"learning-rate schedule {schedule}: recorded as linear (config.json's trainer section has "
                         "the trainer's arguments)")
        schedule = "linear"
    if schedule == "constant" and warmup:
        schedule = "constant_with_warmup"
    optim = str(_value(args.optim))
    optimizer = "paged_adamw_8bit" if optim == "paged_adamw_8bit" else "adamw"
    if optimizer not in OPTIMIZERS or "adamw" not in optim:
        out.notes.append(f"optimizer {optim}: recorded as adamw")
    elif optim not in OPTIMIZERS:
        out.notes.append(f"optimizer {optim} (recorded as {optimizer})")
    out.flat.update(
        batch_size=int(args.per_device_train_batch_size), grad_accum=int(args.gradient_accumulation_steps),
        max_steps=max(1, int(max_steps)), lr=float(args.learning_rate), lr_scheduler_type=schedule,
        warmup_steps=warmup, weight_decay=float(args.weight_decay), max_grad_norm=float(args.max_grad_norm or 0.0),
        optimizer=optimizer, seed=int(args.seed), gc_interval=0,
        checkpointing="full" if args.gradient_checkpointing else "none", compile=bool(args.torch_compile),
        packing=bool(getattr(args, "packing", False)))
    if world_size > 1:
        out.flat.update(nproc_per_node=world_size, parallel="fsdp" if getattr(args, "fsdp", None) else "ddp")
    return out


def attention_config(model):
    """The config the FLOP count reads (layers, heads, head size, vocabulary), or None where the model has none."""
    config = base_config(model)
    needed = ("num_hidden_layers", "num_attention_heads", "hidden_size")
    return config if config is not None and all(getattr(config, k, None) for k in needed) else None
