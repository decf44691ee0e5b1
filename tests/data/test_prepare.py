import pytest

from ftprof.config import DataConfig
from ftprof.data.prepare import prepare_dataset, sequence_stats, tokenize_processes
from ftprof.errors import ConfigError
from ftprof.models.tokenizer import build_tokenizer
from tests.data_files import chat_rows, instruction_rows, text_rows, write


@pytest.mark.parametrize("name, rows, fmt", [
    ("d.txt", text_rows(), "text"), ("d.json", text_rows(), "text"), ("d.jsonl", text_rows(), "text"),
    ("d.csv", instruction_rows(), "instruction"), ("d.parquet", chat_rows(), "chat"), ("saved", chat_rows(), "chat"),
])
def test_every_format_prepares_with_stats(tmp_path, name, rows, fmt):
    path = write(tmp_path / name, rows)
    prepared = prepare_dataset(DataConfig(dataset=path, seq_len=192), build_tokenizer(), progress=False)
    stats = prepared.stats
    assert stats["format"] == fmt and stats["rows_loaded"] == len(rows) == stats["rows"] == prepared.rows
    assert len(stats["fingerprint"]) == 16 and stats["fingerprint"] != stats["tokenized_fingerprint"]
    assert 0 < stats["mean_seq_len"] <= stats["max_seq_len"] <= 192
    assert 0 < stats["padding_fraction"] < 1 and 0 < stats["label_fraction"] < 1 - stats["padding_fraction"] + 1e-9


def test_tokenization_is_cached_for_the_next_run(tmp_path):
    import os

    path = write(tmp_path / "d.jsonl", instruction_rows(40))
    data = DataConfig(dataset=path, seq_len=192)
    first = prepare_dataset(data, build_tokenizer(), progress=False)
    cache = os.environ["HF_DATASETS_CACHE"]
    files = {os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs}
    second = prepare_dataset(data, build_tokenizer(), progress=False)
    assert second.stats["tokenized_fingerprint"] == first.stats["tokenized_fingerprint"]
    assert {os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs} == files  # nothing tokenized again
    other = prepare_dataset(DataConfig(dataset=path, seq_len=192, train_on="prompt"), build_tokenizer(),
                            progress=False)
    assert other.stats["tokenized_fingerprint"] != first.stats["tokenized_fingerprint"]


def test_rows_with_nothing_to_learn_are_dropped_and_none_left_is_an_error(tmp_path):
    rows = instruction_rows(6)
    rows[0]["instruction"] = " ".join(["the model trains"] * 40)  # the response falls past --seq-len 160
    rows[1]["output"] = ""
    prepared = prepare_dataset(DataConfig(dataset=write(tmp_path / "d.jsonl", rows), seq_len=160), build_tokenizer(),
                               progress=False)
    assert prepared.stats["rows_loaded"] == 6 and prepared.stats["rows"] == 4 and prepared.stats["rows_dropped"] == 2
    # the dropped rows are gone from what the model is fed, not only from the count
    assert len(prepared.offsets) - 1 == 4 == prepared.stats["sequences"]
    spans = zip(prepared.offsets[:-1], prepared.offsets[1:], strict=True)
    assert all((prepared.labels[a:b] != -100).any() for a, b in spans)
    with pytest.raises(ConfigError, match="no row of .* has a token to train on once cut to --seq-len"):
        prepare_dataset(DataConfig(dataset=write(tmp_path / "e.jsonl", rows[:2]), seq_len=160), build_tokenizer(),
                        progress=False)
    (tmp_path / "blank.csv").write_text("text\n")
    with pytest.raises(ConfigError, match="--dataset: cannot load .*blank.csv': it has no rows"):
        prepare_dataset(DataConfig(dataset=str(tmp_path / "blank.csv")), build_tokenizer(), progress=False)


def test_two_processes_tokenize_the_same_as_one(tmp_path):
    path = write(tmp_path / "d.jsonl", chat_rows(8))
    one = prepare_dataset(DataConfig(dataset=path, seq_len=64, dataset_num_proc=1), build_tokenizer(), progress=False)
    two = prepare_dataset(DataConfig(dataset=path, seq_len=64, dataset_num_proc=2), build_tokenizer(), progress=False)
    assert two.stats["tokenize_processes"] == 2
    assert (one.ids == two.ids).all() and (one.labels == two.labels).all()


def test_processes_by_default_only_for_large_datasets():
    assert tokenize_processes(DataConfig(), 500) == 1
    assert 1 <= tokenize_processes(DataConfig(), 50_000) <= 8
    assert tokenize_processes(DataConfig(dataset_num_proc=3), 5) == 3


def test_sequence_stats_padding_and_labels():
    import numpy as np

    offsets = np.array([0, 4, 12])
    labels = np.array([-100, -100, 5, 5] + [7] * 8)
    padded = sequence_stats(offsets, labels, seq_len=8, packing=False)
    assert padded["mean_seq_len"] == 6 and padded["max_seq_len"] == 8 and padded["padding_fraction"] == 0.25
    # after the causal shift, as steps.csv's real tokens: the second row's first label predicts nothing
    assert padded["label_fraction"] == pytest.approx(9 / 16)
    packed = sequence_stats(offsets, labels, seq_len=4, packing=True)
    assert packed["padding_fraction"] == 0 and packed["sequences"] == 3
    assert packed["label_fraction"] == pytest.approx(8 / 12, abs=1e-4)  # each row's first position predicts none
