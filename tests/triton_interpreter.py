"""ftprof's Triton kernels on the CPU: a child process runs Python source with TRITON_INTERPRET=1, set before Triton
is imported (the interpreter is chosen at import), for the kernel tests that compare it against torch ops."""

from __future__ import annotations

import os
import subprocess
import sys


def run_in_interpreter(child: str) -> subprocess.CompletedProcess:
    """``child`` (Python source) run in a fresh interpreter under Triton's interpreter; its output captured."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=600)
