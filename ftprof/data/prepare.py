"""Real data, ready to batch: load, check, tokenize (cached by ``datasets``), drop rows with nothing to learn, and
the figures that change tokens/s (rows, sequence lengths, padding) for result.json.

``prepare_dataset`` runs in preflight, before the model loads, so bad data is one line there. Tokenization goes
through ``Dataset.map``: ``datasets`` fingerprints the rows, the tokenizer and the options and reuses the cached
result on the next run (for files and hub datasets; an in-memory dataset has no cache).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ftprof.config import DataConfig
from ftprof.data.formats import RowTokenizer, check_chat, check_chat_turns, resolve_format
from ftprof.errors import ConfigError

PARALLEL_ROWS = 10_000  # below this, starting worker processes costs more than it saves
MAX_PROC = 8


def tokenize_processes(data: DataConfig, rows: int) -> int:
    if data.dataset_num_proc is not None:
        return data.dataset_num_proc
    if rows < PARALLEL_ROWS:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_PROC, cores))


@dataclass
class PreparedData:
    """Token ids and labels of every kept row, flat (Arrow buffers as numpy) with row offsets, and their stats."""

    ids: Any  # numpy int array, all rows end to end
    labels: Any  # same shape; IGNORE_INDEX where no loss is taken
    offsets: Any  # row i is ids[offsets[i]:offsets[i + 1]]
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return len(self.offsets) - 1

    @functools.cached_property
    def content_hash(self) -> str:
        """A hash of the tokens, labels and row bounds a run trains on: what a resumed run compares with its
        checkpoint's (the rows' ``fingerprint`` follows the file's modification time, not its content)."""
        import numpy as np

        digest = hashlib.blake2b(digest_size=16)
        for part in (self.ids, self.labels, self.offsets):
            digest.update(np.ascontiguousarray(part).view(np.uint8).data)
        return digest.hexdigest()


@contextlib.contextmanager
def _progress_bars(show: bool):
    """datasets' progress bars (loading, tokenizing, filtering) only when the run is not quiet and stderr is a
    terminal: into a file or a pipe they are carriage-return frames (a bench experiment's log, a one-line data
    error preceded by them)."""
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    from ftprof.runtime import is_terminal

    show = show and is_terminal()

    was_disabled = are_progress_bars_disabled()
    if not show:
        disable_progress_bars()
    try:
        yield
    finally:
        if not show and not was_disabled:
            enable_progress_bars()


def check_rows(data: DataConfig) -> None:
    """What tokenizing would refuse that needs no tokenizer: the rows load (a corrupt parquet, a bad split), there
    are some, the format's columns exist and the text column holds text, every chat row has an assistant turn. The
    same lines as a run's."""
    from ftprof.data.source import load_rows, locate

    if locate(data).kind == "hub":
        return  # read when the run starts (it may need the network); files and folders are read here
    with _progress_bars(False):
        rows = load_rows(data)
    if len(rows) == 0:
        raise ConfigError(f"{data.option('dataset')}: '{data.dataset}' split '{data.dataset_split}' has no rows")
    fmt = resolve_format(data, list(rows.column_names))
    _check_text_column(data, rows, fmt)
    if fmt == "chat":
        check_chat_turns(data, rows)


def prepare_dataset(data: DataConfig, tokenizer, model: str = "", progress: bool = True) -> PreparedData:
    """Load ``--dataset``, check it, tokenize it; ConfigError (one line) for anything wrong with the data."""
    with _progress_bars(progress):
        return _prepare(data, tokenizer, model)


