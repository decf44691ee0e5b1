"""The training options of a run people keep: schedules and warm-ups under the HF names, epochs, eval, save, the
--config file, the HF spellings, and old files read with the meaning they were written with."""

import json

import pytest

from ftprof.cli.common import config_from_args
from ftprof.cli.main import build_parser
from ftprof.cli.train import config_with_file
from ftprof.config import SCHEMA_VERSION, RunConfig
from ftprof.errors import ConfigError


def _cfg(argv):
    return config_with_file(build_parser().parse_args(["train", *argv]))


def test_hf_spellings_mean_our_options():
    cfg = _cfg(["lora", "--bf16", "--max-seq-length", "64", "--per-device-train-batch-size", "3",
                "--gradient-accumulation-steps", "2", "--learning-rate", "1e-3", "--warmup-steps", "3",
                "--lr-scheduler-type", "cosine"])
    assert (cfg.model.dtype, cfg.data.seq_len, cfg.data.batch_size, cfg.train.grad_accum) == ("bfloat16", 64, 3, 2)
    assert (cfg.train.lr, cfg.train.warmup_steps, cfg.train.lr_scheduler_type) == (1e-3, 3, "cosine")
    assert cfg.train.measure_warmup_steps == 2  # the measurement warm-up keeps its default
    assert _cfg(["full", "--fp16"]).model.dtype == "float16"


def test_warmup_ratio_rounds_up_like_transformers():
    t = RunConfig.from_flat({"warmup_ratio": 0.25, "max_steps": 10}).train
    assert t.lr_warmup_steps() == 3 and t.lr_warmup_steps(4) == 1


@pytest.mark.parametrize("values, fragment", [
    ({"warmup_steps": 2, "warmup_ratio": 0.1}, "give one"),
    ({"lr_scheduler_type": "constant", "warmup_steps": 2}, "constant_with_warmup"),
    ({"lr_scheduler_type": "cosin"}, "did you mean 'cosine'"),
    ({"num_train_epochs": 2}, "synthetic data is an endless stream"),
    ({"num_train_epochs": 0, "dataset": "x.jsonl"}, "--num-train-epochs must be a positive number"),
    ({"eval_steps": 0}, "--eval-steps must be at least 1"),
    ({"eval_steps": 2, "dataset": "x.jsonl"}, "--eval-dataset or --eval-split"),
    ({"eval_split": "test"}, "evaluate it on that stream"),
    ({"save_dir": "out"}, "--save-dir needs --save"),
])
def test_bad_training_options_are_one_line(values, fragment):
    with pytest.raises(ConfigError, match=None) as err:
        RunConfig.from_flat(values)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_schema_1_config_reads_with_its_meaning():
    """An old config.json's warmup_steps was the measurement warm-up, and its learning rate was constant."""
    old = {"schema_version": 1, "method": {"method": "lora"}, "train": {"warmup_steps": 3, "max_steps": 8}}
    cfg = RunConfig.from_dict(old)
    t = cfg.train
    assert (t.measure_warmup_steps, t.warmup_steps, t.lr_scheduler_type) == (3, 0, "constant")
    assert cfg.schema_version == SCHEMA_VERSION == 2
    assert RunConfig.from_dict(cfg.to_dict()) == cfg  # today's files round-trip unchanged


def test_old_run_dir_rows_read_with_their_meaning(tmp_path):
    from ftprof.results.load import run_row

    (tmp_path / "config.json").write_text(json.dumps({"schema_version": 1, "method": {"method": "lora"},
                                                      "train": {"warmup_steps": 4}}))
    row = run_row(tmp_path)
    assert (row["measure_warmup_steps"], row["warmup_steps"], row["lr_scheduler_type"]) == (4, 0, "constant")


def test_config_file_under_command_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("method: lora\nmodel: tiny\nlr: 1.0e-3\nmax_steps: 7\nlora_targets: [q_proj, v_proj]\n")
    cfg = _cfg(["--config", str(path), "--lr", "5e-4"])
    assert (cfg.method.method, cfg.train.lr, cfg.train.max_steps) == ("lora", 5e-4, 7)
    assert cfg.method.lora_targets == ("q_proj", "v_proj")
    # the method on the command line wins (--config after it works too)
    path.write_text("method: lora\nmodel: tiny\nlr: 1.0e-3\nmax_steps: 7\n")
    cfg = _cfg(["full", "--config", str(path), "--max-steps", "3"])
    assert (cfg.method.method, cfg.train.max_steps, cfg.train.lr) == ("full", 3, 1e-3)
    # the command line's length of training replaces the file's
    path.write_text("method: lora\ndataset: x.jsonl\nnum_train_epochs: 2\n")
    assert _cfg(["--config", str(path), "--max-steps", "4"]).train.num_train_epochs is None


def test_config_file_schema_1_keeps_its_warmup_meaning(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("schema_version: 1\nmethod: lora\nwarmup_steps: 3\nmax_steps: 6\n")
    t = _cfg(["--config", str(path)]).train
    assert (t.measure_warmup_steps, t.warmup_steps, t.lr_scheduler_type) == (3, 0, "constant")


def test_sweep_files_without_a_version_read_warmup_steps_as_before(tmp_path):
    from ftprof.bench.sweep import load_sweep

    old = tmp_path / "old.yaml"
    old.write_text("base: {model: tiny, seq_len: 32, max_steps: 4, warmup_steps: 1, device: cpu}\n"
                   "matrix: {method: [lora]}\n")
    (exp,) = load_sweep(old).experiments
    t = exp.config.train
    assert (t.measure_warmup_steps, t.warmup_steps, t.lr_scheduler_type) == (1, 0, "constant")
    assert "warmup_steps" in exp.values  # the cell's name (from the values as written) does not change
    new = tmp_path / "new.yaml"
    new.write_text("schema_version: 2\nbase: {model: tiny, seq_len: 32, max_steps: 4, warmup_steps: 1}\n"
                   "matrix: {method: [lora]}\n")
    (exp,) = load_sweep(new).experiments
    assert (exp.config.train.warmup_steps, exp.config.train.measure_warmup_steps) == (1, 2)


def test_both_lengths_on_the_command_line_are_refused():
    with pytest.raises(ConfigError, match="give one"):
        _cfg(["lora", "--dataset", "x.jsonl", "--max-steps", "3", "--num-train-epochs", "1"])


def test_plain_namespace_still_builds():
    cfg = config_from_args(build_parser().parse_args(["train", "qlora", "--eval-steps", "2", "--save"]))
    assert cfg.eval.eval_steps == 2 and cfg.save.save and cfg.eval.enabled
