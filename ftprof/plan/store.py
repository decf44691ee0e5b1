"""The calibration store's records as the planner may read them: each record checked against the schema the planner
reads (``problem``), and the store kept small as it grows (``newest``, ``compact``).

What the planner reads of a record (calibration.py and host.py) and what a record must hold to be used:
- method, policy, kernels, device_name: strings; compile: a bool; knobs: an object of scalars (its option values);
- flops_per_token, micro_batch_tokens (whole), flops_per_s, tokens_per_s: finite positive numbers; world_size a
  whole number >= 1; FLOP/s per GPU (the record's, and its model FLOPs x tokens/s / world size) at most the GPU's
  dense bf16 peak (twice that with FP8 base matmuls; ``UNKNOWN_PEAK`` for the CPU or a GPU of no known peak);
- model: a string or null; layers, seq_len: whole numbers >= 1 or null; checkpointed_layers >= 0 or null;
- prediction: an object (or absent) whose byte counts are numbers >= 0, its candidate an object, its grad_accum a
  whole number >= 1; training_peak: a whole number of bytes > 0 or null; gpu_busy: a fraction 0..1 or null;
  host_floor_s: positive seconds or null.
Sizes beyond ``LIMITS`` are not believed either (no run has them: a typo, or a record written by hand).

Growth: a configuration run again and again adds a record each time while the planner's medians need only the
recent ones. The planner reads the newest ``KEEP`` records of each configuration (``newest``); once a store holds
``COMPACT_AT`` records beyond those, the read that finds them rewrites the store without them (``compact``: under
the lock ``append_record`` takes, through a file renamed over the store), so the next read parses only what is used.
Lines that are not believed are kept (the warning names them until they are removed by hand).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from ftprof.metrics import peak_flops
from ftprof.results.load import OWN_TRAINER

KEEP = 20  # records kept per configuration: the newest (the planner takes medians over them)
COMPACT_AT = 1000  # records superseded (beyond KEEP per configuration) that make a read rewrite the store
UNKNOWN_PEAK = 1e16  # FLOP/s per device believed for the CPU or a GPU without a known peak (10x a B200's bf16)
HOST_BOUND_BUSY = 0.85  # NVML's busy fraction below which a run's GPU waited on its host (plan/host.py)


def host_bound(record: dict) -> bool:
    """Whether a record's (or a shipped row's) GPU waited on its host: NVML busy below ``HOST_BOUND_BUSY``."""
    busy = record.get("gpu_busy")
    return isinstance(busy, (int, float)) and busy < HOST_BOUND_BUSY

LIMITS = {  # the most a believable record holds
    "flops_per_token": 1e18,  # 6 x 1.6e17 parameters
    "micro_batch_tokens": 1 << 34,
    "tokens_per_s": 1e12,
    "world_size": 1 << 20,
    "layers": 100_000,
    "seq_len": 1 << 26,
    "checkpointed_layers": 100_000,
    "training_peak": 1 << 50,  # 1 PiB on one GPU
    "prediction_bytes": 1 << 60,
    "grad_accum": 1 << 30,
    "host_floor_s": 3600.0,
}
STRINGS = ("method", "policy", "kernels", "device_name")
PREDICTION_NUMBERS = ("activation_bytes", "activation_factor", "gradient_bytes", "static_bytes", "transient_bytes",
                      "peak_bytes")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a bool", type(None): "null"}.get(
        type(value), type(value).__name__)


def peak_bound(record: dict) -> float:
    """The most FLOP/s per GPU a record of this device may claim."""
    device = record.get("device_name")
    peak = peak_flops(device) if device != "cpu" else None
    if not peak:
        return UNKNOWN_PEAK
    knobs = record.get("knobs") or {}
    fp8 = any(str(k).startswith("fp8") and v not in (None, False) for k, v in knobs.items())
    return peak * (2 if fp8 else 1)


def problem(record) -> str | None:  # noqa: C901 - one check a field, in the order the docstring lists them
    """Why the planner may not use ``record`` (one phrase), or None when it may."""
    if not isinstance(record, dict):
        return f"{_kind(record)}, not a record"
    for name in STRINGS:
        if not isinstance(record.get(name), str) or not record[name]:
            return f"{name} is {_kind(record.get(name)) if name in record else 'missing'}, not a name"
    if not isinstance(record.get("compile"), bool):
        return f"compile is {_kind(record.get('compile')) if 'compile' in record else 'missing'}, not true/false"
    knobs = record.get("knobs")
    if not isinstance(knobs, dict):
        return f"knobs is {_kind(knobs) if 'knobs' in record else 'missing'}, not an object of options"
    for key, value in knobs.items():
        if not (value is None or isinstance(value, (str, bool)) or (_is_number(value) and math.isfinite(value))):
            return f"option {key} is {_kind(value)}, not a value"
    for name in ("flops_per_token", "micro_batch_tokens", "flops_per_s", "tokens_per_s"):
        value = record.get(name)
        if not _is_number(value) or not math.isfinite(value) or value <= 0:
            return f"{name} is {value!r}, not a positive number" if name in record else f"{name} is missing"
        if name in LIMITS and value > LIMITS[name]:
            return f"{name} {value:.3g} is beyond any run's ({LIMITS[name]:.3g})"
    if not _is_whole(record["micro_batch_tokens"]):
        return f"micro_batch_tokens is {record['micro_batch_tokens']!r}, not a whole number"
    world = record.get("world_size")
    if not _is_whole(world) or not 1 <= world <= LIMITS["world_size"]:
        return f"world_size is {world!r}, not a number of GPUs"
    bound = peak_bound(record)
    model_rate = record["flops_per_token"] * record["tokens_per_s"] / world
    for what, rate in (("flops_per_s", record["flops_per_s"]), ("flops_per_token x tokens_per_s", model_rate)):
        if rate > bound:
            return (f"{what} {rate:.3g} FLOP/s per GPU is beyond {record['device_name']}'s peak "
                    f"({bound:.3g} FLOP/s)")
    return _size_problem(record)


def _size_problem(record: dict) -> str | None:
    """The record's sizes, prediction and host figures (``problem``'s second half)."""
    model = record.get("model")
    if model is not None and not isinstance(model, str):
        return f"model is {_kind(model)}, not a name"
    for name, least in (("layers", 1), ("seq_len", 1), ("checkpointed_layers", 0)):
        value = record.get(name)
        if value is not None and (not _is_whole(value) or not least <= value <= LIMITS[name]):
            return f"{name} is {value!r}, not a whole number from {least} to {LIMITS[name]}"
    prediction = record.get("prediction", {})
    if prediction is None:
        prediction = {}
    if not isinstance(prediction, dict):
        return f"prediction is {_kind(prediction)}, not an object"
    for name in PREDICTION_NUMBERS:
        value = prediction.get(name)
        if value is not None and (not _is_number(value) or not math.isfinite(value) or value < 0
                                  or value > LIMITS["prediction_bytes"]):
            return f"prediction's {name} is {value!r}, not a size"
    candidate = prediction.get("candidate")
    if candidate is not None and not isinstance(candidate, dict):
        return f"prediction's candidate is {_kind(candidate)}, not an object"
    accum = (candidate or {}).get("grad_accum")
    if accum is not None and (not _is_whole(accum) or not 1 <= accum <= LIMITS["grad_accum"]):
        return f"prediction's grad_accum is {accum!r}, not a whole number >= 1"
    peak = record.get("training_peak")
    if peak is not None and (not _is_whole(peak) or not 0 < peak <= LIMITS["training_peak"]):
        return f"training_peak is {peak!r}, not a number of bytes"
    busy = record.get("gpu_busy")
    if busy is not None and (not _is_number(busy) or not 0 <= busy <= 1):
        return f"gpu_busy is {busy!r}, not a fraction from 0 to 1"
    floor = record.get("host_floor_s")
    if floor is not None and (not _is_number(floor) or not 0 < floor <= LIMITS["host_floor_s"]):
        return f"host_floor_s is {floor!r}, not seconds"
    return None


def configuration(record: dict) -> tuple:
    """What sets which of the planner's look-ups a (valid) record answers, and with which others: its device, class
    and options, model and shape, and whether it can calibrate memory (a CUDA peak) and the host floor (GPU busy
    below ``HOST_BOUND_BUSY``). Records of one configuration differ only in what they measured."""
    return (record.get("trainer", OWN_TRAINER), record["device_name"], record["method"], record["policy"],
            record["kernels"], record["compile"],
            json.dumps(record["knobs"], sort_keys=True), record.get("model"), record.get("layers"),
            record.get("seq_len"), record["micro_batch_tokens"], record.get("checkpointed_layers"),
            record["world_size"], record["flops_per_token"], host_bound(record),
            bool(record.get("training_peak") and record.get("prediction")))


def newest(records: Iterable[tuple[int, dict]], keep: int = KEEP) -> set[int]:
    """The ids of the newest ``keep`` records (store order: appended as runs finish) of each configuration."""
    by_config: dict[tuple, list[int]] = defaultdict(list)
    for ident, record in records:
        by_config[configuration(record)].append(ident)
    return {i for ids in by_config.values() for i in ids[-keep:]}


def parse(data: bytes, first: int = 1) -> tuple[list[tuple[int, dict]], list[tuple[int, str]]]:
    """(line number, record) of the believable records, and (line number, why) of the others, blank lines aside;
    ``first``: the number of data's first line."""
    good, bad = [], []
    for number, line in enumerate(data.splitlines(), first):
        if not line.strip():
            continue
        try:
            record = json.loads(line)  # UnicodeDecodeError is a ValueError too
        except (ValueError, RecursionError):
            bad.append((number, "not a JSON line"))
            continue
        why = problem(record)
        if why is None:
            good.append((number, record))
        else:
            bad.append((number, why))
    return good, bad


