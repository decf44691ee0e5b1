"""Interval arithmetic over compact arrays (a large trace has millions of kernels): vectorized, no per-event
Python objects."""

from __future__ import annotations

import numpy as np


def union_us(starts, ends) -> float:
    """Total length of the union of intervals (kernels on several streams overlap). Vectorized, sorted copies only:
    about 24 bytes per kernel at the peak."""
    if not len(starts):
        return 0.0
    s, e = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    del order
    np.maximum.accumulate(e, out=e)  # e[i]: how far the busy segment reaches by kernel i
    first = np.flatnonzero(s[1:] > e[:-1]) + 1  # a new segment starts where a kernel begins after all earlier end
    last = np.empty(len(first) + 1, dtype=np.int64)
    last[:-1] = first - 1
    last[-1] = len(s) - 1
    busy = float(e[last].sum() - s[0] - s[first].sum())
    return busy


def step_index(times: np.ndarray, steps: list[tuple[float, float]]) -> np.ndarray:
    """Index of the step range containing each time (-1: outside every step). Without steps, everything is step 0."""
    if not steps:
        return np.zeros(len(times), dtype=np.int64)
    starts = np.array([s for s, _ in steps])
    ends = np.array([e for _, e in steps])
    idx = np.searchsorted(starts, times, side="right") - 1
    ok = (idx >= 0) & (times < ends[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1)


def lookup(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Index into ``keys`` of each wanted value (-1 where absent or NaN)."""
    if not len(keys):
        return np.full(len(wanted), -1, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    pos = np.clip(np.searchsorted(sorted_keys, wanted), 0, len(keys) - 1)
    found = sorted_keys[pos] == wanted
    return np.where(found, order[pos], -1)
