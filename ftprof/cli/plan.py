"""`ftprof plan METHOD[,METHOD...]`: predict each configuration's peak memory per GPU and tokens/s before anything
trains; rank them against a memory budget; write plan.json, plan.csv and a sweep of the top K; --verify K runs
them and prints predicted against measured."""

from __future__ import annotations

import argparse
from pathlib import Path

from ftprof.cli.common import FASTEST_WORDS, add_common_arguments, config_from_args, path_argument
from ftprof.config import METHODS
from ftprof.config.declarations import DECLARED
from ftprof.errors import ConfigError

PLAN_OPTIONS = {"gpu", "gpus", "top", "show", "verify", "plan_dir", "methods", "train", "trial_steps"}
TRIAL_STEPS = 8
# The options each candidate sets, which the plan chooses among: given, they pin its candidates to their value
CANDIDATE_OPTIONS = frozenset({"checkpointing", "gradient_checkpointing", "checkpoint_layers", "kernels", "compile",
                               *(d.name for d in DECLARED if d.planner_values)})
# Options that act only in some plans: (where they act, what they do). Given where they would not act, they would be
# ignored, or run rows planned for another machine here, so they are refused. HERE: this machine, and any --gpu plans
# for another (even for this machine's model: its budget is then the card's memory, not what is free here); TRAIN:
# --train (its trials; its full run, which alone takes a run's name: bench names each row's run itself).
HERE, TRAIN = "here", "train"
ACTS_ONLY = {"verify": (HERE, "runs the plan's top rows"), "train": (HERE, "trains"),
             "device": (HERE, "picks the device"), "trial_steps": (TRAIN, "times --train's trials"),
             "run_name": (TRAIN, "names --train's run"), "quiet": (TRAIN, "quiets --train's run")}


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def plan_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plan", help="predict peak memory and tokens/s of every configuration before training, and rank them",
        description="Predict, for one model and shape, each configuration's peak memory per GPU and tokens/s "
                    "(methods, checkpointing none/selective/full and partial, kernels, compile, micro-batch x "
                    "gradient accumulation at the same tokens per step) without training the model: memory from a "
                    "two-layer probe of the model on the CPU, speed from FLOPs and the calibration store. Ranks "
                    "them against --memory-limit-gib (or the GPU's memory), writes plan.json, plan.csv and "
                    "plan-sweep.yaml (the top K, for ftprof bench).")
    parser.add_argument("methods", metavar="METHOD[,METHOD...]",
                        help=f"the methods to compare: one of {', '.join(METHODS)}, several comma-separated, or all")
    parser.add_argument("--gpu", metavar="NAME", help="plan for this GPU (e.g. h200, h100, a100-80gb, l4, rtx4090) "
                        "instead of this machine's: works on a CPU machine too")
    parser.add_argument("--gpus", type=_positive, default=1, help="GPUs per run (FSDP2 shards the model over them)")
    parser.add_argument("--top", type=_positive, default=5, help="configurations in plan-sweep.yaml (default 5)")
    parser.add_argument("--show", type=_positive, default=15, help="rows of the table (default 15)")
    parser.add_argument("--verify", type=_positive, metavar="K", help="run the top K with ftprof bench and print "
                        "predicted against measured")
    parser.add_argument("--train", action="store_true",
                        help="from the plan to a training run: time the top K (--verify K, default 3) for "
                        "--trial-steps steps each, then train the full run (--max-steps) with the fastest measured; "
                        "its result.json records the plan, the trials and the choice")
    parser.add_argument("--trial-steps", type=_positive,
                        help=f"steps each trial of --train runs (default {TRIAL_STEPS}: 3 warm-up, 5 timed)")
    parser.add_argument("--plan-dir", type=path_argument,
                        help="where the plan's files go (default: <output-dir>/plan-<model>-s<seq>-<batch>x<accum>-"
                        "<gpu>[-<budget>g])")
    add_common_arguments(parser)
    parser.intent_hints = dict.fromkeys(FASTEST_WORDS, FASTEST_HINT)
    parser.set_defaults(func=plan_command)
    return parser


FASTEST_HINT = ("the plan ranks every option by predicted speed already: its top row is the fastest predicted to "
                "fit --memory-limit-gib; --verify K times the top K, --train trains the fastest measured")


