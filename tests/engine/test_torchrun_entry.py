"""torchrun in ftprof's wrapper: Ctrl-C of a multi-process launch is one line, and the ranks record it."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ftprof.engine.torchrun_entry import exit_status, failed_ranks_status, kill_still_running

REPO = Path(__file__).resolve().parents[2]


def _failure(rank: int, exitcode: int, tmp_path) -> ProcessFailure:
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(tmp_path / "none"))


def test_failed_ranks_status_names_only_ranks_that_were_not_interrupted(tmp_path):
    exc = ChildFailedError("ftprof.engine.worker", {0: _failure(0, 3, tmp_path), 1: _failure(1, 130, tmp_path)})
    status, lines = failed_ranks_status(exc)
    assert status in (3, 130)  # the first failure by time (equal timestamps here: either)
    assert lines == ["ftprof: rank 0 exited with status 3"]
    interrupted = ChildFailedError("w", {0: _failure(0, 130, tmp_path), 1: _failure(1, -signal.SIGINT, tmp_path)})
    assert failed_ranks_status(interrupted)[1] == []
    assert exit_status(-signal.SIGKILL) == 137 and exit_status(2) == 2


def test_ranks_that_do_not_stop_are_killed_with_one_line_each(capfd):
    import psutil

    stuck = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, "
                              "signal.SIG_IGN); time.sleep(60)"])
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done_rank = psutil.Process(done.pid)
    done.wait()  # a rank that stopped in time is left alone
    assert kill_still_running([done_rank, psutil.Process(stuck.pid)], grace_s=30) == [stuck.pid]
    assert stuck.wait(timeout=10) == -signal.SIGKILL
    assert capfd.readouterr().err == f"ftprof: rank process {stuck.pid} did not stop within 30 s of Ctrl-C; killed it\n"


def _wait_for_steps(proc, steps_csv: Path, rows: int, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and proc.poll() is None:
        if steps_csv.is_file() and len(steps_csv.read_text().splitlines()) > rows:
            return
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no {rows} steps in {steps_csv} (exit status {proc.poll()}): {proc.communicate()}")


@pytest.mark.slow  # two ranks have to start and train (15-20 s on the 2-core machine)
def test_ctrl_c_of_a_two_process_launch_is_one_line_and_recorded(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "ftprof", "train", "lora", "--model", "tiny", "--device", "cpu", "--nproc-per-node",
           "2", "--max-steps", "100000", "--seq-len", "32", "--output-dir", str(tmp_path), "--run-name", "r"]
    # Its own process group, like a shell's foreground job: Ctrl-C is SIGINT to every process of the group.
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    run = tmp_path / "r"
    _wait_for_steps(proc, run / "steps_rank0.csv", rows=3)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130  # as `ftprof train` interrupted in one process
    assert "Traceback" not in err and "Error" not in err, err
    assert err.strip().splitlines() == [f"ftprof: interrupted (Ctrl-C); run dir {run}"], err
    for name in ("result.json", "result_rank0.json", "result_rank1.json"):
        assert json.loads((run / name).read_text())["status"] == "interrupted", name
    result = json.loads((run / "result.json").read_text())
    assert result["world_size"] == 2 and any("rank 0's" in n for n in result["notes"])  # not "cpu x1"
