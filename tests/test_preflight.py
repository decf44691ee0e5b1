"""Preflight input checks that need a little I/O: a local checkpoint without a tokenizer and a text dataset."""

import pytest

import ftprof
from ftprof.cli.main import main
from ftprof.models.presets import preset_config


@pytest.fixture
def checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    preset_config("tiny").save_pretrained(ckpt)  # config.json only: no weights needed to fail, no tokenizer
    data = tmp_path / "data.txt"
    data.write_text("some text to train on\n")
    return ckpt, data


def test_text_dataset_with_a_checkpoint_without_tokenizer_is_an_input_error(checkpoint, tmp_path, capsys):
    ckpt, data = checkpoint
    code = main(["train", "full", "--model", str(ckpt), "--dataset", str(data), "--output-dir", str(tmp_path / "o"),
                 "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "has no tokenizer files" in err and str(ckpt) in err
    assert not (tmp_path / "o").exists()  # nothing started


def test_a_tokenizer_file_satisfies_the_check(checkpoint):
    from ftprof.models.source import resolve_model_source
    from ftprof.preflight import _check_tokenizer

    ckpt, data = checkpoint
    (ckpt / "tokenizer.json").write_text("{}")
    _check_tokenizer(resolve_model_source(str(ckpt)), str(data))  # no error
    _check_tokenizer(resolve_model_source(str(ckpt)), "synthetic")


def test_rows_dropped_from_a_dataset_are_said(tmp_path):
    from ftprof.preflight import preflight
    from tests.conftest import tiny_config
    from tests.data_files import instruction_rows, write

    rows = instruction_rows(6)
    rows[0]["instruction"] = " ".join(["the model trains"] * 40)  # the response falls past --seq-len 160
    plan = preflight(tiny_config(tmp_path, "lora", dataset=write(tmp_path / "d.jsonl", rows), seq_len=160))
    assert "--dataset: 1 of 6 rows dropped: no token to train on once cut to --seq-len" in plan.notes
    kept = preflight(tiny_config(tmp_path, "lora", dataset=write(tmp_path / "e.jsonl", rows[1:]), seq_len=160))
    assert not any("dropped" in n for n in kept.notes)


def test_packing_a_dataset_smaller_than_one_sequence_is_said(tmp_path):
    from ftprof.preflight import preflight
    from tests.conftest import tiny_config
    from tests.data_files import write

    tiny = preflight(tiny_config(tmp_path, "lora", dataset=write(tmp_path / "t.jsonl", [{"text": "hi"}]),
                                 packing=True, seq_len=32))
    assert any("less than one sequence of --seq-len 32" in n for n in tiny.notes), tiny.notes
    rows = [{"text": " ".join(["the model trains on this"] * 20)}] * 4
    enough = preflight(tiny_config(tmp_path, "lora", dataset=write(tmp_path / "e.jsonl", rows), packing=True,
                                   seq_len=32))
    assert not any("less than one sequence" in n for n in enough.notes)


def test_a_dataset_smaller_than_one_batch_is_said(tmp_path):
    """Unpacked, each batch is filled by repeating rows: said as packing's shortfall is."""
    from ftprof.preflight import preflight
    from tests.conftest import tiny_config
    from tests.data_files import write

    rows = [{"text": "the model trains on this"}]
    few = preflight(tiny_config(tmp_path, "lora", dataset=write(tmp_path / "t.jsonl", rows), batch_size=4))
    assert any("--batch-size 4: the dataset holds 1 row(s) to train on, fewer than one batch" in n for n in few.notes)
    enough = preflight(tiny_config(tmp_path, "lora", dataset=write(tmp_path / "e.jsonl", rows * 4), batch_size=4))
    assert not any("fewer than one batch" in n for n in enough.notes)


@pytest.mark.parametrize("steps", [1, 2])
def test_a_run_of_warm_up_steps_only_runs_and_says_it_measures_nothing(tmp_path, steps):
    """--max-steps 1 and 2 under the default measurement warm-up (2) are treated alike: they train, with a note."""
    from ftprof.config import RunConfig

    cfg = RunConfig.from_flat({"method": "full", "model": "tiny", "max_steps": steps, "measure_warmup_steps": 2,
                               "device": "cpu", "output_dir": str(tmp_path)})
    result = ftprof.train(cfg)
    assert result.status == "ok" and result.throughput.tokens_per_s is None
    assert any("measurement warm-up" in n and "no steady-state figures" in n for n in result.notes)