def parse_methods(text: str) -> tuple[str, ...]:
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    if "all" in names:
        if len(names) > 1:
            raise ConfigError(f"'{text}': all already means every method; give all alone, or methods from "
                              f"{', '.join(METHODS)} comma-separated")
        names = METHODS
    for name in names:
        if name not in METHODS:
            raise ConfigError(f"unknown method '{name}'; choose from {', '.join(METHODS)} (comma-separated), "
                              "or all for every one")
    if not names:
        raise ConfigError(f"give at least one method ({', '.join(METHODS)}, comma-separated), or all")
    return tuple(dict.fromkeys(names))


def plan_request(args: argparse.Namespace):
    """The request from the command line: every check that needs no torch, done (one line, exit 2 on a problem)."""
    from ftprof.checks import check_before_load, check_cache_dir, host_has_cuda
    from ftprof.gpus import gpu_named
    from ftprof.plan.make import PlanRequest

    misplaced = _misplaced_option(args)
    if misplaced:
        raise ConfigError(misplaced)
    methods = parse_methods(args.methods)
    if args.gpu is not None:
        gpu_named(args.gpu)
    elif args.gpus > 1 and not host_has_cuda():  # the plan would be for this CPU, one process: --gpus ignored
        raise ConfigError(f"--gpus {args.gpus}: this machine has no NVIDIA GPU; plan for one with --gpu NAME "
                          f"(e.g. --gpu h100 --gpus {args.gpus})")
    methods, notes, needs_here = settle_packages(methods, args)
    given = {k: v for k, v in vars(args).items() if k not in PLAN_OPTIONS | {"func", "command"}}
    lora_like = [m for m in methods if m != "full"]
    cfg = config_from_args(argparse.Namespace(**given, method=(lora_like or list(methods))[0]))
    check_before_load(cfg, method_packages=cfg.method.method not in {m for m, _ in needs_here},
                      weights=bool(args.verify or args.train))  # the probe alone needs config.json only
    check_cache_dir()  # the probes' cache and the calibration store live there
    _check_budget(cfg)
    _check_weights_fit(cfg, methods, args)
    request = PlanRequest(cfg, methods, args.gpu, args.gpus, args.top, notes, needs_here, _pins(cfg, given))
    _check_pins(request)
    return request, given


def _misplaced_option(args: argparse.Namespace) -> str | None:
    """The first option given where it does not act (ACTS_ONLY), as one line; None when each one acts."""
    for name, (where, does) in ACTS_ONLY.items():
        if getattr(args, name, None) in (None, False):  # not given
            continue
        flag = "--" + name.replace("_", "-")
        if where == HERE and args.gpu is not None:
            return (f"{flag} {does} on this machine, but --gpu {args.gpu} plans for another (any --gpu does: the plan "
                    "then takes the card's memory, not what is free here); leave out --gpu to plan for this machine")
        if where == TRAIN and not args.train:
            return f"{flag} {does}: give --train too, or leave {flag} out"
    return None


def _check_budget(cfg) -> None:
    """--memory-limit-gib at or below the budget's margin leaves nothing to plan for: said before the probe."""
    from ftprof.metrics import BUDGET_MARGIN_MIN_BYTES, BUDGET_MARGIN_WORDS, GIB, budget_margin

    limit = cfg.output.memory_limit_gib
    if limit is not None and int(limit * GIB) <= budget_margin(int(limit * GIB)):
        raise ConfigError(f"--memory-limit-gib {limit:g} leaves no budget: the plan keeps a margin of it free "
                          f"({BUDGET_MARGIN_WORDS}), so give more than {BUDGET_MARGIN_MIN_BYTES / GIB:g} GiB")


