"""torch.profiler on a wait/warmup/active schedule, counted in optimizer steps, with artifacts people can open.

One torch.profiler session per cycle: after each cycle its artifacts are exported, and if the trace was larger than
``--prof-max-trace-mb`` the costly options (stacks, shapes, memory) are turned off for the cycles that follow.

Artifacts per rank and cycle, in the profile directory (ftprof/profiling/layout.py):
    cycle{c}/trace_rank{r}_cycle{c}.pt.trace.json.gz
                                               Perfetto / chrome://tracing / HTA / TensorBoard (carries the rank);
                                               one folder per cycle holding only its traces, one file per rank
    key_averages_rank{r}_cycle{c}.txt          operator table, by device time (CPU time on CPU runs)
    stacks_rank{r}_cycle{c}.txt                folded stacks for flame graphs (with --prof-with-stack)
    memory_timeline_rank{r}_cycle{c}.html      memory by category over time (--prof-memory-timeline; JSON fallback)
    memory_snapshot_rank{r}_cycle{c}.pickle    CUDA allocator history, for pytorch.org/memory_viz
    allocator_pools_rank{r}_cycle{c}.csv       reserved and allocated memory by stream and pool at that snapshot
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

from ftprof.config import ProfilingConfig
from ftprof.profiling import allocator_pools, layout
from ftprof.profiling.kineto_noise import quiet_kineto
from ftprof.results.store import write_csv_atomic, write_text_atomic

SNAPSHOT_MAX_ENTRIES = 100_000  # bounded allocator history: enough for a few steps of a large model


@dataclasses.dataclass
class ResolvedProfiling:
    """What actually ran (recorded in result.json), which can differ from what was asked."""

    activities: list[str]
    record_shapes: bool
    with_stack: bool
    profile_memory: bool
    memory_timeline: bool
    memory_snapshot: bool
    notes: list[str]


def resolve(cfg: ProfilingConfig, device: torch.device, compiled_in_checkpoints: bool = False) -> ResolvedProfiling:
    """What this run records. ``compiled_in_checkpoints``: compiled code runs inside activation checkpoints."""
    notes: list[str] = []
    acts = ["cpu"] + (["cuda"] if device.type == "cuda" else []) if cfg.prof_activities == "auto" \
        else list(cfg.activities())
    if "cuda" in acts and device.type != "cuda":
        acts.remove("cuda")
        notes.append("cuda activity dropped: the run is on CPU")
    shapes, stack, memory = cfg.prof_record_shapes, cfg.prof_with_stack, cfg.prof_profile_memory
    if cfg.prof_memory_timeline and not (shapes and stack and memory):
        shapes = stack = memory = True
        notes.append("--prof-memory-timeline turned on shapes, stacks and memory recording (it needs all three)")
    snapshot = cfg.prof_memory_snapshot
    if snapshot and device.type != "cuda":
        snapshot = False
        notes.append("--prof-memory-snapshot skipped: the CUDA allocator snapshot needs a CUDA device")
    elif snapshot and compiled_in_checkpoints and _history_breaks_checkpointed_compile():
        snapshot = False
        notes.append("--prof-memory-snapshot skipped: from torch 2.11 recording the allocator history fails compiled "
                     "code inside activation checkpoints (pytorch/pytorch#179536, 'returned NULL without setting an "
                     "exception'; an H200 run of QLoRA, full checkpointing, --compile died so); run it without "
                     "--compile or without checkpointing to see the peak")
    return ResolvedProfiling(acts, shapes, stack, memory, cfg.prof_memory_timeline, snapshot, notes)


def _history_breaks_checkpointed_compile() -> bool:
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 11)


class TorchProfiler:
    """The loop calls ``step()`` once per optimizer step; ``phase(i)`` says what step ``i`` (1-based) will be."""

    enabled = True

    def __init__(self, cfg: ProfilingConfig, out_dir: Path, device: torch.device, rank: int = 0,
                 log: Callable[[str], None] = print, metadata: dict | None = None):
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.device = device
        self.rank = rank
        self.log = log
        self.metadata = metadata or {}
        self.settings = resolve(cfg, device, bool(self.metadata.get("compile") and self.metadata.get("checkpointing")))
        self._schedule = schedule(wait=cfg.prof_wait_steps, warmup=cfg.prof_warmup_steps,
                                  active=cfg.prof_active_steps, repeat=1)
        self._prof: profile | None = None
        self._done_steps = 0  # optimizer steps completed so far
        self._cycle = 0
        self._snapshot_on = False
        self._artifacts: dict[str, str] = {}
        self.trace_bytes: list[int] = []
        self._gpu = torch.cuda.is_available()  # Kineto's "no GPU" error is noise only where there is none

    # ------------------------------------------------------------------ schedule
    def phase(self, index: int) -> str:
        """'wait', 'warmup', 'active' or '' (after the last cycle) for 1-based optimizer step ``index``."""
        if index < 1 or index > self.cfg.total_steps:
            return ""
        action = self._schedule((index - 1) % self.cfg.cycle_steps)
        return {ProfilerAction.NONE: "wait", ProfilerAction.WARMUP: "warmup"}.get(action, "active")

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> TorchProfiler:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._start_cycle()
        self._maybe_start_snapshot(1)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._prof is not None:  # an unfinished cycle (error or interruption): stop without exporting
            self._prof.on_trace_ready = None
            try:
                with quiet_kineto(self._gpu):
                    self._prof.stop()
            except Exception:  # noqa: BLE001 - never mask the original error
                pass
            self._prof = None
        if self._snapshot_on:
            torch.cuda.memory._record_memory_history(enabled=None)
            self._snapshot_on = False

    def step(self) -> None:
        self._done_steps += 1
        if self._prof is None:
            return
        finished_active = self.phase(self._done_steps) == "active" and (
            self._done_steps % self.cfg.cycle_steps == 0)
        if finished_active:
            self._stop_snapshot()
        with quiet_kineto(self._gpu):
            self._prof.step()  # at the end of the active window this calls _export (on_trace_ready)
        self._add_metadata()
        if self._done_steps % self.cfg.cycle_steps == 0:
            with quiet_kineto(self._gpu):
                self._prof.stop()
            self._prof = None
            if self._cycle < self.cfg.prof_repeat:
                self._guard_trace_size()
                self._start_cycle()
        self._maybe_start_snapshot(self._done_steps + 1)

    def _start_cycle(self) -> None:
        self._cycle += 1
        s = self.settings
        acts = [ProfilerActivity.CPU] if "cpu" in s.activities else []
        if "cuda" in s.activities:
            acts.append(ProfilerActivity.CUDA)
        extra = {}
        if s.with_stack:
            # Without the verbose experimental config, export_stacks writes an empty file.
            extra["experimental_config"] = torch._C._profiler._ExperimentalConfig(verbose=True)
        self._prof = profile(activities=acts, schedule=self._schedule, on_trace_ready=self._export,
                             record_shapes=s.record_shapes, with_stack=s.with_stack,
                             profile_memory=s.profile_memory, **extra)
        with quiet_kineto(self._gpu):
            self._prof.start()
        self._meta_added = False
        self._add_metadata()

    def _add_metadata(self) -> None:
        """Trace metadata can only be added once Kineto is collecting (warm-up or active), not while waiting."""
        if self._meta_added or self._prof is None or self._prof.current_action == ProfilerAction.NONE:
            return
        # HTA and TensorBoard read the rank from distributedInfo; torch writes it only under torch.distributed.
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        self._prof.add_metadata_json("distributedInfo", json.dumps({"rank": self.rank, "world_size": world,
                                                                    "backend": "none" if world == 1 else "nccl"}))
        block = layout.encode_metadata({**self.metadata, "cycle": self._cycle})
        self._prof.add_metadata_json("ftprof", json.dumps(block))  # a string: see layout.encode_metadata
        self._meta_added = True

    def update_metadata(self, values: dict) -> None:
        """Add to ftprof's metadata block (what the run learns once it runs, e.g. a measured sequence length); a
        cycle already collecting gets the block again (Kineto keeps a key's last value)."""
        self.metadata.update(values)
        if self._meta_added:
            self._meta_added = False
            self._add_metadata()

    # ------------------------------------------------------------------ allocator snapshot
    def _maybe_start_snapshot(self, next_index: int) -> None:
        starts_active = self.phase(next_index) == "active" and self.phase(next_index - 1) != "active"
        if self.settings.memory_snapshot and starts_active and not self._snapshot_on:
            torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_MAX_ENTRIES, stacks="python")
            self._snapshot_on = True

    def _stop_snapshot(self) -> None:
        if not self._snapshot_on:
            return
        path = self._path("memory_snapshot", "pickle")
        self._try("memory snapshot", lambda: torch.cuda.memory._dump_snapshot(str(path)), path)
        torch.cuda.memory._record_memory_history(enabled=None)
        self._snapshot_on = False
        table = self._path("allocator_pools", "csv")
        self._try("allocator pools", lambda: self._write_pools(table), table)

    def _write_pools(self, path: Path) -> None:
        """Reserved and allocated memory by stream and pool at the snapshot (profiling/allocator_pools.py)."""
        found = allocator_pools.pools(torch.cuda.memory_snapshot())
        write_csv_atomic(path, allocator_pools.rows(found), allocator_pools.COLUMNS)
        note = allocator_pools.side_pool_note(found, torch.cuda.current_stream().cuda_stream)
        if note:
            self.log(note)
            self.settings.notes.append(note)

    # ------------------------------------------------------------------ export
    def _path(self, kind: str, suffix: str) -> Path:
        return self.out_dir / f"{kind}_rank{self.rank}_cycle{self._cycle}.{suffix}"

    def _try(self, label: str, fn: Callable[[], None], path: Path) -> bool:
        """Run one exporter; a failure warns and the other artifacts are still written."""
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - exporters fail in many ways (matplotlib missing, empty data...)
            msg = f"profiler: {label} export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            warnings.warn(msg, stacklevel=2)
            self.log(msg)
            self.settings.notes.append(msg)  # lands in result.json's notes
            return False
        self._artifacts[f"{label.replace(' ', '_')}_rank{self.rank}_cycle{self._cycle}"] = str(path)
        return True

    def _export(self, prof: profile) -> None:
        trace = layout.trace_path(self.out_dir, self.rank, self._cycle)
        trace.parent.mkdir(parents=True, exist_ok=True)
        if self._try("trace", lambda: prof.export_chrome_trace(str(trace)), trace):
            self.trace_bytes.append(trace.stat().st_size)
        cuda = "cuda" in self.settings.activities
        sort = "self_device_time_total" if cuda else "self_cpu_time_total"
        table = self._path("key_averages", "txt")
        group = 5 if self.settings.with_stack else 0
        self._try("key averages", lambda: write_text_atomic(table, prof.key_averages(group_by_stack_n=group).table(
            sort_by=sort, row_limit=60, max_name_column_width=80)), table)
        if self.settings.with_stack:
            stacks = self._path("stacks", "txt")
            metric = "self_cuda_time_total" if cuda else "self_cpu_time_total"
            self._try("stacks", lambda: prof.export_stacks(str(stacks), metric=metric), stacks)
        if self.settings.memory_timeline:
            self._export_memory_timeline(prof)

    def _export_memory_timeline(self, prof: profile) -> None:
        device = str(self.device) if self.device.type == "cuda" else "cpu"
        html = self._path("memory_timeline", "html")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # export_memory_timeline is marked deprecated
            if self._try("memory timeline", lambda: prof.export_memory_timeline(str(html), device), html):
                return
            js = self._path("memory_timeline", "json.gz")
            self._try("memory timeline", lambda: prof.export_memory_timeline(str(js), device), js)

    def _guard_trace_size(self) -> None:
        """Past the size budget, turn off the costly options for the remaining cycles, and say so."""
        if not self.trace_bytes:
            return
        mb = self.trace_bytes[-1] / 2 ** 20
        s = self.settings
        if mb <= self.cfg.prof_max_trace_mb or not (s.with_stack or s.record_shapes or s.profile_memory):
            return
        costly = [name for name, on in (("stacks", s.with_stack), ("shapes", s.record_shapes),
                                         ("memory", s.profile_memory)) if on]
        note = (f"cycle {self._cycle} trace was {mb:.0f} MB (> --prof-max-trace-mb {self.cfg.prof_max_trace_mb:g}); "
                f"{', '.join(costly)} recording {'is' if len(costly) == 1 else 'are'} off for the remaining cycles")
        self.settings = dataclasses.replace(s, with_stack=False, record_shapes=False, profile_memory=False,
                                            memory_timeline=False, notes=s.notes + [note])
        self.log(note)

    # ------------------------------------------------------------------ results
    def artifacts(self) -> dict[str, str]:
        return {k: os.path.relpath(v, self.out_dir.parent) for k, v in self._artifacts.items()}

    def resolved(self) -> dict:
        return dataclasses.asdict(self.settings)
