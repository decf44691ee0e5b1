"""One owner at a time: a lock on a sweep's output directory, and a claim on each experiment being run.

The lock is ``fcntl.flock`` on ``<output dir>/.ftprof-bench.lock`` (the kernel releases it when its holder dies, on
NFS too, where Linux maps flock to a byte-range lock); the file records who holds it (pid, host, start) so a second
bench can say so. A claim is ``<run dir>/.claim``, created with O_EXCL (atomic on a shared filesystem too) and
holding the pids of the bench and of the experiment it started, with their host. A claim whose processes are all
gone (checked on the same host only: another host's pids cannot be checked from here), or that names no process
(empty or unreadable) and is older than ``CLAIM_WRITE_GRACE_S``, is stale and is taken over; ``--force`` takes
over a live one too, and says whose.
Launchers that run cells on other machines (Slurm) follow the same rule: claim a cell before starting it.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ftprof.errors import FtprofError, StorageError
from ftprof.results.store import write_json_atomic

LOCK_FILE = ".ftprof-bench.lock"
CLAIM_FILE = ".claim"
WAIT_POLL_S = 1.0
# A claim naming no process (empty, damaged, or from a writer that died mid-write) is stale after this long.
CLAIM_WRITE_GRACE_S = 10.0


class OutputDirBusy(FtprofError):
    """Another bench holds the output directory (exit status 2: say who, change nothing)."""


def _me() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": _dt.datetime.now().isoformat(timespec="seconds")}


def describe_holder(info: dict) -> str:
    if not info:
        return "another ftprof bench"
    return (f"ftprof bench pid {info.get('pid', '?')} on {info.get('host', '?')} "
            f"(since {info.get('started', '?')})")


class OutputLock:
    """``with OutputLock(out_dir, wait=False):`` hold the output directory for this process."""

    def __init__(self, out_dir: Path, *, wait: bool = False, on_wait=None):
        self.path = Path(out_dir) / LOCK_FILE
        self.wait = wait
        self.on_wait = on_wait or (lambda holder: None)
        self._fd: int | None = None

    def holder(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not self.wait:
                    os.close(fd)
                    raise OutputDirBusy(f"{self.path.parent} is in use by {describe_holder(self.holder())}; "
                                        "wait for it to finish, or pass --wait") from None
                if not told:
                    self.on_wait(describe_holder(self.holder()))
                    told = True
                time.sleep(WAIT_POLL_S)
        self._fd = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(_me()) + "\n").encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


# ---------------------------------------------------------------------------------------------- per-cell claims
@dataclass
class Claim:
    path: Path
    overridden: str | None = None  # whose live claim --force took over

    def add_process(self, pid: int) -> None:
        """Record the experiment's own process, so a rerun sees it alive even if this bench is gone."""
        info = read_claim(self.path.parent) or _me()
        info["pids"] = sorted({*info.get("pids", [info.get("pid")]), pid} - {None})
        write_json_atomic(self.path, info)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


def read_claim(run_dir: Path) -> dict | None:
    try:
        data = json.loads((Path(run_dir) / CLAIM_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # being written, or damaged: treat as held by someone unknown
    return data if isinstance(data, dict) else {}


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, someone else's
    try:  # a zombie is not running the cell
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001 - psutil missing or the process just left
        return True


def claim_holder(run_dir: Path) -> str | None:
    """Who is running this cell now (a line for the user), or None when nobody is (no claim, or a stale one)."""
    info = read_claim(run_dir)
    if info is None:
        return None
    if not isinstance(info.get("pid"), int) and not info.get("pids"):
        # empty, unreadable or naming no process: stale once it is old enough not to be one being written
        return None if _claim_age(run_dir) > CLAIM_WRITE_GRACE_S else "a process writing its claim"
    if info.get("host") == socket.gethostname():
        pids = [p for p in info.get("pids", [info.get("pid")]) if _alive(p)]
        if not pids:
            return None
        return f"pid {', '.join(map(str, pids))} on {info['host']} since {info.get('started', '?')}"
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')} since {info.get('started', '?')}"


def _claim_age(run_dir: Path) -> float:
    try:
        return time.time() - (Path(run_dir) / CLAIM_FILE).stat().st_mtime
    except OSError:
        return float("inf")


def claim_cell(run_dir: Path, *, force: bool = False) -> Claim | None:
    """Claim ``run_dir`` for this process; None if a live process (or another host) holds it, unless ``force``:
    then the claim is taken over and ``Claim.overridden`` says whose it was.

    The claim is written whole to a temp file and linked into place (``link`` fails if the name exists, atomically,
    on NFS too): no reader ever sees it half-written, and a full disk leaves no claim behind (StorageError)."""
    path = Path(run_dir) / CLAIM_FILE
    tmp = _write_temp_claim(path)
    try:
        for _ in range(2):
            try:
                _link(tmp, path)
                return Claim(path)
            except FileExistsError:
                holder = claim_holder(run_dir)
                if holder is not None and force:
                    os.replace(tmp, path)
                    return Claim(path, overridden=holder)
                if holder is not None:
                    return None
                path.unlink(missing_ok=True)  # stale: its processes are gone
        return None
    except OSError as exc:
        raise _storage_error(exc, path) from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def _link(tmp: str, path: Path) -> None:
    """Put the written claim at ``path`` unless something is there (FileExistsError). A file system without hard
    links gets an O_EXCL create and a copy of the claim instead."""
    try:
        os.link(tmp, path)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(Path(tmp).read_bytes())
        except OSError:
            path.unlink(missing_ok=True)
            raise


def _write_temp_claim(path: Path) -> str:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f"{CLAIM_FILE}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _storage_error(exc, path) from None
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump({**_me(), "pids": [os.getpid()]}, fh)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _storage_error(exc, path) from None
    return tmp


def _storage_error(exc: OSError, path: Path) -> OSError:
    """A full disk (or quota, read-only file system) as ftprof's one-line StorageError; other errors as they are."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS):
        return StorageError(exc.errno, f"cannot claim {path.parent.name}: {path}: {exc.strerror}")
    return exc
