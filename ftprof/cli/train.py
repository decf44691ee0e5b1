"""`ftprof train <method>`: fine-tune with one method and record throughput, loss and memory."""

from __future__ import annotations

import argparse

from ftprof.cli.common import add_common_arguments, config_from_args
from ftprof.config import METHODS, inapplicable_options

METHOD_HELP = {"full": "every weight trained (AdamW state for all of them)",
               "lora": "LoRA adapters on a frozen base in the run dtype",
               "qlora": "LoRA adapters on a bitsandbytes 4-bit (NF4) base",
               "gptq-lora": "LoRA adapters on a GPTQ-quantized base (GPTQModel)"}


def train_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train", help="fine-tune a causal LM with one method and record per-step throughput, loss and memory",
        description="Fine-tune a causal LM (built-in preset, local checkpoint or hub id) with one method; writes "
                    "config.json, env.json, steps.csv and result.json to a run directory.")
    # One sub-parser per method, so that `ftprof train full --help` lists only the options full accepts. The others
    # still parse (hidden), so that giving one gets the config's own message ("--lora-r is a lora option ...").
    methods = parser.add_subparsers(dest="method", metavar="method", required=True,
                                    title="fine-tuning method")
    for method in METHODS:
        sub = methods.add_parser(method, help=METHOD_HELP[method],
                                 description=f"ftprof train {method}: {METHOD_HELP[method]}.")
        add_common_arguments(sub, hidden=inapplicable_options(method))
        sub.set_defaults(func=train_command)
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
