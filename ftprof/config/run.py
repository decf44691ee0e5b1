"""RunConfig: the sections together, built from and spelled as flat option names (sweep files, argparse
namespaces, command lines)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field, fields
from typing import Any

from ftprof.config import declarations
from ftprof.config.data import DataConfig
from ftprof.config.distributed import DistributedConfig
from ftprof.config.evaluation import EvalConfig
from ftprof.config.method import MethodConfig
from ftprof.config.model import ModelConfig
from ftprof.config.options import SCHEMA_VERSION, checked_value, require
from ftprof.config.output import OutputConfig
from ftprof.config.profiling import ProfilingConfig
from ftprof.config.saving import SaveConfig
from ftprof.config.train import TrainConfig
from ftprof.errors import ConfigError, did_you_mean

SECTIONS = {"model": ModelConfig, "data": DataConfig, "method": MethodConfig, "train": TrainConfig,
            "eval": EvalConfig, "save": SaveConfig, "output": OutputConfig, "profiling": ProfilingConfig,
            "distributed": DistributedConfig}


@dataclass
class RunConfig:
    """Everything one run needs. ``ftprof.train(RunConfig(...))`` runs it."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    save: SaveConfig = field(default_factory=SaveConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        for name, cls in SECTIONS.items():  # RunConfig(model="tiny"): a section, not an option's value
            given = getattr(self, name)
            require(isinstance(given, cls), f"RunConfig's {name} is a {cls.__name__}, got {type(given).__name__} "
                    f"({given!r:.40}); RunConfig.from_flat({{...}}) builds one from option names")
        if self.model.checkpointing == "auto" and self.distributed.parallel == "fsdp" and \
                (self.distributed.world_size > 1 or self.distributed.fsdp_cpu_offload):
            raise ConfigError("--checkpointing auto estimates one unsharded process's memory: use it on one GPU "
                              "without --fsdp-cpu-offload or with --parallel ddp, or pick a policy for FSDP runs")
        if self.model.kernels == "liger" and "lm_head" in (self.method.lora_targets or ()):
            raise ConfigError("--lora-targets lm_head: Liger's fused linear cross entropy computes the loss from "
                              "lm_head's weight directly and would skip its adapter; use --kernels eager")
        for problem in declarations.problems(self.declared_values()):
            raise ConfigError(problem)
        self._check_steps()

    def declared_values(self) -> dict:
        """Every option's value in one flat mapping, with the derived facts the option declarations read
        (config/declarations.py)."""
        d = self.distributed
        values = {k: v for section in SECTIONS for k, v in dataclasses.asdict(getattr(self, section)).items()}
        values[declarations.SHARDED] = d.parallel == "fsdp" and (d.world_size > 1 or d.fsdp_cpu_offload)
        values[declarations.SEVERAL] = d.world_size > 1
        return values

    def _check_steps(self) -> None:
        """Epochs need a dataset; eval on real data needs eval rows. (A run all of whose steps are measurement warm-up
        runs, with a note and no steady figures: preflight says so.)"""
        t, synthetic = self.train, self.data.dataset == "synthetic"
        require(t.num_train_epochs is None or not synthetic,
                 "--num-train-epochs: synthetic data is an endless stream with no epochs; use --max-steps")
        e = self.eval
        require(not (e.eval_steps is not None and not synthetic and e.eval_dataset is None and e.eval_split is None),
                 "--eval-steps: say what to evaluate on with --eval-dataset or --eval-split")
        require(not (synthetic and (e.eval_split is not None or e.eval_dataset is not None)),
                 "--eval-dataset/--eval-split: the model trains on the synthetic token stream; evaluate it on that "
                 "stream with --eval-steps alone, or train on a --dataset")

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> RunConfig:
        """Build from option names (snake_case long names, as in sweep files and argparse namespaces)."""
        require(isinstance(values, dict), f"RunConfig.from_flat takes a dict of option names, got "
                f"{type(values).__name__}")
        owner = flat_field_owners()
        unknown = [k for k in values if k not in owner]
        if unknown:
            raise ConfigError(f"unknown option '{unknown[0]}'{_nearest_option(str(unknown[0]), owner)}")
        parts: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
        for key, value in values.items():
            parts[owner[key]][key] = _check_type(key, value)
        try:
            return cls(**{s: SECTIONS[s](**kw) for s, kw in parts.items()})
        except TypeError as exc:  # a wrong type that slipped past the parser, e.g. from Python callers
            raise ConfigError(str(exc)) from None

    def to_flat(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for section in SECTIONS:  # fields are plain values (tuples, not nested dataclasses): no deep copy needed
            part = getattr(self, section)
            out.update({f.name: getattr(part, f.name) for f in fields(part)})
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """A config.json's content, read with the meaning its schema_version gave it (files without one are
        version 1)."""
        require(isinstance(data, dict), f"a run configuration is a JSON object (config.json), got "
                f"{type(data).__name__}")
        version = data.get("schema_version", 1)
        require(version <= SCHEMA_VERSION, f"config schema_version {version} is newer than this ftprof "
                 f"({SCHEMA_VERSION})")
        flat: dict[str, Any] = {}
        for section in SECTIONS:
            part = data.get(section, {})
            require(isinstance(part, dict), f"config section '{section}' is an object of options, got "
                    f"{type(part).__name__}")
            flat.update(part)
        flat = migrate_flat(flat, version)
        if isinstance(flat.get("lora_targets"), list):
            flat["lora_targets"] = tuple(flat["lora_targets"])
        return cls.from_flat(flat)

    def cli_args(self) -> list[str]:
        """The command-line words that rebuild this config (``ftprof train`` after the method: options that differ
        from their defaults). The one place where a config is spelled as a command line: command.sh uses it; child
        processes get the config as a file instead."""
        defaults = _default_flat()
        values = self.to_flat()
        args = [values.pop("method")]
        for key, value in values.items():
            # profile and gradient_checkpointing are implied by other options (--prof-*, --checkpointing)
            if value == defaults.get(key) or key in ("profile", "gradient_checkpointing") or value is None:
                continue
            args += option_words(key, value)
        if values.get("profile") and not any(a.startswith("--prof-") for a in args):
            args += ["--prof-active-steps", str(values["prof_active_steps"])]  # any --prof-* option turns it on
        return args

    def replace(self, **flat: Any) -> RunConfig:
        """A copy with some options changed, by flat name."""
        values = self.to_flat()
        values.update(flat)
        return RunConfig.from_flat(values)


def migrate_flat(values: dict[str, Any], version: int) -> dict[str, Any]:
    """Flat options written under an older schema_version, in today's names. Version 1: ``warmup_steps`` was the
    measurement warm-up (today's ``measure_warmup_steps``) and the learning rate was constant."""
    if version >= 2:
        return dict(values)
    out = dict(values)
    if "warmup_steps" in out:
        out["measure_warmup_steps"] = out.pop("warmup_steps")
    out.setdefault("lr_scheduler_type", "constant")
    return out


@functools.cache
def _default_flat() -> dict[str, Any]:
    return RunConfig().to_flat()


def option_words(key: str, value: Any) -> list[str]:
    """One option as command-line words: --flag / --no-flag for booleans, comma-joined lists, str() otherwise."""
    flag = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + key.replace("_", "-")]
    if isinstance(value, (list, tuple)):
        return [flag, ",".join(map(str, value))]
    return [flag, str(value)]


@functools.cache
def _field_types() -> dict[str, Any]:
    """Each option's type hint, resolved once (typing.get_type_hints is slow; sweeps check thousands of values)."""
    import typing

    return {name: hint for cls in SECTIONS.values() for name, hint in typing.get_type_hints(cls).items()}


def _check_type(key: str, value: Any) -> Any:
    """Values from YAML or Python callers: the right type, or one line naming the option (ints pass as floats)."""
    return checked_value(key, _field_types()[key], value)


def _nearest_option(name: str, owner: dict) -> str:
    """`` (did you mean 'lr'?)``: the HF Trainer's spelling (learning_rate) first, else the closest option name."""
    from ftprof.config.options import HF_ALIASES

    ours = {flag[2:].replace("-", "_"): key for key, flag in HF_ALIASES.items()}
    return f" (did you mean '{ours[name]}'?)" if name in ours else did_you_mean(name, owner)


def flat_field_owners() -> dict[str, str]:
    """Map each option name to its section."""
    return dict(_owners())


@functools.cache
def _owners() -> dict[str, str]:
    return {f.name: section for section, cls in SECTIONS.items() for f in fields(cls)}
