"""The training section: steps, measurement warm-up, optimizer and seed."""

from __future__ import annotations

from dataclasses import dataclass

from ftprof.config.options import OPTIMIZERS, one_of, option, require


@dataclass
class TrainConfig:
    grad_accum: int = option(1, "micro-batches per optimizer step")
    max_steps: int = option(10, "optimizer steps to run")
    warmup_steps: int = option(2, "measurement warm-up: first steps left out of the steady-state figures (reported "
                               "separately); not a learning-rate warm-up, the learning rate is constant")
    lr: float = option(2e-4, "learning rate (constant)")
    weight_decay: float = option(0.0, "AdamW weight decay")
    max_grad_norm: float = option(0.0, "clip gradients to this norm; 0 disables clipping")
    optimizer: str = option("adamw", "adamw (fused on CUDA) or bitsandbytes' paged 8-bit AdamW", choices=OPTIMIZERS)
    seed: int = option(0, "seed for weights, data and dropout")

    def __post_init__(self) -> None:
        require(self.grad_accum >= 1, f"--grad-accum must be at least 1, got {self.grad_accum}")
        require(self.max_steps >= 1, f"--max-steps must be at least 1, got {self.max_steps}")
        require(self.warmup_steps >= 0, f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        require(self.lr > 0, f"--lr must be positive, got {self.lr}")
        require(self.weight_decay >= 0, f"--weight-decay must be >= 0, got {self.weight_decay}")
        require(self.max_grad_norm >= 0, f"--max-grad-norm must be >= 0, got {self.max_grad_norm}")
        one_of("--optimizer", self.optimizer, OPTIMIZERS)
