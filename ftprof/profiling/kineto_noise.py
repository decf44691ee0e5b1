"""Keep torch.profiler's C++ side (Kineto) from writing its noise into ftprof's output.

Kineto logs straight to file descriptor 2, past Python's sys.stderr: a ``USDT: ... profiler_start`` /
``profiler_stop`` trace point each time a profiler starts and stops, and, on a machine without a CUDA driver,
``ERROR: ... DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35`` when the profiler stops (it asks for
the GPUs' properties to write into the trace, whatever activities were requested). Around each call into the
profiler, fd 2 goes to a temporary file; afterwards every line that is not such noise is written back to fd 2, in
order, so a real error printed from the same call still shows.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

_TRACE_POINT = re.compile(r"^USDT:.*\] profiler_(start|stop)\s*$")
_NO_GPU = re.compile(r"^ERROR:.*gpuGetDeviceCount failed")


def is_noise(line: str, gpu_present: bool) -> bool:
    """Kineto's start/stop trace points, and its complaint that there is no GPU on a machine that has none."""
    return bool(_TRACE_POINT.match(line) or (not gpu_present and _NO_GPU.match(line)))


def _gpu_present() -> bool:
    import torch

    return torch.cuda.is_available()


@contextlib.contextmanager
def quiet_kineto(gpu_present: bool | None = None) -> Iterator[None]:
    """Run the body with fd 2 captured; replay the lines that are not Kineto noise. Python's own stderr writes in
    the body are captured and replayed too (flushed first, so their order holds)."""
    gpu = _gpu_present() if gpu_present is None else gpu_present
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no fd 2 to redirect (a closed or replaced stderr): run as is
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().decode(errors="replace").splitlines(keepends=True)
                    if not is_noise(line, gpu)]
            if kept:
                os.write(2, "".join(kept).encode())
