"""Where a dataset lives and how it is loaded: a data file, a folder written by ``save_to_disk``, or a hub name.

``check_dataset`` is cheap (no ``datasets`` import): it catches a missing or unreadable file before anything loads.
``load_rows`` imports ``datasets`` and returns one split as a ``datasets.Dataset``.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from ftprof.config import DataConfig
from ftprof.data.hub import dataset_maybe_cached, offline_unless_reachable
from ftprof.errors import ConfigError, did_you_mean
from ftprof.runtime import logger_level

# file suffix -> the datasets builder that reads it
FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class DatasetLocation:
    kind: str  # "file" | "disk" (a save_to_disk folder) | "hub"
    name: str  # absolute path, or the hub name as given


def _looks_like_path(name: str) -> bool:
    if name.startswith((".", "/", "~")) or Path(name).suffix.lower() in FILE_BUILDERS:
        return True
    try:
        return Path(name).exists()
    except (OSError, ValueError):  # a name longer than the file system takes, a NUL byte: no path of ours
        return False


def locate(data: DataConfig) -> DatasetLocation:
    """Classify ``--dataset``; one line naming the problem if it is none of the accepted kinds."""
    name = data.dataset
    if not _looks_like_path(name):
        if not _HUB_NAME.match(name) or ("/" not in name and did_you_mean(name, ["synthetic"])):
            raise ConfigError(f"{data.option('dataset')}: '{name}' is not 'synthetic', a data file, a save_to_disk "
                              f"folder or a hub dataset name{did_you_mean(name, ['synthetic'])}")
        return DatasetLocation("hub", name)
    path = Path(name).expanduser()
    if path.is_dir():
        if not any((path / marker).is_file() for marker in ("state.json", "dataset_dict.json")):
            raise ConfigError(f"{data.option('dataset')}: folder '{name}' was not written by datasets' save_to_disk "
                              "(no state.json or dataset_dict.json)")
        return DatasetLocation("disk", str(path.resolve()))
    if path.suffix.lower() not in FILE_BUILDERS:
        raise ConfigError(f"{data.option('dataset')}: '{name}' is not a supported file ({', '.join(FILE_BUILDERS)})")
    if not path.is_file():
        raise ConfigError(f"{data.option('dataset')}: '{name}' does not exist")
    return DatasetLocation("file", str(path.resolve()))


def check_dataset(data: DataConfig) -> None:
    """Cheap checks (exists, readable, right shape) so a bad dataset fails before anything big loads."""
    if data.dataset == "synthetic":
        return
    where = locate(data)
    if where.kind == "hub" and not dataset_maybe_cached(where.name) and offline_unless_reachable():
        raise _not_cached(data)  # before torch (the load refused it after the model's imports)
    if where.kind != "file":
        return
    if Path(where.name).suffix == ".parquet":
        return _check_parquet_marker(where.name, data)
    try:
        with open(where.name, encoding="utf-8") as fh:
            if where.name.endswith(".jsonl"):
                found = _check_jsonl_lines(fh, data.dataset, data.option('dataset'))
            else:
                found = sum(1 for line in fh if line.strip())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{data.option('dataset')}: cannot read '{data.dataset}': {exc}") from None
    if not found:
        raise ConfigError(f"{data.option('dataset')}: '{data.dataset}' is empty")
    if found == 1 and where.name.endswith(".csv"):  # (a CSV's first line is its header)
        raise ConfigError(f"{data.option('dataset')}: '{data.dataset}' has a header line but no rows")


def _check_parquet_marker(path: str, data: DataConfig) -> None:
    """A Parquet file starts and ends with b'PAR1' (the format's magic): anything else is not one."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
            fh.seek(0, 2)
            if fh.tell() >= 8:
                fh.seek(-4, 2)
            tail = fh.read(4)
    except OSError as exc:
        raise ConfigError(f"{data.option('dataset')}: cannot read '{data.dataset}': {exc}") from None
    if head != b"PAR1" or tail != b"PAR1":
        raise ConfigError(f"{data.option('dataset')}: '{data.dataset}' is not a Parquet file (no PAR1 marker)")


def _check_jsonl_lines(fh, name: str, opt: str = "--dataset") -> bool:
    """Every record of a .jsonl file, streamed: the first bad line is named by its number. True if any record."""
    found = False
    for number, line in enumerate(fh, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{opt}: '{name}' line {number} is not JSON: {exc.msg}") from None
        if not isinstance(record, dict):
            raise ConfigError(f"{opt}: '{name}' line {number} is not a JSON object")
        found = True
    return found


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_rows(data: DataConfig):
    """One split of the dataset as a ``datasets.Dataset`` (memory-mapped Arrow; ``datasets`` caches it)."""
    where = locate(data)
    offline = where.kind == "hub" and offline_unless_reachable()  # no network: no retries, the cache only
    try:
        # datasets logs a failure as an error line and then raises it: the raise becomes our one line (a corrupt
        # parquet's schema would otherwise print beside ours)
        with logger_level("datasets", logging.CRITICAL):
            rows = _load(data, where)
    except ConfigError:
        raise
    except ConnectionError as exc:  # no network, or HF_HUB_OFFLINE=1 and not in the local cache
        raise ConfigError(f"{data.option('dataset')}: cannot reach hub dataset '{data.dataset}' and it is not in the "
                          "local "
                          f"datasets cache ({_offline_hint() or _first_line(exc)})") from None
    except (ValueError, KeyError) as exc:  # a bad split name or slice, a bad config name
        if offline:
            raise _not_cached(data) from None
        if where.kind == "file" and data.dataset_split.split("[")[0].strip() == "train":  # its one split: content
            why = "it has no rows" if "corresponds to no data" in str(exc) else _first_line(exc)  # (datasets' words)
            raise ConfigError(f"{data.option('dataset')}: cannot load '{data.dataset}': {why}") from None
        raise ConfigError(f"{data.option('dataset_split')}: '{data.dataset}' split '{data.dataset_split}': "
                          f"{_first_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - unknown dataset, unreadable file, parse error: all user input
        if offline:
            raise _not_cached(data) from None
        raise ConfigError(f"{data.option('dataset')}: cannot load '{data.dataset}': {_first_line(exc)}") from None
    if rows._indices is not None:  # a selected or shuffled view: make the Arrow table match the rows
        rows = rows.flatten_indices()
    return rows


def _not_cached(data: DataConfig) -> ConfigError:
    """Offline (HF_HUB_OFFLINE, set by the user or because the hub is unreachable): not in the local cache."""
    return ConfigError(f"{data.option('dataset')}: hub dataset '{data.dataset}' (split '{data.dataset_split}') is not "
                       "in the local "
                       f"datasets cache ({_offline_hint() or 'HF_HUB_OFFLINE is set'})")


def _offline_hint() -> str:
    from ftprof.data.hub import OFFLINE_HINT, found_unreachable

    return OFFLINE_HINT if found_unreachable() else ""


def _load(data: DataConfig, where: DatasetLocation):
    import datasets

    if where.kind == "disk":
        loaded = datasets.load_from_disk(where.name)
        name, rows = _split_slice(data.dataset_split, data.option("dataset_split"))
        if isinstance(loaded, datasets.DatasetDict):
            return _sliced(_pick_split(loaded, name, data.dataset, data.option('dataset_split')), rows)
        if name != "train":
            raise ConfigError(f"{data.option('dataset_split')}: folder '{data.dataset}' holds a single dataset, "
                              "not splits (its rows are split 'train', which takes a slice: train[:100])")
        return _sliced(loaded, rows)
    if where.kind == "file":
        builder = FILE_BUILDERS[Path(where.name).suffix.lower()]
        # .txt: one document per paragraph (blank-line separated), as a corpus is usually written
        extra = {"sample_by": "paragraph"} if builder == "text" else {}
        return datasets.load_dataset(builder, data_files={"train": where.name}, split=data.dataset_split, **extra)
    return datasets.load_dataset(where.name, data.dataset_config, split=data.dataset_split)


_SLICE = re.compile(r"\s*([\w.-]+)\s*(?:\[\s*(-?\d*)\s*(%?)\s*:\s*(-?\d*)\s*(%?)\s*\])?\s*")


def _split_slice(spec: str, opt: str) -> tuple[str, tuple | None]:
    """A split spec as datasets writes it for files and the hub ("train", "train[:100]", "train[10%:20%]") read for
    a save_to_disk folder, which datasets does not slice: (split name, (start, percent, stop, percent) or None)."""
    m = _SLICE.fullmatch(spec)
    if m is None:
        raise ConfigError(f"{opt}: '{spec}' is not a split, or a split with one slice (train[:100], train[10%:20%]), "
                          "as a save_to_disk folder takes it")
    name, start, start_pct, stop, stop_pct = m.groups()
    return name, None if start is None else (start, start_pct, stop, stop_pct)


def _sliced(rows, bounds: tuple | None):
    """``rows`` cut to ``bounds`` (_split_slice's), with Python's slice meaning; percentages of the rows."""
    if bounds is None:
        return rows
    start, start_pct, stop, stop_pct = bounds

    def at(text: str, pct: str) -> int | None:
        return None if text == "" else round(len(rows) * int(text) / 100) if pct else int(text)

    return rows.select(range(len(rows))[slice(at(start, start_pct), at(stop, stop_pct))])


def _pick_split(splits, split: str, name: str, opt: str = "--dataset-split"):
    if split in splits:
        return splits[split]
    raise ConfigError(f"{opt}: '{name}' has no split '{split}' (splits: {', '.join(splits)})"
                      f"{did_you_mean(split, list(splits))}")
