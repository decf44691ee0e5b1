"""FtprofCallback on TRL's SFTTrainer, with packing and without (skipped where trl is not installed)."""

from __future__ import annotations

import csv
import json

import pytest

from tests.integrations.tiny import VOCAB, tiny_llama, token_rows

trl = pytest.importorskip("trl", reason="trl is not installed (pip install 'ftprof[trl]')")

pytestmark = pytest.mark.slow


def _tokenizer():
    from ftprof.models.tokenizer import build_tokenizer

    tok = build_tokenizer()  # pad 0, eos 2: the ids the tiny rows never use
    return tok


@pytest.mark.parametrize("packing", [False, True])
def test_sft_trainer_writes_a_run_directory(tmp_path, packing):
    import datasets
    from trl import SFTConfig, SFTTrainer

    import ftprof
    from ftprof.integrations import FtprofCallback

    seq = 64
    rows = token_rows(48, seq, ragged=True)  # documents of 32-64 tokens: padded, or packed into full rows
    args = SFTConfig(str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=4, max_length=seq,
                     packing=packing, report_to=[], logging_steps=1000, save_strategy="no", use_cpu=True,
                     disable_tqdm=True, learning_rate=1e-3, dataset_num_proc=None)
    callback = FtprofCallback(tmp_path / "run")
    trainer = SFTTrainer(model=tiny_llama(lora=True), args=args, train_dataset=datasets.Dataset.from_dict(rows),
                         processing_class=_tokenizer(), callbacks=[callback])
    trainer.train()
    run_dir = tmp_path / "run"
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok", result["notes"]
    assert result["training_proof"]["passed"] is True
    config = json.loads((run_dir / "config.json").read_text())
    assert config["trainer"]["name"] == "trl-sft" and config["data"]["packing"] is packing
    assert config["method"]["method"] == "lora"
    steps = list(csv.DictReader((run_dir / "steps.csv").open()))
    assert len(steps) == 4
    assert all(0 < int(s["real_tokens"]) <= int(s["tokens"]) for s in steps)
    if not packing:  # padded rows: fewer real tokens than positions
        assert any(int(s["real_tokens"]) < int(s["tokens"]) - 4 for s in steps)
    frame = ftprof.load_results(run_dir)
    assert len(frame) == 1 and frame.iloc[0]["tokens_per_s"] > 0
    assert VOCAB == config_vocab(trainer)
    if packing:  # TRL packs padding-free: one row per batch; the packed length is the sequence length
        assert config["data"]["seq_len"] == seq


def config_vocab(trainer) -> int:
    return trainer.model.get_base_model().config.vocab_size


def test_padding_free_without_packing_is_measured_at_its_documents_length(tmp_path):
    """TRL's padding_free=True (no packing): each batch's 4 documents of 64 tokens in one row of 256, told apart by
    cu_seq_lens_q and position_ids. The sequence length is the documents' 64, not the row's 256."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    from ftprof.integrations import FtprofCallback

    args = SFTConfig(str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=4, max_length=None,
                     padding_free=True, report_to=[], logging_steps=1000, save_strategy="no", use_cpu=True,
                     disable_tqdm=True, learning_rate=1e-3, dataset_num_proc=None)
    SFTTrainer(model=tiny_llama(lora=True), args=args, train_dataset=datasets.Dataset.from_dict(token_rows(48, 64)),
               processing_class=_tokenizer(), callbacks=[FtprofCallback(tmp_path / "run")]).train()
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "ok"
    assert (result["seq_len"], result["tokens_per_step"], result["batch_size"]) == (64, 256, 4)
    assert any("padding-free batches detected" in n and "longest document, 64" in n for n in result["notes"])
