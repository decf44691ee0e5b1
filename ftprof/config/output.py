"""The output section: where the run dir goes, the device, memory logging and trackers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ftprof.config import alloc_conf
from ftprof.config.options import (
    MEMORY_LOGGING,
    MEMORY_LOGGING_ALIASES,
    TRACKERS,
    check_types,
    one_of,
    option,
    require,
)


@dataclass
class OutputConfig:
    output_dir: str = option("runs", "parent of run dirs: a run writes DIR/<run-name>/ (the HF Trainer's is the "
                             "run dir itself)", metavar="DIR")
    run_name: Optional[str] = option(None, "run directory name under --output-dir (default: "
                                     "<method>-<model>-<timestamp>); a name whose directory holds a finished run "
                                     "is refused unless --overwrite-output-dir")
    overwrite_output_dir: bool = option(False, "let --run-name replace the finished run in its directory (its "
                                        "result, steps and checkpoints are removed first), as the HF Trainer's "
                                        "--overwrite_output_dir")
    logging_steps: Optional[int] = option(None, "print a progress line (step, loss, tokens/s, lr) every N steps, "
                                          "as the HF Trainer's --logging_steps (default: the progress bar, or "
                                          "a line now and then when not on a terminal)", metavar="N")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    memory_limit_gib: Optional[float] = option(
        None, "cap what PyTorch may allocate on the GPU at this many GiB (torch's per-process memory fraction): "
        "the run fails for memory as on a smaller card (which would also hold the CUDA context, ~0.5 GiB), and "
        "--checkpointing auto plans for the cap; CUDA only", metavar="GIB")
    memory_logging: str = option("torch", "memory sources to record: torch (allocator stats), nvml (device "
                                 "sampler), all, none; aliases: huggingface=torch, nvidia=nvml",
                                 choices=MEMORY_LOGGING + tuple(MEMORY_LOGGING_ALIASES))
    alloc_conf: Optional[str] = option(None, "PYTORCH_ALLOC_CONF for the run (default: the environment's, else "
                                       "expandable_segments:True); recorded in env.json")
    quiet: bool = option(False, "no progress bar or summary table")
    report_to: Optional[tuple[str, ...]] = option(
        None, "experiment trackers that receive per-step figures, the final result and the config (main rank "
        "only), as the HF Trainer spells them: comma-separated tensorboard, wandb, mlflow, or all, or none "
        "(default none)", metavar="NAMES")

    def __post_init__(self) -> None:
        check_types(self)
        self.report_to = normalize_report_to(self.report_to)
        self.memory_logging = MEMORY_LOGGING_ALIASES.get(self.memory_logging, self.memory_logging)
        one_of("--memory-logging", self.memory_logging, MEMORY_LOGGING)
        if self.memory_limit_gib is not None:
            require(math.isfinite(self.memory_limit_gib) and self.memory_limit_gib > 0,
                     f"--memory-limit-gib must be a positive number of GiB, got {self.memory_limit_gib}")
        dev = self.device
        ok = dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())
        require(ok, f"--device: '{dev}' is not auto, cpu, cuda or cuda:N")
        require(self.logging_steps is None or self.logging_steps >= 1,
                f"--logging-steps must be at least 1, got {self.logging_steps}")
        if self.alloc_conf is not None:
            why = alloc_conf.problem(self.alloc_conf)
            require(why is None, f"--alloc-conf '{self.alloc_conf}': {why}")
        if self.run_name is not None:
            require(bool(self.run_name) and "/" not in self.run_name and self.run_name not in (".", ".."),
                     f"--run-name: '{self.run_name}' is not a plain directory name")


def normalize_report_to(value) -> tuple[str, ...] | None:
    """'tensorboard,mlflow' / a list / 'all' / 'none' -> a tuple of tracker names, or None for no tracker."""
    if value is None:
        return None
    names = [n.strip() for n in (value.split(",") if isinstance(value, str) else value) if str(n).strip()]
    if names in (["none"], []):
        return None
    if names == ["all"]:
        return TRACKERS
    for name in names:
        one_of("--report-to", name, TRACKERS)
    return tuple(dict.fromkeys(names))
