"""Where a model comes from: a built-in preset, a local checkpoint directory, or a hub id.

Resolving a source reads only the model's config (no weights), so bad input is caught before anything big loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftprof.errors import ConfigError, did_you_mean
from ftprof.models.presets import PRESETS, preset_config


@dataclass
class ModelSource:
    kind: str  # "preset" | "local" | "hub"
    name: str  # preset name, absolute directory, or hub id
    config: Any  # transformers PretrainedConfig

    @property
    def is_gptq_checkpoint(self) -> bool:
        qc = getattr(self.config, "quantization_config", None)
        if qc is None:
            return False
        method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
        return str(method).lower().endswith("gptq")

    @property
    def max_positions(self) -> int | None:
        return getattr(self.config, "max_position_embeddings", None)


def classify_model_name(name: str) -> str | None:
    """What ``--model NAME`` names, without reading anything: "preset", "local" (a path: it starts with ., / or ~,
    or exists), "hub" (exactly owner/name), or None (none of these). The sweep check and the run agree through it."""
    if name in PRESETS:
        return "preset"
    if name.startswith((".", "/", "~")) or Path(name).exists():
        return "local"
    if name.count("/") == 1 and all(name.split("/")):
        return "hub"
    return None


def unknown_model_message(name: str) -> str:
    return f"'{name}' is not a preset ({', '.join(PRESETS)}), a directory, or a hub id{did_you_mean(name, PRESETS)}"


def resolve_model_source(name: str) -> ModelSource:
    """Classify ``name`` and read its config; raise ConfigError with one line on failure."""
    kind = classify_model_name(name)
    if kind == "preset":
        return ModelSource("preset", name, preset_config(name))
    if kind == "local":
        path = Path(name).expanduser().resolve()
        if not path.is_dir():
            raise ConfigError(f"--model: '{name}' is not a directory")
        if not (path / "config.json").is_file():
            raise ConfigError(f"--model: '{name}' has no config.json (not a transformers checkpoint)")
        try:
            json.loads((path / "config.json").read_text())
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(str(path))
        except Exception as exc:  # noqa: BLE001 - any parse failure is a user error here
            raise ConfigError(f"--model: cannot read {path / 'config.json'}: {exc}") from None
        return ModelSource("local", str(path), config)
    if kind == "hub":
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(name)
        except Exception as exc:  # noqa: BLE001 - offline, unknown repo, gated...
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"--model: cannot load hub id '{name}': {first}") from None
        return ModelSource("hub", name, config)
    raise ConfigError(f"--model: {unknown_model_message(name)}")
