"""Padding-free batches (TRL's ``padding_free``, Unsloth's SFTTrainer): a batch's documents concatenated into one
row, told apart by ``position_ids`` restarting at 0 (or ``cu_seq_lens_q``, ``packed_seq_lengths``). The measured
sequence length, the FLOPs per token and the trace's metadata follow the documents, not the row."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from ftprof import metrics
from ftprof.integrations.lengths import Lengths, document_lengths, document_stats
from ftprof.profiling import layout
from tests.integrations.tiny import VOCAB, tiny_llama, token_rows, training_args

DOC, DOCS = 64, 4


def _json(path) -> dict:
    return json.loads(path.read_text())


def _positions(lengths: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in lengths])[None]


def _batch(ids: torch.Tensor, free: bool, lengths: list[int] | None = None) -> dict:
    """Rows of documents as a model call's keywords: as they are, or padding-free (one row, position_ids)."""
    if not free:
        return {"input_ids": ids, "labels": ids}
    row = ids.reshape(1, -1)
    return {"input_ids": row, "labels": row, "position_ids": _positions(lengths or [ids.shape[-1]] * ids.shape[0])}


def _measured(tmp_path, name: str, free: bool, steps: int = 3, lengths: list[int] | None = None, **kw):
    """A LoRA plain loop under ``measure``: DOCS x DOC documents per step, padded rows or one padding-free row."""
    from ftprof.integrations import measure

    model = tiny_llama(lora=True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    g = torch.Generator().manual_seed(0)
    with measure(model, tmp_path / name, optimizer=opt, max_steps=steps, **kw) as m:
        for _ in range(steps):
            ids = torch.randint(3, VOCAB, (DOCS, DOC), generator=g)
            model(**_batch(ids, free, lengths)).loss.backward()
            opt.step()
            opt.zero_grad()
            m.step()
    return tmp_path / name


def test_a_padding_free_loop_is_measured_at_its_documents_length(tmp_path):
    plain, free = _measured(tmp_path, "plain", False), _measured(tmp_path, "free", True)
    a, b = _json(plain / "result.json"), _json(free / "result.json")
    assert a["status"] == b["status"] == "ok"
    assert (a["seq_len"], b["seq_len"]) == (DOC, DOC)  # not the row's 256
    assert b["flops_per_token"] == a["flops_per_token"] > 0
    assert b["tokens_per_step"] == a["tokens_per_step"] == DOCS * DOC
    for run in (plain, free):
        data = _json(run / "config.json")["data"]
        assert (data["seq_len"], data["batch_size"]) == (DOC, DOCS)  # the documents are the rows
    assert [n for n in b["notes"] if "padding-free" in n] == [
        f"padding-free batches detected (documents concatenated into rows of up to {DOCS * DOC} positions, told "
        f"apart by position_ids or sequence lengths): seq_len is the longest document, {DOC}, not the row; the "
        f"attention FLOPs count the token-weighted mean document length, {DOC}.0"]
    assert not any("padding-free" in n or "widths varied" in n for n in a["notes"])  # an ordinary batch: as before


def test_ragged_documents_count_their_longest_and_their_mean(tmp_path):
    """Documents of 40, 64, 128 and 24 positions in one row: seq_len the longest, attention the token-weighted
    mean length (sum of squares over tokens), the padded-batch convention with documents for rows."""
    lengths = [40, 64, 128, 24]  # 256 positions, the loop's DOCS x DOC ids as one row
    run = _measured(tmp_path, "ragged", True, lengths=lengths)
    result = _json(run / "result.json")
    assert result["seq_len"] == 128
    mean = sum(n * n for n in lengths) / sum(lengths)
    model = tiny_llama(lora=True)
    layers, attn_dim = metrics.attention_dims(model.config)
    assert result["flops_per_token"] == pytest.approx(
        metrics.flops_per_token(metrics.count_params(model), layers, attn_dim, mean))
    assert any("longest document, 128, not the row" in n and f"{mean:.1f}" in n for n in result["notes"])


def test_the_trace_metadata_takes_the_same_length(tmp_path):
    """The profiler window's trace metadata (written after the first step) carries the run's own figures."""
    run = _measured(tmp_path, "free", True, steps=4, profile=True)
    result = _json(run / "result.json")
    events = json.loads(gzip.open(layout.trace_path(run / "profile", 0, 1)).read())
    meta = layout.decode_metadata(events["ftprof"])
    assert (meta["seq_len"], meta["batch_size"]) == (DOC, DOCS)
    assert meta["flops_per_token"] == result["flops_per_token"]
    summary = _json(run / "profile" / "summary.json")
    assert summary["breakdown"]["hfu_flops_per_step"] == pytest.approx(result["flops_per_token"] * DOCS * DOC)


def _padding_free_collator(rows: list[dict]) -> dict:
    """TRL's padding-free collation: every row's tokens in one row, position_ids restarting at each row's start."""
    ids = [torch.tensor(r["input_ids"]) for r in rows]
    row = torch.cat(ids)[None]
    return {"input_ids": row, "labels": row.clone(), "position_ids": _positions([len(i) for i in ids])}


@pytest.mark.parametrize("free", [False, True])
def test_the_trainer_records_the_documents_length(tmp_path, free):
    import datasets
    from transformers import Trainer, default_data_collator

    from ftprof.integrations import FtprofCallback

    rows = token_rows(16, DOC)
    rows["labels"] = rows["input_ids"]
    callback = FtprofCallback(tmp_path / "run")
    Trainer(model=tiny_llama(lora=True), args=training_args(tmp_path / "out", 3, batch_size=DOCS),
            train_dataset=datasets.Dataset.from_dict(rows), callbacks=[callback],
            data_collator=_padding_free_collator if free else default_data_collator).train()
    result = _json(tmp_path / "run" / "result.json")
    assert result["status"] == "ok" and result["seq_len"] == DOC and result["tokens_per_step"] == DOCS * DOC
    model = tiny_llama(lora=True)
    layers, attn_dim = metrics.attention_dims(model.config)
    assert result["flops_per_token"] == metrics.flops_per_token(metrics.count_params(model), layers, attn_dim, DOC)
    assert any("padding-free batches detected" in n for n in result["notes"]) is free


@pytest.mark.parametrize("key", ["position_ids", "cu_seq_lens_q", "packed_seq_lengths"])
def test_document_lengths_from_each_spelling(key):
    lengths = [3, 5, 2]
    value = {"position_ids": _positions(lengths), "cu_seq_lens_q": torch.tensor([0, 3, 8, 10], dtype=torch.int32),
             "packed_seq_lengths": torch.tensor(lengths, dtype=torch.int32)}[key]
    found = document_lengths({key: value}, 10)
    assert sorted(n for n in found.tolist() if n) == sorted(lengths)
    assert document_stats(found).tolist() == [3, 5, 9 + 25 + 4]


def test_lengths_read_nothing_from_the_device_until_the_step_ends(monkeypatch):
    """The forward's work only queues device work: reading a tensor there would synchronise inside the step."""
    lengths = Lengths()
    lengths.begin_step()

    def refuse(*_a, **_k):
        raise AssertionError("a tensor was read inside the step")

    with monkeypatch.context() as patch:
        for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
            patch.setattr(torch.Tensor, name, refuse)
        lengths.forward({"position_ids": _positions([DOC] * DOCS)}, torch.zeros(1, DOC * DOCS), first=True)
    assert lengths.seq_len() == 0  # nothing read yet
    lengths.end_step()
    assert (lengths.seq_len(), lengths.attention_len(), lengths.first_docs) == (DOC, DOC, DOCS)


def test_packing_keeps_the_packed_length_and_one_document_rows_their_width():
    packed = Lengths()
    packed.packed_len = 128  # TRL's packing=True, max_length 128
    packed.forward({"position_ids": _positions([40, 50])}, torch.zeros(1, 90), first=True)
    packed.end_step()
    assert (packed.seq_len(), packed.attention_len()) == (128, 128.0)
    assert packed.notes() == ["padding-free packed batches (documents in one row): seq_len and the attention FLOPs "
                              "use the packed length, max_length 128"]
    single = Lengths()  # one row, one document: an ordinary batch of one row
    single.forward({"position_ids": _positions([90])}, torch.zeros(1, 90), first=True)
    single.forward({}, torch.zeros(2, 60), first=False)
    single.end_step()
    assert (single.seq_len(), single.docs, single.widths) == (90, 0, {90: 90, 60: 120})
