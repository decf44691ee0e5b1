"""Sweep files: YAML -> a validated list of experiments, before anything runs.

    name: quickstart            # results go to results/<name>/ unless --output-dir is given
    base: {model: tiny, max_steps: 6}          # any train option, by its long name in snake_case
    matrix: {method: [full, lora], batch_size: [1, 2]}   # cartesian product
    experiments: [{method: lora, seq_len: 256}]          # extra cells, each merged over base
    exclude: [{method: full, batch_size: 2}]             # drop matrix cells matching all given keys
    repeats: 1
    memory_logging: all         # nvml | torch | all | none (MEMORY_LOGGING in the environment overrides it)
    timeout_s: 1800             # per experiment
    launcher: {type: slurm, partition: gpu, time: 60}   # where experiments run (ftprof/bench/launcher.py)
    schema_version: 2           # without it, 1: warmup_steps is read as measure_warmup_steps, the lr is constant

Two keys a cell may set (in base, matrix, experiments or exclude) that are not train options:

    trainer: hf                 # what trains the cell: ftprof (its own loop, the default), or a peer recipe
                                # through ftprof's Trainer callback: hf (Trainer + PEFT), trl (SFTTrainer), unsloth
    python: /tmp/peers/bin/python   # the interpreter (a venv's) the cell runs in; default: the one running bench.
                                # ~, $VAR and ${VAR:-default} expand; an unset $VAR is refused; empty: the default

Every problem is reported as one line naming the file and where in it (``sweep.yaml: matrix.batch_size: ...``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftprof.bench.launcher import LauncherSettings, launcher_from_file
from ftprof.checks import check_before_load
from ftprof.config import (
    MEMORY_LOGGING,
    MEMORY_LOGGING_ALIASES,
    SCHEMA_VERSION,
    RunConfig,
    flat_field_owners,
    migrate_flat,
)
from ftprof.config.yaml_io import YamlProblem, canonical_keys, check_old_names, read_yaml, whole_numbers
from ftprof.errors import ConfigError, did_you_mean

TOP_KEYS = {"name": str, "base": dict, "matrix": dict, "experiments": list, "exclude": list, "repeats": int,
            "memory_logging": str, "timeout_s": (int, float), "description": str, "launcher": dict,
            "schema_version": int}
# How each top-level key's type reads in a message ("repeats: must be a whole number, got str").
TYPE_WORDS = {str: "a string", dict: "a mapping", list: "a list", int: "a whole number", (int, float): "a number"}
# What a sweep may expand to, checked on the list lengths before anything is expanded.
MAX_CELLS = 100_000  # matrix cells plus experiments, times repeats
MAX_REPEATS = 1_000
# Options whose one value is a list of names (a string of them, comma-separated, works too).
LIST_OPTIONS = ("lora_targets", "report_to")
# Train options bench sets itself for each experiment, so a sweep may not: why, and what to do instead.
PER_EXPERIMENT = {
    "output_dir": "is set by bench for each experiment (<output dir>/<experiment>); use ftprof bench --output-dir",
    "run_name": "is set by bench for each experiment (its directory name, from the options that vary); leave it out",
    "quiet": "bench always runs experiments quietly (their output goes to each one's stdout.log and stderr.log); "
             "leave it out",
}
SWEEP_ONLY = set(PER_EXPERIMENT)
# Keys a cell may set that bench reads itself (not train options): what trains the cell and in which interpreter.
CELL_KEYS = ("trainer", "python")
# ``trainer``: ftprof's own loop, or a peer recipe (ftprof/integrations/recipes/<name>.py) measured by FtprofCallback.
TRAINERS = ("ftprof", "hf", "trl", "unsloth")
RECIPES = {"hf": "the HF Trainer + PEFT recipe", "trl": "TRL's SFTTrainer", "unsloth": "Unsloth"}
# How config.json's trainer section names each (FtprofCallback's names: hf-trainer, trl-sft).
TRAINER_NAMES = {"hf": "hf-trainer", "trl": "trl-sft", "unsloth": "unsloth"}
# The options a peer recipe spells in its own library (everything else must stay at ftprof's default in its cells):
# the method, model, data, shape, LoRA, optimizer and schedule a Trainer script sets.
RECIPE_OPTIONS = frozenset({
    "method", "model", "dtype", "checkpointing", "gradient_checkpointing", "attn_implementation", "kernels",
    "lora_r", "lora_alpha", "lora_dropout", "lora_targets", "quant_type", "double_quant", "compute_dtype",
    "kbit_prepare",
    "dataset", "dataset_config", "dataset_split", "data_format", "text_field", "prompt_template", "response_field",
    "messages_field", "train_on", "dataset_num_proc", "seq_len", "batch_size", "packing",
    "grad_accum", "max_steps", "measure_warmup_steps", "lr", "lr_scheduler_type", "warmup_steps", "warmup_ratio",
    "weight_decay", "max_grad_norm", "optimizer", "seed", "device", "memory_logging",
})
RECIPE_VALUES = {  # option -> the values a recipe runs (others are refused in its cells)
    "method": ("full", "lora", "qlora"), "checkpointing": ("none", "full"), "device": ("auto", "cpu", "cuda"),
}
UNSLOTH_VALUES = {"kernels": ("eager",)}  # Unsloth patches in its own kernels: Liger's would be a different recipe


@dataclass
class Experiment:
    name: str  # directory name: stable across runs of the same sweep, so resume finds it
    values: dict[str, Any]  # the flat options of this cell (base merged), as given (trainer and python included)
    config: RunConfig
    trainer: str = "ftprof"  # TRAINERS: ftprof's loop, or the peer recipe that trains the cell
    python: str | None = None  # the interpreter the cell runs in (absolute); None: the one running bench

    @property
    def is_peer(self) -> bool:
        """Trained by a peer recipe (HF Trainer, TRL, Unsloth) rather than ftprof's own loop."""
        return self.trainer != "ftprof"

    @property
    def gpus(self) -> int:
        """GPUs this experiment needs on this node (its slot size)."""
        return self.config.distributed.nproc_per_node


