"""`ftprof train <method>`: fine-tune with one method and record throughput, loss and memory."""

from __future__ import annotations

import argparse

from ftprof.cli.common import add_common_arguments, config_from_args
from ftprof.config import METHODS

EXIT_CODES = {"ok": 0, "error": 1, "oom_device": 3, "oom_host": 3, "timeout": 4, "interrupted": 130}


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
    from ftprof.engine import distributed
    from ftprof.engine.run import train

    result = train(config_from_args(args))
    code = EXIT_CODES.get(result.status, 1)
    if distributed.under_torchrun():
        exit_worker(code)
    return code


def exit_worker(code: int) -> None:
    """A torchrun worker leaves without interpreter teardown: gloo's threads can abort it there (seen with torch
    2.14 on CPU: 'terminate called without an active exception') after every file is already written."""
    import os
    import sys

    from ftprof.engine import distributed

    distributed.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