def _check_weights_fit(cfg, methods, args: argparse.Namespace) -> None:
    """A model whose weights alone, stored the leanest way any planned method stores them (4 bits for QLoRA, GPTQ's
    bits, 16 otherwise) and spread over --gpus, exceed the budget: said before the probe (llama-70b on a 24 GB card
    took a 25 s probe to say nothing fits). The budget: --memory-limit-gib, else the --gpu card's memory."""
    from ftprof.gpus import gpu_named
    from ftprof.metrics import GIB, budget_margin
    from ftprof.models.modules import model_config_dict
    from ftprof.models.source import least_params

    if cfg.output.memory_limit_gib is not None:
        limit = int(cfg.output.memory_limit_gib * GIB)
    elif args.gpu is not None:
        limit = gpu_named(args.gpu).usable_bytes
    else:
        return  # this machine's free memory: read once torch is up
    params = least_params(model_config_dict(cfg.model.model) or {})
    bits = {"qlora": 4, "gptq-lora": cfg.method.gptq_bits or 4}
    method = min(methods, key=lambda m: bits.get(m, 16))
    floor = (params or 0) * bits.get(method, 16) / 8 / max(1, args.gpus)
    budget = limit - budget_margin(limit)
    if floor > budget:
        raise ConfigError(f"nothing can fit: '{cfg.model.model}' has at least {params / 1e9:.1f}B parameters, "
                          f"{floor / GIB:.1f} GiB per GPU in {bits.get(method, 16)} bits ({method}) before any "
                          f"activation, over the {budget / GIB:.1f} GiB budget")


def _pins(cfg, given: dict) -> tuple:
    """(option, value) of the candidate options given (CANDIDATE_OPTIONS): the plan compares only candidates with
    those values. --gradient-checkpointing is --checkpointing full; auto pins nothing (it chooses among the policies,
    as the plan does)."""
    values = cfg.to_flat()
    names = {"checkpointing" if n == "gradient_checkpointing" else n for n in given.keys() & CANDIDATE_OPTIONS}
    if values["checkpointing"] == "auto":
        names.discard("checkpointing")
    if values["checkpoint_layers"] is not None and values["checkpointing"] == "selective":
        raise ConfigError("--checkpoint-layers with --checkpointing selective: the plan checkpoints part of the "
                          "layers under full checkpointing only (give --checkpointing full)")
    return tuple((n, values[n]) for n in sorted(names))


def _check_pins(request) -> None:
    """Pins that no candidate of the target has, refused before the probe where the target is known without torch
    (--gpu NAME, or this machine's CPU); for this machine's GPU make_plan says it once torch knows the GPU."""
    from ftprof.checks import host_has_cuda
    from ftprof.gpus import gpu_named
    from ftprof.plan import candidates
    from ftprof.plan.make import shards

    if not request.pins:
        return
    if request.gpu is not None:
        gpu = gpu_named(request.gpu)
        cuda, capability, target = True, gpu.capability, gpu.name
    elif request.cfg.output.device == "cpu" or not host_has_cuda():
        cuda, capability, target = False, None, "cpu"
    else:
        return
    pins, cfg = dict(request.pins), request.cfg
    layers = 2  # the model's are the probe's to tell; they only place the partial-checkpointing candidates
    if not candidates.for_target(list(request.methods), layers, cfg.data.batch_size, cfg.train.grad_accum, cuda,
                                 capability, pins, shards(cfg, request.gpus), request.gpus > 1):
        raise ConfigError(candidates.nothing_pinned(pins, request.methods, target, cuda, capability))


def settle_packages(methods: tuple[str, ...], args: argparse.Namespace):
    """(methods to plan, notes, (method, package) of rows kept that need a package this machine lacks).

    A method whose package is not installed here: with --verify or --train (the rows run here), or a plan for this
    machine (no --gpu), ``all`` leaves it out with a note and a method named explicitly is refused; a plan for
    --gpu NAME without them keeps its rows (the package may be installed where they run), noted "needs PKG here"."""
    from ftprof.checks import method_package_line, missing_method_package

    missing = {m: miss for m in methods if (miss := missing_method_package(m))}
    if not missing:
        return methods, (), ()
    runs_here = bool(args.verify or args.train)
    if args.gpu is not None and not runs_here:
        notes = tuple(f"{m}: {pkg} is not installed here; its rows are kept for --gpu {args.gpu} (install it where "
                      f"they run: {hint})" for m, (pkg, hint) in missing.items())
        return methods, notes, tuple((m, pkg) for m, (pkg, _) in missing.items())
    if "all" not in (m.strip() for m in args.methods.split(",")):  # named explicitly
        method, miss = next(iter(missing.items()))
        why = ("--train runs the plan's rows here" if args.train else "--verify runs the plan's rows here"
               if runs_here else "the plan is for this machine; for another, give --gpu NAME")
        raise ConfigError(f"{method_package_line(method, miss)} ({why})")
    notes = tuple(f"{m} left out: {pkg} is not installed here ({hint})" for m, (pkg, hint) in missing.items())
    return tuple(m for m in methods if m not in missing), notes, ()


