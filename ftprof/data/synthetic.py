"""The default data: a learnable synthetic token stream (no tokenizer, no files)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ftprof.config import DataConfig

SYNTHETIC_STATES = 61  # the synthetic stream walks a fixed random cycle over this many token ids


def _synthetic_cycle(vocab_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed successor table: token -> next token. A model learns it quickly, so loss visibly falls."""
    n = min(SYNTHETIC_STATES, vocab_size - 3)
    gen = torch.Generator().manual_seed(1234 + seed)
    ids = torch.randperm(vocab_size - 3, generator=gen)[:n] + 3  # skip pad/bos/eos
    nxt = torch.zeros(vocab_size, dtype=torch.long)
    nxt[ids] = ids.roll(-1)
    return ids, nxt


def synthetic_batches(data: DataConfig, vocab_size: int, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    ids, nxt = _synthetic_cycle(vocab_size, seed)
    gen = torch.Generator().manual_seed(seed)
    bsz, seq = data.batch_size, data.seq_len
    while True:
        start = ids[torch.randint(len(ids), (bsz,), generator=gen)]
        tokens = torch.empty(bsz, seq, dtype=torch.long)
        tokens[:, 0] = start
        for t in range(1, seq):
            tokens[:, t] = nxt[tokens[:, t - 1]]
        yield {"input_ids": tokens, "attention_mask": torch.ones_like(tokens), "labels": tokens.clone()}
