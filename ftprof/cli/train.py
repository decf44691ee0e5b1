"""`ftprof train <method>`: fine-tune with one method and record throughput, loss and memory."""

from __future__ import annotations

import argparse

from ftprof.cli.common import add_common_arguments, config_from_args
from ftprof.config import METHODS


def train_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train", help="fine-tune a causal LM with one method and record per-step throughput, loss and memory",
        description="Fine-tune a causal LM (built-in preset, local checkpoint or hub id) with one method; writes "
                    "config.json, env.json, steps.csv and result.json to a run directory.")
    parser.add_argument("method", choices=METHODS, help="fine-tuning method")
    add_common_arguments(parser)
    parser.set_defaults(func=train_command)
    return parser


def train_command(args: argparse.Namespace) -> int:
    from ftprof.engine.run import train
    from ftprof.engine.worker import exit_worker
    from ftprof.ranks import under_torchrun
    from ftprof.results.status import exit_code

    code = exit_code(train(config_from_args(args)).status)
    if under_torchrun():  # started by the user's own torchrun
        exit_worker(code)
    return code
