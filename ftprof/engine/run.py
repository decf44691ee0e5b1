"""``ftprof.train(RunConfig) -> RunResult``: preflight (the resolved run), train, classify the outcome, write the
run directory.

Bad input raises ConfigError before anything big loads. Failures during training (OOM, Ctrl-C, any error) do not
raise: they become the result's status, and the run directory still holds everything recorded up to that point.
With profiling on, the same loop runs under a TorchProfiler and each cycle's trace is summarized at the end.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from ftprof import ranks
from ftprof.config import RunConfig
from ftprof.config.saving import (
    ADAPTER,
    CHECKPOINT_STATE,
    MODEL,
    TRAINER_STATE,
    checkpoint_dirs,
    local_dataset_path,
    read_checkpoint_state,
)
from ftprof.results import run_dir as files
from ftprof.results.schema import RunResult, failure_result
from ftprof.results.status import Status
from ftprof.runtime import pin_allocator_config


def profile_dir(profiling, run_dir: Path) -> Path:
    """Where a run's profiler artifacts go: --prof-output-dir, else <run dir>/profile (``profiling``: a
    ProfilingConfig)."""
    out = profiling.prof_output_dir
    return Path(out).expanduser() if out else Path(run_dir) / files.PROFILE


def _profile_dir(trainer) -> Path:
    return profile_dir(trainer.cfg.profiling, trainer.run_dir)


def make_profiler(trainer, built, log):
    """The run's profiler: torch.profiler when profiling is on for this rank, else the null one."""
    from ftprof.profiling.noop import NullProfiler

    cfg = trainer.cfg
    if not (cfg.profiling.profile and cfg.profiling.profiles_rank(trainer.dist.rank)):
        return NullProfiler()
    from ftprof.profiling.torch_profiler import TorchProfiler

    meta = {"method": cfg.method.method, "model": cfg.model.model, "dtype": cfg.model.dtype,
            "checkpointing": built.checkpointing != "none", "checkpointing_policy": built.checkpointing,
            "checkpointed_layers": built.checkpointed_layers, "selective_rest": trainer.resolved.selective_rest,
            "lean_recompute": trainer.resolved.lean_recompute,
            "kernels": cfg.model.kernels, "compile": cfg.model.compile, "active_steps": cfg.profiling.prof_active_steps,
            "lora_r": cfg.method.lora_r, "lora_fused_a": cfg.method.lora_fused_a,  # the buckets' LoRA split
            "fp8_base": bool(cfg.method.fp8_base),
            "seq_len": cfg.data.seq_len, "batch_size": cfg.data.batch_size,
            "flops_per_token": built.flops.per_token, "recompute_flops_per_token": built.flops.recompute_per_token}
    return TorchProfiler(cfg.profiling, _profile_dir(trainer), trainer.device, rank=trainer.dist.rank, log=log,
                         metadata=meta)


def summarize_profile(out_dir: Path, run_dir: Path, run_config: dict, result: RunResult, main: bool = True):
    """Summarize every trace under ``out_dir`` (summary_rank{r}_cycle{c}.json|.md beside the cycle folders; with
    ``main``, the last one again as summary.json|.md, the name people and ``ftprof report`` look for), the paths into
    ``result.artifacts``. Returns the last summary, None without a trace. ftprof's profiled runs and the
    integrations' profiler window (ftprof.integrations) both summarize through it."""
    from ftprof.analysis import summary_output
    from ftprof.analysis.pipeline import summarize
    from ftprof.profiling import layout

    summary = None
    for trace in layout.trace_files(out_dir):
        summary = summarize(trace, run_config=run_config)
        summary.profiler_overhead = result.profiling.get("profiler_overhead")
        stem = layout.summary_stem(trace)
        paths = summary_output.write(summary, out_dir, stem)
        result.artifacts.update({f"{stem}_json": os.path.relpath(paths["summary_json"], run_dir),
                                 f"{stem}_md": os.path.relpath(paths["summary_md"], run_dir)})
    if summary is not None and main:
        summary_output.write(summary, out_dir, "summary")  # the last cycle, under a name people look for
        result.artifacts["summary"] = os.path.relpath(Path(out_dir) / "summary.md", run_dir)
    return summary