@dataclass
class Sweep:
    name: str
    path: Path
    experiments: list[Experiment]
    memory_logging: str
    timeout_s: float
    repeats: int
    varying: list[str] = field(default_factory=list)  # option names that differ across experiments
    launcher: LauncherSettings = field(default_factory=LauncherSettings)  # the sweep file's launcher: section
    schema_version: int = SCHEMA_VERSION  # the option meanings its file says (none said: 1)

    @property
    def old_meanings_note(self) -> str | None:
        """A line for a sweep read with version 1's option meanings because its file says no schema_version."""
        if self.schema_version >= SCHEMA_VERSION:
            return None
        return (f"note: {self.path.name} says no schema_version, so its options mean what they did in version 1 "
                "(a constant learning rate; warmup_steps is the measurement warm-up); add `schema_version: "
                f"{SCHEMA_VERSION}` for today's meanings (docs/options.md)")


def _fail(path: Path, where: str, message: str) -> ConfigError:
    return ConfigError(f"{path.name}: {where}: {message}" if where else f"{path.name}: {message}")


def _canonical(path: Path, where: str, mapping: Any) -> Any:
    """A section's keys in their options' own names, as a --config file reads them (``learning_rate`` and
    ``max-steps`` are ``lr`` and ``max_steps``); one option under two spellings is refused."""
    if not isinstance(mapping, dict):
        return mapping  # _check_keys names the problem
    try:
        return canonical_keys(mapping, flat_field_owners())
    except ConfigError as exc:
        raise _fail(path, where, str(exc)) from None


def _check_keys(path: Path, where: str, mapping: Any, *, allow_lists: bool) -> None:
    owners = flat_field_owners()
    if not isinstance(mapping, dict):
        raise _fail(path, where, f"must be a mapping of option: value, got {type(mapping).__name__}")
    for key, value in mapping.items():
        if key in PER_EXPERIMENT:
            raise _fail(path, f"{where}.{key}", PER_EXPERIMENT[key])
        if key not in owners and key not in CELL_KEYS:
            raise _fail(path, f"{where}.{key}", f"unknown option{did_you_mean(str(key), owners)}")
        if allow_lists:
            if not isinstance(value, list) or not value:
                raise _fail(path, f"{where}.{key}", "must be a non-empty list of values")
            for i, one in enumerate(value):
                _check_value(path, f"{where}.{key}[{i}]", key, one)
        else:
            _check_value(path, f"{where}.{key}", key, value)


