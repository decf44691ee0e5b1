"""`ftprof profile [method]`: train under torch.profiler on a schedule; or summarize any existing trace."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from ftprof.cli.common import add_common_arguments, add_method_subparsers, config_from_args, path_argument
from ftprof.config import ProfilingConfig, inapplicable_options
from ftprof.errors import ConfigError
from ftprof.results.run_dir import CONFIG

# Inside `profile` the --prof-* options also answer to their short names, except where a short name is already a
# training option (--warmup-steps is the training warm-up, --output-dir the run directory's parent).
TAKEN = {"warmup_steps", "output_dir", "profile"}
SHORT_ALIASES = {f.name: "--" + f.name.removeprefix("prof_").replace("_", "-") for f in fields(ProfilingConfig)
                 if f.name.startswith("prof_") and f.name.removeprefix("prof_") not in TAKEN}


DEFAULT_METHOD = "qlora"


def profile_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "profile", help="train under torch.profiler on a wait/warmup/active schedule and explain where time went",
        description="Train as `ftprof train` does, under torch.profiler; export the traces and summarize where the "
                    "time went. METHOD defaults to qlora. --summarize TRACE summarizes an existing trace instead "
                    "(--baseline: A/B against another).")
    summarize_options = [
        (("--summarize",), dict(metavar="TRACE", type=path_argument,
                                help="summarize this trace (.json or .json.gz), or every rank's trace in a cycle "
                                "folder (profile/cycle1), and exit")),
        (("--baseline",), dict(metavar="TRACE", type=path_argument,
                               help="with --summarize: compare against this profile (a trace, a cycle folder or a "
                               "summary .json): per-bucket time per step, the difference with its 95%% confidence "
                               "interval, the buckets that explain it and the kernels that changed"))]
    for flags, kwargs in summarize_options:
        parser.add_argument(*flags, default=None, **kwargs)
    # The method is optional (`ftprof profile --active-steps 2` profiles qlora): without one, this parser takes the
    # options itself, as the default method's sub-parser would.
    add_common_arguments(parser, skip={"profile"}, aliases=SHORT_ALIASES,
                         hidden=inapplicable_options(DEFAULT_METHOD))
    subs = add_method_subparsers(parser, "profile", profile_command, required=False, skip={"profile"},
                                 aliases=SHORT_ALIASES)
    for sub in subs.values():  # `ftprof profile lora --summarize X` parses as before (the method is ignored)
        for flags, kwargs in summarize_options:
            sub.add_argument(*flags, default=argparse.SUPPRESS, **{**kwargs, "help": argparse.SUPPRESS})
    parser.set_defaults(func=profile_command, method=DEFAULT_METHOD)
    return parser


def _run_config_near(trace: Path) -> dict | None:
    """The config.json of the ftprof run a trace belongs to: <run>/profile/cycle<c>/<trace> (older runs:
    <run>/profile/<trace>)."""
    for parent in list(trace.resolve().parents)[1:3]:
        if (parent / CONFIG).is_file():
            try:
                data = json.loads((parent / CONFIG).read_text())
            except (OSError, ValueError):
                return None  # a damaged run config only loses the dtype hints
            return data if isinstance(data, dict) else None
    return None


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def usable_hints(hints: list[str], gpu_trace: bool) -> list[str]:
    """The open hints that work for this trace here: TensorBoard only with its profiler plugin installed
    (torch-tb-profiler), HTA only for a trace with GPU kernels (it has nothing to analyse in a CPU-only trace) and
    with the package installed. The first line (where the traces are) and Perfetto always."""
    works = {"TensorBoard:": _installed("tensorboard") and _installed("torch_tb_profiler"),
             "HTA:": gpu_trace and _installed("hta")}
    return [h for h in hints if works.get(h.split()[0], True)]


def print_open_hints(result, quiet: bool = False) -> None:
    """Where the traces are and how to open them: the last thing `ftprof profile` prints (under --quiet, only
    where they are)."""
    from ftprof.console import make_console
    from ftprof.profiling.layout import open_hints

    traces = sorted(v for k, v in result.artifacts.items() if k.startswith("trace_rank"))
    if not traces:
        return
    trace_dir = (Path(result.run_dir) / traces[-1]).parent
    if trace_dir.is_dir():
        hints = open_hints(trace_dir)
        gpu_trace = "cuda" in (getattr(result, "profiling", None) or {}).get("activities", [])
        shown = hints[:1] if quiet else usable_hints(hints, gpu_trace)
        make_console().print("\n".join(shown), highlight=False, markup=False, soft_wrap=True)


def _inputs(path_text: str, option: str) -> list[Path]:
    """The traces (or summaries) one side names: a file, or every trace of a cycle folder."""
    from ftprof.profiling.layout import TRACE_SUFFIX

    path = Path(path_text).expanduser()
    if path.is_dir():
        files = sorted(path.glob(f"*{TRACE_SUFFIX}"))
        cycles = sorted({f.parent for f in path.glob(f"*/*{TRACE_SUFFIX}")})  # a run's profile/: its cycle folders
        if not files and len(cycles) == 1:
            return sorted(cycles[0].glob(f"*{TRACE_SUFFIX}"))
        if not files:
            inside = f"; its cycles are in {', '.join(c.name + '/' for c in cycles)}: give one" if cycles else ""
            raise ConfigError(f"{option}: '{path_text}' holds no *{TRACE_SUFFIX} file{inside}")
        return files
    if not path.is_file():
        raise ConfigError(f"{option}: '{path_text}' does not exist")
    return [path]


def _is_summary(path: Path) -> bool:
    return path.suffix == ".json" and "summary" in path.name


def _load(paths: list[Path], option: str) -> list:
    """Summaries (TraceSummary) of traces, or the dicts of summary .json files."""
    from ftprof.analysis.pipeline import summarize

    out = []
    for path in paths:
        try:
            out.append(json.loads(path.read_text()) if _is_summary(path)
                       else summarize(path, run_config=_run_config_near(path)))
        except Exception as exc:  # noqa: BLE001 - not JSON, truncated gzip, not a trace...
            raise ConfigError(f"{option}: cannot read '{path}' as a trace: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
        if not isinstance(out[-1], dict) and not _has_events(out[-1]):
            raise ConfigError(f"{option}: '{path}' holds no trace events (not a torch.profiler trace)")
    return out


def _has_events(summary) -> bool:
    """{} and [] parse as traces of nothing: not a trace someone meant to summarize."""
    return bool(summary.categories_us or summary.top_operators or summary.top_kernels)


def summarize_command(trace: str, baseline: str | None = None) -> int:
    from ftprof.analysis import summary_output
    from ftprof.console import make_console
    from ftprof.profiling.layout import summaries_dir

    paths = _inputs(trace, "--summarize")  # both sides checked before any trace is read
    base_paths = _inputs(baseline, "--baseline") if baseline else []
    summaries = _load(paths, "--summarize")
    baselines = _load(base_paths, "--baseline")  # read before anything prints: a bad one is the only output
    console = make_console()
    for path, summary in zip(paths, summaries, strict=True):
        if isinstance(summary, dict):
            continue  # a summary file given as the new side: nothing to write
        # <trace name>.summary.json/.md: never a name the trace itself could have; outside ftprof's cycle folders
        out = summary_output.write(summary, summaries_dir(path), path.name.split(".")[0] + ".summary")
        console.print(summary_output.rich_view(summary))
        console.print(f"[dim]wrote {out['summary_json']} and {out['summary_md']}[/dim]")
    if len(summaries) > 1 and not any(isinstance(s, dict) for s in summaries):
        console.print(summary_output.ranks_table(summaries))
    if base_paths:
        _compare(console, baselines, summaries, base_paths, paths)
    return 0


def _side_name(paths: list[Path]) -> str:
    """A side's name when its run's config does not give one: the cycle folder's run, or the trace's stem."""
    first = paths[0]
    if len(paths) > 1 or first.parent.name.startswith("cycle"):
        run = first.parent.parent.parent if first.parent.name.startswith("cycle") else first.parent
        return run.name if run.name else first.parent.name
    return first.name.split(".")[0]


def _describe_side(items: list, paths: list[Path], fallback: str):
    """Who a side is (diff_sides.Side): its run's name, method and shape, from its run's config.json where the
    trace lies in a run directory, else from the ftprof block in the trace."""
    from ftprof.analysis.diff_sides import side_of

    first = items[0] if isinstance(items[0], dict) else items[0].to_dict()
    config = None if _is_summary(paths[0]) else _run_config_near(paths[0])
    return side_of(first, _side_name(paths) or fallback, config)


def _compare(console, base: list, new: list, base_paths: list[Path], paths: list[Path]) -> None:
    from ftprof.analysis import diff_output
    from ftprof.analysis.diff import diff_summaries
    from ftprof.profiling.layout import summaries_dir
    from ftprof.results.store import write_json_atomic, write_text_atomic

    def as_dicts(items):
        return [s if isinstance(s, dict) else s.to_dict() for s in items]

    a_side, b_side = _describe_side(base, base_paths, "A"), _describe_side(new, paths, "B")
    if a_side.name == b_side.name:  # two cycles of one run, or two traces of one name: say which is which
        a_side.name, b_side.name = f"{a_side.name} (baseline)", f"{b_side.name} (new)"
    try:
        d = diff_summaries(as_dicts(base), as_dicts(new), sides=(a_side, b_side))
    except ValueError as exc:
        raise ConfigError(f"--baseline: {exc}") from None
    console.print(diff_output.rich_view(d, a_side.name, b_side.name))
    stem = str(summaries_dir(paths[0]) / f"{_diff_name(base_paths[0], paths[0])}.diff")
    write_json_atomic(Path(stem + ".json"), d.to_dict())
    write_text_atomic(Path(stem + ".md"), diff_output.to_markdown(d, a_side.name, b_side.name))
    console.print(f"[dim]wrote {stem}.json and {stem}.md[/dim]")


def _diff_name(base: Path, new: Path) -> str:
    """``NEW.vs-BASE``: each baseline's comparison a file of its own (one name overwrote the last). Two cycles of
    one run have the same trace name: the baseline's folder tells them apart."""
    stem = lambda p: p.name.split(".")[0]  # noqa: E731 - a trace's or a summary's name without its suffixes
    other = stem(base) if stem(base) != stem(new) else f"{base.resolve().parent.name}-{stem(base)}"
    return f"{stem(new)}.vs-{other}"


