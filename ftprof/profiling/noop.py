"""The profiler interface the training loop talks to, and the object used when profiling is off.

The loop is the same either way: it enters the profiler, calls ``step()`` once per optimizer step, and exits it.
"""

from __future__ import annotations


class NullProfiler:
    """Does nothing; costs one method call per step."""

    enabled = False

    def __enter__(self) -> NullProfiler:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def step(self) -> None:
        return None

    def phase(self, index: int) -> str:
        return ""

    def resolved(self) -> dict:
        return {}

    def artifacts(self) -> dict[str, str]:
        return {}