def _check_value(path: Path, where: str, key: object, value: Any) -> None:
    """One option's value has a shape an option can have: a scalar, or for a list option a flat list of names."""
    if key in LIST_OPTIONS and isinstance(value, list):
        bad = next((v for v in value if not isinstance(v, str)), None)
        if bad is not None or not value:
            got = "an empty list" if not value else f"a {type(bad).__name__} ({bad!r}) in it"
            raise _fail(path, where, f"must be a list of names (or one comma-separated string), got {got}")
    elif isinstance(value, (list, dict)):
        raise _fail(path, where, f"must be a single value, got a {type(value).__name__}")
    elif key == "trainer" and value not in TRAINERS:
        raise _fail(path, where, f"'{value}' is not one of {', '.join(TRAINERS)}{did_you_mean(str(value), TRAINERS)}")
    elif key == "python" and (not isinstance(value, str) or "\n" in value):
        raise _fail(path, where, f"must be the path of a Python interpreter, got {value!r}")
    elif key in LIST_OPTIONS and not isinstance(value, str) and value is not None:
        raise _fail(path, where, f"must be a list of names or a comma-separated string, got {type(value).__name__} "
                    f"({value!r})")


def _slug(values: dict[str, Any], keys: list[str]) -> str:
    parts = []
    for k in keys:
        if k not in values:  # an option only some cells set: the others keep its default, unnamed
            continue
        v = values[k]
        v = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v
        parts.append(f"{k}={v}")
    text = "_".join(parts) or "run"
    return re.sub(r"[^A-Za-z0-9_.=,+-]+", "-", text)[:120]


def _digest(values: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _differing_keys(cells: list[dict[str, Any]]) -> set[str]:
    """Options whose value is not the same in every cell (one pass over the cells: linear, not quadratic)."""
    seen: dict[str, set[str]] = {}
    for values in cells:
        for key in values:
            seen.setdefault(key, set())
    for values in cells:
        for key, distinct in seen.items():
            if len(distinct) < 2:
                distinct.add(json.dumps(values.get(key), default=str))
    return {key for key, distinct in seen.items() if len(distinct) > 1}


def load_sweep(path: str | Path) -> Sweep:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"'{path}' is a directory, not a sweep file (a YAML file of experiments)")
    if not path.is_file():
        raise ConfigError(f"sweep file '{path}' does not exist")
    try:
        data = read_yaml(path)  # the loader --config files use: numbers, duplicate keys, merge keys
    except YamlProblem as exc:
        raise _fail(path, exc.where, exc.problem) from None
    if not isinstance(data, dict):
        raise _fail(path, "", "must be a YAML mapping with at least 'matrix' or 'experiments'")
    for key, value in data.items():
        if key not in TOP_KEYS:
            raise _fail(path, str(key), f"unknown key{did_you_mean(str(key), TOP_KEYS)}")
        if not isinstance(value, TOP_KEYS[key]) or isinstance(value, bool):
            raise _fail(path, str(key), f"must be {TYPE_WORDS[TOP_KEYS[key]]}, got {type(value).__name__}")
    return _expand(path, data)


