"""Read run directories back: one flat row per run (config options + result fields), never a crash.

A directory is a run directory when ftprof wrote a run into it (``is_run_dir``): config.json of ftprof's shape, or
config.json beside a run's own files. A saved model (transformers' config.json in adapter/, base/, model/, merged/,
checkpoint-<step>/ or a --save-dir) is not one, and a run's own save folders are not searched. Half-written or
unreadable run directories and newer schema versions are reported (``problems``: one line each,
"<run dir>: <file>: <why>") and skipped.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftprof.config import SCHEMA_VERSION, SECTIONS, migrate_flat
from ftprof.config.saving import ADAPTER, BASE, CHECKPOINT_PREFIX, MERGED, MODEL
from ftprof.results.run_dir import CONFIG, ENV, RESULT, SLURM, SLURM_TASK, STEPS, rank_file
from ftprof.results.status import INCOMPLETE, STATUSES, Status


@dataclass
class LoadReport:
    rows: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one line each: "<dir>: <why skipped>"


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}_{k}" if prefix else str(k), v, out)
    elif isinstance(value, list):
        out[prefix] = json.dumps(value, default=str)
    else:
        out[prefix] = value


_KINDS = {"str": (str,), "int": (int,), "float": (int, float), "dict": (dict,), "list": (list,)}


@functools.cache
def _expected_types() -> dict[str, tuple[tuple[type, ...], bool]]:
    """result.json's keys: the JSON types each may hold, and whether null is allowed."""
    from ftprof.results.schema import RunResult

    out = {}
    for key, text in RunResult.flat_annotations().items():
        optional = text.startswith("Optional[")
        base = text.removeprefix("Optional[").split("[")[0].rstrip("]")
        out[key] = (_KINDS.get(base, (object,)), optional)
    return out


