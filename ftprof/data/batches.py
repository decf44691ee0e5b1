"""Training batches: fixed-shape dicts of int64 CPU tensors ``input_ids``, ``attention_mask`` and ``labels``
(IGNORE_INDEX where no loss is taken), shape [batch_size, seq_len]. Batches repeat forever (a new order each epoch);
the trainer decides how many it takes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from ftprof.config import DataConfig
from ftprof.data.formats import IGNORE_INDEX
from ftprof.data.prepare import PreparedData, prepare_dataset
from ftprof.data.synthetic import synthetic_batches

__all__ = ["IGNORE_INDEX", "count_tokens", "eval_batches", "make_batches", "packed_batches", "packed_rows",
           "padded_batches"]


def packed_rows(prepared: PreparedData, seq: int) -> tuple[np.ndarray, np.ndarray]:
    """All rows end to end, cut into full sequences (the last partial one dropped; a stream shorter than one
    sequence is repeated). Attention crosses document boundaries, as in the usual packing."""
    ids, labels = prepared.ids, prepared.labels
    if len(ids) < seq:
        reps = seq // len(ids) + 1
        ids, labels = np.tile(ids, reps), np.tile(labels, reps)
    n = len(ids) // seq
    return ids[:n * seq].reshape(n, seq), labels[:n * seq].reshape(n, seq)


def _epochs(rows: int, bsz: int, gen: torch.Generator) -> Iterator[list[int]]:
    """Row indices of each batch: a new permutation per epoch, the last batch filled by wrapping around."""
    while True:
        order = torch.randperm(rows, generator=gen).tolist()
        order += (order * (bsz // len(order) + 1))[: (-len(order)) % bsz]
        for i in range(0, len(order), bsz):
            yield order[i:i + bsz]


def packed_batches(prepared: PreparedData, data: DataConfig, seed: int) -> Iterator[dict]:
    ids, labels = packed_rows(prepared, data.seq_len)
    for picked in _epochs(len(ids), data.batch_size, torch.Generator().manual_seed(seed)):
        batch_ids = torch.from_numpy(ids[picked])
        yield {"input_ids": batch_ids, "attention_mask": torch.ones_like(batch_ids),
               "labels": torch.from_numpy(labels[picked])}


def padded_batches(prepared: PreparedData, data: DataConfig, pad: int, seed: int) -> Iterator[dict]:
    """One row per sequence, cut to --seq-len, padding after it (masked, no labels)."""
    seq, bsz = data.seq_len, data.batch_size
    gen = torch.Generator().manual_seed(seed)
    off = prepared.offsets
    for picked in _epochs(prepared.rows, bsz, gen):
        batch_ids = torch.full((bsz, seq), pad, dtype=torch.long)
        batch_labels = torch.full((bsz, seq), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros(bsz, seq, dtype=torch.long)
        for b, j in enumerate(picked):
            start, end = off[j], min(off[j + 1], off[j] + seq)
            batch_ids[b, :end - start] = torch.from_numpy(prepared.ids[start:end])
            batch_labels[b, :end - start] = torch.from_numpy(prepared.labels[start:end])
            mask[b, :end - start] = 1
        yield {"input_ids": batch_ids, "attention_mask": mask, "labels": batch_labels}


def make_batches(data: DataConfig, tokenizer, vocab_size: int, seed: int,
                 prepared: PreparedData | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """The run's batches: synthetic, or real data (``prepared`` by preflight; prepared here when not given)."""
    if data.dataset == "synthetic":
        return synthetic_batches(data, vocab_size, seed)
    if prepared is None:
        prepared = prepare_dataset(data, tokenizer)
    if data.packing:
        return packed_batches(prepared, data, seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return padded_batches(prepared, data, pad, seed)


def count_tokens(batch: dict[str, torch.Tensor]) -> tuple[int, int]:
    """(tokens, real_tokens): all positions fed to the model; positions that carry a label after the causal shift."""
    labels = batch["labels"]
    return labels.numel(), int((labels[:, 1:] != IGNORE_INDEX).sum())


def eval_batches(prepared: PreparedData, data: DataConfig, pad: int, limit: int | None = None) -> list[dict]:
    """The eval split in order, in batches of the training shape (packed or padded as training is); the last batch
    is filled with empty rows (no label, masked), so every row counts once and no batch changes shape."""
    seq, bsz = data.seq_len, data.batch_size
    if data.packing:
        ids, labels = packed_rows(prepared, seq)
        rows = [(ids[i], labels[i]) for i in range(len(ids))]
    else:
        off = prepared.offsets
        rows = [(prepared.ids[off[j]:min(off[j + 1], off[j] + seq)], prepared.labels[off[j]:min(off[j + 1],
                 off[j] + seq)]) for j in range(prepared.rows)]
    count = -(-len(rows) // bsz)
    out = []
    for b in range(count if limit is None else min(count, limit)):
        batch_ids = torch.full((bsz, seq), pad, dtype=torch.long)
        batch_labels = torch.full((bsz, seq), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros(bsz, seq, dtype=torch.long)
        for i, (ids, labels) in enumerate(rows[b * bsz:(b + 1) * bsz]):
            batch_ids[i, :len(ids)] = torch.as_tensor(ids)
            batch_labels[i, :len(ids)] = torch.as_tensor(labels)
            mask[i, :len(ids)] = 1
        out.append({"input_ids": batch_ids, "attention_mask": mask, "labels": batch_labels})
    return out
