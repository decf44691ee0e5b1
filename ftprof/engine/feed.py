"""Micro-batches on their way to the device, the next step's first one prepared while the GPU runs this step.

Each step ends with a sync (the step timer waits for its kernels), so the GPU is idle from then until the next
step's first kernel. Whatever the host does in between counts in the next step's time: making the batch (the
synthetic stream took 18 ms for 4 x 2048 tokens on a 2-core host before it became one gather; real data's
collation and padding still take host time) and copying it from pageable memory. Profiled on an
H200 (llama-8b QLoRA, compiled blocks), the GPU waited 42 ms per step outside forward, backward and the optimizer
step. With prefetching, the next batch is made, pinned and its copy queued after the step's kernels are launched
and before the sync: the host work overlaps the GPU's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from ftprof.data import count_tokens


class BatchFeed:
    """``take()`` the next micro-batch on the device, with its (tokens, real tokens); ``prefetch()`` prepares it
    now, so that ``take()`` returns at once. The stream's order is unchanged either way. ``load_s`` sums the host
    seconds spent making batches and queueing their copies. With a ``host_embedding`` (--offload-embeddings) the
    batch carries its embedding rows, gathered on the host, instead of its token ids."""

    def __init__(self, batches: Iterator[dict], device: torch.device, host_embedding=None):
        self._batches = batches
        self._device = device
        self._embedding = host_embedding  # --offload-embeddings: rows gathered here, sent as inputs_embeds
        self._ready: tuple[dict, int, int] | None = None
        self.load_s = 0.0

    def prefetch(self) -> None:
        if self._ready is None:
            self._ready = self._load(pin=self._device.type == "cuda")

    def take(self) -> tuple[dict, int, int]:
        ready, self._ready = self._ready, None
        return ready if ready is not None else self._load(pin=False)

    def _load(self, pin: bool) -> tuple[dict, int, int]:
        t0 = time.perf_counter()
        batch = next(self._batches)
        tokens, real = count_tokens(batch)
        if self._embedding is not None:  # the rows, gathered on the host (pinned), replace the ids
            batch = {**batch, "inputs_embeds": self._embedding.rows(batch["input_ids"])}
            del batch["input_ids"]
        # From pinned memory a non-blocking copy is queued behind the running kernels instead of waiting for them.
        moved = {k: (v.pin_memory() if pin else v).to(self._device, non_blocking=True) for k, v in batch.items()}
        self.load_s += time.perf_counter() - t0
        return moved, tokens, real
