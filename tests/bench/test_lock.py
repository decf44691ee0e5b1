"""One owner per output directory (flock), one process per cell (O_EXCL claims), stale claims taken over."""

import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from ftprof.bench.lock import CLAIM_FILE, LOCK_FILE, OutputDirBusy, OutputLock, claim_cell, claim_holder

HOLD = """
import sys, time
from pathlib import Path
from ftprof.bench.lock import OutputLock
with OutputLock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    (Path(sys.argv[1]) / "holder-done").touch()  # the last thing it does holding the lock
"""


def _holder(out, seconds):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_owner_is_refused_with_who_holds_it(tmp_path):
    proc = _holder(tmp_path, 30)
    try:
        with pytest.raises(OutputDirBusy) as err:
            OutputLock(tmp_path).acquire()
        text = str(err.value)
        assert f"pid {proc.pid}" in text and socket.gethostname() in text and "--wait" in text
    finally:
        proc.kill()
        proc.wait()
    with OutputLock(tmp_path):  # the kernel released it with its holder, even killed
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] > 0


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_wait_blocks_until_the_holder_leaves(tmp_path):
    proc = _holder(tmp_path, 1.5)
    told = []
    with OutputLock(tmp_path, wait=True, on_wait=told.append):
        holder_was_done = (tmp_path / "holder-done").exists()  # not how long it waited: whom it waited for
    proc.wait()
    assert holder_was_done and told and str(proc.pid) in told[0]


def test_a_claim_is_exclusive_and_released(tmp_path):
    claim = claim_cell(tmp_path / "cell")
    assert claim is not None and (tmp_path / "cell" / CLAIM_FILE).is_file()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        claim.add_process(sleeper.pid)  # the experiment's own pid: alive even when bench is not
        assert str(sleeper.pid) in (claim_holder(tmp_path / "cell") or "")
        assert claim_cell(tmp_path / "cell") is None
    finally:
        sleeper.kill()
        sleeper.wait()
    assert claim_holder(tmp_path / "cell") is not None  # its bench (this process) is still alive
    claim.release()
    assert not (tmp_path / "cell" / CLAIM_FILE).exists() and claim_holder(tmp_path / "cell") is None


def test_stale_claim_is_taken_over_and_other_hosts_are_respected(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    cell = tmp_path / "cell"
    cell.mkdir()
    (cell / CLAIM_FILE).write_text(json.dumps({"pid": dead.pid, "pids": [dead.pid], "host": socket.gethostname()}))
    assert claim_holder(cell) is None
    assert claim_cell(cell) is not None
    other = tmp_path / "other"
    other.mkdir()
    (other / CLAIM_FILE).write_text(json.dumps({"pid": dead.pid, "host": "node-elsewhere", "started": "t"}))
    assert "node-elsewhere" in claim_holder(other) and claim_cell(other) is None


def test_only_one_of_many_racing_claimers_wins(tmp_path):
    wins = []
    barrier = threading.Barrier(8)

    def race():
        barrier.wait()
        wins.append(claim_cell(tmp_path / "cell"))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(c is not None for c in wins) == 1


@pytest.mark.parametrize("content", ["", "{not json", "[1, 2]", '{"host": "elsewhere"}', "\x00\x01"])
def test_a_claim_naming_no_process_is_stale_once_old(tmp_path, content):
    import os

    from ftprof.bench import lock

    path = tmp_path / CLAIM_FILE
    path.write_text(content)
    assert claim_holder(tmp_path) == "a process writing its claim"  # fresh: maybe being written
    assert claim_cell(tmp_path) is None
    old = time.time() - lock.CLAIM_WRITE_GRACE_S - 1
    os.utime(path, (old, old))
    assert claim_holder(tmp_path) is None
    claim = claim_cell(tmp_path)
    assert claim is not None and json.loads(path.read_text())["pids"]


def test_force_takes_over_a_live_claim_and_says_whose(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / CLAIM_FILE).write_text(json.dumps({"pid": sleeper.pid, "pids": [sleeper.pid],
                                                       "host": socket.gethostname(), "started": "t0"}))
        assert claim_cell(tmp_path) is None
        claim = claim_cell(tmp_path, force=True)
        assert claim is not None and claim.overridden == f"pid {sleeper.pid} on {socket.gethostname()} since t0"
        assert json.loads((tmp_path / CLAIM_FILE).read_text())["pids"] == [__import__("os").getpid()]
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("where", ["mkstemp", "fsync", "link"])
def test_a_full_disk_is_a_storage_error_and_leaves_no_claim(tmp_path, monkeypatch, where):
    import errno
    import os
    import tempfile

    from ftprof.errors import StorageError

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    target = {"mkstemp": (tempfile, "mkstemp"), "fsync": (os, "fsync"), "link": (os, "link")}[where]
    monkeypatch.setattr(*target, no_space)
    with pytest.raises(StorageError, match="No space left on device"):
        claim_cell(tmp_path / "cell")
    assert not any(p.name.startswith(CLAIM_FILE) for p in (tmp_path / "cell").glob("*"))


def test_bench_on_a_full_disk_is_one_line_and_leaves_no_claim(tmp_path, monkeypatch, capsys):
    import errno
    import os

    from ftprof.cli.main import main

    sweep = tmp_path / "s.yaml"
    sweep.write_text("base: {model: tiny, max_steps: 3}\nexperiments: [{method: full}]\n")
    real_link = os.link

    def no_space(src, dst, *args, **kwargs):
        if str(dst).endswith(CLAIM_FILE):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", no_space)
    code = main(["bench", str(sweep), "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1 and "No space left on device" in err and len(err.strip().splitlines()) == 1, err
    assert not list((tmp_path / "out").rglob(f"{CLAIM_FILE}*"))


def test_sighup_stops_bench_like_sigterm():
    import os
    import signal

    from ftprof.bench.runner import _sigterm_as_interrupt

    with pytest.raises(KeyboardInterrupt), _sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)
