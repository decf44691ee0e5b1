"""Bad input of issue 41's fourth pass: one line naming the right option (or path), exit 2, before torch where the
check needs none. All command-line cases run in one fresh interpreter (tests/cli/test_bad_input.py's RUNNER)."""

from __future__ import annotations

import json

import pytest

from ftprof.config.file import load_run_file
from ftprof.errors import ConfigError
from tests.cli.test_bad_input import corpus_problems

GOOD_DATA = "".join(json.dumps({"text": f"hello world number {i}"}) + "\n" for i in range(20))


def _files(t):
    (t / "good.jsonl").write_text(GOOD_DATA)
    (t / "nocol.jsonl").write_text('{"x": 1}\n')
    (t / "notjson.jsonl").write_text("not json\n")
    (t / "empty.jsonl").write_text("")
    (t / "adir").mkdir()
    (t / "x.yaml").write_text("method: lora\n")


def _cases(t):
    train = ["train", "lora", "--model", "tiny", "--device", "cpu", "--max-steps", "1", "--output-dir", str(t / "o")]
    data = [*train, "--dataset", str(t / "good.jsonl")]
    # (argv, words the line must hold, words it must not hold, torch allowed)
    return [
        (["plan", "lora,all"], ["all already means every method"], ["unknown method 'all'"], False),
        (["plan", "lora,dora"], ["unknown method 'dora'", "or all"], [], False),
        (["train", "--config", str(t / "adir")], ["--config", "is a directory"], ["does not exist"], False),
        (["plan", "--config", str(t / "x.yaml")], ["--config", "only `ftprof train` reads a config file"],
         ["did you mean"], False),
        (["profile", "--config", str(t / "x.yaml")], ["--config", "only `ftprof train` reads a config file"],
         ["invalid choice"], False),
        (["profile", "lora", "--config=x.yaml"], ["only `ftprof train` reads a config file"], [], False),
        # suggestions from the subcommand's own options
        (["train", "qlora", "--active-steps", "2"], ["ftprof train qlora", "did you mean '--prof-active-steps'"],
         ["'--active-steps'?"], False),
        (["plan", "lora", "--active-steps", "2"], ["ftprof plan"], ["'--active-steps'?"], False),
        # eval data's problems name --eval-dataset / --eval-split, not --dataset (the tokenizer loads: torch)
        ([*data, "--eval-dataset", str(t / "nocol.jsonl")], ["--eval-dataset"], ["--dataset:"], True),
        ([*data, "--eval-dataset", str(t / "notjson.jsonl")], ["--eval-dataset", "line 1"], ["--dataset:"], True),
        ([*data, "--eval-dataset", str(t / "empty.jsonl")], ["--eval-dataset", "is empty"], ["--dataset:"], True),
        ([*data, "--eval-split", "validation"], ["--eval-split", "validation"], ["--dataset:"], True),
        ([*data, "--eval-dataset", str(t / "adir")], ["--eval-dataset", "save_to_disk"], ["--dataset:"], False),
    ]


def test_round4_corpus(tmp_path):
    _files(tmp_path)
    cases = _cases(tmp_path)
    problems = corpus_problems(cases, tmp_path)
    assert problems == [], "\n".join(problems)


# ---- config files: read as sweep files are (numbers, merge keys), the CLI's option names


def _config(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_config_numbers_as_sweep_files_read_them(tmp_path):
    from ftprof.cli.main import build_parser
    from ftprof.cli.train import config_with_file

    path = _config(tmp_path, "method: lora\nmodel: tiny\nlr: 1e-4\nmax_steps: 1e1\nweight_decay: 5E-3\n")
    assert load_run_file(path)["lr"] == 1e-4
    cfg = config_with_file(build_parser().parse_args(["train", "--config", str(path)]))
    assert cfg.train.lr == 1e-4 and cfg.train.max_steps == 10 and isinstance(cfg.train.max_steps, int)


@pytest.mark.parametrize("text, key, value", [
    ("learning_rate: 3e-4\n", "lr", 3e-4),
    ("max-steps: 7\n", "max_steps", 7),
    ("per_device_train_batch_size: 3\n", "batch_size", 3),
    ("gradient_accumulation_steps: 2\n", "grad_accum", 2),
])
def test_config_takes_the_cli_spellings(tmp_path, text, key, value):
    assert load_run_file(_config(tmp_path, "method: lora\n" + text))[key] == value


def test_config_merge_keys_work_as_in_safe_load(tmp_path):
    text = "defaults: &d {model: tiny, lr: 1e-3}\n"
    with pytest.raises(ConfigError, match="unknown option 'defaults'"):  # the anchor's holder is a key too
        load_run_file(_config(tmp_path, text + "<<: *d\n"))
    values = load_run_file(_config(tmp_path, "<<: {model: tiny, lr: 1e-3, max_steps: 4}\nlr: 2e-4\nmethod: full\n"))
    assert values["model"] == "tiny" and values["lr"] == 2e-4 and values["max_steps"] == 4


@pytest.mark.parametrize("text, words", [
    ("<<: 3\n", ["merge key '<<'", "not a scalar", "line 1"]),
    ("lr: 1e-4\nlearning_rate: 2e-4\n", ["learning_rate", "lr", "give it once"]),
    ("max_steps: 1\nmax-steps: 2\n", ["max-steps", "max_steps", "give it once"]),
    ("schema_version: 1\nwarmup_steps: 2\nmeasure_warmup_steps: 1\n", ["warmup_steps", "measure_warmup_steps"]),
    ("lr: 1\nlr: 2\n", ["line 2", "'lr' is given twice"]),
])
def test_config_refusals_name_the_problem(tmp_path, text, words):
    with pytest.raises(ConfigError) as info:
        load_run_file(_config(tmp_path, text))
    message = str(info.value)
    assert message.startswith("--config run.yaml: ") and "\n" not in message
    assert all(w in message for w in words), message


def test_sweep_schema1_naming_one_option_twice_is_refused(tmp_path):
    from ftprof.bench.sweep import load_sweep

    path = tmp_path / "s.yaml"
    path.write_text("base: {model: tiny, device: cpu, warmup_steps: 2, measure_warmup_steps: 1}\n"
                    "matrix: {method: [lora]}\n")
    with pytest.raises(ConfigError, match="warmup_steps and measure_warmup_steps are one option"):
        load_sweep(path)
