"""Is the Hugging Face hub reachable? Asked once, quickly, before anything would contact it.

huggingface_hub retries an unreachable host with backoff (about 25 s a file) before it gives up; with no network
a run, or every cell a sweep checks, would wait that long for an error. One short TCP connect answers first, and
when the hub cannot be reached ``HF_HUB_OFFLINE=1`` is set for this process: the libraries then read their local
caches only, and fail at once for what is not there.
"""

from __future__ import annotations

import os
import socket
import sys
from urllib.parse import urlparse

CONNECT_TIMEOUT_S = 3.0
OFFLINE_HINT = "the hub is unreachable, so HF_HUB_OFFLINE=1 was set: only the local cache is read"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


_probed: list[bool] = []  # the one probe's answer, once asked


def hub_reachable() -> bool:
    """Whether the hub answered (asked once per process)."""
    if not _probed:
        _probed.append(_connect())
    return _probed[0]


def found_unreachable() -> bool:
    """The probe ran and the hub did not answer (so HF_HUB_OFFLINE was set here, not by the user)."""
    return bool(_probed) and not _probed[0]


def _connect() -> bool:
    """One TCP connect to the hub's endpoint (HF_ENDPOINT, default huggingface.co), at most CONNECT_TIMEOUT_S."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def offline_unless_reachable() -> bool:
    """Set HF_HUB_OFFLINE=1 (and tell already-imported libraries) when the hub cannot be reached. True when this
    process is offline (set here, or by the user)."""
    if _truthy(os.environ.get("HF_HUB_OFFLINE")):
        return True
    if hub_reachable():
        return False
    os.environ["HF_HUB_OFFLINE"] = "1"
    for module, attr in (("huggingface_hub.constants", "HF_HUB_OFFLINE"), ("datasets.config", "HF_HUB_OFFLINE"),
                         ("transformers.utils.hub", "_is_offline_mode"), ("datasets.config", "HF_DATASETS_OFFLINE")):
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, attr):  # read from the environment when they were imported
            setattr(loaded, attr, True)
    return True


def dataset_maybe_cached(name: str) -> bool:
    """Whether a hub dataset may be in a local cache: ``datasets``' own (HF_DATASETS_CACHE, default
    $HF_HOME/datasets; a folder ``owner___name``) or the hub's downloads (HF_HUB_CACHE; ``datasets--owner--name``).
    False only where neither folder exists (compared without case: what is there is the load's to judge)."""
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    places = {
        os.environ.get("HF_DATASETS_CACHE") or os.path.join(home, "datasets"): name.replace("/", "___"),
        os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub"):
            "datasets--" + name.replace("/", "--"),
    }
    for folder, entry in places.items():
        try:
            if entry.lower() in (e.lower() for e in os.listdir(folder)):
                return True
        except OSError:  # no such cache folder
            continue
    return False
