"""Training data: a learnable synthetic stream (default) or real data loaded through the ``datasets`` library.

- ``source``:    where a dataset lives (file, save_to_disk folder, hub name); cheap checks; loading.
- ``formats``:   which columns make a row (text, instruction, chat), their checks, and one row -> ids and labels.
- ``prepare``:   load, check, tokenize (cached by ``datasets``, several processes), filter; the dataset's stats.
- ``batches``:   fixed-shape batches (padded or packed) from prepared data, or the synthetic stream.

Names are re-exported lazily, so ``from ftprof.data import check_dataset`` imports neither torch nor datasets.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "IGNORE_INDEX": "formats", "count_tokens": "batches", "make_batches": "batches",
    "eval_batches": "batches", "synthetic_batches": "synthetic", "synthetic_eval_batches": "synthetic",
    "check_dataset": "source",
    "PreparedData": "prepare", "prepare_dataset": "prepare", "check_rows": "prepare",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"ftprof.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'ftprof.data' has no attribute {name!r}")


__all__ = list(_EXPORTS)
