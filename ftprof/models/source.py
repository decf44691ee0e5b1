"""Where a model comes from: a built-in preset, a local checkpoint directory, or a hub id.

Resolving a source reads only the model's config (no weights), so bad input is caught before anything big loads.
"""

from __future__ import annotations

import json
import os
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


# ---------------------------------------------------------------------------------------------------- local configs
# What ftprof builds, probes and trains is a decoder-only causal LM; the sizes the probe and the planner read, each by
# the names configs spell it (GPT-2's n_embd is hidden_size to transformers).
SIZES = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"),
    "vocab_size": ("vocab_size",),
}
DERIVED_INTERMEDIATE = {"gpt2", "gpt_neo", "gptj", "gpt_bigcode", "bloom", "falcon", "codegen"}  # 4 x hidden if null
ENCODERS = {"bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "xlm-roberta",
            "camembert", "mpnet", "t5", "mt5", "umt5", "bart", "mbart", "pegasus", "marian", "longformer",
            "modernbert", "vit", "clip", "whisper", "wav2vec2"}
# Decoders whose modules are not named as Llama's (q_proj, ..., down_proj: the default --lora-targets), and theirs.
OTHER_MODULE_NAMES = {
    "gpt2": "c_attn, c_proj, c_fc", "gpt_bigcode": "c_attn, c_proj, c_fc",
    "codegen": "qkv_proj, out_proj, fc_in, fc_out",
    "gpt_neox": "query_key_value, dense, dense_h_to_4h, dense_4h_to_h",
    "bloom": "query_key_value, dense, dense_h_to_4h, dense_4h_to_h",
    "falcon": "query_key_value, dense, dense_h_to_4h, dense_4h_to_h",
    "phi3": "qkv_proj, o_proj, gate_up_proj, down_proj",
}
WEIGHT_MARGIN = 10  # a model whose bf16 weights exceed this many times the largest memory anywhere: a typo


def read_local_config(path: Path) -> dict:
    """A local model directory's config.json as a dict (ConfigError, one line, when it is not one)."""
    file = path / "config.json"
    try:
        data = json.loads(file.read_bytes())
    except OSError as exc:
        raise ConfigError(f"--model: cannot read {file}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError):
        raise ConfigError(f"--model: {file} is not JSON") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--model: {file} holds a JSON {type(data).__name__}, not a model configuration")
    return data


def weights_problem(path: Path) -> str | None:
    """Why the checkpoint directory ``path`` has no weights a run could load (one line), or None: no *.safetensors
    or *.bin file at all, an index naming shards that are not there, or a model.safetensors whose header is not
    safetensors' (8 bytes of length, then that many bytes of JSON). Read before torch; ``ftprof plan`` alone needs
    only config.json (its probe builds the layers from it)."""
    names = {p.name for p in path.iterdir() if p.is_file()}
    if not any(n.endswith((".safetensors", ".bin")) for n in names):
        return f"--model: '{path}' has a config.json but no weights (no *.safetensors or *.bin file)"
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if index in names:
            try:
                shards = set(json.loads((path / index).read_bytes()).get("weight_map", {}).values())
            except (OSError, ValueError, AttributeError):
                return f"--model: {path / index} is not a weight index (JSON with a weight_map)"
            missing = sorted(shards - names)
            if missing:
                return f"--model: {path / index} names {len(missing)} missing shard(s), e.g. {missing[0]}"
    if "model.safetensors" in names:
        with open(path / "model.safetensors", "rb") as f:
            head = f.read(9)
        size = (path / "model.safetensors").stat().st_size
        length = int.from_bytes(head[:8], "little") if len(head) == 9 else 0
        if not (0 < length <= size - 8) or head[8:9] != b"{":
            return f"--model: {path / 'model.safetensors'} is not a safetensors file (its header is not one)"
    return None


def least_params(data: dict) -> int | None:
    """A floor on the parameters of a model with config ``data`` (None where its sizes are missing or odd): one
    embedding table, and per layer the query and output projections and two MLP matrices. The key and value
    projections (small under grouped-query attention), a second table, norms and biases are left out."""
    sizes = {n: _size(data, n) for n in SIZES}
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in sizes.values() if v is not None) \
            or None in (sizes["hidden_size"], sizes["num_hidden_layers"], sizes["vocab_size"]):
        return None
    hidden = sizes["hidden_size"]
    inter = sizes["intermediate_size"] or 4 * hidden
    return sizes["vocab_size"] * hidden + sizes["num_hidden_layers"] * (2 * hidden * hidden + 2 * hidden * inter)


def _size(data: dict, name: str):
    return next((data[k] for k in SIZES[name] if data.get(k) is not None), None)


