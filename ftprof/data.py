"""Training batches: a learnable synthetic stream (default), or text from .txt / .jsonl files.

Every batch is a dict of int64 CPU tensors ``input_ids``, ``attention_mask`` and ``labels`` (-100 where no loss is
taken), shape [batch_size, seq_len]. Batches repeat forever; the trainer decides how many it takes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from ftprof.config import DataConfig
from ftprof.errors import ConfigError

IGNORE_INDEX = -100
SYNTHETIC_STATES = 61  # the synthetic stream walks a fixed random cycle over this many token ids


def check_dataset(data: DataConfig) -> None:
    """Cheap checks (exists, readable, right shape) so a bad dataset fails before the model loads."""
    if data.dataset == "synthetic":
        return
    path = Path(data.dataset).expanduser()
    if path.suffix not in (".txt", ".jsonl"):
        raise ConfigError(f"--dataset: '{data.dataset}' must be 'synthetic', a .txt file or a .jsonl file")
    if not path.is_file():
        raise ConfigError(f"--dataset: '{data.dataset}' does not exist")
    try:
        with path.open(encoding="utf-8") as fh:
            first = next((line for line in fh if line.strip()), None)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--dataset: cannot read '{data.dataset}': {exc}") from None
    if first is None:
        raise ConfigError(f"--dataset: '{data.dataset}' is empty")
    if path.suffix == ".jsonl":
        try:
            record = json.loads(first)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--dataset: '{data.dataset}' line 1 is not JSON: {exc.msg}") from None
        if not isinstance(record, dict) or not isinstance(record.get(data.text_field), str):
            raise ConfigError(f"--dataset: '{data.dataset}' line 1 has no string field '{data.text_field}' "
                              "(see --text-field)")


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


def read_texts(data: DataConfig) -> list[str]:
    path = Path(data.dataset).expanduser()
    if path.suffix == ".txt":
        texts = [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n")]
    else:
        texts = []
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    texts.append(json.loads(line)[data.text_field])
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise ConfigError(f"--dataset: '{data.dataset}' line {n} has no field '{data.text_field}'") \
                        from None
    texts = [t for t in texts if t]
    if not texts:
        raise ConfigError(f"--dataset: '{data.dataset}' holds no text")
    return texts


def _packed_rows(docs: list[list[int]], seq: int, eos: int) -> list[list[int]]:
    stream = [tok for doc in docs for tok in doc + [eos]]
    if len(stream) < seq:
        stream = stream * (seq // len(stream) + 1)
    return [stream[i:i + seq] for i in range(0, len(stream) - seq + 1, seq)]


def text_batches(data: DataConfig, tokenizer, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    """Tokenize once, then yield shuffled batches forever (a new permutation per epoch)."""
    seq, bsz = data.seq_len, data.batch_size
    docs = tokenizer(read_texts(data), add_special_tokens=False)["input_ids"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    pad = pad if pad is not None else eos
    if data.packing:
        rows = [(r, seq) for r in _packed_rows(docs, seq, eos)]
    else:
        rows = [((d + [eos])[:seq], min(len(d) + 1, seq)) for d in docs if d]
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(rows), generator=gen).tolist()
        order += order[: (-len(order)) % bsz]  # fill the last batch by wrapping around
        for i in range(0, len(order), bsz):
            ids = torch.full((bsz, seq), pad, dtype=torch.long)
            mask = torch.zeros(bsz, seq, dtype=torch.long)
            for b, j in enumerate(order[i:i + bsz]):
                row, n = rows[j]
                ids[b, :n] = torch.tensor(row[:n])
                mask[b, :n] = 1
            labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
            yield {"input_ids": ids, "attention_mask": mask, "labels": labels}


def make_batches(data: DataConfig, tokenizer, vocab_size: int, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    if data.dataset == "synthetic":
        return synthetic_batches(data, vocab_size, seed)
    return text_batches(data, tokenizer, seed)


def count_tokens(batch: dict[str, torch.Tensor]) -> tuple[int, int]:
    """(tokens, real_tokens): all positions fed to the model; positions that carry a label after the causal shift."""
    labels = batch["labels"]
    return labels.numel(), int((labels[:, 1:] != IGNORE_INDEX).sum())
