"""`ftprof train <method>`: fine-tune with one method and record throughput, loss and memory.

``--config run.yaml`` gives the options (and the method) from a file; options on the command line override it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ftprof.cli.common import (
    FASTEST_WORDS,
    add_common_arguments,
    add_method_subparsers,
    config_from_args,
    path_argument,
)
from ftprof.config import METHODS
from ftprof.errors import ConfigError

CONFIG_HELP = ("a YAML file of options (the keys of a sweep file's base, method among them); options given here "
               "override it")


def train_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train", help="fine-tune a causal LM with one method and record per-step throughput, loss and memory",
        description="Fine-tune a causal LM (built-in preset, local checkpoint or hub id) with one method; writes "
                    "config.json, env.json, steps.csv and result.json to a run directory. The method may come "
                    "from --config instead.")
    parser.add_argument("--config", metavar="FILE", type=path_argument, default=None, help=CONFIG_HELP)
    # Without a method (`ftprof train --config run.yaml --lr 1e-4`) this parser takes the options itself: its
    # --help shows the options most runs use, as `ftprof train METHOD --help` does, and --help-all every one.
    add_common_arguments(parser)
    subs = add_method_subparsers(parser, "train", train_command, required=False)
    for method, sub in subs.items():
        sub.add_argument("--config", metavar="FILE", type=path_argument, default=argparse.SUPPRESS, help=CONFIG_HELP)
        sub.intent_hints = dict.fromkeys(FASTEST_WORDS, f"ftprof train runs the options it is given; `ftprof plan "
                                         f"{method} --train` tries every option within --memory-limit-gib and "
                                         "trains the fastest measured")
    # (after the method sub-commands: argparse names them from the usage in force when they are added)
    parser.usage = "%(prog)s METHOD [options]   (METHOD: " + ", ".join(METHODS) + "; or 'method' in --config)"
    parser.set_defaults(func=train_command)
    return parser


def config_with_file(args: argparse.Namespace):
    """The RunConfig from --config's file (if any) under the options given on the command line."""
    from ftprof.config.file import load_run_file

    values = load_run_file(args.config) if getattr(args, "config", None) else {}
    given = {k: v for k, v in vars(args).items() if v is not None or k != "method"}
    method = given.get("method") or values.get("method")
    if method is None:
        raise ConfigError(f"give a method ({', '.join(METHODS)}), or 'method' in --config")
    merged = argparse.Namespace(**{**values, **given, "method": method})
    if "max_steps" in given and "num_train_epochs" in given:
        raise ConfigError("--max-steps and --num-train-epochs both say how long to train: give one")
    # The command line's length of training wins over the file's (in a file, epochs win over max_steps).
    if "num_train_epochs" in given:
        vars(merged).pop("max_steps", None)
    if "max_steps" in given:
        vars(merged).pop("num_train_epochs", None)
    try:
        return config_from_args(merged)
    except ConfigError as exc:
        raise ConfigError(_naming_the_file(str(exc), args, values, given)) from None


def _naming_the_file(message: str, args: argparse.Namespace, values: dict, given: dict) -> str:
    """A refusal of an option that came from --config's file (not the command line) says so: the user typed no
    --lora-r, the file holds lora_r."""
    from_file = [k for k in values if k not in given and k != "method"]
    if any(f"'{k}'" in message or f"--{k.replace('_', '-')}" in message for k in from_file):
        return f"--config {Path(args.config).name}: {message}"
    return message


def train_command(args: argparse.Namespace) -> int:
    import sys

    from ftprof.checks import check_before_run, length_notes

    cfg = config_with_file(args)
    check_before_run(cfg)  # bad input: one line, exit 2, before torch is imported
    from ftprof.engine.run import resolve_resume

    cfg = resolve_resume(cfg)  # before the run dir it names could be emptied by --overwrite-output-dir
    from ftprof.results.run_dir import replace_named_run

    replace_named_run(cfg.output.output_dir, cfg.output.run_name, cfg.output.overwrite_output_dir)
    for note in length_notes(cfg):
        print(f"ftprof: note: {note}", file=sys.stderr, flush=True)
    if cfg.output.quiet:
        from ftprof.console import silence_third_party

        silence_third_party()  # before torch, transformers and peft are imported
    from ftprof.engine.run import train
    from ftprof.engine.worker import exit_worker, sigterm_stops_the_run
    from ftprof.ranks import under_torchrun
    from ftprof.results.status import exit_code

    with sigterm_stops_the_run():
        code = exit_code(train(cfg).status)
    if under_torchrun():  # started by the user's own torchrun
        exit_worker(code)
    return code
