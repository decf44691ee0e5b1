"""The common argument group, generated from the config dataclasses (each option is defined once, in ftprof/config/).

Options default to ``argparse.SUPPRESS``: the namespace holds only what the user typed, and the dataclass defaults
fill the rest, so there is exactly one place where a default lives.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import types
import typing
from dataclasses import MISSING, fields
from typing import Any

from ftprof.config import METHODS, SECTIONS, RunConfig, inapplicable_options
from ftprof.config.options import HF_ALIASES, HF_DTYPE_FLAGS, type_hints

SECTION_TITLES = {"model": "model", "data": "data", "method": "method options (LoRA, bitsandbytes, GPTQ)",
                  "train": "training", "eval": "evaluation", "save": "saving what was trained",
                  "output": "output and device",
                  "profiling": "profiling (torch.profiler; any --prof-* option turns profiling on)",
                  "distributed": "several GPUs (torchrun; FSDP2 or DDP)"}
POSITIONAL = {"method"}  # given as a subcommand argument, not an option
# The names HF's example scripts (run_clm.py, TRL's sft.py) give these options, beside options.HF_ALIASES; read as
# ours by trainer_spellings (left out of --help, which they would lengthen).
SCRIPT_SPELLINGS = {"--model-name-or-path": "--model", "--dataset-name": "--dataset"}
# What people type when they want the fastest configuration for their GPU: a parser's ``intent_hints`` answers them
# with where that is, not with the nearest spelling (``--fast`` was offered ``--format``).
FASTEST_WORDS = ("--fast", "--fastest", "--auto", "--best", "--optimize", "--optimise", "--tune", "--autotune")


class OneLineErrorParser(argparse.ArgumentParser):
    """Usage errors print one line naming the problem (and where --help is), then exit 2. No abbreviations: a
    prefix (``--max-step``) would silently stand for an option, and slip past the check for options given twice."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        if message.startswith("unrecognized arguments:"):
            message += self._closest_option(message.split(":", 1)[1].split())
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)

    def _closest_option(self, words: list[str]) -> str:
        """`` (did you mean '--lora-r'?)`` for the first unknown option, over this parser's own options (the
        subcommand's: :meth:`parse_args` hands what the subcommands left over to the one that was chosen)."""
        unknown = next((w.split("=", 1)[0] for w in words if w.startswith("--")), None)
        if unknown is None:
            return ""
        intent = getattr(self, "intent_hints", {}).get(unknown.lower().replace("_", "-"))
        if intent:
            return f" ({intent})"
        # compared without the dashes every option shares, which would make any two look alike (--dry-run was
        # offered --node-rank)
        known = {o[2:]: o for o in self._option_string_actions if o.startswith("--")}
        hint = difflib.get_close_matches(unknown[2:].lower().replace("_", "-"), list(known), n=1)
        return f" (did you mean '{known[hint[0]]}'?)" if hint else ""

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but arguments nobody took are reported by the subcommand that was chosen (its name in the
        line, its own options in the suggestion), not by the root parser over every subcommand's options."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            _chosen(self, parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def parse_known_args(self, args=None, namespace=None):
        words = trainer_spellings(self, sys.argv[1:] if args is None else list(args))
        self._refuse_repeats(words)
        self._refuse_config(words)
        return super().parse_known_args(words, namespace)

    def _refuse_config(self, words: list[str]) -> None:
        """``--config`` given to a subcommand that reads no config file (only ``ftprof train`` does): say so, before
        argparse takes the file for a positional argument."""
        options = words[:words.index("--")] if "--" in words else words
        if "--config" in _option_strings(self) or not any(w.split("=", 1)[0] == "--config" for w in options):
            return
        bench = self.prog.endswith(" bench")
        how = (f"{self.prog} takes a sweep file as its argument ({self.prog} SWEEP.yaml)" if bench
               else f"give {self.prog} its options on the command line")
        self.error(f"--config: only `ftprof train` reads a config file; {how}")

    def _refuse_repeats(self, words: list[str]) -> None:
        """An option given twice, under any of its spellings (``--active-steps 2 --prof-active-steps 3``, or
        ``--packing --no-packing``), is an error: argparse would silently keep the last."""
        given: dict[str, str] = {}
        for word in words:
            if word == "--":
                break
            if not word.startswith("--"):
                continue
            action = self._option_string_actions.get(word.split("=", 1)[0])
            if action is None or action.dest in ("help", "version") or isinstance(action, argparse._AppendAction):
                continue  # (an append option, --sbatch, is given once per value)
            flag = word.split("=", 1)[0]
            if action.dest in given:
                both = f"; both set --{action.dest.replace('_', '-')}" if flag != given[action.dest] else ""
                self.error(f"{flag} repeats {given[action.dest]}{both} (give each option once)")
            given[action.dest] = flag


