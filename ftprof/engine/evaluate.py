"""Evaluation between steps: the eval batches' mean loss per label token, outside the steps' timed window.

Every rank evaluates the same batches (FSDP needs every rank in each forward; DDP's are identical), in eval mode
(dropout off; see ``evaluating``) and without gradients. The losses are summed on the device and read once at the
end, so one evaluation costs one sync, after the step's own.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from ftprof.config import RunConfig
from ftprof.data import IGNORE_INDEX
from ftprof.models.dequant import is_4bit_linear


@dataclass
class EvalOutcome:
    loss: float
    seconds: float


class Evaluator:
    """``due(step)``: whether an evaluation follows optimizer step ``step`` (every --eval-steps, and after the
    last); ``run(built)``: one evaluation."""

    def __init__(self, cfg: RunConfig, batches: list[dict], device: torch.device):
        self.every = cfg.eval.eval_steps
        self.last = cfg.train.max_steps
        self.batches = batches
        self.device = device
        # the label tokens each batch scores (after the causal shift): the weight of its mean loss
        self.weights = [int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches]
        self.tokens = sum(self.weights)

    def due(self, step: int) -> bool:
        return bool(self.batches) and (step == self.last or (self.every is not None and step % self.every == 0))

    def run(self, built) -> EvalOutcome:
        t0 = time.perf_counter()
        total = torch.zeros((), device=self.device, dtype=torch.float64)
        with evaluating(built.model), torch.no_grad():
            for batch, weight in zip(self.batches, self.weights, strict=True):
                if weight == 0:
                    continue
                if built.compiled is not None and built.compiled.cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()
                moved = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
                with built.autocast():
                    loss = built.model(**moved).loss
                total += loss.detach().double() * weight
            mean = total.item() / max(1, self.tokens)  # the one sync
        return EvalOutcome(mean, time.perf_counter() - t0)


@contextlib.contextmanager
def evaluating(model: torch.nn.Module):
    """Eval mode (dropout off) for every module but bitsandbytes' 4-bit linears: on CPUs with AVX-512 bf16, one in
    eval mode without gradients repacks its weight in place for an inference kernel that needs 32-row multiples
    (the tiny preset's are not) and leaves training to unpack it. Their forward is the same either way."""
    was = {m: m.training for m in model.modules()}
    for module in model.modules():
        module.training = is_4bit_linear(module) and was[module]
    try:
        yield model
    finally:
        for module, training in was.items():
            module.training = training


def eval_batches_for(resolved, tokenizer) -> list[dict]:
    """The run's eval batches (CPU tensors): the eval split's, synthetic data's held-out ones, or none."""
    from ftprof.data import eval_batches, synthetic_eval_batches

    cfg = resolved.config
    e = cfg.eval
    if not e.enabled:
        return []
    if resolved.eval_data is None:  # synthetic data: --eval-steps alone
        return synthetic_eval_batches(cfg.data, resolved.source.config.vocab_size, cfg.train.seed, e.eval_batches)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return eval_batches(resolved.eval_data, cfg.data, pad, e.eval_batches)
