"""One effective configuration per run: what the run's options meant for what ran, spelled one way.

A run row (``load.run_row``) holds every option config.json recorded, including options that did nothing in that
run (``compile_loss`` when the run was not compiled, a LoRA rank on a full fine-tune, the text column of synthetic
data) and values spelled several ways across ftprof versions and sweep files (``0`` / ``False``, ``32`` / ``32.0``).
``effective_frame`` turns a frame of such rows into the effective configuration: every option that does not apply
is None, every value has one spelling (booleans as bool, integers as int, other numbers as float, lists as
comma-joined text). Everything that groups, pairs, labels or compares runs reads it, so two runs that ran the same
way are the same configuration, and an option that did nothing never tells two runs apart.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from ftprof.config import METHOD_OPTION_GROUPS, SECTIONS, flat_field_owners
from ftprof.config.declarations import DECLARED, ON, Declared, When, is_on
from ftprof.results.parts import AUTO_OPTIONS

# Options that say where or how a run was recorded, not what it ran: never part of a configuration.
# gradient_checkpointing is the yes/no derived from the checkpointing policy (HF's spelling); the policy is the column.
NOT_CONFIG = frozenset({
    "output_dir", "run_name", "quiet", "run_dir", "prof_output_dir", "memory_logging", "seed",
    "gradient_checkpointing", "slurm_job_id", "slurm_nodes",  # slurm_*: where bench ran it
    "node_rank", "rdzv_endpoint", "rdzv_backend", "report_to", "dataset_num_proc",  # where, trackers, tokenizing
    "save_dir",  # where --save wrote
    # how the run was kept and shown, not what it ran (checkpoints are written outside the steps' time)
    "logging_steps", "overwrite_output_dir", "resume_from_checkpoint", "save_total_limit",
})
# Not an option but part of a configuration: which training loop ran (load.trainer_name: "ftprof" for ftprof's own,
# the HF Trainer, TRL, ... through ftprof.integrations), so a Trainer run is labelled and paired apart from ftprof's
# loop at the same settings.
TRAINER = "trainer"
OWN_TRAINER = "ftprof"
# Options that change the step time a little (what measuring costs): a configuration of their own when they vary
# across the runs shown (an overhead sweep), ignored otherwise and when matching baselines.
MEASUREMENT_OPTIONS = ("memory_logging",)
# Options of real data, by the data formats they apply to (auto: whichever the columns picked, so all of them).
DATA_OPTIONS = {
    "dataset_config": None, "dataset_split": None, "data_format": None, "packing": None,
    "text_field": ("text", "auto"), "prompt_template": ("instruction", "auto"),
    "response_field": ("instruction", "auto"), "messages_field": ("chat", "auto"),
    "train_on": ("instruction", "chat", "auto"),
}
EFFECTIVE_MARK = "ftprof_effective_configuration"
_TRUE = {True, "True", "true", "1", "yes", "on"}  # 1 and 1.0 equal True in a set
_FALSE = {False, "False", "false", "0", "no", "off"}  # 0 and 0.0 equal False


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


@functools.cache
def option_kinds() -> dict[str, str]:
    """Each option's kind from its type hint: bool, int, float, list or str."""
    import typing

    from ftprof.config.options import type_hints

    kinds = {}
    for cls in SECTIONS.values():
        for name, hint in type_hints(cls).items():
            args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
            base = typing.get_origin(args[0]) or args[0]
            kinds[name] = {bool: "bool", int: "int", float: "float", tuple: "list", list: "list"}.get(base, "str")
    return kinds


def normalize_value(kind: str, value: Any) -> Any:
    """One spelling per value: None for missing, bool for flags, int or float for numbers, text otherwise."""
    if _missing(value):
        return None
    try:
        if kind == "bool":
            return True if value in _TRUE else False if value in _FALSE else value
        if kind == "int":
            number = float(value)
            return int(number) if number.is_integer() else number
        if kind == "float":
            return float(value)
    except (TypeError, ValueError):
        return value  # not a number after all: kept as written, so it still tells runs apart
    if kind == "list" and isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return value if isinstance(value, str) else str(value)