def _check_summarize_only(args: argparse.Namespace) -> None:
    """--summarize reads traces: a run's option beside it would do nothing, and a trace is no baseline of itself."""
    from ftprof.config import SECTIONS

    run_options = {f.name for cls in SECTIONS.values() for f in fields(cls)} - {"method"}
    given = sorted(k for k in vars(args) if k in run_options)
    if given:
        raise ConfigError(f"--{given[0].replace('_', '-')} is an option of a run, and --summarize reads traces a run "
                          "already wrote: leave it out (or leave out --summarize to profile a new run)")
    if args.baseline and Path(args.baseline).expanduser().resolve() == Path(args.summarize).expanduser().resolve():
        raise ConfigError("--baseline names the trace --summarize reads: compare against another profile")


def profile_command(args: argparse.Namespace) -> int:
    if args.baseline and not args.summarize:
        raise ConfigError("--baseline needs --summarize (the profile to compare against it)")
    if args.summarize:
        _check_summarize_only(args)
        return summarize_command(args.summarize, args.baseline)
    from ftprof.checks import check_before_run

    cfg = config_from_args(args, extra_keys={"summarize", "baseline"})
    cfg = cfg.replace(profile=True)
    check_before_run(cfg)  # bad input: one line, exit 2, before torch is imported
    if cfg.output.quiet:
        from ftprof.console import silence_third_party

        silence_third_party()
    from ftprof.engine.run import train
    from ftprof.engine.worker import sigterm_stops_the_run
    from ftprof.results.status import exit_code

    with sigterm_stops_the_run():
        result = train(cfg)
    print_open_hints(result, quiet=bool(cfg.output.quiet))
    return exit_code(result.status)
