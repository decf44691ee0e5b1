"""The training section: how long (steps or epochs), the learning rate and its schedule, the measurement warm-up,
optimizer and seed.

Names and meanings follow the HF Trainer where it has the option: ``--warmup-steps``/``--warmup-ratio`` are the
learning-rate warm-up, ``--lr-scheduler-type`` its schedule. The steps left out of the speed statistics are the
measurement warm-up, ``--measure-warmup-steps`` (before schema_version 2 that was ``warmup_steps``:
``RunConfig.from_dict`` reads old files with that meaning).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ftprof.config.options import LR_SCHEDULERS, MAX_STEPS, OPTIMIZERS, check_types, one_of, option, require


@dataclass
class TrainConfig:
    grad_accum: int = option(1, "micro-batches per optimizer step")
    max_steps: int = option(10, "optimizer steps to run (with --num-train-epochs: computed from the epochs)")
    num_train_epochs: Optional[float] = option(
        None, "train for this many passes over the dataset instead of --max-steps: steps = ceil(sequences / "
        "(batch size x grad accum x processes)) x epochs (rounded up); real data only", metavar="EPOCHS")
    measure_warmup_steps: int = option(2, "measurement warm-up: the first steps, left out of the steady-state "
                                       "figures (reported separately)")
    lr: float = option(2e-4, "peak learning rate")
    lr_scheduler_type: str = option("linear", "learning-rate schedule after the warm-up, as the HF Trainer names "
                                    "them: linear (decay to 0 at the last step), cosine (half a cosine to 0), "
                                    "constant (no warm-up), constant_with_warmup", choices=LR_SCHEDULERS)
    warmup_steps: int = option(0, "learning-rate warm-up: steps over which the learning rate rises linearly from 0 "
                               "(the HF Trainer's meaning; the measurement warm-up is --measure-warmup-steps)")
    warmup_ratio: float = option(0.0, "learning-rate warm-up as a fraction of the run's steps (rounded up); "
                                 "instead of --warmup-steps")
    weight_decay: float = option(0.0, "AdamW weight decay")
    max_grad_norm: float = option(0.0, "clip gradients to this norm; 0 disables clipping")
    optimizer: str = option("adamw", "adamw (fused on CUDA) or bitsandbytes' paged 8-bit AdamW", choices=OPTIMIZERS)
    seed: int = option(0, "seed for weights, data and dropout")
    gc_interval: int = option(10, "Python's garbage collector during the loop: off inside steps, setup's objects "
                              "frozen, the young generations collected between steps every N steps (outside step "
                              "time); 0 = Python's automatic collection, which can pause any step")

    def __post_init__(self) -> None:
        check_types(self)
        require(self.grad_accum >= 1, f"--grad-accum must be at least 1, got {self.grad_accum}")
        require(1 <= self.max_steps <= MAX_STEPS, f"--max-steps must be from 1 to {MAX_STEPS:,}, got {self.max_steps}")
        if self.num_train_epochs is not None:
            require(math.isfinite(self.num_train_epochs) and self.num_train_epochs > 0,
                     f"--num-train-epochs must be a positive number, got {self.num_train_epochs}")
        require(self.measure_warmup_steps >= 0,
                 f"--measure-warmup-steps must be >= 0, got {self.measure_warmup_steps}")
        require(self.lr > 0, f"--lr must be positive, got {self.lr}")
        one_of("--lr-scheduler-type", self.lr_scheduler_type, LR_SCHEDULERS)
        require(self.warmup_steps >= 0, f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        require(0 <= self.warmup_ratio < 1, f"--warmup-ratio must be in [0, 1), got {self.warmup_ratio}")
        require(not (self.warmup_steps and self.warmup_ratio),
                 "--warmup-steps and --warmup-ratio both set a learning-rate warm-up: give one")
        require(self.lr_scheduler_type != "constant" or not (self.warmup_steps or self.warmup_ratio),
                 "--lr-scheduler-type constant has no warm-up (as in transformers): use constant_with_warmup")
        # the warm-up's first step runs at lr 0 (engine/schedule.py): a one-step run with one trains nothing
        require(self.num_train_epochs is not None or self.max_steps > 1 or not self.lr_warmup_steps(),
                "--max-steps 1 with a learning-rate warm-up: the warm-up starts at 0, so the only step would run "
                "at learning rate 0 and train nothing; run 2 or more steps or leave out the warm-up")
        require(self.weight_decay >= 0, f"--weight-decay must be >= 0, got {self.weight_decay}")
        require(self.max_grad_norm >= 0, f"--max-grad-norm must be >= 0, got {self.max_grad_norm}")
        one_of("--optimizer", self.optimizer, OPTIMIZERS)
        require(self.gc_interval >= 0, f"--gc-interval must be >= 0 (0: Python's automatic collection), got "
                f"{self.gc_interval}")

    def lr_warmup_steps(self, total: int | None = None) -> int:
        """The learning-rate warm-up in steps for a run of ``total`` steps (``--warmup-ratio`` rounds up, as in
        transformers)."""
        total = self.max_steps if total is None else total
        return self.warmup_steps or math.ceil(total * self.warmup_ratio)
