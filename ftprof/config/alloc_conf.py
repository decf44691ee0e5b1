"""PYTORCH_ALLOC_CONF's syntax, checked before torch is imported: torch aborts the process with a C++ stack for a
value it cannot tokenize (``garbage``: "INTERNAL ASSERT FAILED ... ConfigTokenizer", exit 134, torch 2.14), and
takes a misspelt key or a boolean it does not know (``expandable_segments:maybe``) without a word on a CPU.

A value is comma-separated ``key:value`` items; roundup_power2_divisions also takes a bracketed list
(``[256:1,512:2,>:4]``). The keys are torch's caching-allocator keys (c10/core/AllocatorConfig and the CUDA
allocator's, torch 2.11-2.14)."""

from __future__ import annotations

import re

from ftprof.errors import did_you_mean

BOOLEAN_KEYS = ("expandable_segments", "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
                "pinned_use_cuda_host_register", "pinned_use_hip_host_register", "pinned_use_background_threads",
                "graph_capture_record_stream_reuse")
NUMBER_KEYS = ("max_split_size_mb", "max_non_split_rounding_mb", "large_segment_size_mb",
               "pinned_num_register_threads", "pinned_max_cached_size_mb", "pinned_max_round_threshold_mb",
               "pinned_reserve_segment_size_mb", "garbage_collection_threshold", "per_process_memory_fraction")
BACKENDS = ("native", "cudaMallocAsync")
KEYS = (*BOOLEAN_KEYS, *NUMBER_KEYS, "roundup_power2_divisions", "backend")
_NUMBER = re.compile(r"^\d+(\.\d+)?$")
_DIVISIONS = re.compile(r"^(\d+|\[\s*(\d+|>)\s*:\s*\d+\s*(,\s*(\d+|>)\s*:\s*\d+\s*)*\])$")


def _items(value: str) -> list[str]:
    """``value`` split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(value):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(value[start:i])
            start = i + 1
    return [*items, value[start:]]


def _value_problem(key: str, value: str) -> str | None:
    if key in BOOLEAN_KEYS and value not in ("True", "False"):
        return f"{key} takes True or False, got '{value}'"
    if key in NUMBER_KEYS and not _NUMBER.match(value):
        return f"{key} takes a non-negative number, got '{value}'"
    if key == "backend" and value not in BACKENDS:
        return f"backend is native or cudaMallocAsync, got '{value}'"
    if key == "roundup_power2_divisions" and not _DIVISIONS.match(value):
        return f"roundup_power2_divisions takes a number or a list such as [256:1,512:2,>:4], got '{value}'"
    return None


def problem(value: str) -> str | None:
    """What is wrong with ``value`` as PYTORCH_ALLOC_CONF, in a phrase, or None."""
    if not value.strip():
        return "it is empty"
    for item in _items(value.strip()):
        key, sep, setting = (part.strip() for part in item.partition(":"))
        if not sep or not key or not setting:
            return f"'{item}' is not key:value (comma-separated items such as expandable_segments:True)"
        if key not in KEYS:
            return f"'{key}' is not an allocator setting{did_you_mean(key, KEYS)}"
        wrong = _value_problem(key, setting)
        if wrong:
            return wrong
    return None
