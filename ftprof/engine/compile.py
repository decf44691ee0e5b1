"""``--compile``: torch.compile each decoder block (not the whole model: blocks are identical, so one compiled
graph serves them all, and the loss, the optimizer and PEFT's wrappers stay eager).

Under full checkpointing a block is compiled inside its checkpoint (engine/compiled_checkpoint.py): torch's
checkpoint stays outside compiled code, keeping only the layer's input, and recomputes the compiled forward (under
the CUDA-graph modes the block's children are compiled instead, the way measured there).
Selective checkpointing keeps the compiled block with the checkpoint inside: its policy is traced with it. Layer by
layer: under --selective-rest the full layers are compiled inside their checkpoint, the selective ones whole.

``--compile-mode`` is torch.compile's mode, applied to each block: max-autotune-no-cudagraphs lets inductor
benchmark its Triton GEMM templates (which can fuse the elementwise work around a matmul, such as adding LoRA's
output to the base projection's) against cuBLAS for every matmul shape; reduce-overhead and max-autotune replay
each compiled block as a CUDA graph (the loop then marks each micro-batch as a new step for torch's CUDA graph trees).

The loss is compiled too (``--compile-loss``, on by default), unless a kernel set computes it (Liger's fused
linear cross entropy): transformers' causal-LM loss upcasts the whole logits tensor to fp32 and runs cross entropy
over it, memory-bound passes over 4 GiB for llama-8b at 4 x 2048 (5.4% of the step on an H200, eager). Compiled,
the upcast, log-softmax and their backward are fused: on an H200 +2.5% tokens/s for QLoRA, +2.1% for LoRA, 8.4 GB
less memory. It is set on the transformers model itself, which reads it on every forward.

Compilation happens at the first forward. ``warm_up`` runs that first forward and backward on a batch of the
run's shape before the loop, times it as the compile time (reported apart from step time), and when it fails
(an op the compiler cannot handle in a quantized layer, a missing C++ compiler on CPU) puts every block back to
eager and says why in one line.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ftprof import metrics, models
from ftprof.config.options import CUDA_GRAPH_MODES
from ftprof.engine import compiled_checkpoint
from ftprof.models.checkpointing import selective_layers
from ftprof.results.parts import CompileOutcome  # what --compile did, as result.json records it


@contextlib.contextmanager
def eager_rounding(enabled: bool):
    """While a run compiles, make inductor round low-precision intermediates where eager rounds them.

    Fused kernels otherwise keep the bf16 results of one op in fp32 for the next. That is closer to exact, but not
    what eager computes, and the first optimizer step amplifies the difference: measured on an H200 (llama-1b LoRA,
    2 x 512), compiled blocks gave a loss 1.3% below eager's at step 2 (11.763 against 11.921); with this setting,
    11.921 (the same to 4 digits for 8 steps). TORCHINDUCTOR_EMULATE_PRECISION_CASTS, when set, wins."""
    if not enabled or "TORCHINDUCTOR_EMULATE_PRECISION_CASTS" in os.environ:
        yield
        return
    import torch._inductor.config as inductor_config

    with inductor_config.patch(emulate_precision_casts=True):
        yield


def compile_kwargs(mode: str, tuning: bool) -> dict:
    """torch.compile's arguments for ``mode`` (--compile-mode), with --compile-tuning: coordinate-descent tuning of
    the Triton kernels inductor generates (max-autotune's own kernel tuning, without its GEMM templates).
    torch.compile takes a mode or options, not both, so tuning spells the mode out as its options."""
    if not tuning:
        return {"mode": None if mode == "default" else mode}
    from torch._inductor import list_mode_options

    return {"options": {**list_mode_options(mode), "coordinate_descent_tuning": True}}


def tag_caches() -> None:
    """Put a digest of ftprof's model code into torch.compile's cache keys (``torch.compiler.config.cache_key_tag``,
    added to a tag already set). torch's caches key on the traced graph and torch's own config; the backward of a
    custom op (models/fp8_kernels.py) is traced from Python those keys do not cover, so after ftprof changed, a
    cached graph of the old code ran (seen while developing: a changed backward was served from the cache)."""
    import torch.compiler.config as compiler_config

    digest = hashlib.sha256()
    for path in sorted(Path(models.__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    tag = f"ftprof-{digest.hexdigest()[:16]}"
    if tag not in compiler_config.cache_key_tag:
        compiler_config.cache_key_tag = "+".join(filter(None, (compiler_config.cache_key_tag, tag)))


def allow_forward_side_effects_under_checkpoint() -> None:
    """Let dynamo trace a selective-checkpointed block whole. transformers' hub-kernel wrapper (the ``kernels``
    package, around each attention forward) sets a context variable, a side effect dynamo refuses inside a
    checkpoint ("Mutating a variable from outside the scope of this HOP"): the block broke into pieces and ran
    mostly eager, slower than no compile (llama-8b QLoRA selective on an H200: 8,320 tokens/s compiled, 12,147
    uncompiled, 16,794 without checkpointing). The flag traces it and does not replay that side effect when the
    backward recomputes: recomputation runs compiled code, where the variable is never read. Process-wide, as
    dynamo's config is; torch versions without the flag keep their behaviour."""
    import torch._dynamo.config as dynamo_config

    if hasattr(dynamo_config, "skip_fwd_side_effects_in_bwd_under_checkpoint"):
        dynamo_config.skip_fwd_side_effects_in_bwd_under_checkpoint = True


