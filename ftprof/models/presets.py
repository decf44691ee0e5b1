"""Built-in model presets: real architectures (shapes from their public configs) with random weights.

No download is needed: a preset is a transformers config built from the numbers below, and its weights are
initialised at random on the target device (``ftprof.models.materialize``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Preset:
    name: str
    family: str  # "llama" or "mistral": which transformers config class
    description: str
    shape: dict[str, Any] = field(default_factory=dict)


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_theta": 500000.0}

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("tiny", "llama", "2-layer Llama, 64 wide: for tests and CPU smoke runs", dict(
        vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    Preset("llama-1b", "llama", "Llama-3.2-1B shape (1.24B parameters)", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
        tie_word_embeddings=True, rope_parameters=_LLAMA3_ROPE)),
    Preset("llama-8b", "llama", "Llama-3.1-8B shape (8.03B parameters)", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters=dict(_LLAMA3_ROPE, factor=8.0))),
    Preset("mistral-7b", "mistral", "Mistral-7B-v0.1 shape (7.24B parameters)", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=32768, rms_norm_eps=1e-5, sliding_window=4096,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    Preset("llama-70b", "llama", "Llama-2-70B shape (69.0B parameters)", dict(
        vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
)}


def preset_config(name: str):
    """The transformers config of a preset (cheap: no weights)."""
    from transformers import LlamaConfig, MistralConfig

    preset = PRESETS[name]
    cls = {"llama": LlamaConfig, "mistral": MistralConfig}[preset.family]
    # Token ids match the locally built tokenizer (ftprof.models.tokenizer).
    config = cls(**preset.shape, bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.02,
                 use_cache=False)
    config.name_or_path = f"ftprof-preset/{name}"
    return config
