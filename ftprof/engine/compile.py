"""``--compile``: torch.compile each decoder block (not the whole model: blocks are identical, so one compiled
graph serves them all, and the loss, the optimizer and PEFT's wrappers stay eager).

Compilation happens at the first forward. ``warm_up`` runs that first forward and backward on a batch of the
run's shape before the loop, times it as the compile time (reported apart from step time), and when it fails
(an op the compiler cannot handle in a quantized layer, a missing C++ compiler on CPU) puts every block back to
eager and says why in one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from ftprof import metrics


@dataclass
class CompileOutcome:
    blocks: int = 0
    compiled: bool = False
    compile_time_s: float | None = None  # the warm-up forward + backward, compilation included
    fallback: str | None = None  # why the run went eager, if it did

    def to_dict(self) -> dict:
        return asdict(self)


def compile_blocks(model) -> int:
    blocks = metrics.decoder_layers(model)
    for block in blocks:
        block.compile()
    return len(blocks)


def uncompile_blocks(model) -> None:
    for block in metrics.decoder_layers(model):
        block._compiled_call_impl = None  # what Module.compile() set: calls go to the eager forward again


def warm_up(model, params, batch: dict, autocast: Callable, log: Callable[[str], None]) -> CompileOutcome:
    """Compile the blocks by running one forward and backward; on failure, run eager. Gradients are cleared."""
    outcome = CompileOutcome(blocks=compile_blocks(model))
    start = time.perf_counter()
    try:
        with autocast():
            loss = model(**batch).loss
        loss.backward()
        if batch["input_ids"].is_cuda:
            torch.cuda.synchronize()  # sync point: compile time includes the kernels it launched
        outcome.compiled = True
        outcome.compile_time_s = time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - any compiler failure means: run eager, and say so
        uncompile_blocks(model)
        torch._dynamo.reset()
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        outcome.fallback = f"{type(exc).__name__}: {first}"
        log(f"--compile: decoder blocks did not compile ({outcome.fallback}); running eager")
    for p in params:
        p.grad = None
    return outcome
