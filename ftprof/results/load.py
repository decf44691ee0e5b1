"""Read run directories back: one flat row per run (config options + result fields), never a crash.

A directory is a run directory when it holds config.json. Half-written or unreadable directories and newer schema
versions are reported (``problems``) and skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftprof.config import SCHEMA_VERSION, SECTIONS
from ftprof.results.run_dir import CONFIG, RESULT
from ftprof.results.status import INCOMPLETE


@dataclass
class LoadReport:
    rows: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one line each: "<dir>: <why skipped>"


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}_{k}" if prefix else str(k), v, out)
    elif isinstance(value, list):
        out[prefix] = json.dumps(value, default=str)
    else:
        out[prefix] = value


def run_row(run_dir: Path) -> dict[str, Any]:
    """One run as a flat dict. Raises ValueError naming the problem."""
    try:
        config = json.loads((run_dir / CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"unreadable config.json ({type(exc).__name__})") from None
    version = config.get("schema_version", 0)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ValueError(f"schema_version {version} is newer than this ftprof reads ({SCHEMA_VERSION})")
    row: dict[str, Any] = {"run_dir": str(run_dir), "run_name": run_dir.name}
    for section in SECTIONS:
        for key, value in (config.get(section) or {}).items():
            row[key] = ",".join(map(str, value)) if isinstance(value, list) else value
    row["run_name"] = run_dir.name  # the directory, even if copied or renamed since the run
    result_path = run_dir / RESULT
    if not result_path.is_file():
        row["status"] = INCOMPLETE  # started, never finished (killed before bench could record it)
        return row
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"unreadable result.json ({type(exc).__name__})") from None
    if result.get("schema_version", 0) > SCHEMA_VERSION:
        raise ValueError(f"result schema_version {result['schema_version']} is newer than this ftprof reads")
    flat: dict[str, Any] = {}
    _flatten("", result, flat)
    flat.pop("run_dir", None)
    row.update(flat)
    return row


def find_run_dirs(paths: list[str | Path]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        if (p / CONFIG).is_file():
            found.append(p)
        elif p.is_dir():
            found.extend(sorted(c.parent for c in p.rglob(CONFIG)))
    return sorted(set(found))


def read_runs(paths: list[str | Path]) -> LoadReport:
    report = LoadReport()
    for run_dir in find_run_dirs(paths):
        try:
            report.rows.append(run_row(run_dir))
        except ValueError as exc:
            report.problems.append(f"{run_dir}: {exc}")
    return report
