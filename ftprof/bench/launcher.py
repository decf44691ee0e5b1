"""Where a sweep's experiments run: ``local`` (child processes here) or ``slurm`` (one job array task each).

The settings come from the sweep file's ``launcher:`` section, then the command line (which wins)::

    launcher:
      type: slurm            # local (default) | slurm
      partition: gpu
      account: my-project
      qos: normal
      time: "02:00:00"       # per experiment: minutes, or [days-]hours:minutes:seconds (Slurm's --time)
      gpus_per_node: 8       # default: each experiment's nproc_per_node (none for device: cpu)
      nodes: 1               # default: each experiment's nnodes
      cpus_per_task: 16
      mem: 200G              # per node (Slurm's --mem)
      constraint: h200
      sbatch: ["--exclusive"]  # extra #SBATCH directives, as given
      max_jobs: 8            # how many experiments may run at once (the job array's %limit)
      poll_s: 10             # how often squeue is read while watching

Every problem is one line naming the file and the key, before anything runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ftprof.errors import ConfigError, did_you_mean

LAUNCHERS = ("local", "slurm")
_TIME = re.compile(r"\d+|\d+:\d{1,2}(:\d{1,2})?|\d+-\d+(:\d{1,2}){0,2}")
_MEM = re.compile(r"\d+[KMGT]?")


@dataclass(frozen=True)
class LauncherSettings:
    type: str = "local"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    gpus_per_node: int | None = None
    nodes: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    constraint: str | None = None
    sbatch: tuple[str, ...] = field(default_factory=tuple)
    max_jobs: int | None = None
    poll_s: float = 10.0

    def merged(self, overrides: dict[str, Any], where: str = "") -> LauncherSettings:
        """These settings with ``overrides`` (None values ignored) applied, validated."""
        given = {k: v for k, v in overrides.items() if v is not None and v != ()}
        return parse_launcher({**self.as_dict(), **given}, where)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


KEYS = tuple(f.name for f in fields(LauncherSettings))
_INTS = ("gpus_per_node", "nodes", "cpus_per_task", "max_jobs")
_STRS = ("partition", "account", "qos", "constraint")


def parse_launcher(data: Any, where: str = "launcher") -> LauncherSettings:
    """The ``launcher:`` mapping as settings; ConfigError (one line, prefixed with ``where``) on any problem."""
    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(f"{where}.{key}: {message}" if where else f"{key}: {message}")

    if data is None:
        return LauncherSettings()
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping (type: slurm, partition: ...), got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in KEYS:
            raise fail(str(key), f"unknown launcher setting{did_you_mean(str(key), KEYS)}")
        if value is None:
            continue
        if key == "type":
            if value not in LAUNCHERS:
                raise fail(key, f"'{value}' is not one of {', '.join(LAUNCHERS)}{did_you_mean(value, LAUNCHERS)}")
        elif key in _INTS:
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if key == "gpus_per_node" else 1):
                raise fail(key, f"must be a whole number {'>= 0' if key == 'gpus_per_node' else '>= 1'}, "
                                f"got {value!r}")
        elif key in _STRS:
            if not isinstance(value, str) or not value.strip() or "\n" in value:
                raise fail(key, f"must be a non-empty one-line string, got {value!r}")
        elif key == "time":
            value = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
            if not isinstance(value, str) or not _TIME.fullmatch(value):
                raise fail(key, f"'{value}' is not a Slurm time limit (minutes, or [days-]hours:minutes:seconds)")
        elif key == "mem":
            value = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
            if not isinstance(value, str) or not _MEM.fullmatch(value):
                raise fail(key, f"'{value}' is not a Slurm memory size (a number with K, M, G or T)")
        elif key == "sbatch":
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)) or not all(
                    isinstance(s, str) and s.startswith("-") and "\n" not in s for s in items):
                raise fail(key, "must be a list of sbatch options such as ['--exclusive', '--reservation=x']")
            value = tuple(items)
        elif key == "poll_s":
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 3600:
                raise fail(key, f"must be seconds between 0 and 3600, got {value!r}")
            value = float(value)
        out[key] = value
    return replace(LauncherSettings(), **out)


def launcher_from_file(path: Path, data: Any) -> LauncherSettings:
    return parse_launcher(data, f"{path.name}: launcher")
