"""`ftprof train <method>`: fine-tune with one method and record throughput, loss and memory."""

from __future__ import annotations

import argparse

from ftprof.cli.common import add_method_subparsers, config_from_args


def train_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train", help="fine-tune a causal LM with one method and record per-step throughput, loss and memory",
        description="Fine-tune a causal LM (built-in preset, local checkpoint or hub id) with one method; writes "
                    "config.json, env.json, steps.csv and result.json to a run directory.")
    add_method_subparsers(parser, "train", train_command)
    parser.set_defaults(func=train_command)
    return parser


def train_command(args: argparse.Namespace) -> int:
    from ftprof.checks import check_before_run

    cfg = config_from_args(args)
    check_before_run(cfg)  # bad input: one line, exit 2, before torch is imported
    if cfg.output.quiet:
        from ftprof.console import silence_third_party

        silence_third_party()  # before torch, transformers and peft are imported
    from ftprof.engine.run import train
    from ftprof.engine.worker import exit_worker
    from ftprof.ranks import under_torchrun
    from ftprof.results.status import exit_code

    code = exit_code(train(cfg).status)
    if under_torchrun():  # started by the user's own torchrun
        exit_worker(code)
    return code
