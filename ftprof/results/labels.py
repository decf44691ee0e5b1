"""Configuration labels: the method, then only the options that vary between the runs shown, each spelled short
("lora b8 ckpt-full compile 2 GPUs"), read from the runs' effective configuration (results/effective.py), so an
option that did nothing in a run never appears in its label. Where several trainers ran (ftprof beside Unsloth or
the HF recipe), a run's label names its trainer and the options that vary between the runs of that trainer only: a
peer recipe's own settings (its dtype, its 4-bit storage) differ from ftprof's in every row and would fill every
label without telling two runs of one trainer apart."""

from __future__ import annotations

import math

import pandas as pd

from ftprof.config.declarations import BY_NAME
from ftprof.results.effective import TRAINER, config_columns, config_key, effective_frame, inapplicable_masks

# Options that identify a run's size but whose label is spelled specially (GPUs come from world_size).
GPU_OPTIONS = {"nproc_per_node", "nnodes"}
# Labels read method first, then the options people sweep most; any other varying option follows.
LABEL_ORDER = ("method", "trainer", "model", "batch_size", "seq_len", "grad_accum", "checkpointing", "kernels",
               "compile", "compile_mode", "sdpa_backend", "world_size")
_PREFIX = {"batch_size": "b", "seq_len": "s", "grad_accum": "ga"}


def missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def varying_options(df: pd.DataFrame) -> list[str]:
    """Configuration options whose effective value differs between the rows (GPU count as ``world_size``).
    An option that applies to some rows only (a LoRA rank) varies when its set values differ, not by being unset
    where it does not apply; where it applies, unset is a value of its own (no ``--memory-limit-gib`` against 8.5)."""
    eff = effective_frame(df)
    cols = [c for c in config_columns(eff) if c not in GPU_OPTIONS] + ["world_size"]
    varying = differing(eff, [c for c in cols if c in eff])
    return sorted(varying, key=lambda c: LABEL_ORDER.index(c) if c in LABEL_ORDER else len(LABEL_ORDER))


def differing(eff: pd.DataFrame, columns: list[str]) -> list[str]:
    """Those of ``columns`` (of an effective frame) whose values differ between the rows where they apply."""
    inapplicable = inapplicable_masks(eff)
    return [c for c in columns if _values_where_applies(eff, c, inapplicable.get(c)).nunique() > 1]


def _values_where_applies(eff: pd.DataFrame, column: str, inapplicable) -> pd.Series:
    """The column's values, as text, in the rows where its option applies or has an effective value (what auto
    chose, where the option itself does not apply), unset being one more value."""
    values = eff[column] if inapplicable is None else eff.loc[~inapplicable | ~eff[column].map(missing), column]
    return values.map(lambda v: "<unset>" if missing(v) else str(v))


def processes(value: object, device: object = None) -> str:
    """"2 GPUs", or "2 procs" for processes that ran on the CPU."""
    n = int(value) if isinstance(value, float) and value.is_integer() else value
    if str(device) == "cpu":
        return f"{n} proc" + ("s" if str(n) != "1" else "")
    return f"{n} GPU" + ("s" if str(n) != "1" else "")


def short(name: str, value: object, device: object = None) -> str:
    """One option as a label word."""
    if isinstance(value, float) and value.is_integer() and name != "lr":
        value = int(value)  # a whole number read back as float (a column with gaps)
    if name == "method":
        return str(value)
    if name == "world_size":
        return processes(value, device)
    if name == "checkpointing":
        return "no-ckpt" if value == "none" else f"ckpt-{value}"
    if name in _PREFIX:
        return f"{_PREFIX[name]}{value}"
    if name in BY_NAME and name != "compile":  # a declared option's own spelling (config/declarations.py)
        return BY_NAME[name].spell(value)
    if isinstance(value, bool):
        return name if value else f"no-{name}"
    if isinstance(value, float):
        return f"{name}={value:g}"
    return f"{name}={value}"


def label(options: dict[str, object], method: object | None = None, device: object = None) -> str:
    """A configuration's short name: its method, then each varying option that applies to it."""
    parts = [] if method is None or "method" in options else [str(method)]
    parts += [short(k, v, device) for k, v in options.items() if not missing(v)]
    return " ".join(parts) or "(one configuration)"


def labels(df: pd.DataFrame, varying: list[str] | None = None, repeats: bool = True) -> pd.Series:
    """Every row's label (index as ``df``), with "#k" for the k-th repeat of a configuration."""
    if not len(df):
        return pd.Series([], index=df.index, dtype=object)
    eff = effective_frame(df)
    varying = varying_options(eff) if varying is None else varying
    cols = list(dict.fromkeys(varying + (["method"] if "method" in eff else []) + (["device"] if "device" in eff
                                                                                      else [])))
    spelled = _spelled_options(eff, varying)
    out = pd.Series([label({c: r.get(c) for c in spelled[i]}, r.get("method"), r.get("device"))
                     for i, r in enumerate(eff[cols].to_dict("records"))], index=eff.index, dtype=object)
    if repeats:
        keys = config_key(eff)
        counts = keys.map(keys.value_counts())
        nth = keys.groupby(keys).cumcount() + 1
        out = out.where(counts <= 1, out + " #" + nth.astype(str))
    return out


def _spelled_options(eff: pd.DataFrame, varying: list[str]) -> list[list[str]]:
    """Each row's options to spell (by position): ``varying``, or, where several trainers ran, the trainer and those
    of ``varying`` that vary between the runs of the row's own trainer. Two runs of one trainer that differ still
    differ in an option spelled in both labels, so labels stay as distinct as the configurations."""
    if TRAINER not in varying or TRAINER not in eff:
        return [varying] * len(eff)
    trainers = eff[TRAINER].map(str).to_numpy()
    within = {t: set(varying_options(eff[trainers == t])) for t in set(trainers)}
    return [[c for c in varying if c == TRAINER or c in within[t]] for t in trainers]


def labeller(df: pd.DataFrame):
    """A function row -> its label (see ``labels``), for code that walks rows."""
    names = labels(df)
    return lambda row: names.get(row.name, label({}, row.get("method")))
