"""Process-level settings that change what is measured: allocator config, device, dtype, noisy imports.

Importing peft imports gptqmodel whenever it is installed, and gptqmodel's import sets PYTORCH_ALLOC_CONF
(expandable segments, split size, GC threshold) and CUDA_DEVICE_ORDER and prints banners. Left alone, that silently
changes CUDA memory behaviour for every method. ftprof therefore decides the allocator config itself, before CUDA is
initialised, restores it after any such import, and records what was in effect (env.json).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import sys
import warnings
from dataclasses import dataclass

from ftprof.metrics import GIB

DEFAULT_ALLOC_CONF = "expandable_segments:True"
_GUARDED_ENV = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_DEVICE_ORDER")


@dataclass
class AllocatorSetting:
    value: str
    source: str  # "option" | "environment" | "ftprof default"
    overridden_by_import: dict  # variable -> value a library import tried to set (and we reverted)


# torchao (imported by gptqmodel and transformers when installed) registers enums that make torch log a deprecation
# warning at import; it is noise to an ftprof user.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "No CUDA runtime is found" on CPU hosts
# bitsandbytes suggests the optional `kernels` package for faster CPU 4-bit matmuls on every CPU QLoRA run.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

# Off a terminal (a pipe, a file, a bench experiment's log) a progress bar is a stream of carriage returns and
# redrawn frames: the libraries' bars are turned off there (ftprof prints its own plain progress lines). tqdm reads
# TQDM_* when it is imported, huggingface_hub and datasets read theirs at import too: hence at ftprof.runtime's
# import, which comes before theirs (the engine imports torch, transformers and datasets later).
_OFF_TERMINAL_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
                     "TQDM_DISABLE": "1", "LOGBAR_ANIMATION": "0"}


@functools.cache
def triton_installed() -> bool:
    """Whether Triton can be imported (torch's dependency on Linux x86, not everywhere): ftprof's Triton kernels
    run only where it is (--dequant-kernel triton, the lean ops' kernels)."""
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def is_terminal(stream=None) -> bool:
    """Whether ``stream`` (default sys.stderr, where progress bars go) is a terminal."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def no_progress_bars_off_terminal(stream=None) -> bool:
    """Turn third-party progress bars off unless ``stream`` is a terminal (a value the user set stays). Returns
    whether they were turned off."""
    if is_terminal(stream):
        return False
    for key, value in _OFF_TERMINAL_ENV.items():
        os.environ.setdefault(key, value)
    return True


no_progress_bars_off_terminal()

_setting: AllocatorSetting | None = None
_tampering: dict[str, str] = {}


def pin_allocator_config(requested: str | None) -> AllocatorSetting:
    """Choose PYTORCH_ALLOC_CONF for this process. Must run before the first CUDA allocation."""
    global _setting
    if requested:
        value, source = requested, "option"
    elif os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        value = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ["PYTORCH_CUDA_ALLOC_CONF"]
        source = "environment"
    else:
        value, source = DEFAULT_ALLOC_CONF, "ftprof default"
    os.environ["PYTORCH_ALLOC_CONF"] = value
    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # the older name; one source of truth
    _setting = AllocatorSetting(value, source, _tampering)
    return _setting


def allocator_setting() -> AllocatorSetting | None:
    return _setting


@contextlib.contextmanager
def logger_level(name: str, level: int):
    """The named library logger at ``level`` for the duration, then back to what it was."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


@contextlib.contextmanager
def quiet_import():
    """Import noisy libraries (peft -> gptqmodel): swallow banners, revert the environment they change."""
    before = {k: os.environ.get(k) for k in _GUARDED_ENV}
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink):
            yield
    finally:
        _release_import_frames()
        for key, old in before.items():
            new = os.environ.get(key)
            if new != old:
                _tampering[key] = new or ""
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old


def _release_import_frames() -> None:
    """Drop the tracebacks of the import errors gptqmodel keeps as module globals (``gguf_cpp``'s
    ``_LLAMA_CPP_IMPORT_ERROR`` and the like; the errors and their messages stay).

    A traceback holds the frames it passed through, and they hold their callers: every frame on the stack when
    gptqmodel was first imported, locals included. peft imports gptqmodel's layers lazily inside get_peft_model,
    so the first model a process built stayed alive after ``ftprof.train()`` returned (on an H200, 2.3 GiB of a
    later run's memory cap was a previous run's llama-1b)."""
    import sys

    for name, module in list(sys.modules.items()):
        if module is None or name.partition(".")[0] != "gptqmodel":
            continue
        for value in list(vars(module).values()):
            seen: set[int] = set()
            while isinstance(value, BaseException) and id(value) not in seen:
                seen.add(id(value))
                value.__traceback__ = None
                value = value.__cause__ or value.__context__


def import_peft():
    """Import peft with gptqmodel's side effects undone."""
    with quiet_import():
        import peft
    return peft


def resolve_device(requested: str):
    import torch

    from ftprof.errors import ConfigError

    # The default index is LOCAL_RANK (torchrun) or 0, not torch.cuda.current_device(): that call would create a
    # CUDA context in a process that may only launch workers (it would hold ~0.5 GiB of GPU 0 for the whole run).
    default_index = int(os.environ.get("LOCAL_RANK", 0))
    if requested == "auto":
        return torch.device("cuda", default_index) if torch.cuda.is_available() else torch.device("cpu")
    if requested.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {requested}: CUDA is not available on this machine")
        dev = torch.device(requested)
        index = dev.index if dev.index is not None else default_index
        if index >= torch.cuda.device_count():
            raise ConfigError(f"--device {requested}: only {torch.cuda.device_count()} CUDA device(s) visible")
        return torch.device("cuda", index)
    return torch.device("cpu")


def resolve_dtype_name(requested: str, device) -> str:
    """auto = float32 on CPU (bf16 matmuls are ~6x slower on CPUs without AVX-512), bfloat16 on CUDA."""
    if requested != "auto":
        return requested
    return "bfloat16" if device.type == "cuda" else "float32"


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
            "uint8": torch.uint8}[name]


@contextlib.contextmanager
def memory_cap(device, gib: float | None):
    """``--memory-limit-gib``: for the duration of a run, the caching allocator refuses to hold more than ``gib``
    on ``device`` (an allocation beyond it raises torch's out-of-memory error, as on a card that size); after
    the run the fraction is 1.0 again (no cap)."""
    if gib is None or device.type != "cuda":
        yield
        return
    import torch

    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * GIB / total), device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def available_memory(device, cap_gib: float | None = None) -> int:
    """Bytes this process can use for training now: free device memory plus what torch already holds (CUDA; at
    most ``cap_gib``, --memory-limit-gib), or available host memory (CPU)."""
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        usable = free + torch.cuda.memory_reserved(device)
        return usable if cap_gib is None else min(usable, int(cap_gib * GIB))
    import psutil

    return psutil.virtual_memory().available + psutil.Process().memory_info().rss
