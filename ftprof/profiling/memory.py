"""Memory per stage: torch allocator stats on CUDA, process RSS on CPU. Bytes everywhere.

Stages: load, method_setup, first_forward, first_backward, first_optimizer_step, steady_state. At each stage
boundary the torch peak counters are reset, so each stage's peak is its own; the run's peak is the max over stages
and steps (``ftprof.metrics.run_peak``).
"""

from __future__ import annotations

import contextlib
import resource
import sys
from dataclasses import asdict, dataclass

import psutil
import torch


@dataclass
class StageMemory:
    stage: str
    allocated_before: int
    allocated_after: int
    peak_allocated: int
    reserved_after: int
    peak_reserved: int
    rss_after: int

    @property
    def delta(self) -> int:
        return self.allocated_after - self.allocated_before


def host_peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


class MemoryTracker:
    """Records memory per stage. On CPU, 'allocated' is the process RSS (no allocator stats exist).

    A context manager like the other trackers; what it recorded (``stages``) is read when the run ends. The run's
    peaks are derived from the stages and the steps together (``ftprof.metrics.run_peak``)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.stages: list[StageMemory] = []
        self._proc = psutil.Process()
        self.open_peak: dict[str, int] = {}  # the peak counters when the run ended, set on exit

    def __enter__(self) -> MemoryTracker:
        return self

    def __exit__(self, *exc) -> None:
        # The counters since the last reset count too: after an OOM they hold the high-water mark that did not fit.
        if self.cuda:
            now = self.current()
            self.open_peak = {"allocated": now["peak_allocated"], "reserved": now["peak_reserved"]}

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device) if self.cuda else self._proc.memory_info().rss

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def alloc_retries(self) -> int:
        """The caching allocator's retries so far: each is a cudaMalloc that failed, after which the allocator freed
        its cached blocks (synchronizing the device) and tried again. 0 on CPU."""
        return int(torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)) if self.cuda else 0

    def current(self) -> dict[str, int]:
        """Allocator state now and peaks since the last reset (CUDA), or RSS (CPU)."""
        if self.cuda:
            return {"allocated": torch.cuda.memory_allocated(self.device),
                    "peak_allocated": torch.cuda.max_memory_allocated(self.device),
                    "reserved": torch.cuda.memory_reserved(self.device),
                    "peak_reserved": torch.cuda.max_memory_reserved(self.device)}
        rss = self._proc.memory_info().rss
        return {"allocated": rss, "peak_allocated": rss, "reserved": rss, "peak_reserved": rss}

    @contextlib.contextmanager
    def stage(self, name: str):
        # Sync so the 'before' numbers do not include work still queued from the previous stage.
        if self.cuda:
            torch.cuda.synchronize(self.device)
        before = self.allocated()
        self.reset_peak()
        yield
        self.close_stage(name, before)

    def close_stage(self, name: str, before: int, *, peak_allocated: int | None = None,
                    peak_reserved: int | None = None) -> None:
        """Record a stage that began with ``before`` bytes allocated. Its peaks are the allocator's counters since
        the last reset unless given (a stage spanning several steps passes the max of the steps' own peaks)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        now = self.current()
        if peak_allocated is None:
            peak_allocated = now["peak_allocated"] if self.cuda else max(now["allocated"], before)
        if peak_reserved is None:
            peak_reserved = now["peak_reserved"]
        # a peak is never under what is held at the stage's end (on a CPU the steps' peaks are RSS read at each
        # step's end, and the stage's end reads it later)
        peak_allocated, peak_reserved = max(peak_allocated, now["allocated"]), max(peak_reserved, now["reserved"])
        self.stages.append(StageMemory(name, before, now["allocated"], peak_allocated, now["reserved"],
                                       peak_reserved, self._proc.memory_info().rss))

    def stage_fields(self) -> dict[str, int]:
        """Per-stage deltas and peaks, as result.json's memory_stages holds them."""
        out: dict[str, int] = {}
        for s in self.stages:
            out[f"mem_{s.stage}_delta"] = s.delta
            out[f"mem_{s.stage}_peak"] = s.peak_allocated
        return out

    def stage_rows(self) -> list[dict]:
        return [asdict(s) | {"delta": s.delta} for s in self.stages]


def dump_oom_snapshot(path) -> bool:
    """Write the CUDA allocator state at an OOM (segments and blocks; stacks too if history was being recorded).

    Called before the error is reported, while the allocator still holds the memory that did not fit.
    """
    try:
        from pathlib import Path

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))
        return True
    except Exception:  # noqa: BLE001 - a failed snapshot must not hide the OOM itself
        return False


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t  # FSDP2 DTensor: this rank's shard


def _tensor_bytes(t) -> int:
    local = _local(t)
    return local.numel() * local.element_size()


def static_breakdown(model, optimizer, device_type: str | None = None) -> dict[str, int]:
    """Exact bytes of what lives for the whole run on this rank: weights (frozen / trainable, quantized ones as
    stored, with their quantization constants), gradients and optimizer state. Call while gradients exist (after
    backward, before they are cleared). Activations and transients are the peak minus these.

    With ``device_type``, tensors that live on another device (--fsdp-cpu-offload keeps weights, gradients and
    optimizer state on the host) are no part of this device's peak: their bytes go to ``offloaded`` instead."""
    parts = {"weights_frozen": 0, "weights_trainable": 0, "gradients": 0, "optimizer_state": 0, "offloaded": 0}

    def add(part: str, t) -> None:
        here = device_type is None or _local(t).device.type == device_type
        parts[part if here else "offloaded"] += _tensor_bytes(t)

    seen: set[int] = set()
    for module in model.modules():
        tensors = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        for _, t in tensors:
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            if getattr(t, "requires_grad", False):
                add("weights_trainable", t)
                if t.grad is not None:
                    add("gradients", t.grad)
                continue
            add("weights_frozen", t)
            qs = getattr(t, "quant_state", None)  # bitsandbytes absmax (and nested absmax with double quant)
            for attr in ("absmax", "code"):
                if qs is not None and isinstance(getattr(qs, attr, None), torch.Tensor):
                    add("weights_frozen", getattr(qs, attr))
            nested = getattr(qs, "state2", None)
            if nested is not None and isinstance(getattr(nested, "absmax", None), torch.Tensor):
                add("weights_frozen", nested.absmax)
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                add("optimizer_state", v)
    if not parts["offloaded"]:
        del parts["offloaded"]
    return parts


class SavedActivations:
    """Bytes autograd keeps for backward during a forward (each storage once, parameters excluded).

    Exact and device-independent: the activation memory a forward leaves behind, which activation checkpointing
    shrinks to the block inputs (checkpointing registers its own hooks inside, so only what it keeps is seen).
    Used on the first micro-batch only; costs nothing afterwards.
    """

    def __init__(self, model):
        self.exclude = {p.untyped_storage().data_ptr() for p in model.parameters() if p.device.type != "meta"}
        self.storages: dict[int, int] = {}

    def _pack(self, tensor):
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensor subclasses without a plain storage
            return tensor
        ptr = storage.data_ptr()
        if ptr not in self.exclude:
            self.storages.setdefault(ptr, storage.nbytes())
        # Detached: the same storage without the grad_fn. Returned as is, a saved output would hold its own node
        # and the graph would be a reference cycle, kept until the garbage collector runs: --checkpointing auto's
        # probe forwards (never run backward) kept 2.4 GiB on an H200 (llama-8b QLoRA), and auto under a 12 GiB cap
        # then ran out of memory.
        return tensor.detach()

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())
