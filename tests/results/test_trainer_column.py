"""The trainer column: config.json's top-level ``trainer`` section (written by ftprof.integrations' callback) is
part of a run's configuration, so `ftprof report` labels and pairs an HF Trainer run apart from ftprof's own loop at
the same settings (issue 40: the trainer is an option)."""

import json

import pandas as pd

from ftprof.config import RunConfig
from ftprof.results.effective import config_columns, config_key, effective
from ftprof.results.labels import labels
from ftprof.results.load import flat_row, read_runs


def _plant(root, name, trainer=None, tokens_per_s=1000.0):
    d = root / name
    d.mkdir()
    config = RunConfig.from_flat({"method": "lora", "model": "tiny", "batch_size": 4}).to_dict()
    if trainer is not None:
        config["trainer"] = trainer
    (d / "config.json").write_text(json.dumps(config))
    result = {"status": "ok", "run_dir": str(d), "method": "lora", "model": "tiny", "device": "cpu",
              "device_name": "cpu", "world_size": 1, "seq_len": 128, "batch_size": 4, "grad_accum": 1,
              "steps_completed": 10, "tokens_per_s": tokens_per_s}
    (d / "result.json").write_text(json.dumps(result))
    return d


HF = {"name": "hf-trainer", "args_class": "transformers.training_args.TrainingArguments",
      "versions": {"transformers": "4.57.0"}, "training_args": {"learning_rate": 2e-4}}


def _rows(tmp_path):
    _plant(tmp_path, "own")
    _plant(tmp_path, "hf", HF, tokens_per_s=800.0)
    _plant(tmp_path, "sft", {"name": "trl-sft"}, tokens_per_s=900.0)
    report = read_runs([tmp_path])
    assert report.problems == []
    return pd.DataFrame(report.rows).sort_values("run_name").reset_index(drop=True)


def test_each_run_row_names_its_trainer(tmp_path):
    df = _rows(tmp_path)
    assert dict(zip(df["run_name"], df["trainer"], strict=True)) == {"own": "ftprof", "hf": "hf-trainer",
                                                                    "sft": "trl-sft"}
    assert "trainer_name" not in df.columns and "trainer_training_args" not in df.columns  # one column, not a spill


def test_the_trainer_is_part_of_the_configuration(tmp_path):
    df = _rows(tmp_path)
    assert "trainer" in config_columns(df)
    keys = config_key(df)
    assert keys.nunique() == 3  # same settings, three trainers: three configurations, never repeats of one
    names = dict(zip(df["run_name"], labels(df), strict=True))
    assert names["hf"] != names["own"] and "hf-trainer" in names["hf"] and "ftprof" in names["own"]
    assert all("#" not in n for n in names.values())


def test_same_trainer_same_settings_pair_as_repeats(tmp_path):
    _plant(tmp_path, "hf1", HF)
    _plant(tmp_path, "hf2", HF)
    df = pd.DataFrame(read_runs([tmp_path]).rows)
    keys = config_key(df)
    assert keys.nunique() == 1


def test_a_row_without_the_column_is_ftprofs_own(tmp_path):
    assert effective({"method": "lora", "trainer": None})["trainer"] == "ftprof"
    d = _plant(tmp_path, "own")
    config = json.loads((d / "config.json").read_text())
    result = json.loads((d / "result.json").read_text())
    assert flat_row(result, config)["trainer"] == "ftprof"
    assert flat_row(result, {**config, "trainer": {"name": "loop"}})["trainer"] == "loop"
    assert flat_row(result, {**config, "trainer": {"no": "name"}})["trainer"] == "unknown"


def test_report_tables_label_the_trainer_apart(tmp_path):
    from ftprof.report.tables import config_key as report_key

    df = _rows(tmp_path)
    assert report_key(df).nunique() == 3


def test_a_peer_recipe_s_own_settings_stay_out_of_every_label(tmp_path):
    """The HF recipe's float32 and gc_interval differ from ftprof's in every row: they tell no two runs of one
    trainer apart, so only the options that vary within a trainer's runs are spelled (the peers table's labels)."""
    for name, batch in (("own-b2", 2), ("own-b4", 4)):
        _plant(tmp_path, name)
        for file, section in (("config.json", "train"), ("result.json", None)):
            data = json.loads((tmp_path / name / file).read_text())
            (data[section] if section else data)["batch_size"] = batch
            (tmp_path / name / file).write_text(json.dumps(data))
    hf = _plant(tmp_path, "hf", HF, tokens_per_s=800.0)
    config = json.loads((hf / "config.json").read_text())
    config["train"]["dtype"], config["train"]["gc_interval"] = "float32", 0
    (hf / "config.json").write_text(json.dumps(config))
    df = pd.DataFrame(read_runs([tmp_path]).rows).sort_values("run_name").reset_index(drop=True)
    names = dict(zip(df["run_name"], labels(df), strict=True))
    assert names["hf"] == "lora trainer=hf-trainer", names
    assert names["own-b2"] == "lora trainer=ftprof b2" and names["own-b4"] == "lora trainer=ftprof b4", names
    assert len(set(names.values())) == 3
