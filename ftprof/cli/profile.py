"""`ftprof profile [method]`: train under torch.profiler on a schedule; or summarize any existing trace."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from ftprof.cli.common import add_common_arguments, config_from_args
from ftprof.config import METHODS, ProfilingConfig
from ftprof.errors import ConfigError
from ftprof.results.run_dir import CONFIG

# Inside `profile` the --prof-* options also answer to their short names, except where a short name is already a
# training option (--warmup-steps is the training warm-up, --output-dir the run directory's parent).
TAKEN = {"warmup_steps", "output_dir", "profile"}
SHORT_ALIASES = {f.name: "--" + f.name.removeprefix("prof_").replace("_", "-") for f in fields(ProfilingConfig)
                 if f.name.startswith("prof_") and f.name.removeprefix("prof_") not in TAKEN}


def profile_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "profile", help="train under torch.profiler on a wait/warmup/active schedule and explain where time went",
        description="Run the same training as `ftprof train` under torch.profiler, export traces, tables, stacks, "
                    "memory timeline and allocator snapshot, and summarize where the time went. "
                    "--summarize TRACE summarizes an existing trace from any torch.profiler run instead.")
    parser.add_argument("method", nargs="?", default="qlora", choices=METHODS,
                        help="fine-tuning method (default: qlora)")
    parser.add_argument("--summarize", metavar="TRACE", help="summarize this trace (.json or .json.gz) and exit")
    add_common_arguments(parser, skip={"profile"}, aliases=SHORT_ALIASES)
    parser.set_defaults(func=profile_command)
    return parser


def summarize_command(trace: str) -> int:
    from ftprof.console import make_console
    from ftprof.profiling import summary_output
    from ftprof.profiling.trace_summary import summarize

    path = Path(trace).expanduser()
    if not path.is_file():
        raise ConfigError(f"--summarize: '{trace}' does not exist")
    config_path = path.parent.parent / CONFIG  # an ftprof run dir: <run>/profile/<trace>
    run_config = json.loads(config_path.read_text()) if config_path.is_file() else None
    try:
        summary = summarize(path, run_config=run_config)
    except Exception as exc:  # noqa: BLE001 - not JSON, truncated gzip, not a trace...
        raise ConfigError(f"--summarize: cannot read '{trace}' as a trace: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    # <trace name>.summary.json/.md beside the trace: never a name the trace itself could have
    stem = path.name.split(".")[0] + ".summary"
    paths = summary_output.write(summary, path.parent, stem)
    console = make_console()
    console.print(summary_output.rich_view(summary))
    console.print(f"[dim]wrote {paths['summary_json']} and {paths['summary_md']}[/dim]")
    return 0


def profile_command(args: argparse.Namespace) -> int:
    if args.summarize:
        return summarize_command(args.summarize)
    from ftprof.engine.run import train
    from ftprof.results.status import exit_code

    cfg = config_from_args(args, extra_keys={"summarize"})
    cfg = cfg.replace(profile=True)
    if cfg.output.quiet:
        from ftprof.console import silence_third_party

        silence_third_party()
    result = train(cfg)
    return exit_code(result.status)