def _largest_memory() -> tuple[float, str]:
    """(bytes, what) of the largest memory a model could be put in: the largest GPU ftprof plans for, or this
    machine's RAM."""
    from ftprof.gpus import CATALOGUE

    gpu = max(CATALOGUE.values(), key=lambda g: g.memory_gib)
    best = (gpu.memory_gib * 2**30, f"the largest GPU's {gpu.memory_gib:.0f} GiB ({gpu.name})")
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        host = 0
    return max(best, (float(host), f"this machine's {host / 2**30:.0f} GiB"))


def known_model_types() -> frozenset[str]:
    """The model types the installed transformers knows (CONFIG_MAPPING_NAMES' keys), read from its source text:
    importing the mapping imports torch. transformers 5 keeps the mapping in models/auto/auto_mappings.py, earlier
    versions in configuration_auto.py. Empty where neither can be read (then no type is refused)."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    auto = Path(next(iter(spec.submodule_search_locations))) / "models" / "auto"
    types: set[str] = set()
    for name in ("auto_mappings.py", "configuration_auto.py"):
        try:
            text = (auto / name).read_text()
        except OSError:
            continue
        types.update(re.findall(r'"([\w-]+)"\s*[:,]\s*"\w+Config"', text))
    return frozenset(types) if len(types) > 50 else frozenset()  # (a layout this reader does not know: no check)


def local_config_problem(name: str, data: dict) -> str | None:
    """Why the model directory ``name`` with config.json ``data`` cannot be probed or trained (one line naming the
    fields and their values), or None. Read before transformers: a config it would complete with another model's
    defaults (LlamaConfig's are a 7B model), sizes no model has, or an architecture ftprof cannot build."""
    where = f"--model '{name}': config.json"
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return f"{where} has no model_type (e.g. \"llama\"): transformers cannot tell what architecture it is"
    known = known_model_types()
    if known and model_type not in known and "auto_map" not in data:  # (auto_map: the checkpoint's own code)
        return (f"{where}: model_type '{model_type}' is not an architecture the installed transformers knows"
                f"{did_you_mean(model_type, known)}")
    archs = data.get("architectures") if isinstance(data.get("architectures"), list) else []
    causal = any(isinstance(a, str) and a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    if model_type.lower() in ENCODERS or (data.get("is_encoder_decoder") is True and not causal):
        return (f"{where}: a {model_type} model ({', '.join(map(str, archs)) or 'no architectures'}) is not a "
                "decoder-only causal LM: ftprof probes and fine-tunes causal LMs (Llama, Mistral, Qwen, ...)")
    missing = [n for n in SIZES if _size(data, n) is None
               and not (n == "intermediate_size" and model_type in DERIVED_INTERMEDIATE)]
    if missing:
        return (f"{where} lacks {', '.join(missing)}: transformers would fill them with {model_type}'s defaults "
                "(another model's sizes); give the model's own")
    sizes = {n: _size(data, n) for n in SIZES if _size(data, n) is not None}
    for n, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{where}: {n} is {value!r}; it must be a whole number of at least 1"
    hidden, heads = sizes["hidden_size"], sizes["num_attention_heads"]
    if hidden % heads and not isinstance(data.get("head_dim"), int):
        return f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}"
    inter = sizes.get("intermediate_size", 4 * hidden)
    params = 2 * sizes["vocab_size"] * hidden + sizes["num_hidden_layers"] * (4 * hidden * hidden + 3 * hidden * inter)
    largest, what = _largest_memory()
    if params * 2 > WEIGHT_MARGIN * largest:
        return (f"{where}: hidden_size {hidden:,}, num_hidden_layers {sizes['num_hidden_layers']:,}, intermediate_size "
                f"{inter:,}, vocab_size {sizes['vocab_size']:,} make about {params:.2g} parameters, "
                f"{params * 2 / 2**40:,.0f} TiB of bf16 weights: over {WEIGHT_MARGIN}x {what}; check the sizes")
    return None


def default_targets_problem(name: str, data: dict) -> str | None:
    """For a LoRA run without --lora-targets: a decoder whose modules are not named as the default targets
    (Llama's q_proj ... down_proj) is told to pass --lora-targets, with its own module names."""
    model_type = data.get("model_type")
    names = OTHER_MODULE_NAMES.get(str(model_type))
    if names is None:
        return None
    return (f"--model '{name}': {model_type} names its layers {names}, not q_proj ... down_proj (the default LoRA "
            f"targets): pass --lora-targets with its own names (e.g. --lora-targets {names.split(', ')[0]}) or "
            "--lora-targets all-linear")
