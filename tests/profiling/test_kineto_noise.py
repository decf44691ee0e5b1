"""Kineto writes to fd 2 past Python: its start/stop trace points and, without a GPU, 'gpuGetDeviceCount failed'.
ftprof's profiler filters them out, and only them (checked in a child process, on its real stderr)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ftprof.profiling.kineto_noise import is_noise

REPO = Path(__file__).resolve().parents[2]
NO_GPU = "ERROR:2026-12-02 05:57:03 18885:18885 DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35\n"


def test_what_counts_as_noise():
    assert is_noise("USDT:2026-12-02 05:57:03 1:1 SyncActivityProfilerHandler.cpp:39] profiler_start\n", True)
    assert is_noise("USDT:2026-12-02 05:57:03 1:1 SyncActivityProfilerHandler.cpp:46] profiler_stop\n", False)
    assert is_noise(NO_GPU, gpu_present=False)
    assert not is_noise(NO_GPU, gpu_present=True)  # with a GPU it would be a real failure
    assert not is_noise("ERROR: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES\n", False)


def _child(body: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_a_cpu_profile_writes_nothing_to_stderr(tmp_path):
    done = _child(f"""
        import torch
        import ftprof
        from ftprof.config import ProfilingConfig
        from ftprof.profiling.torch_profiler import TorchProfiler

        cfg = ProfilingConfig(profile=True, prof_wait_steps=1, prof_warmup_steps=1, prof_active_steps=1)
        with TorchProfiler(cfg, {str(tmp_path)!r}, torch.device("cpu"), log=lambda m: None) as prof:
            for _ in range(cfg.total_steps):
                torch.ones(64, 64) @ torch.ones(64, 64)
                prof.step()
        print("traces", len(list(__import__("pathlib").Path({str(tmp_path)!r}).glob("cycle1/*.gz"))))
        """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "traces 1"
    assert done.stderr == "", done.stderr


def test_other_lines_written_to_fd2_are_kept_in_order():
    done = _child("""
        import os, sys
        from ftprof.profiling.kineto_noise import quiet_kineto

        with quiet_kineto(gpu_present=False):
            os.write(2, b"USDT:2026 1:1 x.cpp:39] profiler_start\\n")
            print("python line", file=sys.stderr)
            os.write(2, b"ERROR:2026 1:1 DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35\\n")
            os.write(2, b"a real error\\n")
        print("after", file=sys.stderr)
        """)
    assert done.returncode == 0
    assert done.stderr.splitlines() == ["python line", "a real error", "after"]
