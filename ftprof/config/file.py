"""A single run's configuration file (``ftprof train --config run.yaml``): the keys of a sweep file's ``base``
(flat option names in snake_case, ``method`` among them), one value each. Options given on the command line
override the file's. Read before torch is imported: every problem is one line naming the file.

A file may say ``schema_version: 1`` to be read with that version's meanings (``warmup_steps`` then is the
measurement warm-up); without it, it is read with today's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftprof.config.options import SCHEMA_VERSION
from ftprof.config.run import flat_field_owners, migrate_flat
from ftprof.errors import ConfigError, did_you_mean


def _strict_loader():
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """safe_load that refuses a key given twice (PyYAML silently keeps the last)."""

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise ConfigError(f"line {key_node.start_mark.line + 1}: key '{key}' is given twice")
                seen.add(key)
            return super().construct_mapping(node, deep)

    return StrictLoader


def _parse(path: Path) -> Any:
    import yaml

    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_strict_loader())  # a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}not valid YAML: {problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}") from None


def load_run_file(path: str | Path) -> dict[str, Any]:
    """The file's options as flat names and values, in today's meanings; ConfigError (one line) otherwise."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"--config: '{path}' does not exist")
    try:
        data = _parse(path)
    except ConfigError as exc:
        raise ConfigError(f"--config {path.name}: {exc}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path.name}: must be a mapping of option: value (a sweep file's base), got "
                          f"{type(data).__name__}")
    version = data.pop("schema_version", SCHEMA_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
        raise ConfigError(f"--config {path.name}: schema_version must be 1 to {SCHEMA_VERSION}, got {version!r}")
    owners = flat_field_owners()
    for key, value in data.items():
        if key not in owners:
            raise ConfigError(f"--config {path.name}: unknown option '{key}'{did_you_mean(str(key), owners)}")
        if isinstance(value, dict):
            raise ConfigError(f"--config {path.name}: {key}: one value, not a mapping")
        if isinstance(value, list) and key not in ("lora_targets", "report_to"):
            raise ConfigError(f"--config {path.name}: {key}: one value, not a list (lists are for sweep files)")
    return migrate_flat(data, version)