def compact(path: Path, read_all, keep: int = KEEP, read: tuple[bytes, list] | None = None) -> int | None:
    """Rewrite the store at ``path`` without the records superseded (beyond the newest ``keep`` per configuration),
    under the exclusive lock ``append_record`` takes; lines not believed and blank-free order kept. The new file is
    written beside the store and renamed over it, so a reader sees the old store or the new one, never a part.
    Records dropped, or None when the store could not be rewritten (read-only, no lock: it stays as it was).
    ``read``: (the bytes a reader parsed, their believable records), reused where the store only grew since."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    tmp = None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            return None  # no lock, no rewrite: an appender could lose its record
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            return None  # rewritten meanwhile by another process
        data = read_all(fd)
        lines = data.splitlines()
        if read is not None and read[0].endswith(b"\n") and data.startswith(read[0]):  # grown since: parse the rest
            good = read[1] + parse(data[len(read[0]):], len(read[0].splitlines()) + 1)[0]
        else:
            good, _ = parse(data)
        kept = newest(good, keep)
        dropped = {n for n, _ in good} - kept
        if not dropped:
            return 0
        body = b"".join(line + b"\n" for n, line in enumerate(lines, 1) if n not in dropped and line.strip())
        tmp = path.with_name(f".{path.name}.compact-{os.getpid()}")
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, os.fstat(fd).st_mode & 0o777)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(out, view):]
            os.fsync(out)
        finally:
            os.close(out)
        os.replace(tmp, path)  # appenders waiting on the old file's lock see the new file and reopen (append_record)
        tmp = None
        return len(dropped)
    except OSError:
        return None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        os.close(fd)


# ---------------------------------------------------------------------------- reading and appending the store
STORE_ENV = "FTPROF_CALIBRATION"
OFF = "off"
STORE_NAME = "calibration.jsonl"
_warned: set[str] = set()  # one warning per problem per process


def enabled() -> bool:
    return os.environ.get(STORE_ENV, "").strip().lower() != OFF


def store_path() -> Path:
    """$FTPROF_CALIBRATION if set (and not ``off``), else calibration.jsonl in ftprof's cache directory."""
    value = os.environ.get(STORE_ENV, "").strip()
    if value and value.lower() != OFF:
        return Path(value).expanduser()
    # The one resolver of FTPROF_CACHE_DIR (it lives beside the GPTQ cache, whose module imports torch: imported
    # only when a path is needed, never at this module's import).
    from ftprof.models.gptq import cache_root

    return cache_root().parent / STORE_NAME