def _expand(path: Path, data: dict[str, Any]) -> Sweep:
    base, matrix, extra, exclude = _sections(path, data)
    repeats = data.get("repeats", 1)
    _check_size(path, matrix, extra, repeats)
    timeout = float(data.get("timeout_s", 1800))
    if not math.isfinite(timeout) or timeout <= 0:
        raise _fail(path, "timeout_s", f"must be positive and finite (seconds), got {timeout}")
    memory = _sweep_memory_logging(path, data)
    launcher = launcher_from_file(path, data.get("launcher"))
    cells = _cells(path, base, matrix, extra, exclude)
    differs = _differing_keys([values for _, values in cells])
    order = ["method"] + list(matrix) + sorted(differs)  # method first, then the matrix's own order
    # (python: where a cell runs, not what it runs; its digest still tells cells apart)
    varying = list(dict.fromkeys(k for k in order if k in differs and k != "python"))
    # A sweep file without schema_version is read as version 1 (warmup_steps: the measurement warm-up, constant
    # learning rate): the options a cell runs with are migrated, its name (from the values as written) is not.
    version = data.get("schema_version", 1)
    if not 1 <= version <= SCHEMA_VERSION:
        raise _fail(path, "schema_version", f"must be 1 to {SCHEMA_VERSION}, got {version}")
    experiments = _experiments(path, cells, varying, memory, repeats, version)
    sweep_name = data.get("name", path.stem)  # given, it is the name: an empty one is refused, not replaced
    if not sweep_name:
        raise _fail(path, "name", f"is empty: give a plain directory name, or leave name out to use '{path.stem}'")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", sweep_name) or sweep_name in (".", ".."):
        raise _fail(path, "name", f"'{sweep_name}' must be a plain directory name")
    return Sweep(sweep_name, path, experiments, memory, timeout, repeats, varying, launcher, version)


def _check_size(path: Path, matrix: dict, extra: list, repeats: int) -> None:
    """Refuse, from the lists' lengths alone, a sweep too large to expand (before one cell is made)."""
    if repeats < 1:
        raise _fail(path, "repeats", "must be at least 1")
    if repeats > MAX_REPEATS:
        raise _fail(path, "repeats", f"{repeats:,} is more than the {MAX_REPEATS:,} a sweep may repeat each cell")
    cells = (math.prod(len(v) for v in matrix.values()) if matrix else 0) + len(extra)
    if cells > MAX_CELLS:
        lengths = " x ".join(str(len(v)) for v in matrix.values())
        raise _fail(path, "matrix", f"{cells:,} cells ({lengths} in the matrix, {len(extra)} experiments): at most "
                    f"{MAX_CELLS:,}")
    if cells * repeats > MAX_CELLS:
        raise _fail(path, "repeats", f"{cells:,} cells x {repeats:,} repeats = {cells * repeats:,} experiments: at "
                    f"most {MAX_CELLS:,}")


def _sections(path: Path, data: dict[str, Any]) -> tuple[dict, dict, list, list]:
    """base, matrix, experiments and exclude, each checked: known option names, lists only in the matrix, and
    exclude rules that name matrix keys."""
    base, matrix = _canonical(path, "base", data.get("base", {}) or {}), \
        _canonical(path, "matrix", data.get("matrix", {}) or {})
    extra = [_canonical(path, f"experiments[{i}]", cell) for i, cell in enumerate(data.get("experiments", []) or [])]
    exclude = [_canonical(path, f"exclude[{i}]", rule) for i, rule in enumerate(data.get("exclude", []) or [])]
    _check_keys(path, "base", base, allow_lists=False)
    _check_keys(path, "matrix", matrix, allow_lists=True)
    for i, cell in enumerate(extra):
        _check_keys(path, f"experiments[{i}]", cell, allow_lists=False)
    for i, rule in enumerate(exclude):
        _check_keys(path, f"exclude[{i}]", rule, allow_lists=False)
        unknown = [k for k in rule if k not in matrix]
        if unknown:
            raise _fail(path, f"exclude[{i}].{unknown[0]}", "is not a matrix key, so it cannot exclude anything")
        # the matrix is a full product: a rule matches no cell exactly when one of its values is not in the matrix
        absent = next((k for k, v in rule.items() if v not in matrix[k]), None)
        if absent is not None:
            raise _fail(path, f"exclude[{i}].{absent}", f"{rule[absent]!r} is not one of the matrix's values "
                        f"({', '.join(map(str, matrix[absent]))}), so this rule excludes nothing")
    return base, matrix, extra, exclude


def _sweep_memory_logging(path: Path, data: dict[str, Any]) -> str:
    """The sweep's memory logging: MEMORY_LOGGING in the environment, else the file's, else all."""
    memory = os.environ.get("MEMORY_LOGGING") or data.get("memory_logging", "all")
    memory = MEMORY_LOGGING_ALIASES.get(memory, memory)
    if memory not in MEMORY_LOGGING:
        src = "MEMORY_LOGGING" if os.environ.get("MEMORY_LOGGING") else "memory_logging"
        raise _fail(path, src, f"'{memory}' is not one of {', '.join(MEMORY_LOGGING)} (or nvidia, huggingface)")
    return memory


