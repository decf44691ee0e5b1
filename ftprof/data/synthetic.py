"""The default data: a learnable synthetic token stream (no tokenizer, no files)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ftprof.config import DataConfig

SYNTHETIC_STATES = 61  # the synthetic stream walks a fixed random cycle over this many token ids


def _synthetic_cycle(vocab_size: int, seed: int) -> torch.Tensor:
    """A fixed cycle of token ids: each is followed by the next (the last by the first). A model learns the
    successor table quickly, so loss visibly falls."""
    n = min(SYNTHETIC_STATES, vocab_size - 3)
    gen = torch.Generator().manual_seed(1234 + seed)
    return torch.randperm(vocab_size - 3, generator=gen)[:n] + 3  # skip pad/bos/eos


def synthetic_batches(data: DataConfig, vocab_size: int, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    cycle = _synthetic_cycle(vocab_size, seed)
    gen = torch.Generator().manual_seed(seed)
    bsz, seq = data.batch_size, data.seq_len
    steps = torch.arange(seq)
    while True:
        # Each row starts at a random place on the cycle and walks it: one gather, not a loop over positions
        # (which took 18 ms per 4 x 2048 batch on a 2-core host, while a GPU step can take less).
        start = torch.randint(len(cycle), (bsz,), generator=gen)
        tokens = cycle[(start[:, None] + steps) % len(cycle)]
        yield {"input_ids": tokens, "attention_mask": torch.ones_like(tokens), "labels": tokens.clone()}


SYNTHETIC_EVAL_BATCHES = 4
EVAL_SEED_OFFSET = 1_000_003  # another generator: other starting places on the same cycle


def synthetic_eval_batches(data: DataConfig, vocab_size: int, seed: int, count: int | None = None) -> list[dict]:
    """Batches for --eval-steps on synthetic data: the same cycle as rank 0's training stream (the task), other
    random starting places. (No unseen sequence exists: the stream is one fixed cycle; this measures what the model
    learned of it.)"""
    cycle = _synthetic_cycle(vocab_size, seed)
    gen = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
    steps = torch.arange(data.seq_len)
    out = []
    for _ in range(count or SYNTHETIC_EVAL_BATCHES):
        start = torch.randint(len(cycle), (data.batch_size,), generator=gen)
        tokens = cycle[(start[:, None] + steps) % len(cycle)]
        out.append({"input_ids": tokens, "attention_mask": torch.ones_like(tokens), "labels": tokens.clone()})
    return out
