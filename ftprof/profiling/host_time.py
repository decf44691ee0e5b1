"""Host time inside a step that is not the model's own work: Python's garbage collector and torch.compile.

Both stop the host from launching kernels while they run, so a step in which they run is longer unless the GPU
still has that much work queued (a compile never overlaps: the graph it makes is what runs next). Measured from
their own callbacks, not guessed from the step time:

- ``gc.callbacks``: every collection, any generation (a full collection over a large model's Python objects can
  take tenths of a second).
- dynamo's compile callbacks: tracing a new frame, a recompilation after a guard failed, a backward compiled lazily
  at its first call, CUDA-graph recording. Library code that compiles on its own (a quantized kernel's first call)
  counts too. The handler calls them around the outermost compile only, so nested compiles are not counted twice.

A collection that runs inside a compile counts in both; the slow-step verdict (``ftprof.metrics.slow_steps``) names
the larger.
"""

from __future__ import annotations

import gc
import time


class HostTime:
    """A context manager: while entered, sums seconds spent in garbage collection and in torch.compile; ``lap()``
    returns the sums since the previous lap (or since entering) and starts new ones."""

    def __init__(self) -> None:
        self.gc_s = 0.0
        self.compile_s = 0.0
        self._gc_started: float | None = None
        self._compile_started: float | None = None
        self._dynamo = None

    def __enter__(self) -> HostTime:
        gc.callbacks.append(self._on_gc)
        self._dynamo = _dynamo_callbacks()
        if self._dynamo is not None:
            self._dynamo.register_start_callback(self._on_compile_start)
            self._dynamo.register_end_callback(self._on_compile_end)
        return self

    def __exit__(self, *exc) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._dynamo is not None:  # torch._dynamo.reset() clears every callback: ours may be gone already
            if self._on_compile_start in self._dynamo.start_callbacks:
                self._dynamo.remove_start_callback(self._on_compile_start)
            if self._on_compile_end in self._dynamo.end_callbacks:
                self._dynamo.remove_end_callback(self._on_compile_end)
            self._dynamo = None

    def lap(self) -> dict[str, float]:
        out = {"gc_s": self.gc_s, "compile_s": self.compile_s}
        self.gc_s = self.compile_s = 0.0
        return out

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            self.gc_s += time.perf_counter() - self._gc_started
            self._gc_started = None

    # The handler passes one argument (the trigger and compile id) in current torch; older releases passed none.
    def _on_compile_start(self, *args) -> None:
        self._compile_started = time.perf_counter()

    def _on_compile_end(self, *args) -> None:
        if self._compile_started is not None:
            self.compile_s += time.perf_counter() - self._compile_started
            self._compile_started = None


def _dynamo_callbacks():
    """torch.compile's callback handler, or None where this torch has none. torch._dynamo is already imported by
    the time a run trains (transformers and peft import it), so this costs nothing."""
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:
        return None
    return callback_handler