def _normalize_column(series, kind: str):
    """A column in one spelling (object dtype, so None stays None beside ints and bools)."""
    import pandas as pd

    if kind == "bool" and series.dtype == bool:
        return series.astype(object)
    # built as object: map() would infer float64 and turn [None, 16] into [nan, 16.0]
    return pd.Series([normalize_value(kind, v) for v in series], index=series.index, dtype=object)


def _column(df, name: str, default: Any = None):
    import pandas as pd

    return df[name] if name in df else pd.Series([default] * len(df), index=df.index, dtype=object)


def _is(df, name: str, values: tuple) -> Any:
    return _column(df, name).isin(values)


def inapplicable_masks(df) -> dict[str, Any]:
    """For each option, the rows where it does not apply (a boolean Series): the option did nothing there."""
    masks: dict[str, Any] = {}

    def drop(names, mask) -> None:
        for name in names:
            masks[name] = masks[name] | mask if name in masks else mask

    method = _column(df, "method")
    for methods, names in METHOD_OPTION_GROUPS.values():  # method options of the other methods
        drop(names, ~method.isin(methods))
    for d in DECLARED:  # where a declared option does not apply, or does nothing (config/declarations.py)
        drop([d.name], ~_applies(df, d))
    policy = _column(df, "checkpointing")
    drop(["checkpoint_layers"], ~policy.isin(("full", "selective")))
    drop(["gptq_calibration_samples"], _is(df, "gptq_quantizer", ("rtn",)))  # round-to-nearest calibrates nothing
    synthetic = _column(df, "dataset", "synthetic").isin(("synthetic",))
    data_format = _column(df, "data_format", "auto")
    for name, formats in DATA_OPTIONS.items():
        drop([name], synthetic | (~data_format.isin(formats) if formats else False))
    no_eval = _column(df, "eval_dataset").map(_missing)
    drop(["eval_split", "eval_steps", "eval_batches"], no_eval)  # evaluation's options without an eval set
    profiled = _is(df, "profile", (True,))
    drop([n for n in flat_field_owners() if n.startswith("prof_")], ~profiled)
    world = _world_size(df)
    offload = _is(df, "fsdp_cpu_offload", (True,))
    drop(["parallel", "fsdp_reshard_after_forward"], (world <= 1) & ~offload)
    drop(["fsdp_reshard_after_forward", "fsdp_cpu_offload"], _is(df, "parallel", ("ddp",)))
    return masks


def _holds(df, when: When):
    """Rows where ``when`` holds (ON: any value that is on)."""
    column = _column(df, when.option)
    mask = column.isin([v for v in when.values if v not in (ON, None)])
    if None in when.values:
        mask = mask | column.map(_missing)
    if ON in when.values:
        mask = mask | column.map(lambda v: not _missing(v) and is_on(normalize_value("bool", v)))
    return mask


def _applies(df, d: Declared):
    """Rows where the declared option does something: its method, what it needs, none of what voids it."""
    mask = _column(df, "method").isin(d.methods)
    for when in d.needs:
        mask = mask & _holds(df, when)
    for when in d.void_when:
        mask = mask & ~_holds(df, when)
    return mask


def _world_size(df):
    """Processes per run: the result's world_size, else the configured processes per node times nodes."""
    import pandas as pd

    planned = pd.to_numeric(_column(df, "nproc_per_node", 1), errors="coerce").fillna(1) * \
        pd.to_numeric(_column(df, "nnodes", 1), errors="coerce").fillna(1)
    recorded = pd.to_numeric(_column(df, "world_size"), errors="coerce")
    return recorded.fillna(planned)


