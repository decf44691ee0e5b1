"""Building a run: tokenizer and data, the model by its method, precision, the checkpointing policy, the
data-parallel wrapper, the optimizer, compiled blocks, and the FLOP counts. ``build`` returns everything the loop
needs in one ``Built``. (Fused kernels are patched into transformers before this runs: see models/kernels.py.)"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from ftprof import metrics
from ftprof.data import make_batches
from ftprof.engine import checkpointing, distributed
from ftprof.engine.compile import CompileOutcome, warm_up
from ftprof.engine.evaluate import eval_batches_for
from ftprof.engine.schedule import make_scheduler
from ftprof.models import (
    attention,
    dequant,
    fp8_base,
    fused_projections,
    host_embedding,
    kernels,
    lean_mlp,
    lean_norm,
    offload,
    split_layer,
)
from ftprof.models.checkpointing import SelectivePolicy
from ftprof.models.materialize import materialize_sharded
from ftprof.models.methods import LoadContext, get_strategy
from ftprof.models.precision import precision
from ftprof.models.tokenizer import load_tokenizer as tokenizer_for
from ftprof.profiling.memory import MemoryTracker
from ftprof.resolved import ResolvedRun
from ftprof.results.parts import AutoChoice
from ftprof.runtime import torch_dtype


@dataclass(frozen=True)
class FlopCounts:
    per_token: float  # model FLOPs per token (MFU)
    recompute_per_token: float  # what activation checkpointing runs again (HFU adds it)


@dataclass(frozen=True)
class Built:
    tokenizer: object
    batches: Iterator[dict]
    model: torch.nn.Module
    params: list[torch.nn.Parameter]  # the trainable ones
    optimizer: torch.optim.Optimizer
    autocast: Callable[[], contextlib.AbstractContextManager]
    counts: metrics.ParamCounts
    flops: FlopCounts
    device_name: str
    checkpointing: str  # the policy that runs (auto resolved)
    checkpointed_layers: int | None  # how many decoder layers it applies to (None: all)
    auto_choice: AutoChoice | None  # what --checkpointing auto estimated and chose
    compiled: CompileOutcome | None  # --compile's outcome
    sdpa_backend_used: str | None  # the attention kernel SDPA picks for this model's training shape (CUDA)
    selective: SelectivePolicy | None  # counts what selective checkpointing caches (activations it saves)
    kept_dequantized: int  # QLoRA linears whose recomputation keeps the dequantized weight for backward
    scheduler: object = None  # the learning-rate schedule (torch LambdaLR), stepped after each optimizer step
    eval_batches: list = field(default_factory=list)  # CPU batches each evaluation runs over (engine/evaluate.py)
    host_embedding: object = None  # --offload-embeddings: the HostEmbedding whose rows the batch feed gathers


def build(resolved: ResolvedRun, memory: MemoryTracker, log: Callable[[str], None]) -> Built:
    cfg, rank = resolved.config, resolved.dist.rank
    dtype = torch_dtype(resolved.dtype)
    strategy = get_strategy(cfg.method.method)
    torch.manual_seed(cfg.train.seed)  # same initial weights on every rank
    # Real data: the tokenizer and the tokenized rows come with the resolved run (ftprof.data.prepare).
    tokenizer = resolved.tokenizer if resolved.tokenizer is not None else load_tokenizer(resolved, log)
    vocab = resolved.source.config.vocab_size
    # Each rank reads a different stream of batches (data parallelism).
    batches = make_batches(cfg.data, tokenizer, vocab, cfg.train.seed + rank, prepared=resolved.data)

    def calibration() -> list[torch.Tensor]:
        return calibration_rows(resolved, tokenizer)

    # Under FSDP a preset is sharded while still on the meta device: no rank ever holds the whole model.
    defer = resolved.shards and resolved.source.kind == "preset" and strategy.can_defer_init
    with memory.stage("load"):
        model = strategy.load(LoadContext(cfg, resolved.source, resolved.device, dtype, tokenizer, calibration, log,
                                          defer_init=defer, policy=resolved.policy))
    with memory.stage("method_setup"):
        host_table = _host_embedding(model, resolved, log)
        model = strategy.apply(model, cfg)
        autocast = precision(model, resolved.device_type, dtype, strategy.uses_lora and not cfg.method.kbit_prepare)
        if hasattr(model, "config"):
            model.config.use_cache = False
        model.train()  # HF models start in eval mode, where gradient checkpointing silently does nothing
        policy, layers, auto, selective = checkpointing.resolve_policy(model, resolved)
        if auto is not None:
            log(f"--checkpointing auto: {auto.reason}")
        _say_offloaded(model, resolved, log)
        joined = _joined_then_lean(model, resolved, log)
        if cfg.method.fp8_base:
            log(f"--fp8-base: {fp8_base.convert(metrics.decoder_layers(model))} base linears multiply in e4m3")
        kept, torch_dequant = route_dequantization(model, cfg, policy, layers, compiling=cfg.model.compile)
        model = wrap_model(model, resolved, dtype, defer)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = make_optimizer(params, resolved)
        fused_projections.follow(optimizer, joined)
        t = cfg.train
        scheduler = make_scheduler(optimizer, t.lr_scheduler_type, t.lr_warmup_steps(), t.max_steps)
    compiled = None
    if cfg.model.compile:
        with memory.stage("compile"):
            first = next(make_batches(cfg.data, tokenizer, vocab, cfg.train.seed + rank))  # stream untouched
            compiled = warm_up(model, params, {k: v.to(resolved.device) for k, v in first.items()}, autocast, log,
                               cfg.model.compile_mode,
                               compile_loss=cfg.model.compile_loss and not kernels.fuses_loss(cfg.model.kernels),
                               tuning=cfg.model.compile_tuning)
            compiled.dequant = torch_dequant if compiled.compiled else 0
            if torch_dequant and not compiled.compiled:  # torch-op dequantization pays only inside compiled code
                route_dequantization(model, cfg, policy, layers, compiling=False)
    counts = metrics.count_params(model)
    device_name = torch.cuda.get_device_name(resolved.device) if resolved.device_type == "cuda" else "cpu"
    used = (attention.probe(resolved.source.config, cfg.data.seq_len, resolved.device, dtype)
            if cfg.model.attn_implementation == "sdpa" else None)
    return Built(tokenizer, batches, model, params, optimizer, autocast, counts,
                 count_flops(model, counts, resolved, policy, layers), device_name, policy, layers, auto, compiled,
                 used, selective, kept, scheduler, eval_batches_for(resolved, tokenizer), host_table)


def _joined_then_lean(model, resolved: ResolvedRun, log: Callable[[str], None]) -> list:
    """--lora-fused-projections' joined groups, then --lean-activations (the MLPs keep no SwiGLU product) and
    --lean-norms (the norms feeding shared A matmuls keep their input, not their output; after the joining: joined
    projections keep their own input, and the norms leave them alone)."""
    blocks = metrics.decoder_layers(model)
    joined = fused_projections.fuse(model, blocks) if resolved.config.method.lora_fused_projections else []
    # only the layers that keep their activations: a recomputed layer keeps nothing for them to trim, and there the
    # ops' cost was all that was left (H200, llama-8b QLoRA, full on 28 of 32: -4.7% tokens/s on every layer)
    kept = [blocks[i] for i in metrics.keeping_layers(len(blocks), resolved.policy, resolved.checkpointed_layers,
                                                      resolved.selective_rest)]
    where = f"(the {len(kept)} of {len(blocks)} layers that keep their activations)"
    if resolved.lean_activations:
        log(f"--lean-activations: {lean_mlp.attach(kept)} MLPs keep no SwiGLU product {where}")
    if resolved.lean_norms:
        log(f"--lean-norms: {lean_norm.attach(kept)} norms keep their input, not their output {where}")
    return joined


def _say_offloaded(model, resolved: ResolvedRun, log: Callable[[str], None]) -> None:
    if resolved.offload_checkpoints:
        log(f"--offload-checkpoints: {len(offload.offloaded_layers(model))} layer inputs kept in pinned host memory")
    split = split_layer.split_layers(model)
    if split:
        log(f"--lean-recompute with --offload-checkpoints: {len(split)} layers checkpointed as their two halves "
            "(the attention's output projection is not recomputed either; its input offloaded too)")


def _host_embedding(model, resolved: ResolvedRun, log: Callable[[str], None]) -> host_embedding.HostEmbedding | None:
    """--offload-embeddings (or auto's choice of it): the input table moved to host memory, before PEFT wraps the
    model."""
    if not resolved.offload_embeddings:
        return None
    moved = host_embedding.move_to_host(model, resolved.device)
    if moved is None:
        log("--offload-embeddings: the input embedding stays on the device (the output layer shares its table, or "
            "it does more than a gather): nothing to save")
    else:
        table = moved.host_weight
        log(f"--offload-embeddings: the input embedding table ({table.numel() * table.element_size() / 2**20:,.0f} "
            "MiB) is in host memory; each micro-batch's rows are gathered there")
    return moved


def route_dequantization(model, cfg, policy: str, layers: int | None, compiling: bool) -> tuple[int, int]:
    """QLoRA: under full checkpointing the checkpointed layers' 4-bit linears keep the weights their recomputation
    dequantizes for backward (--keep-dequantized); --dequant-kernel picks the kernel, and while ``compiling``,
    --compile-dequant has torch ops dequantize (models/dequant.py). Returns (linears that keep, linears that
    dequantize with torch ops)."""
    if cfg.method.method != "qlora":
        return 0, 0
    blocks = metrics.decoder_layers(model)
    kept = 0
    if policy == "full" and dequant.keeps_weights(cfg.method):
        kept = len(blocks) if layers is None else layers
    torch_ops = compiling and cfg.model.compile_dequant
    kept, rerouted = dequant.route(blocks, kept, "torch" if torch_ops else cfg.method.dequant_kernel)
    return kept, rerouted if torch_ops else 0


def load_tokenizer(resolved: ResolvedRun, log: Callable[[str], None]):
    return tokenizer_for(resolved.source, synthetic=resolved.config.data.dataset == "synthetic", log=log)


def calibration_rows(resolved: ResolvedRun, tokenizer) -> list[torch.Tensor]:
    """GPTQ calibration sequences, from the run's own data stream (a fresh iterator, same seed)."""
    cfg = resolved.config
    n = cfg.method.gptq_calibration_samples
    vocab = resolved.source.config.vocab_size
    stream = make_batches(cfg.data, tokenizer, vocab, cfg.train.seed, prepared=resolved.data)
    rows: list[torch.Tensor] = []
    while len(rows) < n:
        batch = next(stream)
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=False):
            rows.append(ids[mask.bool()])
    return rows[:n]