def plan_command(args: argparse.Namespace) -> int:
    request, given = plan_request(args)
    from ftprof.console import make_console
    from ftprof.plan import output
    from ftprof.plan.make import make_plan
    from ftprof.results.store import check_writable_dir

    out_dir = Path(args.plan_dir or Path(request.cfg.output.output_dir) / default_dir_name(request))
    check_writable_dir(out_dir, "--plan-dir" if args.plan_dir else "--output-dir")  # before the plan is computed
    if args.verify:
        check_verify_dir(out_dir, output.sweep_name(request.cfg.model.model))
    console = make_console()
    plan = make_plan(request)
    if not plan.fitting:
        raise ConfigError(nothing_fits(plan))  # one line, exit 2
    from ftprof.bench.sweep import SWEEP_ONLY

    per_experiment = {"method", "batch_size", "grad_accum", *CANDIDATE_OPTIONS}  # the candidates' own options
    base = {k: v for k, v in given.items() if k not in per_experiment | SWEEP_ONLY}
    if request.gpus > 1:  # the rows are predicted for that many GPUs: so are their commands and sweeps
        base["nproc_per_node"] = request.gpus
    if plan.target.device_name == "cpu":  # a CPU plan's budget is the plan's alone: train's cap is a GPU's
        base.pop("memory_limit_gib", None)
    paths = output.write(plan, out_dir.expanduser(), request.top, base)
    for line in request.notes:  # methods left out, packages this machine lacks
        console.print(line, soft_wrap=True, markup=False)  # pip install 'ftprof[gptq]' is not a style
    console.print(output.table(plan, args.show))
    for note in (output.ranking_note(plan), output.margin_note(plan, base)):
        if note:
            console.print(note, soft_wrap=True, markup=False)
    for line in output.sources(plan):
        console.print(line)
    for line in output.peer_lines(plan):
        console.print(line, soft_wrap=True, markup=False)
    for i, row in enumerate(plan.fitting[:3]):
        console.print(f"#{i + 1}: {output.command(plan, row, base)}", soft_wrap=True)
    hidden = len(plan.fitting) - min(args.show, len(plan.fitting))
    more = f" ({hidden} not shown above: --show N, or plan.csv)" if hidden > 0 else ""
    console.print(f"{len(plan.fitting)} of {len(plan.rows)} configurations fit{more}; plan in {plan.seconds:.1f} s "
                  f"(probes {plan.probe_seconds:.1f} s); files: {paths['json']}, {paths['csv']}, {paths['sweep']}")
    if args.train:
        run_own = {k: given[k] for k in SWEEP_ONLY - {"output_dir"} if k in given}  # --run-name, --quiet: its own
        return _train(plan, out_dir, args.verify or 3, args.trial_steps or TRIAL_STEPS, base, paths["json"], console,
                      run_own)
    if args.verify:
        return _verify(plan, paths["sweep"], out_dir, args.verify, request, base, console)
    return 0


def _train(plan, out_dir: Path, k: int, trial_steps: int, base: dict, plan_json: Path, console,
           run_own: dict) -> int:
    """--train: the trials, the choice and the full run (ftprof/bench/autotune.py); ``run_own``: the full run's own
    options (its name, --quiet), which the trials' sweep may not set."""
    from rich.table import Table

    from ftprof.bench import autotune

    trials = autotune.run_trials(plan, k, base, trial_steps, out_dir)
    table = Table(title=f"trials: the plan's top {len(trials)}, {trial_steps} steps each", header_style="bold")
    for name in ("#", "configuration", "predicted tokens/s", "measured tokens/s", "status"):
        table.add_column(name, justify="right" if "tokens" in name or name == "#" else "left")
    for i, t in enumerate(trials):
        table.add_row(str(i + 1), t.label, f"{t.predicted_tokens_per_s:,.0f}" if t.predicted_tokens_per_s else "-",
                      f"{t.tokens_per_s:,.0f}" if t.tokens_per_s else "-", t.status)
    console.print(table)
    try:
        chosen, why = autotune.choose(trials)
    except autotune.NoTrialFinished as exc:
        console.print(f"ftprof plan --train: {exc}")
        return 1
    console.print(f"training {chosen.label}: {why}")
    result, _ = autotune.train_chosen(chosen, trials, why, {**base, **run_own}, plan_json,
                                      str(plan.request.cfg.output.output_dir))
    console.print(f"{result.status}: {result.run_dir} (result.json's selection says how it was chosen)")
    return 0 if result.status == "ok" else 1