def _read_object(run_dir: Path, name: str) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / name).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{name}: cannot read ({exc.strerror or type(exc).__name__})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{name}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{name}: must be a JSON object, got {type(data).__name__}")
    version = data.get("schema_version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"{name}: schema_version must be an integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise ValueError(f"{name}: schema_version {version} is newer than this ftprof reads ({SCHEMA_VERSION})")
    return data


# Measured quantities that cannot be negative: a file holding one is damaged, not a slow run
NON_NEGATIVE = ("steps_completed", "tokens_per_s", "tokens_per_s_per_gpu", "real_tokens_per_s",
                "real_tokens_per_s_per_gpu", "step_time_p50_s", "step_time_p90_s", "step_time_mean_s", "mfu", "hfu",
                "torch_peak_allocated", "torch_peak_reserved", "nvml_process_used_peak", "energy_per_token_j")


def _check_result(data: dict[str, Any]) -> None:
    if "status" not in data:
        raise ValueError(f"{RESULT}: has no 'status' (one of {', '.join(STATUSES)})")
    if Status.parse(data["status"]) is None:
        raise ValueError(f"{RESULT}: status {data['status']!r} is not one of {', '.join(STATUSES)}")
    for key, (kinds, optional) in _expected_types().items():
        if key not in data:
            continue
        value = data[key]
        if value is None and optional:
            continue
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise ValueError(f"{RESULT}: field '{key}' must be {' or '.join(k.__name__ for k in kinds)}"
                             f"{' or null' if optional else ''}, got {type(value).__name__}")
        if key in NON_NEGATIVE and isinstance(value, (int, float)) and value < 0:
            raise ValueError(f"{RESULT}: field '{key}' is {value}: a measured quantity cannot be negative")


def _check_config(data: dict[str, Any]) -> None:
    for section in SECTIONS:
        if not isinstance(data.get(section, {}), dict):
            raise ValueError(f"{CONFIG}: '{section}' must be a JSON object, got {type(data[section]).__name__}")


def read_result(run_dir: Path, name: str = RESULT) -> dict[str, Any] | None:
    """A run directory's result.json (or config.json with ``name``), checked for shape and types; None when the
    file does not exist. Raises ValueError naming the file and the problem."""
    if not (Path(run_dir) / name).exists():
        return None
    data = _read_object(Path(run_dir), name)
    (_check_result if name == RESULT else _check_config)(data)
    return data


# Options whose default changed what runs when they came: a run from before them ran the old way.
BEFORE_OPTION = {"prefetch": False, "gc_interval": 0}  # (gc_interval: Python collected on its own)
# (compile_dequant came off by default: what ran before; --dequant-kernel auto runs Triton's kernel on CUDA now)
QLORA_BEFORE_OPTION = {"keep_dequantized": False, "dequant_kernel": "bitsandbytes"}
LORA_BEFORE_OPTION = {"lora_fused_a": False}  # LoRA methods: each adapter applied its own A before it


@functools.cache
def option_defaults(method: str = "qlora") -> dict[str, Any]:
    """Every run option's default for ``method``, as a run row holds it (method options resolved as a run records
    them). A run from before an option existed gets the default, so that it still matches today's runs of the same
    configuration as a repeat or a baseline (a row without compile_mode would otherwise never match one with
    compile_mode=default), or, for an option that changed what runs, what it ran with."""
    import dataclasses

    from ftprof.config import LORA_METHODS, METHODS, RunConfig

    cfg = RunConfig.from_flat({"method": method if method in METHODS else "qlora"})
    flat = cfg.to_flat() | dataclasses.asdict(cfg.method.resolved("bfloat16"))
    flat = {k: ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v for k, v in flat.items()}
    return flat | BEFORE_OPTION | (LORA_BEFORE_OPTION if method in LORA_METHODS else {}) | \
        (QLORA_BEFORE_OPTION if method == "qlora" else {})


def run_row(run_dir: Path) -> dict[str, Any]:
    """One run as a flat dict. Raises ValueError naming the file and the problem."""
    config = read_result(run_dir, CONFIG)
    if config is None:
        raise ValueError(f"{CONFIG}: missing")
    row: dict[str, Any] = {"run_dir": str(run_dir), "run_name": run_dir.name}
    row.update(config_options(config))
    row["run_name"] = run_dir.name  # the directory, even if copied or renamed since the run
    row["trainer"] = trainer_name(config)
    row.update(slurm_columns(run_dir))
    result = read_result(run_dir)
    if result is None:
        row["status"] = INCOMPLETE  # started, never finished (killed before bench could record it)
        return row
    row.update(result_fields(result))
    return row


OWN_TRAINER = "ftprof"  # the trainer column of ftprof's own loop (config.json without a trainer section)


def trainer_name(config: dict[str, Any] | None) -> str:
    """Which training loop a run measured: config.json's top-level ``trainer`` section's name (written by
    ftprof.integrations' callback: hf-trainer, trl-sft, loop, ...), or ftprof's own."""
    section = (config or {}).get("trainer")
    if not isinstance(section, dict):
        return OWN_TRAINER
    name = section.get("name")
    return str(name) if isinstance(name, str) and name.strip() else "unknown"


def config_options(config: dict[str, Any]) -> dict[str, Any]:
    """config.json's options in one flat dict under today's names and meanings (lists as comma-joined text), with
    today's defaults for options newer than the run. The one flattening of a configuration: the report's rows, the
    planner's accuracy rows and the calibration store's records all read a run's options through it."""
    options: dict[str, Any] = {}
    for section in SECTIONS:
        values = config.get(section)
        options.update(values if isinstance(values, dict) else {})
    # an older config's options under today's names and meanings (schema 1's warmup_steps: the measurement warm-up)
    row = {key: ",".join(map(str, value)) if isinstance(value, list) else value
           for key, value in migrate_flat(options, config.get("schema_version", 1)).items()}
    # options newer than the run: it ran with what is now the default, or the old way where an option changed that
    for key, value in option_defaults(str(row.get("method", "qlora"))).items():
        row.setdefault(key, value)
    return row


def result_fields(result: dict[str, Any]) -> dict[str, Any]:
    """result.json as flat columns (nested records joined by "_", lists as JSON text), without its run_dir."""
    flat: dict[str, Any] = {}
    _flatten("", result, flat)
    flat.pop("run_dir", None)
    return flat


def flat_row(result: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run's row from its result.json and config.json as dicts (``run_row`` without the files)."""
    return {**(config_options(config) if config else {}), "trainer": trainer_name(config), **result_fields(result)}


def slurm_columns(run_dir: Path) -> dict[str, str]:
    """A run bench ran as a Slurm job: its job id and node(s), from what the job wrote (else what bench recorded).
    Nothing for a local run; a damaged file only loses these columns."""
    out: dict[str, str] = {}
    for name in (SLURM, SLURM_TASK):  # the job's own record (written later) wins
        try:
            data = json.loads((run_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            for key, column in (("job_id", "slurm_job_id"), ("nodes", "slurm_nodes")):
                if isinstance(data.get(key), str) and data[key]:
                    out[column] = data[key]
    return out


# Besides config.json, files only a run directory holds: with one of them, a config.json that cannot be read is a
# damaged run (reported), not some other tool's file.
RUN_FILES = (RESULT, STEPS, rank_file(STEPS, 0), ENV)
SAVED_FOLDERS = (ADAPTER, BASE, MODEL, MERGED)  # what --save and --save-merged write into a run directory
MODEL_CONFIG_KEYS = ("model_type", "architectures", "transformers_version")  # a saved model's config.json


def _ftprof_config(data: object) -> bool:
    """config.json as ftprof writes it (RunConfig.to_dict: schema_version and the option sections); transformers'
    config.json (model_type, architectures, ...) has neither. Anything that is not a JSON object is no model's
    config either: a damaged run's, reported when read."""
    if not isinstance(data, dict) or "schema_version" in data:
        return True
    if any(key in data for key in MODEL_CONFIG_KEYS):
        return False
    return any(isinstance(data.get(section), dict) for section in SECTIONS)  # from before schema_version


def is_run_dir(path: Path) -> bool:
    """Whether ftprof wrote a run into ``path``: its config.json is ftprof's (an incomplete run has only that), or
    the run's own files lie beside it. A saved model's folder is not a run."""
    if not (path / CONFIG).is_file():
        return False
    if any((path / name).is_file() for name in RUN_FILES):
        return True
    try:
        data = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return True  # half-written: read_runs says why it is skipped
    return _ftprof_config(data)


def _saved_folder(name: str) -> bool:
    """A folder a run saves into its run directory: adapter/, base/, model/, merged/, checkpoint-<step>/."""
    return name in SAVED_FOLDERS or (name.startswith(CHECKPOINT_PREFIX) and name[len(CHECKPOINT_PREFIX):].isdigit())


def _walk(root: Path) -> list[Path]:
    """The run directories under ``root``, not looking into a run's own save folders (symlinks not followed)."""
    found = []
    for here, dirs, files in os.walk(root):
        if CONFIG in files and is_run_dir(Path(here)):
            found.append(Path(here))
            dirs[:] = [d for d in dirs if not _saved_folder(d)]
    return found


def find_run_dirs(paths: list[str | Path]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        if is_run_dir(p):  # a run directory given as such: itself, not what it holds
            found.append(p)
        elif p.is_dir():
            found.extend(_walk(p))
    return sorted(set(found))


def read_runs(paths: list[str | Path]) -> LoadReport:
    report = LoadReport()
    for run_dir in find_run_dirs(paths):
        try:
            report.rows.append(run_row(run_dir))
        except ValueError as exc:
            report.problems.append(f"{run_dir}: {exc}")
    return report
