"""The vocabulary of options: each choice list once, the field helper every section uses to describe its option,
and the two checks that turn a bad value into one line naming the option."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from ftprof.errors import ConfigError, did_you_mean

# 2: warmup_steps became the learning-rate warm-up (the measurement warm-up is measure_warmup_steps), and the
# learning rate follows lr_scheduler_type (before: constant). RunConfig.from_dict reads version 1 with its meaning.
SCHEMA_VERSION = 2

METHODS = ("full", "lora", "qlora", "gptq-lora")
LORA_METHODS = ("lora", "qlora", "gptq-lora")
DTYPES = ("auto", "float32", "bfloat16", "float16")
OPTIMIZERS = ("adamw", "paged_adamw_8bit")
LR_SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup")  # transformers' names and meanings
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Aliases accepted for memory logging: the names users of the earlier benchmark scripts know.
MEMORY_LOGGING_ALIASES = {"nvidia": "nvml", "huggingface": "torch"}
MEMORY_LOGGING = ("none", "torch", "nvml", "all")
CHECKPOINTING = ("none", "full", "selective", "auto")
KERNELS = ("eager", "liger")
SDPA_BACKENDS = ("auto", "flash", "efficient", "cudnn")  # models/attention.py says what each means
# torch.compile's modes, by torch's names; engine/compile.py says what each does to a decoder block.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the modes that replay compiled code as CUDA graphs
TRACKERS = ("tensorboard", "wandb", "mlflow")
DEQUANT_KERNELS = ("auto", "bitsandbytes", "triton")
DATA_FORMATS = ("auto", "text", "instruction", "chat")
TRAIN_ON = ("completion", "prompt")
PARALLEL = ("fsdp", "ddp")
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2", "static")  # torchrun's
PROFILER_ACTIVITIES = ("cpu", "cuda")
MAX_STEPS = 10**8  # more optimizer steps than any fine-tuning takes: a typo (a run that would never end)

# The HF Trainer's (and TRL's) spellings, accepted as aliases where they mean the same thing as ours.
HF_ALIASES = {"lr": "--learning-rate", "batch_size": "--per-device-train-batch-size",
              "grad_accum": "--gradient-accumulation-steps", "seq_len": "--max-seq-length"}
# The HF Trainer's precision flags: each stands for one --dtype value (given with --dtype: an option given twice).
HF_DTYPE_FLAGS = {"--bf16": "bfloat16", "--fp16": "float16"}


def option(default: Any = None, help: str = "", *, choices: tuple | None = None, metavar: str | None = None,
           default_factory: Any = None) -> Any:
    """A dataclass field that also describes its command-line option."""
    meta = {"help": help, "choices": choices, "metavar": metavar}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def checked_value(key: str, hint: Any, value: Any) -> Any:
    """``value`` for option ``key`` of type ``hint``: the right type, or one line naming the option (ConfigError).
    Values from YAML or Python callers: ints pass as floats, lists and strings as tuples (their sections split
    them), bools are not ints."""
    import math
    import numbers
    import os
    import types
    import typing

    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None and type(None) in args:
        return value
    base = next(a for a in args if a is not type(None))
    base = tuple if typing.get_origin(base) is tuple else base
    if base is tuple and isinstance(value, (list, tuple, str)):
        return value
    if base is str and isinstance(value, os.PathLike):  # a pathlib.Path for a directory option
        return os.fspath(value)
    if base is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)  # (numpy's integers too)
    if base is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
    if base is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"--{key.replace('_', '-')} must be a finite number, got {value}")
    if isinstance(base, type) and isinstance(value, base) and not (base is int and isinstance(value, bool)):
        return value
    name = getattr(base, "__name__", str(base))
    raise ConfigError(f"option '{key}' must be {name}, got {type(value).__name__} ({value!r})")


def check_types(section: Any) -> None:
    """Each field of a config section (a dataclass) holds its option's type, coerced as ``checked_value`` does:
    a section built in Python with a wrong type is one line naming the option, not a TypeError from a comparison
    deep inside its checks. Called first in each section's __post_init__."""
    import dataclasses

    hints = type_hints(type(section))
    for f in dataclasses.fields(section):
        setattr(section, f.name, checked_value(f.name, hints[f.name], getattr(section, f.name)))


_HINTS: dict[type, dict[str, Any]] = {}


def type_hints(cls: type) -> dict[str, Any]:
    """A config section's resolved type hints, once per class (typing.get_type_hints is slow: sweeps build
    thousands of sections, and building the CLI's parser asked for them about a hundred times, 25 ms a parser)."""
    if cls not in _HINTS:
        import typing

        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def one_of(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}: '{value}' is not one of {', '.join(map(str, allowed))}"
                          f"{did_you_mean(value, allowed)}")