def check_verify_dir(out_dir: Path, sweep_name: str) -> None:
    """A --plan-dir whose verify/ holds another model's verified rows is refused now, not after the plan is made
    (bench would refuse it then: a folder holds one sweep's results)."""
    from ftprof.bench.flow import recorded_sweep

    held = recorded_sweep(out_dir / "verify")
    if held is not None and held["name"] != sweep_name:
        raise ConfigError(f"{out_dir / 'verify'} holds the verified rows of sweep '{held['name']}', and this plan's "
                          f"is '{sweep_name}': use another --plan-dir")


def nothing_fits(plan) -> str:
    from ftprof.console import fmt_gib_digits as gib
    from ftprof.metrics import BUDGET_MARGIN_WORDS

    least = min(plan.rows, key=lambda r: r.prediction.peak_bytes)
    budget = (f"fits {gib(plan.budget_bytes)} GiB per GPU ({plan.usable_from}, less a {gib(plan.margin_bytes)} GiB "
              "margin)" if plan.budget_bytes > 0 else f"fits: {plan.usable_from} ({gib(plan.usable_bytes)} GiB) "
              f"leaves nothing after the {gib(plan.margin_bytes)} GiB margin ({BUDGET_MARGIN_WORDS})")
    return (f"no configuration of {', '.join(plan.request.methods)} {budget}: the least memory is "
            f"{least.candidate.label} at {gib(least.prediction.peak_bytes)} GiB predicted")


def _verify(plan, sweep_path: Path, out_dir: Path, k: int, request, base: dict, console) -> int:
    from ftprof.bench import verify
    from ftprof.plan import output
    from ftprof.results.store import write_text_atomic

    top = out_dir / "verify-sweep.yaml"
    write_text_atomic(top, output.sweep_yaml(plan, k, base))
    run_dirs = verify.run_top(top, out_dir / "verify")
    table, summary, rows = verify.compare(run_dirs)
    if len(table):
        view = verify_view(table, run_dirs, rows)
        console.print(frame_table(view, "predicted against measured"))
        for line in _measurement_notes(view):
            console.print(line)
        full = write_text_atomic(out_dir / "verify.csv", table.to_csv(index=False))
        console.print(f"with each prediction's sources: {full}")
    else:
        console.print("no run finished with a prediction")
    if len(summary):
        console.print(frame_table(summary, "error by quantity (signed: + predicted above measured)"))
    failed = [f"{r.get('run_name')}: {r.get('status')}" for r in rows if r.get("status") != "ok"]
    for line in failed:
        console.print(f"not ok: {line}")
    return 0 if not failed and len(table) else 1


VERIFY_VIEW = {"rank": "#", "run": "run",
               "predicted_memory_gib": "predicted GiB", "measured_memory_gib": "measured GiB",
               "memory_error_pct": "memory error_pct",
               "predicted_tokens_per_s": "predicted tokens/s", "measured_tokens_per_s": "measured tokens/s",
               "tokens_per_s_error_pct": "tokens/s error_pct"}


UNSTEADY = 1.05  # p90/p50 step time above this: the measured tokens/s is the median of steps that varied


