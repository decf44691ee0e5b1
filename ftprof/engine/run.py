"""``ftprof.train(RunConfig) -> RunResult``: preflight, train, classify the outcome, write the run directory.

Bad input raises ConfigError before anything big loads. Failures during training (OOM, Ctrl-C, any error) do not
raise: they become the result's status, and the run directory still holds everything recorded up to that point.
"""

from __future__ import annotations

from ftprof.config import RunConfig
from ftprof.errors import ConfigError
from ftprof.results.schema import RunResult
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


def train(cfg: RunConfig, *, quiet: bool | None = None, profiler=None) -> RunResult:
    # Before torch touches CUDA: the allocator reads PYTORCH_ALLOC_CONF at its first allocation.
    pin_allocator_config(cfg.output.alloc_conf)
    from ftprof.console import RunDisplay
    from ftprof.engine.trainer import Trainer
    from ftprof.preflight import preflight

    pre = preflight(cfg)
    display = RunDisplay(pre.config, quiet=cfg.output.quiet if quiet is None else quiet)
    trainer = Trainer(pre, log=display.log, profiler=profiler, on_step=display.on_step)
    try:
        trainer.setup()
        display.start(trainer)
        trainer.train_loop()
        result = trainer.result("ok")
    except ConfigError:
        display.stop()
        trainer.teardown(trainer.result("error"))
        raise
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - every failure becomes a recorded status
        display.stop()
        result = trainer.result(classify_exception(exc), exc)
    display.stop()
    trainer.teardown(result)
    display.summary(result)
    return result
