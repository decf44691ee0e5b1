"""What differed between the machines two sets of runs measured on (env.json): threads, CPUs, GPU, driver, CUDA,
library versions, ftprof's environment switches. A baseline verdict names these beside itself, since a 30x slower
CPU sweep on 2 threads instead of 64 is the machine, not the code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ftprof.results.run_dir import ENV


def read_env(run_dir: str | Path) -> dict[str, Any]:
    try:
        data = json.loads((Path(run_dir) / ENV).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def facts(env: dict[str, Any]) -> dict[str, str]:
    """The figures of an env.json that change speed, by the words the report uses for them."""
    gpus = env.get("gpus") or [{}]
    out = {"torch threads": env.get("torch_threads"), "CPUs": env.get("cpu_count"),
           "GPU": gpus[0].get("name"), "GPUs": len(env.get("gpus") or []) or None,
           "driver": gpus[0].get("driver"), "CUDA": env.get("torch_cuda"), "python": env.get("python")}
    for name, version in (env.get("packages") or {}).items():
        if name != "ftprof":
            out[name] = version
    for name, value in (env.get("switches") or {}).items():  # (runs before 2026-12-06 recorded none)
        out[name] = "unset" if value is None else value
    return {k: str(v) for k, v in out.items() if v is not None}


def differences(base_env: dict[str, Any], cur_env: dict[str, Any]) -> list[str]:
    """"torch threads 64 → 2", one per figure that differs (and is known on both sides)."""
    a, b = facts(base_env), facts(cur_env)
    return [f"{k} {a[k]} → {b[k]}" for k in a if k in b and a[k] != b[k]]


def group_differences(base_dirs: list[str], cur_dirs: list[str]) -> list[str]:
    """The differences between the first run of each side that has an env.json."""
    base = next((e for e in map(read_env, base_dirs) if e), {})
    cur = next((e for e in map(read_env, cur_dirs) if e), {})
    return differences(base, cur) if base and cur else []
