"""A single run's configuration file (``ftprof train --config run.yaml``): the keys of a sweep file's ``base``
(flat option names in snake_case, ``method`` among them, or as the command line spells them: ``learning_rate``,
``max-steps``), one value each, read as sweep files are (``ftprof.config.yaml_io``: ``1e-4`` is a number, merge keys
work, a key given twice is refused). Options given on the command line
override the file's. Read before torch is imported: every problem is one line naming the file.

A file may say ``schema_version: 1`` to be read with that version's meanings (``warmup_steps`` then is the
measurement warm-up); without it, it is read with today's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftprof.config.options import SCHEMA_VERSION
from ftprof.config.run import flat_field_owners, migrate_flat
from ftprof.config.yaml_io import YamlProblem, canonical_keys, check_old_names, read_yaml, whole_numbers
from ftprof.errors import ConfigError, did_you_mean


def load_run_file(path: str | Path) -> dict[str, Any]:
    """The file's options as flat names and values, in today's meanings; ConfigError (one line) otherwise."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ConfigError(f"--config: '{path}' is a directory; give a YAML file of options")
    if not path.is_file():
        raise ConfigError(f"--config: '{path}' does not exist" if not path.exists()
                          else f"--config: '{path}' is not a regular file")
    try:
        data = read_yaml(path)
    except YamlProblem as exc:
        raise ConfigError(f"--config {path.name}: {exc}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path.name}: must be a mapping of option: value (a sweep file's base), got "
                          f"{type(data).__name__}")
    version = data.pop("schema_version", SCHEMA_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
        raise ConfigError(f"--config {path.name}: schema_version must be 1 to {SCHEMA_VERSION}, got {version!r}")
    owners = flat_field_owners()
    try:
        data = canonical_keys(data, owners)  # learning_rate: lr, max-steps: max_steps (as the CLI takes them)
        check_old_names(data, version)
    except ConfigError as exc:
        raise ConfigError(f"--config {path.name}: {exc}") from None
    for key, value in data.items():
        if key not in owners:
            raise ConfigError(f"--config {path.name}: unknown option '{key}'{did_you_mean(str(key), owners)}")
        if isinstance(value, dict):
            raise ConfigError(f"--config {path.name}: {key}: one value, not a mapping")
        if isinstance(value, list) and key not in ("lora_targets", "report_to"):
            raise ConfigError(f"--config {path.name}: {key}: one value, not a list (lists are for sweep files)")
    return whole_numbers(migrate_flat(data, version))
