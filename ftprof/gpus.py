"""The GPUs ``ftprof plan --gpu NAME`` can plan for without having one: the name torch gives each (what the
calibration store and the MFU peak table are keyed by) and its memory. Peak FLOP/s come from the one table in
ftprof.metrics. No torch here: a bad name is refused before anything loads.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ftprof.errors import ConfigError
from ftprof.metrics import GIB

CUDA_CONTEXT_GIB = 0.5  # what the CUDA context and library workspaces take from a card before torch allocates


@dataclass(frozen=True)
class Gpu:
    name: str  # as torch.cuda.get_device_name reports it
    memory_gib: float  # the card's memory as the driver reports it (GiB)
    capability: tuple = (8, 0)  # CUDA compute capability: FP8 tensor cores from 8.9 (Ada, Hopper, Blackwell)

    @property
    def usable_bytes(self) -> int:
        return int((self.memory_gib - CUDA_CONTEXT_GIB) * GIB)


# Short names people type -> the card. Memory: total as nvidia-smi reports it (MiB / 1024).
CATALOGUE: dict[str, Gpu] = {
    "h200": Gpu("NVIDIA H200", 140.4, (9, 0)),
    "h100": Gpu("NVIDIA H100 80GB HBM3", 79.6, (9, 0)),
    "h100-pcie": Gpu("NVIDIA H100 PCIe", 79.6, (9, 0)),
    "gh200": Gpu("NVIDIA GH200 480GB", 94.5, (9, 0)),
    "a100-80gb": Gpu("NVIDIA A100-SXM4-80GB", 79.2, (8, 0)),
    "a100-40gb": Gpu("NVIDIA A100-SXM4-40GB", 39.4, (8, 0)),
    "l40s": Gpu("NVIDIA L40S", 44.5, (8, 9)),
    "l4": Gpu("NVIDIA L4", 22.0, (8, 9)),
    "a10g": Gpu("NVIDIA A10G", 22.0, (8, 6)),
    "b200": Gpu("NVIDIA B200", 178.4, (10, 0)),
    "rtx4090": Gpu("NVIDIA GeForce RTX 4090", 23.6, (8, 9)),
    "rtx3090": Gpu("NVIDIA GeForce RTX 3090", 23.6, (8, 6)),
}
ALIASES = {"a100": "a100-80gb", "h100-sxm": "h100", "4090": "rtx4090", "3090": "rtx3090"}


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-").removeprefix("nvidia-")


def gpu_named(name: str) -> Gpu:
    """The card for ``--gpu NAME`` (a short name, or the name torch reports); ConfigError with the known names."""
    key = _key(name)
    key = ALIASES.get(key, key)
    if key in CATALOGUE:
        return CATALOGUE[key]
    for gpu in CATALOGUE.values():
        if _key(gpu.name) == key:
            return gpu
    known = sorted([*CATALOGUE, *ALIASES])
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ConfigError(f"--gpu: unknown GPU '{name}'{hint}; known: {', '.join(known)}")
