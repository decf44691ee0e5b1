"""The `ftprof` console script: a root parser with one module per subcommand."""

from __future__ import annotations

import errno
import sys

from ftprof.cli.bench import bench_parser
from ftprof.cli.common import OneLineErrorParser
from ftprof.cli.help import install_short_help
from ftprof.cli.plan import plan_parser
from ftprof.cli.profile import profile_parser
from ftprof.cli.report import report_parser
from ftprof.cli.train import train_parser
from ftprof.errors import FtprofError, StorageError


def build_parser() -> OneLineErrorParser:
    from ftprof import __version__

    parser = OneLineErrorParser(prog="ftprof", description="Measure fine-tuning: speed, memory, where the time goes.")
    parser.add_argument("--version", action="version", version=f"ftprof {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                       parser_class=OneLineErrorParser)
    train_parser(subparsers)
    profile_parser(subparsers)
    bench_parser(subparsers)
    report_parser(subparsers)
    plan_parser(subparsers)
    install_short_help(parser)  # train and profile: --help the options most runs use, --help-all every one
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    words = sys.argv[1:] if argv is None else list(argv)
    if words and words[0].startswith("-") and words[0] not in parser._option_string_actions:
        parser.error(f"unrecognized arguments: {words[0]}")  # before argparse asks for the COMMAND it lacks
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except StorageError as exc:  # a full disk is not bad input: exit 1, files written so far stay
        print(f"ftprof {args.command}: error: {exc.strerror}", file=sys.stderr)
        return 1
    except FtprofError as exc:
        print(f"ftprof {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        # a path with a component longer than the file system allows: the checks' exists() and is_dir() raise
        # this where a missing path would return False, so it is bad input wherever it was first looked at
        print(f"ftprof {args.command}: error: {_shortened(exc.filename)}: a name in this path is longer than the "
              "file system allows", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ftprof: interrupted", file=sys.stderr)
        return 130


def _shortened(path: object, keep: int = 60) -> str:
    text = str(path or "a path")
    return f"'{text[:keep]}...'" if len(text) > keep else f"'{text}'"


if __name__ == "__main__":
    sys.exit(main())
