"""What was live at the peak of a CUDA allocator snapshot (``ftprof profile --prof-memory-snapshot``), grouped by where
it was allocated. A diagnostic for memory work (issue 39), run where the snapshot was taken:

    python benchmarks/snapshot_peak.py RUN_DIR/profile/memory_snapshot_rank0_cycle0.pickle [--top 30]

Replays the trace's alloc/free events: bytes allocated before the trace began are one "before the trace" line (the
weights, the optimizer state); every block live at the trace's highest point is attributed to the innermost frames
from ftprof, PEFT, transformers, Liger, bitsandbytes or torch's checkpointing and autograd."""

from __future__ import annotations

import argparse
import pickle
import re
from collections import defaultdict

from ftprof.profiling import allocator_pools

OURS = re.compile(r"ftprof/|peft/|transformers/|liger_kernel/|bitsandbytes/|torch/utils/checkpoint|"
                  r"torch/autograd/|torch/_inductor/|torch/_functorch/")


def _where(frames: list[dict], depth: int) -> str:
    picked = [f"{f['filename'].split('site-packages/')[-1]}:{f['line']} {f['name']}" for f in frames
              if OURS.search(f.get("filename", ""))]
    return " <- ".join(picked[:depth]) or "(no python frame)"


def peak_blocks(trace: list[dict]) -> tuple[int, int, dict]:
    """(peak bytes above the trace's start, the event index of the peak, live blocks at the peak)."""
    running = peak = peak_at = 0
    for i, event in enumerate(trace):
        if event["action"] == "alloc":
            running += event["size"]
        elif event["action"] == "free_completed":
            running -= event["size"]
        if running > peak:
            peak, peak_at = running, i
    live: dict[int, dict] = {}
    for event in trace[:peak_at + 1]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
        elif event["action"] == "free_completed":
            live.pop(event["addr"], None)
    return peak, peak_at, live


def print_segments(snap: dict) -> None:
    """The allocator's reserved memory at the dump, by stream and pool (ftprof/profiling/allocator_pools.py)."""
    print("stream / pool: reserved GiB, allocated GiB, segments, pending-free GiB (awaiting another stream)")
    for p in allocator_pools.pools(snap["segments"]):
        print(f"  stream {p.stream} {p.kind} pool: {p.reserved / 2**30:.3f} {p.allocated / 2**30:.3f} {p.segments} "
              f"{p.pending_free / 2**30:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("snapshot")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--depth", type=int, default=3)
    args = parser.parse_args()
    with open(args.snapshot, "rb") as fh:
        snap = pickle.load(fh)
    print_segments(snap)
    allocated_now = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    for device, trace in enumerate(snap["device_traces"]):
        if not trace:
            continue
        net = sum(e["size"] if e["action"] == "alloc" else -e["size"] for e in trace
                  if e["action"] in ("alloc", "free_completed"))
        before = allocated_now - net
        peak, at, live = peak_blocks(trace)
        groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for block in live.values():
            g = groups[_where(block.get("frames") or [], args.depth)]
            g[0] += block["size"]
            g[1] += 1
        print(f"device {device}: {len(trace)} events; before the trace {before / 2**30:.3f} GiB; "
              f"peak {(before + peak) / 2**30:.3f} GiB at event {at}; live at the peak beyond the start "
              f"{peak / 2**30:.3f} GiB in {len(live)} blocks")
        for where, (size, count) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:args.top]:
            print(f"{size / 2**20:10.1f} MiB {count:5d}  {where}")


if __name__ == "__main__":
    main()