BOOL_WORDS = {"true": True, "t": True, "yes": True, "y": True, "1": True,
              "false": False, "f": False, "no": False, "n": False, "0": False}  # HF's string_to_bool


def trainer_spellings(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """The HF Trainer's spellings in ours, for the options ``parser`` knows: ``--learning_rate`` (underscores) ->
    ``--learning-rate``; a yes/no option with a value (``--packing true``, ``--gradient_checkpointing=false``) ->
    ``--packing`` / ``--no-gradient-checkpointing``; ``--bf16 true`` -> ``--bf16``, ``--bf16 false`` -> nothing when
    the other precision flag is on, else ``--dtype float32`` (the Trainer trains in float32 without either).
    Words after ``--`` and words that are no option of ``parser`` are left as they are."""
    known = parser._option_string_actions
    out: list[str] = []
    dtype_off = None  # where the first `--bf16/--fp16 false` went, and whether a true one came
    dtype_on = False
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            out += words[i:]
            break
        flag = word.split("=", 1)[0]
        if word.startswith("--") and flag not in known:
            flag = flag.replace("_", "-")
            flag = SCRIPT_SPELLINGS.get(flag, flag)
        if not word.startswith("--") or flag not in known:
            out.append(word)
            i += 1
            continue
        value = word.split("=", 1)[1] if "=" in word else None
        action = known[flag]
        takes_no_value = action.nargs == 0
        if takes_no_value:
            given = value
            if given is None and i + 1 < len(words) and words[i + 1].lower() in BOOL_WORDS:
                given, i = words[i + 1], i + 1
            i += 1
            on = True if given is None else BOOL_WORDS.get(given.lower())
            if on is None:  # `--packing=maybe`: argparse's own message
                out.append(word)
                continue
            if flag in HF_DTYPE_FLAGS:
                dtype_on = dtype_on or on
                if on:
                    out.append(flag)
                elif dtype_off is None:
                    dtype_off = len(out)
                    out.append("")  # filled in below
                continue
            if isinstance(action, argparse.BooleanOptionalAction) and not on:
                flag = "--no-" + flag[2:] if not flag.startswith("--no-") else "--" + flag[5:]
            elif not on:  # a store_true flag given `false`: not given
                continue
            out.append(flag)
            continue
        out.append(flag if value is None else f"{flag}={value}")
        i += 1
    if dtype_off is not None:
        out[dtype_off:dtype_off + 1] = [] if dtype_on else ["--dtype", "float32"]
    return out


def _chosen(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> argparse.ArgumentParser:
    """The deepest subcommand parser that ``parsed`` went through (``ftprof train qlora``'s), or ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = action.choices.get(getattr(parsed, action.dest, None) or "")
            if sub is not None:
                return _chosen(sub, parsed)
    return parser


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every long option of ``parser`` and of its subcommands, all the way down."""
    out = {o for o in parser._option_string_actions if o.startswith("--")}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _option_strings(sub)
    return out


def path_argument(value: str) -> str:
    """An argparse type for a path: an empty one (an unset shell variable) is an error, not "not given"."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return value


def _base_type(annotation: Any) -> Any:
    """int/float/str/bool/tuple from annotations such as Optional[int] or Optional[tuple[str, ...]]."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _base_type(args[0])
    if origin is tuple:
        return tuple
    return annotation


def _help(f, base: Any) -> str:
    text = f.metadata.get("help", "")
    if f.default is not MISSING and f.default is not None:
        shown = f.default if base is not bool else ("on" if f.default else "off")
        text += f" (default: {shown})"
    return text.replace("%", "%%")


def add_field_option(group, f, hints: dict[str, Any], aliases: dict[str, str] | None = None,
                     hidden: bool = False) -> None:
    """One option from a config field; ``hidden`` keeps it parseable (so that its misuse gets the config's own
    message) but out of --help."""
    base = _base_type(hints[f.name])
    flags = ["--" + f.name.replace("_", "-")]
    if aliases and f.name in aliases:
        flags.append(aliases[f.name])
    kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                              "help": argparse.SUPPRESS if hidden else _help(f, base)}
    if base is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = str if base is tuple else base
        if f.metadata.get("choices"):
            kwargs["choices"] = f.metadata["choices"]
        if f.metadata.get("metavar"):
            kwargs["metavar"] = f.metadata["metavar"]
    group.add_argument(*flags, **kwargs)


def add_common_arguments(parser: argparse.ArgumentParser, skip: set[str] = frozenset(),
                         aliases: dict[str, str] | None = None, hidden: set[str] = frozenset()) -> None:
    """The options shared by every subcommand that runs training (train, profile; bench reuses the names).
    ``hidden``: accepted but left out of --help (the method options a method does not take)."""
    aliases = {**HF_ALIASES, **(aliases or {})}
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(SECTION_TITLES[section])
        hints = type_hints(cls)
        for f in fields(cls):
            if f.name not in POSITIONAL and f.name not in skip:
                add_field_option(group, f, hints, aliases, hidden=f.name in hidden)
            if f.name == "dtype" and "dtype" not in skip:
                for flag, dtype in HF_DTYPE_FLAGS.items():
                    group.add_argument(flag, dest="dtype", action="store_const", const=dtype,
                                       default=argparse.SUPPRESS, help=argparse.SUPPRESS if "dtype" in hidden
                                       else f"--dtype {dtype} (the HF Trainer's spelling; here the weights "
                                       "themselves are in that dtype, with no fp32 master copy"
                                       + (" or loss scaling: a full fine-tune can overflow, --bf16 does not)"
                                          if dtype == "float16" else ")"))


METHOD_HELP = {"full": "every weight trained (AdamW state for all of them)",
               "lora": "LoRA adapters on a frozen base in the run dtype",
               "qlora": "LoRA adapters on a bitsandbytes 4-bit (NF4) base",
               "gptq-lora": "LoRA adapters on a GPTQ-quantized base (GPTQModel)"}


def add_method_subparsers(parser: argparse.ArgumentParser, command: str, func, required: bool = True,
                          skip: set[str] = frozenset(),
                          aliases: dict[str, str] | None = None) -> dict[str, argparse.ArgumentParser]:
    """One sub-parser per method (train, profile), so that ``ftprof <command> full --help`` lists only the options
    full accepts. The others still parse (hidden), so that giving one gets the config's own message ("--lora-r is a
    lora option ..."), exit 2. Returns the sub-parsers by method."""
    methods = parser.add_subparsers(dest="method", metavar="method", required=required,
                                    title="fine-tuning method")
    subs = {}
    for method in METHODS:
        sub = methods.add_parser(method, help=METHOD_HELP[method],
                                 description=f"ftprof {command} {method}: {METHOD_HELP[method]}.")
        add_common_arguments(sub, skip=skip, aliases=aliases, hidden=inapplicable_options(method))
        sub.set_defaults(func=func)
        subs[method] = sub
    return subs


def config_from_args(args: argparse.Namespace, extra_keys: set[str] = frozenset()) -> RunConfig:
    """RunConfig from a parsed namespace: only options the user gave, over the dataclass defaults."""
    known = {f.name for cls in SECTIONS.values() for f in fields(cls)}
    given = {k: v for k, v in vars(args).items() if k in known and k not in extra_keys}
    if any(k.startswith("prof_") for k in given) and "profile" not in given:
        given["profile"] = True  # `ftprof train qlora --prof-active-steps 2` profiles too
    return RunConfig.from_flat(given)


def option_names() -> list[str]:
    """Every common option's long name, as the CLI spells it."""
    return ["--" + f.name.replace("_", "-") for cls in SECTIONS.values() for f in fields(cls)
            if f.name not in POSITIONAL]