def _summarize(trainer, result: RunResult, display) -> None:
    """Summarize every trace this run wrote; show the last one."""
    from ftprof.analysis import summary_output

    summary = summarize_profile(_profile_dir(trainer), trainer.run_dir, trainer.cfg.to_dict(), result,
                                trainer.dist.is_main)
    if summary is not None and trainer.dist.is_main:
        display.show(summary_output.rich_view(summary))


def _oom_snapshot(trainer, result: RunResult) -> None:
    from ftprof.profiling.memory import dump_oom_snapshot

    if trainer.resolved.device_type != "cuda":
        return
    path = _profile_dir(trainer) / f"oom_snapshot_rank{trainer.dist.rank}.pickle"
    if dump_oom_snapshot(path):
        result.artifacts["oom_snapshot"] = os.path.relpath(path, trainer.run_dir)


def _record_calibration(run_dir: Path) -> None:
    """Feed the planner's calibration store with a finished run (ftprof.plan.calibration: never raises, costs
    milliseconds; a run recorded twice keeps one record)."""
    from ftprof.plan import calibration

    calibration.record_run(run_dir)


def _launch_and_collect(cfg: RunConfig, quiet: bool | None) -> RunResult:
    """Relaunch this run under torchrun: every worker loads the run's config.json; read back rank 0's result."""
    import dataclasses

    from ftprof.engine import distributed
    from ftprof.preflight import preflight
    from ftprof.results.run_dir import RunDirWriter, default_run_name
    from ftprof.results.store import read_json

    preflight(cfg)  # bad input fails here, once, before any process starts
    name = cfg.output.run_name or default_run_name(cfg.method.method, cfg.model.model)
    out = dataclasses.replace(cfg.output, run_name=name, quiet=cfg.output.quiet if quiet is None else quiet)
    cfg = dataclasses.replace(cfg, output=out)
    run_dir = Path(cfg.output.output_dir).expanduser() / name
    run_dir.mkdir(parents=True, exist_ok=True)
    RunDirWriter(run_dir).write_config(cfg.to_dict())
    if cfg.distributed.nnodes > 1:  # torchrun waits silently at the rendezvous until every node has joined
        print(distributed.waiting_message(cfg), file=sys.stderr, flush=True)
    code = distributed.launch(cfg, str(run_dir / files.CONFIG))
    path = run_dir / files.RESULT
    if path.is_file():
        result = RunResult.from_dict(read_json(path))
    else:
        stopped = (Status.INTERRUPTED.exit_code, 128 + signal.SIGTERM, -signal.SIGINT, -signal.SIGTERM)
        status = Status.INTERRUPTED if code in stopped else Status.ERROR  # Ctrl-C or SIGTERM: see torchrun_entry
        result = failure_result(cfg, run_dir, status.value, "torchrun", f"torchrun exited with code {code} before "
                                "rank 0 recorded a result (see the ranks' output above)")
    if path.is_file() and cfg.distributed.node_rank == 0:
        _record_calibration(run_dir)
    if result.status == Status.INTERRUPTED.value:  # the ranks stay quiet about it: one line for all of them
        print(f"ftprof: interrupted (Ctrl-C); run dir {run_dir}", file=sys.stderr, flush=True)
    return result


# Options a resumed run must share with its checkpoint: the weights' shapes, and what the data position means.
RESUME_SAME = ("method", "model", "lora_r", "lora_alpha", "lora_targets", "dataset", "dataset_config",
               "dataset_split", "packing", "seq_len", "batch_size", "grad_accum", "seed")


