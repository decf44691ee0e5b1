"""Atomic file writes: a temp file in the same directory, then rename, so a killed run never leaves half a file."""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TMP_SUFFIX = ".tmp"  # write_bytes_atomic's temp files: ".<name>.<random>.tmp" beside the file they become


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp creates 0600; results are meant to be shared
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        _unlink_quietly(tmp)
        if exc.errno in _STORAGE_ERRNOS:
            from ftprof.errors import StorageError

            raise StorageError(exc.errno, f"cannot write {path}: {exc.strerror}") from None
        raise
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return path


_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def check_writable_dir(path: str | Path, what: str) -> Path:
    """``path`` is (or can be created as) a writable directory; else ConfigError naming ``what`` (an option).

    A directory that does not exist yet is created for real and removed again: a file system can refuse what the
    permission bits allow (/proc, /sys, a name longer than the file system takes)."""
    from ftprof.errors import ConfigError

    path = Path(path).expanduser()
    try:
        probe = path
        while not probe.exists():
            if probe.parent == probe:
                break
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            raise ConfigError(f"{what} '{path}': '{probe}' is a file, not a directory")
        if not os.access(probe, os.W_OK | os.X_OK):
            raise ConfigError(f"{what} '{path}': '{probe}' is not writable")
        if probe != path:
            try:
                path.mkdir(parents=True)
            finally:
                _remove_below(path, probe)
    except OSError as exc:
        raise ConfigError(f"{what} '{path}': cannot create it ({exc.strerror or exc})") from None
    return path


def _remove_below(path: Path, existing: Path) -> None:
    """Remove the (empty) directories from ``path`` up to ``existing``, which was there before: what a check made,
    all of it or as far as it got."""
    for made in (path, *path.parents):
        if made == existing:
            break
        try:
            made.rmdir()
        except OSError:
            pass


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _unlink_quietly(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def write_json_atomic(path: str | Path, data: Any) -> Path:
    """``data`` as strict JSON: a non-finite float (a loss that became NaN) is written null, which every JSON parser
    reads (a bare NaN is Python's extension, refused by strict ones); the run's notes and error say what it was."""
    return write_text_atomic(path, json.dumps(_finite(data), indent=2, sort_keys=False, default=str,
                                              allow_nan=False) + "\n")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_csv_atomic(path: str | Path, rows: Iterable[dict[str, Any]], columns: list[str] | None = None) -> Path:
    rows = list(rows)
    if columns is None:
        columns = []
        for row in rows:
            columns.extend(k for k in row if k not in columns)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return write_text_atomic(path, buf.getvalue())


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def remove_partial_files(directory: str | Path) -> list[Path]:
    """The temp files that writers killed mid-write (SIGKILL: no cleanup ran) left in ``directory``; call it only
    once every writer of the directory is gone (bench, for a cell whose process died). Returns what was removed."""
    removed = []
    for path in Path(directory).glob(f".*{TMP_SUFFIX}"):
        if path.is_file():
            _unlink_quietly(str(path))
            removed.append(path)
    return removed


def partial_dir(final: Path) -> Path:
    """Where a directory is written before it is renamed to ``final`` (``.adapter.tmp-<pid>`` beside it)."""
    return final.parent / f".{final.name}.tmp-{os.getpid()}"


def replaced_dir(final: Path) -> Path:
    """Where the directory a new one replaces is moved for the moment of the swap (``.adapter.old-<pid>``)."""
    return final.parent / f".{final.name}.old-{os.getpid()}"


def remove_partial_dirs(parent: str | Path, names: Iterable[str]) -> list[Path]:
    """Remove what a killed writer left of ``parent/<name>`` for each name (its ``partial_dir``, and a replaced
    directory once its successor is in place; whose process is gone: a live one is still writing); returns the
    paths removed. A replaced directory whose successor is missing (a kill between the two renames) is kept."""
    import re
    import shutil

    parent = Path(parent).expanduser()
    alternatives = "|".join(re.escape(n) for n in names)
    pattern = re.compile(rf"^\.({alternatives})\.(tmp|old)-(\d+)$")
    removed = []
    try:
        entries = list(parent.iterdir()) if parent.is_dir() else []
    except OSError:
        return removed
    for entry in entries:
        found = pattern.match(entry.name)
        if found is None or not entry.is_dir() or _alive(int(found.group(3))):
            continue
        if found.group(2) == "old" and not (parent / found.group(1)).exists():
            continue  # the only copy left
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process's own leftover (an earlier failed attempt): not being written now
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True