def _cells(path: Path, base: dict, matrix: dict, extra: list, exclude: list) -> list[tuple[str, dict[str, Any]]]:
    """(where in the file, option values) of every cell: the matrix's product less the excluded, then the
    explicit experiments, each over the base."""
    cells: list[tuple[str, dict[str, Any]]] = []
    keys = list(matrix)
    for combo in itertools.product(*(matrix[k] for k in keys)) if keys else ():
        cell = dict(zip(keys, combo, strict=True))
        if any(all(cell.get(k) == v for k, v in rule.items()) for rule in exclude):
            continue
        where = "matrix[" + ", ".join(f"{k}={v}" for k, v in cell.items()) + "]"
        cells.append((where, {**base, **cell}))
    cells += [(f"experiments[{i}]", {**base, **cell}) for i, cell in enumerate(extra)]
    if not cells:
        raise _fail(path, "", "the sweep has no experiments (empty matrix and experiments, or all excluded)")
    return cells


def _experiments(path: Path, cells: list[tuple[str, dict[str, Any]]], varying: list[str], memory: str,
                 repeats: int, version: int = SCHEMA_VERSION) -> list[Experiment]:
    """One validated experiment per cell and repeat, named by the options that vary; a duplicate cell is an
    error."""
    experiments: list[Experiment] = []
    seen: dict[str, str] = {}
    runs: dict[str, str] = {}  # what each cell runs (its whole configuration): cells that differ only by defaults
    defaults = _default_options()
    data_checked: set[str] = set()  # each dataset's content is read once, however many cells use it
    pythons: dict[str, str | None] = {}  # each interpreter checked once
    for where, values in cells:
        values.setdefault("method", "qlora")
        options = {k: v for k, v in values.items() if k not in CELL_KEYS}
        try:
            check_old_names(options, version)
        except ConfigError as exc:
            raise _fail(path, where, str(exc)) from None
        trainer = values.get("trainer", "ftprof")
        if trainer != "ftprof":
            _check_recipe_options(path, where, trainer, options)
        config = _cell_config(path, where, migrate_flat(options, version), memory, data_checked)
        python = _python(path, where, values["python"], pythons) if values.get("python") else None
        name = f"{_slug(values, varying or ['method'])}-{_digest(values)}"
        if name in seen:
            raise _fail(path, where, f"duplicates {seen[name]}")
        ran = _off_defaults(values, defaults)
        if ran in runs:
            raise _fail(path, where, f"runs what {runs[ran]} runs (the options they differ in are at their defaults)")
        seen[name], runs[ran] = where, where
        for r in range(repeats):
            experiments.append(Experiment(name if repeats == 1 else f"{name}-r{r + 1}", values, config, trainer,
                                          python))
    return experiments


def _off_defaults(values: dict[str, Any], defaults: dict[str, Any]) -> str:
    """A cell's options less those given at their ``defaults`` (a key: two cells with the same one run the same)."""
    return json.dumps({k: v for k, v in values.items() if k not in defaults or v != defaults[k]}, sort_keys=True,
                      default=str)


def _check_recipe_options(path: Path, where: str, trainer: str, options: dict[str, Any]) -> None:
    """A peer recipe's cell sets only what the recipe spells (RECIPE_OPTIONS, at values it runs); an ftprof option
    off its default (a fast path, saving, evaluation, several processes) is refused in one line, not ignored."""
    defaults = _default_options()
    allowed = {**RECIPE_VALUES, **(UNSLOTH_VALUES if trainer == "unsloth" else {})}
    recipe = RECIPES[trainer]
    for key, value in options.items():
        if key in allowed and value not in allowed[key]:
            raise _fail(path, f"{where}.{key}", f"{recipe} (trainer: {trainer}) runs {key} "
                        f"{', '.join(map(str, allowed[key]))}, not {value!r}")
        if key in RECIPE_OPTIONS or value == defaults.get(key) or (value is None and defaults.get(key) is None):
            continue
        raise _fail(path, f"{where}.{key}", f"is an ftprof option {recipe} (trainer: {trainer}) does not take; "
                    f"leave it out of this cell (or run it with trainer: ftprof)")


