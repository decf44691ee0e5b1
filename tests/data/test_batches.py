import json

from ftprof.config import DataConfig
from ftprof.data import IGNORE_INDEX, count_tokens, make_batches
from ftprof.models.tokenizer import build_tokenizer


def test_synthetic_stream_is_learnable_and_deterministic():
    data = DataConfig(seq_len=16, batch_size=3)
    a, b = make_batches(data, None, 512, seed=1), make_batches(data, None, 512, seed=1)
    first = next(a)
    assert first["input_ids"].shape == (3, 16)
    assert (first["input_ids"] == next(b)["input_ids"]).all()
    # a fixed successor table: the same token is always followed by the same token
    ids = first["input_ids"].flatten().tolist()
    pairs = {}
    for row in first["input_ids"].tolist():
        for x, y in zip(row, row[1:], strict=False):
            assert pairs.setdefault(x, y) == y
    assert min(ids) >= 3
    assert count_tokens(first) == (48, 45)


def test_synthetic_stream_walks_one_cycle_of_61_ids():
    """Each row walks the same cycle from a random start: it repeats every 61 positions, with 61 distinct ids."""
    from ftprof.data.synthetic import SYNTHETIC_STATES

    batch = next(make_batches(DataConfig(seq_len=150, batch_size=4), None, 128256, seed=0))["input_ids"]
    n = SYNTHETIC_STATES
    assert (batch[:, n:] == batch[:, :-n]).all()
    assert all(len(set(row[:n].tolist())) == n for row in batch)
    assert len(set(batch[:, 0].tolist())) > 1  # the rows start at different places


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_jsonl_padding_masks_labels(tmp_path):
    path = _write(tmp_path / "d.jsonl", [json.dumps({"text": "the model trains"}),
                                         json.dumps({"text": "loss goes down as the optimizer updates weights"})])
    data = DataConfig(dataset=path, seq_len=32, batch_size=2)
    batch = next(make_batches(data, build_tokenizer(), 512, seed=0))
    mask = batch["attention_mask"]
    assert (batch["labels"][mask == 0] == IGNORE_INDEX).all()
    assert (batch["labels"][mask == 1] == batch["input_ids"][mask == 1]).all()
    assert batch["input_ids"][mask == 0].eq(build_tokenizer().pad_token_id).all()
    tokens, real = count_tokens(batch)
    assert tokens == 64 and 0 < real < 64


def test_txt_packing_fills_every_position(tmp_path):
    path = _write(tmp_path / "d.txt", ["the model trains on tokens and the loss goes down\n"] * 5)
    data = DataConfig(dataset=path, seq_len=16, batch_size=2, packing=True)
    batch = next(make_batches(data, build_tokenizer(), 512, seed=0))
    assert batch["attention_mask"].all()
    assert count_tokens(batch) == (32, 30)


def test_packing_keeps_prompt_masks_and_document_ends(tmp_path):
    """Packed instruction rows: the stream is every row end to end, each ending with eos, prompts still masked."""
    path = _write(tmp_path / "d.jsonl", [json.dumps({"instruction": f"say {i}", "output": "the model trains"})
                                         for i in range(6)])
    tok = build_tokenizer()
    data = DataConfig(dataset=path, seq_len=24, batch_size=4, packing=True)
    batch = next(make_batches(data, tok, 512, seed=0))
    ids, labels = batch["input_ids"], batch["labels"]
    assert batch["attention_mask"].all() and ids.shape == (4, 24)
    assert (ids == tok.eos_token_id).any()
    trained = labels != IGNORE_INDEX
    assert 0 < trained.sum() < trained.numel()  # prompts carry no labels, responses do
    assert (labels[trained] == ids[trained]).all()
