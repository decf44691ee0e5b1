"""ftprof: measure LLM fine-tuning (full, LoRA, QLoRA, GPTQ-LoRA): speed, memory, and where the time goes.

Python API (the CLI is a thin skin over it)::

    import ftprof
    result = ftprof.train(ftprof.RunConfig(method=ftprof.MethodConfig(method="lora")))
"""

from ftprof.config import (
    DataConfig,
    MethodConfig,
    ModelConfig,
    OutputConfig,
    ProfilingConfig,
    RunConfig,
    TrainConfig,
)
from ftprof.errors import ConfigError, FtprofError

__version__ = "0.1.0"

__all__ = ["ConfigError", "DataConfig", "FtprofError", "MethodConfig", "ModelConfig", "OutputConfig",
           "ProfilingConfig", "RunConfig", "TrainConfig", "build_report", "load_results", "profile", "run_sweep",
           "train", "__version__"]


def train(cfg: RunConfig, **kwargs):
    """Run one fine-tuning measurement; returns a RunResult (status 'ok' or a failure class). A run_name whose
    directory holds a finished run raises ConfigError unless cfg.output.overwrite_output_dir, as on the CLI."""
    from ftprof.engine.run import train as _train
    from ftprof.results.run_dir import replace_named_run

    cfg = _checked(cfg)
    replace_named_run(cfg.output.output_dir, cfg.output.run_name, cfg.output.overwrite_output_dir)
    return _train(cfg, **kwargs)


def _checked(cfg) -> RunConfig:
    """``cfg`` as a RunConfig: one, or a dict of option names (RunConfig.from_flat); anything else is a ConfigError
    naming what was passed."""
    if isinstance(cfg, RunConfig):
        return cfg
    if isinstance(cfg, dict):
        return RunConfig.from_flat(cfg)
    raise ConfigError(f"ftprof.train and ftprof.profile take a RunConfig (or a dict of option names, as "
                      f"RunConfig.from_flat reads them), got {type(cfg).__name__}")


def profile(cfg: RunConfig, **kwargs):
    """``train`` under torch.profiler (cfg.profiling says how); artifacts and summary land in <run dir>/profile."""
    import dataclasses

    cfg = _checked(cfg)
    return train(dataclasses.replace(cfg, profiling=dataclasses.replace(cfg.profiling, profile=True)), **kwargs)


def run_sweep(sweep_file, output_dir=None, *, force: bool = False, retry_failed: bool = False, wait: bool = False):
    """Run a sweep file, one process per experiment, holding the output directory's lock; returns an outcome (name,
    status, seconds, result) for every experiment with a result, those kept from an earlier run included (their
    seconds 0: not run now). ``ftprof bench`` runs the same flow (ftprof.bench.flow.run_sweep)."""
    from ftprof.bench.flow import run_sweep as _run_sweep

    return _run_sweep(sweep_file, output_dir, force=force, retry_failed=retry_failed, wait=wait).every_outcome()


def load_results(*paths, problems=None):
    """Every run directory under ``paths`` as one pandas DataFrame row."""
    from ftprof.report.tables import load_results as _load

    return _load(*paths, problems=problems)


def build_report(paths, out_dir=None, **kwargs):
    """Tables, CSV, Markdown, plots and HTML from run directories (see ftprof.report.build)."""
    from ftprof.report.build import build_report as _build

    return _build(list(paths) if not isinstance(paths, (str, bytes)) else [paths], out_dir, **kwargs)