def _default_options() -> dict[str, Any]:
    return RunConfig().to_flat()


_DEFAULTED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}")


def expand_python(given: str) -> str:
    """``python:`` with ``${VAR:-default}``, ``$VAR``/``${VAR}`` and ``~`` expanded (an unset variable stays as
    written)."""
    text = _DEFAULTED.sub(lambda m: os.environ.get(m.group(1)) or m.group(2), given.strip())
    return os.path.expanduser(os.path.expandvars(text)).strip()


def _python(path: Path, where: str, given: str, checked: dict[str, str | None]) -> str | None:
    """``python:`` as an absolute path to an executable file that can import ftprof, checked before anything runs;
    None (this interpreter) when it expands to nothing (``${PEERS_PYTHON:-}`` with the variable unset)."""
    if given in checked:
        return checked[given]
    expanded = expand_python(given)
    unset = re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expanded)
    if unset:
        raise _fail(path, f"{where}.python", f"'{given}': {unset[0]} is not set in the environment (write "
                    f"${{{unset[0]}:-}} to fall back to the interpreter running bench)")
    if not expanded:
        checked[given] = None
        return None
    found = Path(expanded) if os.sep in expanded else Path(shutil.which(expanded) or expanded)
    shown = f"'{given}'" + (f" ({found})" if str(found) != given else "")
    if not found.exists():
        raise _fail(path, f"{where}.python", f"{shown} does not exist (the interpreter of the environment the cell "
                    "runs in, e.g. /tmp/peers/bin/python)")
    if found.is_dir() or not os.access(found, os.X_OK):
        raise _fail(path, f"{where}.python", f"{shown} is not an executable file")
    interpreter = str(found.absolute())
    if Path(interpreter) != Path(sys.executable):  # another environment: it must be able to run ftprof's side
        problem = _cannot_run_ftprof(interpreter)
        if problem:
            raise _fail(path, f"{where}.python", f"{shown}: {problem}")
    checked[given] = interpreter
    return interpreter


def _cannot_run_ftprof(interpreter: str) -> str | None:
    """Why ``interpreter`` cannot start a cell (not Python, or no ftprof to import), or None. Finds the module
    without importing it: a fraction of a second per interpreter. It must print a fresh token reversed, which only
    Python running the probe does (a script that exits 0 without running it is no interpreter)."""
    token = secrets.token_hex(8)
    probe = ("import importlib.util as u, sys\nif not u.find_spec('ftprof'): sys.exit(3)\n"
             "print('ftprof-probe', sys.argv[1][::-1])")
    try:
        done = subprocess.run([interpreter, "-c", probe, token], capture_output=True, text=True, errors="replace",
                              timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return f"does not run: {exc}"
    if done.returncode == 3:
        return ("cannot import ftprof; install it in that environment (`<env>/bin/pip install -e <this repository>` "
                "beside the versions it pins)")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"does not run Python: {last}"
    if f"ftprof-probe {token[::-1]}" not in done.stdout.splitlines():
        said = (done.stdout.strip().splitlines() or [""])[0][:80]
        printed = f"printing {said!r}" if said else "printing nothing"
        return f"is not a Python interpreter: asked to run a line of Python, it exited 0 {printed}, not its answer"
    return None


def _cell_config(path: Path, where: str, values: dict[str, Any], memory: str, data_checked: set[str]) -> RunConfig:
    """A cell's RunConfig, checked before anything runs, or one line naming the cell."""
    try:
        # A cell's own memory_logging (say, to measure the NVML sampler's cost) wins over the sweep's;
        # MEMORY_LOGGING in the environment wins over both.
        own = None if os.environ.get("MEMORY_LOGGING") else values.get("memory_logging")
        own = MEMORY_LOGGING_ALIASES.get(own, own)
        config = RunConfig.from_flat({**whole_numbers(values), "memory_logging": own or memory, "quiet": True})
        # what `ftprof train` checks before its model loads: LoRA targets, seq_len against the model, packages,
        # the data's content (each dataset read once)
        check_before_load(config, data_checked)
    except ConfigError as exc:
        raise _fail(path, where, str(exc)) from None
    return config