def _warn(message: str, once: str | None = None) -> None:
    if once is not None:
        if once in _warned:
            return
        _warned.add(once)
    print(message, file=sys.stderr, flush=True)


def load_records(path: str | Path | None = None) -> list[dict]:
    """The local store's records the planner may use, oldest first: those with the schema it reads and believable
    figures (``store.problem``), the newest ``store.KEEP`` of each configuration. Lines that are not (not JSON, a
    field of the wrong type, a rate beyond the GPU's peak, an absurd size) are skipped and counted in one warning
    line per store per process. A store with many superseded records is compacted by the read that finds them
    (``compact``). No store, or FTPROF_CALIBRATION=off without an explicit path: []."""

    if path is None:
        if not enabled():
            return []
        path = store_path()
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        _warn(f"ftprof: calibration store {path} unreadable ({exc.strerror or exc}); not used", once=f"read {path}")
        return []
    good, bad = parse(data)
    if bad:
        number, why = bad[0]
        _warn(f"ftprof: calibration store {path}: skipped {len(bad)} record(s) that are damaged or not believable "
              f"(first: line {number}: {why})", once=f"damaged {path}")
    kept = newest(good)
    if len(good) - len(kept) >= COMPACT_AT:
        compact(Path(path), _read_all, read=(data, good))
    return [record for number, record in good if number in kept]


def _run_marker(run_key: str) -> bytes:
    """How a record's key reads in the store (records are written with separators (",", ":"))."""
    return b'"run_key":' + json.dumps(run_key).encode()


def append_record(record: dict, path: str | Path | None = None) -> bool:
    """Append ``record`` as one line, unless a record with its run_key is there already. Safe across processes and
    hosts sharing the file: O_APPEND, one os.write of the whole line, under an exclusive flock (where the file
    system refuses locks, the write goes on unlocked: one O_APPEND write still lands whole on local disks)."""
    path = Path(path) if path is not None else store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = _open_locked(path)
    try:
        existing = _read_all(fd)
        if record.get("run_key") and _run_marker(record["run_key"]) in existing:
            return False
        if existing and not existing.endswith(b"\n"):  # a writer died mid-line: keep that damage to its own line
            line = b"\n" + line
        written = os.write(fd, line)
        while written < len(line):  # a regular file takes the whole line at once; this is belt and braces
            written += os.write(fd, line[written:])
        return True
    finally:
        os.close(fd)  # releases the lock


def _open_locked(path: Path) -> int:
    """The store opened for appending, under its exclusive lock (where the file system has locks). A compaction
    renames a new file over the store while holding the old file's lock: an appender that was waiting for that lock
    opens the new file and locks it instead (its line would land in the replaced file otherwise)."""
    for _ in range(100):
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            return fd  # no locks here: one O_APPEND write still lands whole on local disks
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)  # O_APPEND: writes still go to the end whatever the offset
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------------------------------------------- records
