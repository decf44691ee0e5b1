"""ftprof: measure LLM fine-tuning (full, LoRA, QLoRA, GPTQ-LoRA): speed, memory, and where the time goes.

Python API (the CLI is a thin skin over it)::

    import ftprof
    result = ftprof.train(ftprof.RunConfig(method=ftprof.MethodConfig(method="lora")))
"""

from ftprof.config import DataConfig, MethodConfig, ModelConfig, OutputConfig, RunConfig, TrainConfig
from ftprof.errors import ConfigError, FtprofError

__version__ = "0.1.0"

__all__ = ["ConfigError", "DataConfig", "FtprofError", "MethodConfig", "ModelConfig", "OutputConfig", "RunConfig",
           "TrainConfig", "train", "__version__"]


def train(cfg: RunConfig, **kwargs):
    """Run one fine-tuning measurement; returns a RunResult (status 'ok' or a failure class)."""
    from ftprof.engine.run import train as _train

    return _train(cfg, **kwargs)
