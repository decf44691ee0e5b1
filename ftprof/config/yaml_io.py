"""Reading option files (``ftprof train --config``, sweep files) one way: the same YAML loader, the same numbers, the
same names.

- A key given twice in one mapping is refused (PyYAML silently keeps the last); merge keys (``<<: *base``) work as
  in PyYAML's safe_load, a key written beside the merge overriding the merged one.
- Numbers as people write them: YAML 1.1 needs a dot in a float, so ``2e-4`` and ``5E-5`` would be strings; here
  they are floats, and a whole number written as a float (``max_steps: 1e3``) is an int where the option takes one.
- Option names as the command line takes them: ``learning_rate`` (the HF Trainer's spelling) for ``lr``, and
  ``max-steps`` for ``max_steps``, each option once under any of its names.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Optional

from ftprof.errors import ConfigError

MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlProblem(Exception):
    """Where in the file (``line 3``, or "") and what is wrong: the caller names the file."""

    def __init__(self, where: str, problem: str):
        super().__init__(f"{where}: {problem}" if where else problem)
        self.where, self.problem = where, problem


def _loader():
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            if isinstance(node, yaml.MappingNode):
                for key_node, _ in node.value:
                    if key_node.tag == MERGE_TAG:
                        continue  # SafeLoader's flatten_mapping merges it; keys written here override it
                    key = self.construct_object(key_node, deep=True)
                    if not isinstance(key, (str, int, float, bool)):
                        continue  # a list or mapping as a key: SafeLoader refuses it with its own error
                    if key in seen:
                        raise YamlProblem(f"line {key_node.start_mark.line + 1}", f"key '{key}' is given twice")
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    # Floats with an exponent and no dot (YAML 1.2's spelling), underscores allowed as YAML 1.1 allows them.
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."))
    return StrictLoader


_LOADER = None


def read_yaml(path: Path) -> Any:
    """The file's content; YamlProblem (where, problem) for anything wrong with it."""
    global _LOADER
    import yaml

    if _LOADER is None:
        _LOADER = _loader()
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_LOADER)  # a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if "for merging" in problem:  # a merge key on something that is not a mapping
            found = problem.rsplit("but found ", 1)[-1]
            raise YamlProblem(where, f"merge key '<<' takes a mapping (such as *base, of an anchored '&base' "
                                     f"mapping) or a list of them, not a {found}") from None
        raise YamlProblem(where, f"not valid YAML: {problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise YamlProblem("", f"cannot read: {exc}") from None


def whole_numbers(values: dict[str, Any]) -> dict[str, Any]:
    """A whole number written as a float (``max_steps: 1e3``) is an int where the option takes an int."""
    from ftprof.config.run import _field_types

    types = _field_types()
    out = dict(values)
    for key, value in values.items():
        whole = isinstance(value, float) and math.isfinite(value) and value.is_integer()
        if whole and types.get(key) in (int, Optional[int]):
            out[key] = int(value)
    return out


def cli_aliases() -> dict[str, str]:
    """Other names the command line takes for an option, as file keys: ``learning_rate`` -> ``lr``."""
    from ftprof.config.options import HF_ALIASES

    return {flag.removeprefix("--").replace("-", "_"): name for name, flag in HF_ALIASES.items()}


def canonical_keys(values: dict[Any, Any], owners: dict[str, str]) -> dict[Any, Any]:
    """``values`` with each key in its option's own name (``max-steps`` and ``learning_rate`` read as ``max_steps``
    and ``lr``); ConfigError naming both spellings when one option is given twice. Unknown keys are kept as they are
    (the caller refuses them)."""
    aliases = cli_aliases()
    out: dict[Any, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in values.items():
        name = key
        if isinstance(key, str):
            snake = key.replace("-", "_")
            name = aliases.get(snake, snake if snake in owners else key)
        if name in out:
            raise ConfigError(f"{key} and {spelled[name]} are one option ({name}): give it once")
        out[name] = value
        spelled[name] = str(key)
    return out


def check_old_names(values: dict[str, Any], version: int) -> None:
    """Under schema_version 1, ``warmup_steps`` is the measurement warm-up: given beside ``measure_warmup_steps`` it
    names that option twice (migration would silently keep one)."""
    if version < 2 and "warmup_steps" in values and "measure_warmup_steps" in values:
        raise ConfigError("warmup_steps and measure_warmup_steps are one option under schema_version 1 (warmup_steps "
                          "was the measurement warm-up): give it once, or say schema_version: 2 to mean the LR "
                          "warm-up")