def resolve_resume(cfg: RunConfig) -> RunConfig:
    """Check --save-steps and --resume-from-checkpoint before anything loads (no torch), and pin ``latest`` to the
    checkpoint's absolute path (config.json records where the run resumed from). Raises ConfigError."""
    from ftprof.errors import ConfigError

    several = cfg.distributed.world_size > 1 or cfg.distributed.nnodes > 1
    method = cfg.method.method
    if cfg.save.save_merged and method not in ("lora", "qlora"):
        raise ConfigError("--save-merged: " + (
            "full fine-tuning has no adapters to merge; --save writes the whole model" if method == "full" else
            "a GPTQ base cannot take merged 16-bit weights (its layers are packed integers); --save writes the "
            "adapter, which loads on the GPTQ checkpoint"))
    if cfg.save.save_merged and cfg.distributed.parallel == "fsdp" and (several or cfg.distributed.fsdp_cpu_offload):
        raise ConfigError("--save-merged: an FSDP run's base weights are sharded across ranks; merge from --save's "
                          "adapter and base after the run, or run with --parallel ddp")
    spec = cfg.save.resume_from_checkpoint
    if several and (cfg.save.save_steps or spec):
        raise ConfigError(f"--{'save-steps' if cfg.save.save_steps else 'resume-from-checkpoint'}: checkpoints "
                          "during a run are written and resumed by one process only (no sharded optimizer state "
                          "yet); run without --nproc-per-node/--nnodes, or save at the end with --save")
    if spec is None:
        return cfg
    parent = Path(cfg.output.output_dir).expanduser()
    if spec == "latest":
        roots = sorted(p for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []
        found = [path for root in roots for _, path in checkpoint_dirs(root)]
        if not found:
            raise ConfigError(f"--resume-from-checkpoint latest: no <run dir>/checkpoint-<step>/ under {parent}; "
                              "--save-steps writes them")
        path = max(found, key=lambda p: (p / CHECKPOINT_STATE).stat().st_mtime)
    else:
        path = Path(spec).expanduser()
        try:
            found_dir = path.is_dir()
        except OSError as exc:  # a name the file system refuses (too long, ...): a bad path, said as one
            raise ConfigError(f"--resume-from-checkpoint: {exc.strerror or exc} ({str(spec)[:60]}...)") from None
        if not found_dir:
            raise ConfigError(f"--resume-from-checkpoint {spec}: no such directory")
    path = path.resolve()
    state = read_checkpoint_state(path)
    _check_same_options(cfg, path, state)
    step = int(state.get("step", 0))
    # (with --num-train-epochs the steps are known once the data is read: preflight checks them then)
    if step >= cfg.train.max_steps and cfg.train.num_train_epochs is None:
        raise ConfigError(f"--resume-from-checkpoint {path}: the checkpoint is at step {step}; --max-steps "
                          f"{cfg.train.max_steps} leaves no step to run (--max-steps counts from the run's start)")
    if cfg.output.run_name and (parent / cfg.output.run_name).resolve() == path.parent:
        raise ConfigError(f"--resume-from-checkpoint {path}: a resumed run writes a run directory of its own; give "
                          "another --run-name (or none)")
    _check_checkpoint_files(path, cfg.method.method)
    return cfg.replace(resume_from_checkpoint=str(path))


def _check_same_options(cfg: RunConfig, path: Path, state: dict) -> None:
    """The options of RESUME_SAME are the checkpoint's (ConfigError naming the first that is not)."""
    from ftprof.errors import ConfigError

    theirs, ours = dict(state.get("options", {})), cfg.to_flat()
    here = local_dataset_path(cfg.data.dataset)
    if state.get("dataset_path") and here:  # a local dataset: compared as the file, not its name
        theirs["dataset"], ours["dataset"] = state["dataset_path"], here
    for key in RESUME_SAME:
        mine, saved = ours.get(key), theirs.get(key)
        saved = tuple(saved) if isinstance(saved, list) else saved
        if key in theirs and mine is not None and saved != mine:  # None: a default the run resolves (lora_r)
            what = "method" if key == "method" else "--" + key.replace("_", "-")
            raise ConfigError(f"--resume-from-checkpoint {path}: it was written with {what} {saved}, this run has "
                              f"{mine}; resume with the same options")


def _check_checkpoint_files(path: Path, method: str) -> None:
    """A checkpoint holds its weights and its optimizer state: one that lacks them (copied in part, or damaged) is
    refused before anything loads (it failed after the model was built)."""
    from ftprof.errors import ConfigError

    weights = MODEL if method == "full" else ADAPTER
    missing = [name for name in (TRAINER_STATE, weights) if not (path / name).exists()]
    if missing:
        raise ConfigError(f"--resume-from-checkpoint {path}: the checkpoint has no {' or '.join(missing)} (copied in "
                          "part, or damaged); resume from another checkpoint")


def progress_line(record, max_steps: int) -> str:
    """The --logging-steps line for one step (the figures the HF Trainer logs, and ftprof's speed)."""
    tps = record.tokens / record.step_time_s if record.step_time_s > 0 else 0.0
    warm = " (warm-up)" if record.warmup else ""
    return (f"step {record.step}/{max_steps} | loss {record.loss:.4f} | lr {record.lr:.3g} | {tps:,.0f} tok/s | "
            f"{record.step_time_s:.3f} s{warm}")


def logging_steps_hook(cfg: RunConfig, display):
    """Every --logging-steps steps (and at the last) a progress line through the display's log (nothing under
    --quiet). The display still moves its progress bar on a terminal; its own plain lines (not on a terminal) give
    way to these."""
    every, last = cfg.output.logging_steps, cfg.train.max_steps

    def hook(record) -> None:
        if display.progress is not None:
            display.on_step(record)
        if record.step % every == 0 or record.step == last:
            display.log(progress_line(record, last))

    return hook


def train(cfg: RunConfig, *, quiet: bool | None = None, make_profiler_fn=None) -> RunResult:
    # Before torch touches CUDA: the allocator reads PYTORCH_ALLOC_CONF at its first allocation.
    pin_allocator_config(cfg.output.alloc_conf)
    cfg = resolve_resume(cfg)  # latest -> a path (a no-op when `ftprof train` resolved it already)
    from ftprof.engine import distributed

    if distributed.needs_launch(cfg):
        return _launch_and_collect(cfg, quiet)
    from ftprof.console import RunDisplay
    from ftprof.engine.trainer import Trainer
    from ftprof.exporters import Exporters
    from ftprof.preflight import preflight

    if ranks.under_torchrun():
        import torch

        use_cuda = cfg.output.device != "cpu" and torch.cuda.is_available()
        distributed.init("cuda" if use_cuda else "cpu")
    resolved = preflight(cfg)
    if quiet is None:
        quiet = cfg.output.quiet or not resolved.dist.is_main
    display = RunDisplay(resolved.config, quiet=quiet)
    for note in resolved.notes:
        display.log(note)
    factory = make_profiler_fn or (lambda trainer, built: make_profiler(trainer, built, display.log))
    # --report-to exporters, main rank only: opened once the run is built, each step after the display, the result
    # at the end.
    exporters = Exporters(resolved.config.output.report_to, enabled=resolved.dist.is_main)

    def on_start(trainer) -> None:
        cfg = resolved.config
        exporters.start(cfg.to_dict(), trainer.run_dir, Path(cfg.output.output_dir).expanduser())
        display.start(trainer)

    on_step = display.on_step
    if resolved.config.output.logging_steps:
        on_step = logging_steps_hook(resolved.config, display)
    trainer = Trainer(resolved, log=display.log, on_start=on_start, on_step=exporters.chain(on_step),
                      make_profiler=factory)
    try:
        result = trainer.run()
    except BaseException:
        exporters.close()
        raise
    finally:
        display.stop()
    if result.status == Status.OOM_DEVICE.value:
        _oom_snapshot(trainer, result)
    if trainer.profiler.enabled and result.status == Status.OK.value:
        _summarize(trainer, result, display)
    trainer.teardown(result)
    if resolved.dist.is_main:  # under torchrun too (a torchrun started by hand has no ftprof launcher to record it)
        _record_calibration(trainer.run_dir)
    trainer.release()
    exporters.finish(result)
    display.summary(result)
    return result