def _measurement_notes(view) -> list[str]:
    """What makes a verified row's measured tokens/s partly the measurement's: unsteady steps, a GPU waiting on
    this machine's host (NVML busy below the planner's host-bound line)."""
    import pandas as pd

    from ftprof.plan.host import HOST_BOUND_BUSY

    lines = []
    unsteady = view[pd.to_numeric(view["p90/p50"], errors="coerce") > UNSTEADY]
    if len(unsteady):
        lines.append(f"unsteady (p90/p50 above {UNSTEADY}): rank {', '.join(map(str, unsteady['#']))}: their steps "
                     "varied (a host-bound step, or another process on the GPU), so their error is partly the "
                     "measurement's; --verify with more --max-steps measures them longer")
    waiting = view[pd.to_numeric(view["GPU busy %"], errors="coerce") < 100 * HOST_BOUND_BUSY]
    if len(waiting):
        lines.append(f"host-bound (GPU busy below {HOST_BOUND_BUSY:.0%}): rank {', '.join(map(str, waiting['#']))}: "
                     "their speed is this machine's host's as much as the GPU's, and moves with what else the host "
                     "runs (mistral-7b FP8 cells ran 6-22% apart in two calls on one H200)")
    return lines


def verify_view(table, run_dirs: list[Path], rows: list[dict] | None = None):
    """The comparison as a terminal reads it: the plan's rank, the run, predicted and measured peak and tokens/s
    with their signed errors, how steady the measured steps were (p90/p50 of the step time) and how busy NVML saw
    the GPU (from ``rows``: the runs' flat rows); the sources and device columns stay in verify.csv."""
    ranks = {d.name: i + 1 for i, d in enumerate(run_dirs)}  # the sweep holds the plan's top K in order
    steadiness = {r.get("run_name"): _p90_over_p50(r) for r in rows or ()}
    busy = {r.get("run_name"): _busy_pct(r) for r in rows or ()}
    view = table.assign(rank=table["run_name"].map(ranks), steadiness=table["run_name"].map(steadiness),
                        busy=table["run_name"].map(busy))
    return view[[*VERIFY_VIEW, "steadiness", "busy"]].rename(
        columns={**VERIFY_VIEW, "steadiness": "p90/p50", "busy": "GPU busy %"})


def _busy_pct(row: dict) -> float | None:
    """NVML's mean busy percentage of the run's first GPU (None without NVML samples)."""
    try:
        value = float(row["nvml_gpu0_util_mean"])
    except (KeyError, TypeError, ValueError):
        return None
    return round(value) if value == value else None  # (NaN: no samples)


def _p90_over_p50(row: dict) -> float | None:
    try:
        return round(float(row["step_time_p90_s"]) / float(row["step_time_p50_s"]), 3)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def _slug(model: str) -> str:
    return model.strip("/").split("/")[-1] or "model"


def default_dir_name(request) -> str:
    """plan-<model>-<methods>-s<seq>-<batch>x<accum>-<gpu>[-<budget>g][-<N>gpus]: plans of other methods, shapes,
    GPUs or budgets do not overwrite each other (a lora plan replaced an `all` plan's files, its verify runs left
    beside them)."""
    import re

    from ftprof.config.options import METHODS

    cfg = request.cfg
    gpu = re.sub(r"[^a-z0-9]+", "-", (request.gpu or "here").lower()).strip("-")
    methods = "all" if set(request.methods) == set(METHODS) else "+".join(m for m in METHODS if m in request.methods)
    name = (f"plan-{_slug(cfg.model.model)}-{methods}-s{cfg.data.seq_len}-{cfg.data.batch_size}x"
            f"{cfg.train.grad_accum}-{gpu}")
    if cfg.output.memory_limit_gib is not None:
        name += f"-{cfg.output.memory_limit_gib:g}g"
    return name + (f"-{request.gpus}gpus" if request.gpus > 1 else "")


def frame_table(frame, title: str):
    """A small DataFrame as a rich table: percentages signed (columns named *_pct), other numbers for people
    (fmt_num), "-" for none."""
    from rich.table import Table

    t = Table(title=title, header_style="bold")
    for col in frame.columns:
        t.add_column(str(col).replace("_pct", " %").replace("_", " "),
                     justify="right" if frame[col].dtype.kind in "iuf" else "left")
    for values in frame.itertuples(index=False):
        t.add_row(*(cell(col, v) for col, v in zip(frame.columns, values, strict=True)))
    return t


def cell(column: str, value) -> str:
    from ftprof.console import fmt_num

    if value is None or value is getattr(__import__("pandas"), "NA", None) or \
            (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)) and str(column).endswith("_pct"):
        return f"{value:+.1f}"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) >= 100):
        return f"{int(value):,}"
    if isinstance(value, float):
        return fmt_num(value)
    return str(value)
