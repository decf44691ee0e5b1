"""Module names of the architectures ftprof knows, read from a model's config only (no torch, no weights): enough to
check ``--lora-targets`` and ``--seq-len`` before anything loads."""

from __future__ import annotations

import json
from pathlib import Path

from ftprof.models.presets import PRESETS
from ftprof.models.source import SIZES, classify_model_name

# Llama and Mistral share their module tree; LoRA can adapt the linear layers and the embedding.
LLAMA_MODULES = ("embed_tokens", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                 "lm_head")
ADAPTABLE = {"llama": LLAMA_MODULES, "mistral": LLAMA_MODULES}


def model_config_dict(name: str) -> dict | None:
    """A preset's shape (with its family as model_type) or a local checkpoint's config.json; None for hub ids or
    anything unreadable (the run's own checks report those)."""
    kind = classify_model_name(name)
    if kind == "preset":
        preset = PRESETS[name]
        return {**preset.shape, "model_type": preset.family}
    if kind == "local":
        try:
            data = json.loads((Path(name).expanduser() / "config.json").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None
    return None


def lora_target_problem(model: str, targets: tuple[str, ...] | None) -> str | None:
    """Why ``targets`` name no module of ``model`` (one line), or None when they do or the architecture is unknown.
    A target matches as PEFT matches it: a module name or a dotted suffix of one ('self_attn.q_proj')."""
    if not targets or targets == ("all-linear",):
        return None
    config = model_config_dict(model)
    modules = ADAPTABLE.get(str((config or {}).get("model_type")))
    if modules is None:
        return None
    for target in targets:
        if target.split(".")[-1] not in modules:
            return (f"--lora-targets: '{target}' names no module of {config['model_type']} model '{model}' "
                    f"(adaptable: {', '.join(modules)}, or all-linear)")
    return None


def max_positions(model: str) -> int | None:
    value = (model_config_dict(model) or {}).get("max_position_embeddings")
    return value if isinstance(value, int) else None


def hidden_size(model: str) -> int | None:
    """A preset's or local checkpoint's hidden size (its SIZES spellings), read without torch; None if unknown."""
    data = model_config_dict(model) or {}
    value = next((data[k] for k in SIZES["hidden_size"] if data.get(k) is not None), None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def decoder_layers(model: str) -> int | None:
    """A preset's or local checkpoint's decoder layers (num_hidden_layers), read without torch; None if unknown."""
    value = (model_config_dict(model) or {}).get("num_hidden_layers")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
