"""The environment a run measured: versions, host, GPUs, driver, allocator config, ftprof's git commit."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "transformers", "peft", "bitsandbytes", "gptqmodel", "optimum", "accelerate", "tokenizers",
            "nvidia-ml-py", "ftprof")


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        res = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    return res.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def gpu_info() -> list[dict[str, Any]]:
    """Names, memory, driver and clocks of the visible GPUs (torch for names; NVML for driver and clocks)."""
    import torch

    if not torch.cuda.is_available():
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append({"index": i, "name": props.name, "total_memory": props.total_memory,
                     "capability": f"{props.major}.{props.minor}", "multiprocessors": props.multi_processor_count})
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        for g in gpus:
            g["driver"] = driver.decode() if isinstance(driver, bytes) else driver
            uuid = str(torch.cuda.get_device_properties(g["index"]).uuid)
            handle = _nvml_handle_by_uuid(pynvml, uuid) or pynvml.nvmlDeviceGetHandleByIndex(g["index"])
            g["sm_clock_max_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
            g["power_limit_w"] = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000
        pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - NVML is optional; record why it is missing
        for g in gpus:
            g.setdefault("nvml_error", str(exc))
    return gpus


def _nvml_handle_by_uuid(pynvml, uuid: str):
    want = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(want)
    except Exception:  # noqa: BLE001
        return None


# Environment switches that change how a run computes, read where they act (models/lean_kernels.py: the lean ops'
# Triton kernels; models/kernels.py: Liger's loss chunks): recorded, unset ones as None, so a comparison names them
SWITCHES = ("FTPROF_LEAN_KERNELS", "FTPROF_LOSS_CHUNK_TOKENS")


def collect_env(allocator=None) -> dict[str, Any]:
    import torch

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "packages": package_versions(),
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": gpu_info(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER"),
        "pytorch_alloc_conf": os.environ.get("PYTORCH_ALLOC_CONF"),
        "alloc_conf_source": getattr(allocator, "source", None),
        "alloc_conf_reverted_from_imports": dict(getattr(allocator, "overridden_by_import", {}) or {}),
        "torch_threads": torch.get_num_threads(),
        "switches": {name: os.environ.get(name) for name in SWITCHES},
        "ftprof_git_commit": git_commit(),
    }
