"""Two lengths of --help for the commands that run training: ``--help`` shows the options most runs use, and
``--help-all`` every option (``ftprof train qlora --help-all`` is some 350 lines).

The short form hides the other options from the help text only, for the time it is formatted: every option still
parses, whichever help was asked for.
"""

from __future__ import annotations

import argparse
import re

# The options most runs use (config field names, and the dest of the CLI-only ones). Options of profiling (and
# --summarize, --baseline) only in `profile`'s short help.
SHORT_OPTIONS = frozenset({
    "config", "model", "dtype", "checkpointing", "kernels", "compile", "dataset", "seq_len", "batch_size",
    "grad_accum", "max_steps", "lr", "save", "eval_dataset", "eval_steps", "output_dir", "device"})
PROFILE_SHORT_OPTIONS = (SHORT_OPTIONS - {"save", "eval_dataset", "eval_steps"}) | {
    "summarize", "baseline", "prof_active_steps", "prof_record_shapes"}
# One line instead of a paragraph, in the short help only (the full help keeps each option's whole text).
SHORT_TEXT = {
    "model": "preset name, checkpoint directory or hub id",
    "dtype": "auto = float32 on CPU, bfloat16 on CUDA",
    "max_steps": "optimizer steps to run",
    "prof_record_shapes": "operator shapes (GEMMs split in the summary, FLOPs counted)",
    "checkpointing": "activation checkpointing: none, full, selective or auto",
    "kernels": "eager, or liger (Liger-Kernel's fused ops; CUDA)",
    "compile": "torch.compile each decoder block",
    "dataset": "synthetic, a data file or folder, or a hub dataset name",
    "eval_dataset": "data to evaluate on (read like --dataset)",
    "eval_steps": "evaluate every N optimizer steps, and after the last",
    "save": "save what was trained after the last step (the adapter, or the whole model for full)",
    "summarize": "summarize this trace or cycle folder, and exit",
    "baseline": "with --summarize: compare against this profile (A/B, bucket by bucket)",
}
# plan: its own options, the shape it plans for, and the budget.
PLAN_SHORT_OPTIONS = frozenset({"gpu", "gpus", "top", "show", "verify", "plan_dir", "model", "dtype", "seq_len",
                                "batch_size", "grad_accum", "memory_limit_gib", "device", "output_dir"})
_DEFAULT = re.compile(r"\s*\(default:? [^()]*(\([^()]*\)[^()]*)*\)\s*$")
COMMANDS = ("train", "profile", "plan")  # bench's and report's --help are short already (--help-all: the same)


class HelpAllAction(argparse.Action):
    """``--help-all``: the help with every option, then exit."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.print_help_all()
        parser.exit()


def _hideable(action: argparse.Action, keep: frozenset[str]) -> bool:
    """Out of the short help: an option not in ``keep``, or another spelling with its own flag (--bf16 sets
    --dtype: its first flag is not the option's own name)."""
    if not action.option_strings or action.help is argparse.SUPPRESS or \
            isinstance(action, argparse._HelpAction | argparse._VersionAction | HelpAllAction):
        return False
    return action.dest not in keep or not _own_flag(action)


def _own_flag(action: argparse.Action) -> bool:
    """The option is spelled by its own name (not --bf16, which sets --dtype)."""
    return bool(action.option_strings) and action.option_strings[0] == "--" + str(action.dest).replace("_", "-")


def _one_line(action: argparse.Action) -> str:
    """The short help's text of an option: SHORT_TEXT's line, with the full text's default if it has one."""
    default = _DEFAULT.search(action.help or "")
    return SHORT_TEXT[action.dest] + (default.group(0).rstrip() if default else "")


def short_help(parser: argparse.ArgumentParser, keep: frozenset[str] = SHORT_OPTIONS) -> str:
    """``parser``'s help with only the ``keep`` options, one line of text each where the full text is long, and a
    line saying how many more --help-all shows."""
    hidden = [a for a in parser._actions if _hideable(a, keep)]
    shortened = [a for a in parser._actions if a.dest in SHORT_TEXT and a not in hidden and _own_flag(a)
                 and a.help is not argparse.SUPPRESS]  # (an option hidden from every help stays hidden)
    saved = [(a, a.help) for a in hidden + shortened]
    saved_usage = parser.usage
    for action in hidden:
        action.help = argparse.SUPPRESS
    for action in shortened:
        action.help = _one_line(action)
    parser.usage = "%(prog)s [options]" if hidden and parser.usage is None else parser.usage
    try:
        text = type(parser).format_help(parser)
    finally:
        parser.usage = saved_usage
        for action, text_before in saved:
            action.help = text_before
    if not hidden:
        return text
    return text + f"\n{len(hidden)} more options: {parser.prog} --help-all\n"


def install(parser: argparse.ArgumentParser, keep: frozenset[str] = SHORT_OPTIONS) -> None:
    """--help becomes the short help and --help-all the full one, on ``parser`` only."""
    import sys

    full = type(parser).format_help

    def print_help_all(file=None) -> None:
        parser._print_message(full(parser), file or sys.stdout)

    parser.format_help = lambda: short_help(parser, keep)
    parser.print_help_all = print_help_all
    parser.add_argument("--help-all", action=HelpAllAction, help="show every option and exit")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name, sub in action.choices.items()}


def install_short_help(root: argparse.ArgumentParser, commands: tuple[str, ...] = COMMANDS) -> None:
    """Short and full help on each of ``commands`` and on their method sub-commands (``ftprof train qlora``)."""
    for name, parser in _subparsers(root).items():
        if name not in commands:  # a short help already: --help-all is the same, so that every command takes it
            parser.print_help_all = parser.print_help
            parser.add_argument("--help-all", action=HelpAllAction, help="the same as --help: every option is shown")
            continue
        keep = {"profile": PROFILE_SHORT_OPTIONS, "plan": PLAN_SHORT_OPTIONS}.get(name, SHORT_OPTIONS)
        install(parser, keep)
        for method_parser in _subparsers(parser).values():
            install(method_parser, keep)
