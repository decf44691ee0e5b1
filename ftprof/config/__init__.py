"""Run configuration: small dataclasses that validate themselves, one module per section.

Every option is defined once, as a dataclass field with its help text. The CLI builds its argument groups from
these fields (``ftprof/cli/common.py``) and sweep files use the same names in snake_case, so a field name is also
its long option name (``lora_r`` <-> ``--lora-r``). Names are unique across sections so a flat mapping
(``RunConfig.from_flat``) is unambiguous.

Nothing here imports torch or argparse, and nothing here touches the filesystem: checks that need I/O (does the
dataset exist, does the sequence fit the model) live in ``ftprof.preflight``.
"""

from ftprof.config.data import DataConfig, template_fields
from ftprof.config.distributed import DistributedConfig
from ftprof.config.evaluation import EvalConfig
from ftprof.config.method import METHOD_OPTION_GROUPS, MethodConfig, inapplicable_options
from ftprof.config.model import ModelConfig
from ftprof.config.options import (
    CHECKPOINTING,
    COMPILE_MODES,
    DATA_FORMATS,
    DEFAULT_LORA_TARGETS,
    DEQUANT_KERNELS,
    DTYPES,
    KERNELS,
    LORA_METHODS,
    LR_SCHEDULERS,
    MEMORY_LOGGING,
    MEMORY_LOGGING_ALIASES,
    METHODS,
    OPTIMIZERS,
    PARALLEL,
    PROFILER_ACTIVITIES,
    RDZV_BACKENDS,
    SCHEMA_VERSION,
    SDPA_BACKENDS,
    TRACKERS,
    TRAIN_ON,
    option,
)
from ftprof.config.output import OutputConfig, normalize_report_to
from ftprof.config.profiling import ProfilingConfig
from ftprof.config.run import SECTIONS, RunConfig, flat_field_owners, migrate_flat, option_words
from ftprof.config.saving import SaveConfig
from ftprof.config.train import TrainConfig

__all__ = [
    "CHECKPOINTING", "COMPILE_MODES", "DATA_FORMATS", "DEFAULT_LORA_TARGETS", "DEQUANT_KERNELS", "DTYPES", "KERNELS",
    "LORA_METHODS", "LR_SCHEDULERS", "MEMORY_LOGGING", "MEMORY_LOGGING_ALIASES", "METHODS", "METHOD_OPTION_GROUPS",
    "OPTIMIZERS", "PARALLEL", "PROFILER_ACTIVITIES", "RDZV_BACKENDS", "SCHEMA_VERSION", "SDPA_BACKENDS", "SECTIONS",
    "TRACKERS", "TRAIN_ON", "DataConfig", "DistributedConfig", "EvalConfig", "MethodConfig", "ModelConfig",
    "OutputConfig", "ProfilingConfig", "RunConfig", "SaveConfig", "TrainConfig", "flat_field_owners",
    "inapplicable_options", "migrate_flat", "normalize_report_to", "option", "option_words", "template_fields",
]
