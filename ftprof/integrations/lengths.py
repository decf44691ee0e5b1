"""The sequence length a measured run trains at, and the length its attention FLOPs count with: the one owner of
both figures (config.json's seq_len, result.json's FLOPs per token, the profiler trace's metadata).

Ordinary batches are rows of one width each: the run's sequence length is the widest, and attention counts the
token-weighted mean width (batches padded to their longest row count what they ran).

Padding-free batches (TRL's ``padding_free``, Unsloth's SFTTrainer) concatenate a batch's documents into one row,
told apart by ``packed_seq_lengths`` (Unsloth), ``cu_seq_lens_q`` (TRL) or ``position_ids`` restarting at 0. Each
document attends only to itself, so the documents are the sequences: the longest is the sequence length and
attention counts the token-weighted mean document length (sum of squared lengths over tokens), the padded-batch
convention with documents for rows. The lengths are worked out on the device in the forward pre-hook and read once
at the step's end, after its synchronisation.

TRL's ``packing=True`` keeps ftprof's packing convention instead: its packs of ``max_length`` are the sequences
(the trainer sets ``packed_len``).
"""

from __future__ import annotations

import torch


def _tensor(value) -> torch.Tensor | None:
    return value if isinstance(value, torch.Tensor) else None


def document_lengths(kwargs: dict, n: int) -> torch.Tensor | None:
    """The lengths of the documents in one row of ``n`` positions (zeros where no document ends), from the forward's
    keyword arguments; None where they do not tell documents apart. Device work only: nothing is read."""
    lengths = kwargs.get("packed_seq_lengths")
    if isinstance(lengths, (list, tuple)):
        lengths = torch.tensor(lengths)
    if isinstance(lengths, torch.Tensor):
        return lengths.reshape(-1)
    cu = _tensor(kwargs.get("cu_seq_lens_q"))
    if cu is not None and cu.dim() == 1 and cu.numel() >= 2:
        return cu[1:] - cu[:-1]
    pos = _tensor(kwargs.get("position_ids"))
    if pos is None or pos.numel() != n or n == 0:
        return None
    pos = pos.reshape(-1)
    index = torch.arange(n, device=pos.device)
    starts = pos == 0
    starts[0] = True
    first = torch.where(starts, index, 0).cummax(0).values  # where the document holding each position starts
    ends = torch.cat([starts[1:], starts.new_ones(1)])
    return torch.where(ends, index - first + 1, 0)


def document_stats(lengths: torch.Tensor) -> torch.Tensor:
    """[documents, longest, sum of squared lengths], on the lengths' device."""
    lengths = lengths.long()
    return torch.stack([(lengths > 0).sum(), lengths.max(), (lengths * lengths).sum()])


class Lengths:
    """The widths and documents a run's forwards fed. ``forward`` for each training forward, ``end_step`` after each
    step's synchronisation; ``seq_len``, ``attention_len`` and ``notes`` after the step(s) they describe."""

    def __init__(self):
        self.widths: dict[int, int] = {}  # ordinary batches: width -> tokens fed at that width
        self.docs = self.doc_max = self.doc_sq = self.doc_tokens = 0  # padding-free batches' documents
        self.row_max = 0  # the widest padding-free row
        self.first_docs = 0  # documents in the run's first micro-batch, where it was padding-free
        self.one_row = False  # a one-row batch told its documents apart (padding-free, packed or not)
        self.packed_len: int | None = None  # TRL's packing: the packs' max_length (set by the trainer)
        self._pending: list[tuple[int, int, bool, torch.Tensor]] = []  # this step's one-row batches

    def forward(self, kwargs: dict, ids: torch.Tensor, first: bool) -> None:
        """A training forward of ``ids`` (``first``: the run's first micro-batch)."""
        n, width = ids.numel(), ids.shape[-1]
        lengths = document_lengths(kwargs, n) if ids.dim() == 2 and ids.shape[0] == 1 else None
        if lengths is None or lengths.numel() == 0:
            self.widths[width] = self.widths.get(width, 0) + n
            return
        self.one_row = True
        self._pending.append((n, width, first, document_stats(lengths)))

    def begin_step(self) -> None:
        self._pending = []

    def end_step(self) -> None:
        """Fold the step's one-row batches in (one read of the device, after the step's synchronisation): rows of
        several documents count their documents, rows of one count their width."""
        if not self._pending:
            return
        stats = torch.stack([s.to(self._pending[0][3].device) for *_, s in self._pending]).tolist()
        for (n, width, first, _), (docs, longest, squares) in zip(self._pending, stats, strict=True):
            if docs <= 1:
                self.widths[width] = self.widths.get(width, 0) + n
                continue
            self.docs += docs
            self.doc_max = max(self.doc_max, longest)
            self.doc_sq += squares
            self.doc_tokens += n
            self.row_max = max(self.row_max, width)
            self.first_docs = docs if first else self.first_docs
        self._pending = []

    @property
    def packed(self) -> bool:
        """TRL's packing into one row: its packs of max_length are the sequences."""
        return bool(self.packed_len) and self.one_row

    def seq_len(self) -> int:
        """The longest sequence fed: the widest row, the longest padding-free document, or the packed length."""
        if self.packed:
            return int(self.packed_len)
        return max(max(self.widths, default=0), self.doc_max)

    def attention_len(self) -> float:
        """The length the attention FLOPs count with: the token-weighted mean over rows and padding-free documents
        (the length itself when all were one length), or the packed length."""
        if self.packed:
            return float(self.packed_len)
        tokens = sum(self.widths.values()) + self.doc_tokens
        squares = sum(w * n for w, n in self.widths.items()) + self.doc_sq
        return squares / tokens if tokens else 0.0

    def notes(self) -> list[str]:
        """result.json's one note on how the sequence length was read, where it was not plain."""
        if self.packed:
            return [f"padding-free packed batches (documents in one row): seq_len and the attention FLOPs use the "
                    f"packed length, max_length {self.packed_len}"]
        if self.docs:
            return [f"padding-free batches detected (documents concatenated into rows of up to {self.row_max} "
                    f"positions, told apart by position_ids or sequence lengths): seq_len is the longest document, "
                    f"{self.doc_max}, not the row; the attention FLOPs count the token-weighted mean document "
                    f"length, {self.attention_len():.1f}"]
        if len(self.widths) > 1:
            return [f"sequence widths varied ({min(self.widths)}-{max(self.widths)} positions): seq_len is the "
                    f"widest; the attention FLOPs count the token-weighted mean width, {self.attention_len():.1f}"]
        return []