def effective_frame(df):
    """``df`` with its option columns as the effective configuration (a copy; other columns untouched).

    Idempotent and vectorized; a frame it made (or a slice of one: pandas keeps ``attrs``) is returned as it is,
    so every step that groups or labels runs can ask for it without paying twice."""
    if not len(df) or df.attrs.get(EFFECTIVE_MARK):
        return df
    df = df.copy()
    kinds = option_kinds()
    for name in [c for c in df.columns if c in kinds]:
        df[name] = _normalize_column(df[name], kinds[name])
    if "lora_targets" in df:  # a set of module names: PEFT records it in no particular order
        df["lora_targets"] = df["lora_targets"].map(
            lambda v: ",".join(sorted(v.split(","))) if isinstance(v, str) else v).astype(object)
    if "checkpointing" in df or "gradient_checkpointing" in df:
        df["checkpointing"] = _checkpointing_policy(df)
    for name, mask in inapplicable_masks(df).items():
        if name in df and mask.any():
            df[name] = df[name].where(~mask, None)
    auto = _is(df, "checkpointing", ("auto",))  # config.json says auto: the offloads are what auto chose
    for option, key in AUTO_OPTIONS:
        chose = _auto_chose(df, key) if auto.any() else None
        if chose is not None and (option in df or (chose[auto] == True).any()):  # noqa: E712
            asked = _column(df, option).map(lambda v: normalize_value("bool", v) is True)  # the table: also asked
            df[option] = _column(df, option).where(~auto, chose.where(~asked, True))
    df["world_size"] = _normalize_column(_world_size(df), "int")
    if TRAINER in df:  # a row without one (an older reader's, a planted row) is ftprof's own loop
        df[TRAINER] = df[TRAINER].map(lambda v: OWN_TRAINER if _missing(v) or not str(v).strip() else str(v))
    df.attrs[EFFECTIVE_MARK] = True
    return df


def _checkpointing_policy(df):
    """Runs recorded before the checkpointing policy existed have only the yes/no: their policy is full or none."""
    implied = _column(df, "gradient_checkpointing").map(
        lambda v: None if _missing(v) else "full" if v in _TRUE else "none" if v in _FALSE else None)
    given = _column(df, "checkpointing")
    return given.where(given.map(lambda v: not _missing(v)), implied).astype(object)


def _auto_chose(df, key: str):
    """Under --checkpointing auto: whether auto chose the memory option result.json's checkpointing_auto records as
    ``key`` (offload: --offload-checkpoints, host_embeddings: --offload-embeddings; a record from before the choice
    existed: False), None where no choice was recorded (a run that never started)."""
    import pandas as pd

    chose = _column(df, "checkpointing_auto_policy").map(lambda v: not _missing(v) and bool(v))
    offload = _column(df, f"checkpointing_auto_{key}").map(lambda v: normalize_value("bool", v) is True)
    return pd.Series([bool(o) if c else None for c, o in zip(chose, offload, strict=True)], index=df.index,
                     dtype=object)


def effective(row: dict[str, Any]) -> dict[str, Any]:
    """One run row as its effective configuration (see ``effective_frame``)."""
    import pandas as pd

    out = effective_frame(pd.DataFrame([row])).iloc[0].to_dict()
    return {k: (None if _missing(v) else v) for k, v in out.items()}


def config_columns(df, measurement_if_varying: bool = False) -> list[str]:
    """Columns that identify an experiment's configuration (from config.json), for repeats and baselines."""
    cols = [c for c in flat_field_owners() if c in df.columns and c not in NOT_CONFIG]
    if TRAINER in df.columns:
        cols.append(TRAINER)
    if measurement_if_varying:
        cols += [c for c in MEASUREMENT_OPTIONS if c in df.columns and df[c].map(str).nunique() > 1]
    return cols


def config_key(df, measurement_if_varying: bool = False):
    """One text key per row: equal for runs of the same effective configuration (repeats; a run and its
    baseline)."""
    import pandas as pd

    if not len(df):
        return pd.Series([], index=df.index, dtype=object)
    eff = effective_frame(df)
    cols = config_columns(eff, measurement_if_varying) + ["world_size"]
    # map(str), not astype(str): pandas' string dtype would keep a missing value missing and void the whole key
    text = {c: eff[c].map(str).astype(object) for c in cols}
    return functools.reduce(lambda key, col: key + "|" + text[col], cols[1:], text[cols[0]])