def compile_targets(model, mode: str = "default") -> list[torch.nn.Module]:
    """The modules to compile as modules: each decoder block, except those full checkpointing applies to (all, or
    the first --checkpoint-layers), which are compiled inside their checkpoint instead (a selective layer's
    checkpoint is traced inside its block). Under a CUDA-graph mode
    their children are compiled, as before that: the way measured to run there (QLoRA 9,268 tokens/s on an H200,
    2026-12-02; the planner avoids it); whole layers as graphs replayed by recomputation were never run."""
    targets: list[torch.nn.Module] = []
    for block in metrics.decoder_layers(model):
        if not compiled_checkpoint.checkpointed(block):
            targets.append(block)
        elif mode in CUDA_GRAPH_MODES:
            targets += list(block.children())
    return targets


def causal_lm(model) -> torch.nn.Module | None:
    """The transformers model that computes the loss (under PEFT, DDP or FSDP wrappers), or None. Found by class:
    PEFT's wrappers forward unknown attributes to the model inside, so ``hasattr(peft_model, "loss_function")`` is
    true, and setting it there would change nothing the model reads."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel) and module.get_output_embeddings() is not None:
            return module
    return None


def _scope(blocks: list[torch.nn.Module], targets: list[torch.nn.Module]) -> str:
    """What was compiled: "block"; for the blocks under full checkpointing "block inside its checkpoint", or
    under CUDA graphs "block children"; both as "... in 8 of 16 blocks" when only some are checkpointed."""
    whole = {id(t) for t in targets}
    others = [block for block in blocks if id(block) not in whole]
    if not others:
        return "block"
    children = any(id(child) in whole for child in others[0].children())
    scope = "block children" if children else "block inside its checkpoint"
    return scope if len(others) == len(blocks) else f"{scope} in {len(others)} of {len(blocks)} blocks"


def _first_line(exc: Exception) -> str:
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"


def _forward_backward(model, batch: dict, autocast: Callable) -> None:
    with autocast():
        loss = model(**batch).loss
    loss.backward()
    if batch["input_ids"].is_cuda:
        torch.cuda.synchronize()  # sync point: compile time includes the kernels it launched


def warm_up(model, params, batch: dict, autocast: Callable, log: Callable[[str], None],
            mode: str = "default", compile_loss: bool = True,
            tuning: bool = False) -> CompileOutcome:
    """Compile the blocks (and, with ``compile_loss``, transformers' loss) by running one forward and backward.
    When that fails with the loss compiled, the loss goes back to eager and the blocks are tried alone; when the
    blocks fail, the run is eager. Each fallback is one line through ``log``. Gradients are cleared.
    The model's checkpointing, layer by layer, decides what is compiled (``compile_targets``); ``mode`` is
    torch.compile's; ``tuning`` adds coordinate-descent kernel tuning to blocks and loss."""
    tag_caches()
    if selective_layers(model):  # --checkpointing selective, or the rest of --selective-rest
        allow_forward_side_effects_under_checkpoint()
    blocks, targets = metrics.decoder_layers(model), compile_targets(model, mode)
    for module in targets:
        module.compile(**compile_kwargs(mode, tuning))
    if mode not in CUDA_GRAPH_MODES:  # the full-checkpointed layers, if any
        compiled_checkpoint.attach(model, compile_kwargs(mode, tuning))
    lm = causal_lm(model) if compile_loss else None
    eager_loss = lm.loss_function if lm is not None else None
    if lm is not None:
        # fullgraph: a loss that breaks the graph (a user's loss with a host sync, say) gains little compiled; it
        # fails here instead and runs eager, and the blocks stay compiled.
        lm.loss_function = torch.compile(eager_loss, fullgraph=True,  # transformers reads it on each forward
                                         **compile_kwargs("default", tuning))
    outcome = CompileOutcome(blocks=len(blocks), scope=_scope(blocks, targets), mode=mode, loss=lm is not None,
                             tuning=tuning)
    start = time.perf_counter()
    try:
        try:
            _forward_backward(model, batch, autocast)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: try the blocks without the loss
            if lm is None:
                raise
            lm.loss_function, outcome.loss = eager_loss, False
            for p in params:
                p.grad = None
            _forward_backward(model, batch, autocast)
            log(f"--compile: the loss did not compile ({_first_line(exc)}); it runs eager, the blocks compiled")
        outcome.compiled = True
        outcome.compile_time_s = time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - any compiler failure means: run eager, and say so
        for module in targets:
            module._compiled_call_impl = None  # what Module.compile() set: calls go to the eager forward again
        compiled_checkpoint.detach(model)
        if lm is not None:
            lm.loss_function = eager_loss
        outcome.loss = False
        torch._dynamo.reset()
        outcome.fallback = _first_line(exc)
        log(f"--compile: decoder blocks did not compile ({outcome.fallback}); running eager")
    for p in params:
        p.grad = None
    return outcome
