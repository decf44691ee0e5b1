"""Where the profiler's files go, so that trace readers find one cycle's traces and nothing else.

    <profile dir>/
      cycle{c}/trace_rank{r}_cycle{c}.pt.trace.json.gz   one file per rank: the folder HTA's TraceAnalysis(trace_dir=)
                                                          and TensorBoard (one run per cycle) read
      summary_rank{r}_cycle{c}.json|.md, summary.json|.md the summaries, beside the cycle folders, never inside
      key_averages_*, stacks_*, memory_timeline_*, memory_snapshot_*, allocator_pools_*   the other artifacts, beside

Trace readers pick up every *.json and *.gz file of the folder they are pointed at (HTA keys them by rank, so a
second cycle of the same rank, or a summary, would replace or break a trace); hence one folder per cycle.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

TRACE_SUFFIX = ".pt.trace.json.gz"
_TRACE_NAME = re.compile(r"trace_rank(\d+)_cycle(\d+)\.pt\.trace\.json\.gz$")


def cycle_dir(profile_dir: Path, cycle: int) -> Path:
    return Path(profile_dir) / f"cycle{cycle}"


def trace_path(profile_dir: Path, rank: int, cycle: int) -> Path:
    return cycle_dir(profile_dir, cycle) / f"trace_rank{rank}_cycle{cycle}{TRACE_SUFFIX}"


def trace_files(profile_dir: Path) -> list[Path]:
    """Every trace ftprof wrote under ``profile_dir``, by cycle then rank."""
    found = []
    for path in Path(profile_dir).glob(f"cycle*/trace_rank*_cycle*{TRACE_SUFFIX}"):
        match = _TRACE_NAME.search(path.name)
        if match:
            found.append(((int(match.group(2)), int(match.group(1))), path))
    return [p for _, p in sorted(found)]


def summary_stem(trace: Path) -> str:
    """summary_rank{r}_cycle{c} for trace_rank{r}_cycle{c}.pt.trace.json.gz."""
    return Path(trace).name.replace("trace_", "summary_", 1).removesuffix(TRACE_SUFFIX)


def summaries_dir(trace: Path) -> Path:
    """Where summaries of ``trace`` go: beside its cycle folder when ftprof laid it out (a summary inside would be
    read as a trace), beside the trace otherwise."""
    parent = Path(trace).parent
    return parent.parent if re.fullmatch(r"cycle\d+", parent.name) else parent


def open_hints(trace_dir: Path) -> list[str]:
    """How to open a cycle's traces: Perfetto, TensorBoard, Holistic Trace Analysis."""
    trace_dir = Path(trace_dir)
    files = sorted(trace_dir.glob(f"*{TRACE_SUFFIX}"))
    first = files[0] if files else trace_dir / f"trace_rank0_cycle1{TRACE_SUFFIX}"
    return [
        f"traces: {trace_dir}/ ({len(files)} file{'s' if len(files) != 1 else ''}, one per rank)",
        f"  Perfetto:     open https://ui.perfetto.dev and drag in {first}",
        f"  TensorBoard:  tensorboard --logdir {trace_dir.parent}   (torch-tb-profiler; one run per cycle)",
        "  HTA:          python -c \"from hta.trace_analysis import TraceAnalysis; "
        f"a = TraceAnalysis(trace_dir='{trace_dir}'); print(a.get_temporal_breakdown())\"",
    ]


# ftprof's metadata block sits at the trace's top level as a string: Holistic Trace Analysis (0.5) fails on a nested
# object there. Kineto turns every backslash of a metadata value into '/', so the JSON inside cannot escape its
# quotes: it is written with single quotes, and string values lose any quote or backslash of their own.
def encode_metadata(meta: dict) -> str:
    def clean(v):
        return v.translate({ord('"'): "_", ord("'"): "_", ord("\\"): "/"}) if isinstance(v, str) else v

    return json.dumps({clean(k): clean(v) for k, v in meta.items()}).replace('"', "'")


def decode_metadata(value) -> dict:
    """ftprof's block from a trace: the single-quoted string above, or (older traces) a nested object."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            block = json.loads(value.replace("'", '"'))
        except ValueError:
            return {}
        return block if isinstance(block, dict) else {}
    return {}