def _prepare(data: DataConfig, tokenizer, model: str) -> PreparedData:
    from ftprof.data.source import load_rows

    rows = load_rows(data)
    if len(rows) == 0:
        raise ConfigError(f"{data.option('dataset')}: '{data.dataset}' split '{data.dataset_split}' has no rows")
    fmt = resolve_format(data, list(rows.column_names))
    _check_text_column(data, rows, fmt)
    if fmt == "chat":
        check_chat(data, rows, tokenizer, model)
    procs = min(tokenize_processes(data, len(rows)), len(rows))
    t0 = time.perf_counter()
    tokenized = rows.map(RowTokenizer(data, fmt, tokenizer), batched=True, remove_columns=rows.column_names,
                         num_proc=procs if procs > 1 else None, desc="tokenizing")
    kept = tokenized.filter(lambda n: [x > 0 for x in n], input_columns="n_labels", batched=True,
                            num_proc=procs if procs > 1 else None)
    tokenize_s = time.perf_counter() - t0
    if len(kept) == 0:
        why = " once cut to --seq-len" if not data.packing else ""
        raise ConfigError(f"{data.option('dataset')}: no row of '{data.dataset}' has a token to train on{why} "
                          f"({len(rows)} rows, format {fmt}, --train-on {data.train_on})")
    # filter() only records the kept rows' indices; the Arrow table underneath still holds every row.
    kept = kept.flatten_indices()
    ids, offsets = _flat(kept, "input_ids")
    labels, _ = _flat(kept, "labels")
    prepared = PreparedData(ids, labels, offsets)
    prepared.stats = {
        "dataset": data.dataset, "split": data.dataset_split, "format": fmt, "train_on": data.train_on,
        "fingerprint": rows._fingerprint, "tokenized_fingerprint": kept._fingerprint,
        "rows_loaded": len(rows), "rows": len(kept), "rows_dropped": len(rows) - len(kept),
        "tokenize_processes": procs, "tokenize_s": round(tokenize_s, 3),
        **sequence_stats(offsets, labels, data.seq_len, data.packing),
    }
    return prepared


def _check_text_column(data: DataConfig, rows, fmt: str) -> None:
    """The column a format reads its text from holds text (a column of numbers or of nulls tokenizes to nothing,
    and would be reported as rows without a token)."""
    name = {"text": "text_field", "instruction": "response_field"}.get(fmt)
    feature = rows.features.get(getattr(data, name)) if name else None
    dtype = getattr(feature, "dtype", "string")
    if dtype not in ("string", "large_string"):
        raise ConfigError(f"{data.option(name)}: column '{getattr(data, name)}' of '{data.dataset}' holds {dtype} "
                          "values, not text")


def _flat(ds, column: str):
    """A list column as (values, offsets) numpy arrays, without building Python lists."""
    import numpy as np

    array = ds.data.column(column).combine_chunks()
    offsets = array.offsets.to_numpy()
    values = array.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
    return np.array(values, dtype=np.int64), (offsets - offsets[0]).astype(np.int64)  # copies: writable


def sequence_stats(offsets, labels, seq_len: int, packing: bool) -> dict[str, Any]:
    """Lengths of the rows (tokens, after the cut to --seq-len unless packing) and, for the sequences the model
    sees, the fraction of positions that are padding and the fraction that carry a label after the causal shift
    (a sequence's first token predicts nothing: what steps.csv's real tokens count)."""
    import numpy as np

    from ftprof.data.formats import IGNORE_INDEX

    lengths = np.diff(offsets)
    total = int(lengths.sum())
    labelled = labels != IGNORE_INDEX
    if packing:  # the stream cut into full sequences, as packed_rows cuts it
        sequences = max(1, total // seq_len)
        padding = 0.0
        used = labelled[:sequences * seq_len] if total >= seq_len else np.resize(labelled, seq_len)
        predicted = int(used.reshape(sequences, seq_len)[:, 1:].sum())
    else:
        sequences = len(lengths)
        padding = 1.0 - total / (sequences * seq_len)
        predicted = int(labelled.sum()) - int(labelled[offsets[:-1]].sum())  # each row's first label shifts out
    return {"mean_seq_len": round(float(lengths.mean()), 2), "max_seq_len": int(lengths.max()),
            "tokens": total, "sequences": sequences, "padding_fraction": round(padding, 4),
            "label_fraction": round(predicted / (sequences * seq_len), 4)}
