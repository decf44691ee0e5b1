"""The profiling section: torch.profiler's schedule and what it records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ftprof.config.options import MAX_STEPS, PROFILER_ACTIVITIES, check_types, one_of, option, require


@dataclass
class ProfilingConfig:
    """torch.profiler settings. Steps are optimizer steps. Any --prof-* option given to `train` turns profiling on."""

    profile: bool = option(False, "run under torch.profiler (always on for `ftprof profile`)")
    prof_wait_steps: int = option(1, "steps skipped at the start of each cycle")
    prof_warmup_steps: int = option(1, "profiler warm-up steps per cycle (recorded, then discarded)")
    prof_active_steps: int = option(2, "recorded steps per cycle")
    prof_repeat: int = option(1, "profiling cycles")
    prof_output_dir: Optional[str] = option(None, "artifact directory (default: <run dir>/profile)")
    prof_activities: str = option("auto", "comma-separated: cpu, cuda; auto = cpu plus cuda when on a GPU")
    prof_record_shapes: bool = option(True, "record operator input shapes and dtypes (the summary's fine-tuning "
                                      "buckets split GEMMs and count FLOPs from them)")
    prof_with_stack: bool = option(False, "record Python stacks (flame-graph stacks file; larger traces)")
    prof_profile_memory: bool = option(False, "record tensor allocations in the trace")
    prof_memory_timeline: bool = option(False, "export a memory timeline (turns on shapes, stacks and memory)")
    prof_memory_snapshot: bool = option(False, "record the CUDA allocator history over the active window and dump "
                                        "a snapshot for pytorch.org/memory_viz")
    prof_ranks: str = option("0", "ranks that profile: 'all' or comma-separated ranks")
    prof_max_trace_mb: float = option(512.0, "trace size budget per cycle; past it the costly options are turned off")

    def __post_init__(self) -> None:
        check_types(self)
        require(self.prof_wait_steps >= 0, "--prof-wait-steps must be >= 0")
        require(self.prof_warmup_steps >= 0, "--prof-warmup-steps must be >= 0")
        require(self.prof_active_steps >= 1, "--prof-active-steps must be at least 1")
        require(self.prof_repeat >= 1, "--prof-repeat must be at least 1")
        require(self.prof_max_trace_mb > 0, "--prof-max-trace-mb must be positive")
        require(self.total_steps <= MAX_STEPS, f"--prof-wait-steps, --prof-warmup-steps, --prof-active-steps and "
                f"--prof-repeat ask for {self.total_steps:,} steps, more than any fine-tuning takes ({MAX_STEPS:,})")
        if self.prof_activities != "auto":
            require(bool(self.activities()), f"--prof-activities: '{self.prof_activities}' names nothing; give "
                    "cpu, cuda, both comma-separated, or auto")
            for act in self.activities():
                one_of("--prof-activities", act, PROFILER_ACTIVITIES)
        if self.prof_ranks != "all":
            parts = [r.strip() for r in str(self.prof_ranks).split(",")]
            require(all(p.isdigit() for p in parts), f"--prof-ranks: '{self.prof_ranks}' is not 'all' or a "
                     "comma-separated list of ranks")
            ranks = [int(p) for p in parts]
            repeated = sorted({r for r in ranks if ranks.count(r) > 1})
            require(not repeated, f"--prof-ranks: rank {repeated[0] if repeated else ''} is named more than once "
                    f"in '{self.prof_ranks}'")

    def activities(self) -> tuple[str, ...]:
        return tuple(a.strip() for a in self.prof_activities.split(",") if a.strip())

    @property
    def cycle_steps(self) -> int:
        return self.prof_wait_steps + self.prof_warmup_steps + self.prof_active_steps

    @property
    def total_steps(self) -> int:
        """Steps needed for every requested cycle to complete."""
        return self.cycle_steps * self.prof_repeat

    def profiles_rank(self, rank: int) -> bool:
        return self.prof_ranks == "all" or rank in {int(r) for r in str(self.prof_ranks).split(",")}
