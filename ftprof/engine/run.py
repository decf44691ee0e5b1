"""``ftprof.train(RunConfig) -> RunResult``: preflight, train, classify the outcome, write the run directory.

Bad input raises ConfigError before anything big loads. Failures during training (OOM, Ctrl-C, any error) do not
raise: they become the result's status, and the run directory still holds everything recorded up to that point.
With profiling on, the same loop runs under a TorchProfiler and each cycle's trace is summarized at the end.
"""

from __future__ import annotations

import os
from pathlib import Path

from ftprof.config import RunConfig
from ftprof.errors import ConfigError
from ftprof.results.schema import RunResult, failure_result
from ftprof.runtime import pin_allocator_config


def classify_exception(exc: BaseException) -> str:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return "oom_device"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, MemoryError):
        return "oom_host"
    return "error"


def _profile_dir(trainer) -> Path:
    out = trainer.cfg.profiling.prof_output_dir
    return Path(out).expanduser() if out else trainer.run_dir / "profile"


def _build_profiler(trainer, log):
    from ftprof.profiling.torch_profiler import TorchProfiler

    cfg = trainer.cfg
    meta = {"method": cfg.method.method, "model": cfg.model.model, "dtype": cfg.model.dtype,
            "checkpointing": cfg.model.gradient_checkpointing, "active_steps": cfg.profiling.prof_active_steps,
            "seq_len": cfg.data.seq_len, "batch_size": cfg.data.batch_size,
            "flops_per_token": trainer.flops_token, "recompute_flops_per_token": trainer.recompute_token}
    return TorchProfiler(cfg.profiling, _profile_dir(trainer), trainer.device, rank=trainer.dist.rank, log=log,
                         metadata=meta)


def _summarize(trainer, result: RunResult, display) -> None:
    """Summarize every trace this run wrote; show the last one."""
    from ftprof.profiling import summary_output
    from ftprof.profiling.trace_summary import summarize

    profile_dir = _profile_dir(trainer)
    traces = sorted(profile_dir.glob("trace_rank*_cycle*.pt.trace.json.gz"))
    summary = None
    for trace in traces:
        summary = summarize(trace, run_config=trainer.cfg.to_dict())
        summary.profiler_overhead = result.profiling.get("profiler_overhead")
        stem = trace.name.replace("trace_", "summary_").replace(".pt.trace.json.gz", "")
        paths = summary_output.write(summary, profile_dir, stem)
        result.artifacts.update({f"{stem}_json": os.path.relpath(paths["summary_json"], trainer.run_dir),
                                 f"{stem}_md": os.path.relpath(paths["summary_md"], trainer.run_dir)})
    if summary is not None and trainer.dist.is_main:
        summary_output.write(summary, profile_dir, "summary")  # the last cycle, under a name people look for
        result.artifacts["summary"] = os.path.relpath(profile_dir / "summary.md", trainer.run_dir)
        display.show(summary_output.rich_view(summary))


def _oom_snapshot(trainer, result: RunResult) -> None:
    from ftprof.profiling.memory import dump_oom_snapshot

    if trainer.device.type != "cuda" or not hasattr(trainer, "run_dir"):
        return
    path = _profile_dir(trainer) / f"oom_snapshot_rank{trainer.dist.rank}.pickle"
    if dump_oom_snapshot(path):
        result.artifacts["oom_snapshot"] = os.path.relpath(path, trainer.run_dir)


def _launch_and_collect(cfg: RunConfig, quiet: bool | None) -> RunResult:
    """Relaunch this run under torchrun and read back the result rank 0 wrote."""
    import dataclasses

    from ftprof.cli.common import cli_args
    from ftprof.engine import distributed
    from ftprof.preflight import preflight
    from ftprof.results.run_dir import default_run_name
    from ftprof.results.store import read_json

    preflight(cfg)  # bad input fails here, once, before any process starts
    name = cfg.output.run_name or default_run_name(cfg.method.method, cfg.model.model)
    out = dataclasses.replace(cfg.output, run_name=name, quiet=cfg.output.quiet if quiet is None else quiet)
    cfg = dataclasses.replace(cfg, output=out)
    code = distributed.launch(cfg, cli_args(cfg))
    path = Path(cfg.output.output_dir).expanduser() / name / "result.json"
    if path.is_file():
        return RunResult.from_dict(read_json(path))
    status = "interrupted" if code in (130, -2) else "error"
    return failure_result(cfg, path.parent, status, "torchrun", f"torchrun exited with code {code} before rank 0 "
                          "recorded a result (see the ranks' output above)")


def train(cfg: RunConfig, *, quiet: bool | None = None, profiler=None) -> RunResult:
    # Before torch touches CUDA: the allocator reads PYTORCH_ALLOC_CONF at its first allocation.
    pin_allocator_config(cfg.output.alloc_conf)
    from ftprof.engine import distributed

    if distributed.needs_launch(cfg):
        return _launch_and_collect(cfg, quiet)
    from ftprof.console import RunDisplay
    from ftprof.engine.trainer import Trainer
    from ftprof.preflight import preflight

    if distributed.under_torchrun():
        import torch

        use_cuda = cfg.output.device != "cpu" and torch.cuda.is_available()
        distributed.init("cuda" if use_cuda else "cpu")
    pre = preflight(cfg)
    if quiet is None:
        quiet = cfg.output.quiet or not distributed.env_info().is_main
    display = RunDisplay(pre.config, quiet=quiet)
    for note in pre.notes:
        display.log(note)
    trainer = Trainer(pre, log=display.log, profiler=profiler, on_step=display.on_step)
    try:
        trainer.setup()
        if profiler is None and pre.config.profiling.profile and pre.config.profiling.profiles_rank(trainer.dist.rank):
            trainer.profiler = _build_profiler(trainer, display.log)
        display.start(trainer)
        trainer.train_loop()
        result = trainer.result("ok")
        if trainer.dist.enabled:
            result = trainer.aggregate_ranks(result)
    except ConfigError:
        display.stop()
        trainer.teardown(trainer.result("error"))
        trainer.release()
        raise
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - every failure becomes a recorded status
        display.stop()
        result = trainer.result(classify_exception(exc), exc)
        if result.status == "oom_device":
            _oom_snapshot(trainer, result)
    display.stop()
    if trainer.profiler.enabled and result.status == "ok":
        _summarize(trainer, result, display)
    trainer.teardown(result)
    trainer.release()
    display.summary(result)
    return result
