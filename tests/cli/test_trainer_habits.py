"""The HF Trainer's spellings on ftprof's own command line (issue 40): underscores, yes/no values, --bf16 true."""

import pytest

from ftprof.cli.common import config_from_args
from ftprof.cli.main import build_parser


def parse(*words):
    return config_from_args(build_parser().parse_args(["train", *words]))


def test_the_trainer_command_line_parses():
    cfg = parse("lora", "--learning_rate", "1e-4", "--per_device_train_batch_size", "2", "--bf16", "true",
                "--gradient_accumulation_steps", "2", "--max_steps", "3", "--output_dir", "X",
                "--lr_scheduler_type", "cosine", "--warmup_ratio", "0.1", "--weight_decay", "0.01",
                "--max_grad_norm", "1.0", "--report_to", "none", "--logging_steps", "5", "--run_name", "r")
    assert (cfg.train.lr, cfg.data.batch_size, cfg.model.dtype, cfg.train.grad_accum) == (1e-4, 2, "bfloat16", 2)
    assert (cfg.train.max_steps, cfg.output.output_dir, cfg.train.lr_scheduler_type) == (3, "X", "cosine")
    assert (cfg.train.warmup_ratio, cfg.output.logging_steps, cfg.output.run_name) == (0.1, 5, "r")


def test_epochs_in_underscores():
    args = build_parser().parse_args(["train", "lora", "--num_train_epochs", "2"])
    assert args.num_train_epochs == 2.0


@pytest.mark.parametrize("words, dtype", [
    (["--bf16"], "bfloat16"), (["--bf16", "true"], "bfloat16"), (["--bf16=True"], "bfloat16"),
    (["--fp16", "yes"], "float16"), (["--bf16", "false"], "float32"), (["--fp16", "false"], "float32"),
    (["--fp16", "true", "--bf16", "false"], "float16"), (["--bf16", "false", "--fp16", "1"], "float16"),
    ([], "auto"),
])
def test_precision_flags_take_a_value(words, dtype):
    assert parse("lora", *words).model.dtype == dtype


@pytest.mark.parametrize("words, on", [
    (["--gradient_checkpointing", "true"], True), (["--gradient_checkpointing", "False"], False),
    (["--gradient-checkpointing"], True), (["--gradient_checkpointing=false"], False),
    (["--no_gradient_checkpointing"], False),
])
def test_yes_no_options_take_a_value(words, on):
    assert parse("lora", *words).model.gradient_checkpointing is on


def test_every_option_has_its_underscore_spelling():
    args = build_parser().parse_args(["train", "qlora", "--lora_r", "4", "--lora_targets", "q_proj,v_proj",
                                      "--double_quant", "false", "--seq_len", "64"])
    cfg = config_from_args(args)
    assert (cfg.method.lora_r, cfg.method.lora_targets, cfg.method.double_quant, cfg.data.seq_len) == \
        (4, ("q_proj", "v_proj"), False, 64)


def test_script_names_of_model_and_dataset():
    cfg = parse("lora", "--model_name_or_path", "tiny", "--dataset_name", "synthetic")
    assert (cfg.model.model, cfg.data.dataset) == ("tiny", "synthetic")


@pytest.mark.parametrize("words, fragment", [
    (["--max_steps", "3", "--max-steps", "4"], "repeats"),
    (["--bf16", "true", "--dtype", "float32"], "repeats"),
    (["--packing", "maybe"], "unrecognized arguments: maybe"),
    (["--learning_rat", "1"], "did you mean '--learning-rate'"),
    (["--logging_steps", "0"], None),
])
def test_bad_trainer_spellings_are_one_line(words, fragment, capsys):
    if fragment is None:  # a value the config refuses
        from ftprof.errors import ConfigError

        with pytest.raises(ConfigError, match="--logging-steps must be at least 1"):
            parse("lora", *words)
        return
    with pytest.raises(SystemExit) as info:
        parse("lora", *words)
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and fragment in err and "\n" not in err


def test_options_before_the_method_and_bench_flags():
    assert parse("--quiet", "true", "lora").output.quiet is True
    args = build_parser().parse_args(["bench", "x.yaml", "--dry_run"])
    assert args.dry_run is True


def test_words_after_a_double_dash_are_left_alone():
    from ftprof.cli.common import trainer_spellings

    parser = build_parser()
    assert trainer_spellings(parser, ["--", "--max_steps", "true"]) == ["--", "--max_steps", "true"]


@pytest.mark.slow
def test_a_tiny_run_in_trainer_spellings_logs_every_n_steps(tmp_path, capfd):
    from ftprof.cli.main import main

    code = main(["train", "lora", "--max_steps", "4", "--logging_steps", "2", "--learning_rate", "1e-3",
                 "--bf16", "false", "--per_device_train_batch_size", "1", "--output_dir", str(tmp_path),
                 "--run_name", "r", "--device", "cpu"])
    out = capfd.readouterr().out
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("ftprof: step ")]
    assert [line.split("|")[0].strip() for line in lines] == ["ftprof: step 2/4", "ftprof: step 4/4"]
    assert "lr " in lines[0] and (tmp_path / "r" / "result.json").is_file()
