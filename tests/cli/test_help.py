"""--help shows the options most runs use; --help-all every option (and every option parses either way)."""

import subprocess
import sys

import pytest

from ftprof.cli.common import option_names
from ftprof.config import inapplicable_options


def _help(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "ftprof", *argv], capture_output=True, text=True,
                          env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("argv", [("train", "qlora"), ("train", "full"), ("train",), ("profile",),
                                  ("profile", "lora")])
def test_short_help_is_short_and_names_the_common_options(argv):
    text = _help(*argv, "--help")
    assert len(text.splitlines()) <= (72 if argv == ("train",) else 65), text  # (train alone lists the methods)
    for option in ("--model", "--dtype", "--checkpointing", "--kernels", "--compile", "--dataset", "--seq-len",
                   "--batch-size", "--grad-accum", "--max-steps", "--lr", "--output-dir", "--device"):
        assert option in text, option
    assert "--help-all" in text and "--lora-dropout" not in text and "--fsdp-cpu-offload" not in text
    if argv[0] == "train":
        assert "--save" in text and "--eval-steps" in text
    else:
        assert "--no-prof-record-shapes" in text
        # summarizing a trace takes no method: `profile --help` shows it, `profile lora --help` does not
        assert ("--summarize" in text and "--baseline" in text) == (argv == ("profile",))


def test_train_without_a_method_helps_as_with_one_and_every_command_takes_help_all():
    """`ftprof train --help` names the methods and the options most runs use (it showed 11 options, no --seq-len);
    its --help-all every option; bench and report take --help-all too (their --help shows everything already)."""
    text = _help("train", "--help")
    assert "METHOD" in text and "gptq-lora" in text and "--seq-len" in text and "more options" in text
    assert "--prof-record-shapes" not in text  # a profiling option: `ftprof profile`'s short help
    assert "--lora-r" in _help("train", "--help-all")
    for command in ("bench", "report"):
        assert _help(command, "--help-all") == _help(command, "--help")


@pytest.mark.parametrize("command, method", [("train", "qlora"), ("train", "gptq-lora"), ("profile", "full")])
def test_help_all_lists_every_option(command, method):
    text = _help(command, method, "--help-all")
    skip = {"--" + name.replace("_", "-") for name in inapplicable_options(method)}
    if command == "profile":
        skip.add("--profile")  # always on there
    missing = [o for o in option_names() if o not in skip and o not in text]
    assert not missing, missing


def test_an_option_left_out_of_the_short_help_still_parses():
    from ftprof.cli.main import build_parser

    args = build_parser().parse_args(["train", "lora", "--lora-dropout", "0.1", "--fsdp-cpu-offload"])
    assert args.lora_dropout == 0.1 and args.fsdp_cpu_offload is True


def test_another_spelling_of_an_option_is_not_given_the_options_short_text():
    # `ftprof train --help` (no method yet) lists --bf16 and --fp16: each with its own words, not --dtype's
    lines = [ln for ln in _help("train", "--help").splitlines() if ln.strip().startswith(("--bf16", "--fp16"))]
    assert all("float32 on CPU" not in ln for ln in lines), lines
    assert all("the HF Trainer's spelling" in ln for ln in _help("train", "lora", "--help-all").splitlines()
               if ln.strip().startswith(("--bf16 ", "--fp16 "))), "--bf16/--fp16 lost their own help"
