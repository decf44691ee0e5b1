"""SIGTERM (timeout, scancel, docker stop) to `ftprof train` stops the run as Ctrl-C does: recorded 'interrupted'
with the steps it ran, exit status 130. Its default action killed the run without a result.json."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.test_torchrun_entry import _wait_for_steps

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a tiny run starts and trains a few steps (about 10 s on 2 cores)
def test_sigterm_records_the_run_as_interrupted(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "ftprof", "train", "lora", "--device", "cpu", "--max-steps",
                             "100000", "--seq-len", "32", "--output-dir", str(tmp_path), "--run-name", "r", "--quiet"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = tmp_path / "r"
    _wait_for_steps(proc, run / "steps.csv", rows=3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "interrupted" and result["steps_completed"] >= 3
    assert result["error_message"] == "stopped by SIGTERM"  # not a bare KeyboardInterrupt (Ctrl-C's)


def test_the_sigterm_handler_is_put_back_after_an_in_process_run():
    from ftprof import lifetime
    from ftprof.engine.worker import sigterm_stops_the_run

    before = signal.getsignal(signal.SIGTERM)
    with sigterm_stops_the_run():
        assert signal.getsignal(signal.SIGTERM) is not before
        lifetime.request_stop()
    assert signal.getsignal(signal.SIGTERM) is before and not lifetime.stop_requested()