def wrap_model(model, resolved: ResolvedRun, dtype: torch.dtype, deferred: bool):
    """The data-parallel wrapper (and, for a preset sharded on the meta device, each rank's own weights)."""
    cfg = resolved.config
    if resolved.dist.enabled or resolved.shards:
        model = distributed.wrap(model, cfg, resolved.device, dtype)
    if deferred:
        std = float(getattr(resolved.source.config, "initializer_range", 0.02))
        # FSDP2's CPU offload wants the shards in host memory from the start (seen on two H200s: it refuses
        # parameters materialized on the GPU).
        host = torch.device("cpu") if cfg.distributed.fsdp_cpu_offload else None
        materialize_sharded(model, resolved.device, std=std, seed=cfg.train.seed + resolved.dist.rank, params_on=host)
    return model


def make_optimizer(params: list[torch.nn.Parameter], resolved: ResolvedRun) -> torch.optim.Optimizer:
    t = resolved.config.train
    if t.optimizer == "paged_adamw_8bit":
        import bitsandbytes as bnb

        return bnb.optim.PagedAdamW8bit(params, lr=t.lr, weight_decay=t.weight_decay)
    # Fused AdamW where every parameter lives on the GPU (under --fsdp-cpu-offload they live on the host, and the
    # step runs there).
    fused = bool(params) and all(p.device.type == "cuda" and p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay, fused=fused or None)


def count_flops(model, counts: metrics.ParamCounts, resolved: ResolvedRun, policy: str,
                checkpointed: int | None = None) -> FlopCounts:
    """Model FLOPs per token, and what checkpointing recomputes: the layers' forward under full checkpointing (the
    checkpointed layers' share of it when only some are); under selective the matmuls and attention are saved, so
    only elementwise work (no counted FLOPs) reruns."""
    layers, attn_dim = metrics.attention_dims(resolved.source.config)
    seq = resolved.config.data.seq_len
    recompute = 0.0
    if policy == "full":
        # (split: the layers apply_policy checkpointed as two halves, read off the model rather than its rule again)
        recomputed = metrics.recomputed_params(model, lean=resolved.lean_recompute,
                                               split=bool(split_layer.split_layers(model)))
        recompute = metrics.recompute_flops_per_token(recomputed, layers, attn_dim, seq)
        if checkpointed is not None and layers:
            recompute *= checkpointed / layers  # identical layers: each recomputes the same share
    return FlopCounts(metrics.flops_per_token(counts, layers, attn_dim, seq), recompute)
