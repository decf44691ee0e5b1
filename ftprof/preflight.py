"""Checks that need a little I/O (configs, paths, installed packages), run before anything big loads, and the
resolved run they produce (``preflight(cfg) -> ResolvedRun``, ftprof/resolved.py).

Each failure is a ConfigError with one line naming the problem.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math

from ftprof import runtime
from ftprof.checks import check_layer_count, check_packages, cuda_only_problem
from ftprof.config import RunConfig
from ftprof.config.evaluation import eval_data_config
from ftprof.data import check_dataset
from ftprof.errors import ConfigError
from ftprof.metrics import GIB
from ftprof.models.source import ModelSource, resolve_model_source
from ftprof.ranks import env_info
from ftprof.resolved import ResolvedRun


def preflight(cfg: RunConfig) -> ResolvedRun:
    """Check ``cfg`` against what is installed, the model, the data and the device (a ConfigError with one line
    naming the first problem), and resolve it into the resolved run."""
    from ftprof.engine.distributed import shards
    from ftprof.runtime import resolve_device, resolve_dtype_name

    _check_packages(cfg)
    source = _model_source(cfg.model.model)
    _check_model(cfg, source)
    check_dataset(cfg.data)
    _check_tokenizer(source, cfg.data.dataset)
    device = resolve_device(cfg.output.device)
    _check_device(cfg, device)
    _check_model_options(cfg, source, device)
    dtype = resolve_dtype_name(cfg.model.dtype, device)
    _check_distributed(cfg, device, dtype)
    _check_host_memory(cfg, source, device, dtype)
    notes: list[str] = []
    resolved = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=dtype),
                                   method=cfg.method.resolved(dtype, preset=source.kind == "preset",
                                                              triton=_triton_dequantizes(cfg, device)))
    tokenizer, data = _prepare_data(cfg, source)
    if data is not None and cfg.save.resume_from_checkpoint:
        from ftprof.config.saving import check_same_data

        check_same_data(cfg.save.resume_from_checkpoint, data.content_hash, cfg.data.dataset)
    if data is not None:
        _note_data(cfg, data, notes)
    eval_data = _prepare_eval_data(cfg, tokenizer)
    dist = env_info()
    resolved = _steps_for_profiling(_steps_from_epochs(resolved, data, dist.world_size, notes), notes)
    _note_unmeasured(resolved, notes)
    _note_warmup(resolved, notes)
    sharded = shards(resolved, dist)
    predicted = _predict(resolved, source, device, dtype, sharded, notes)
    return ResolvedRun(source, device, dtype, resolved, dist, sharded, notes, tokenizer, data, eval_data,
                   predicted.prediction, predicted.auto)


def _predict(cfg: RunConfig, source: ModelSource, device, dtype: str, sharded: bool, notes: list[str]):
    """The run's predicted peak and speed (ftprof/plan), auto's choice, --memory-limit-gib's check: a ConfigError
    when nothing fits, before the model loads."""
    from ftprof.plan.for_run import predict_run

    predicted = predict_run(cfg, source, device, dtype, sharded)
    if predicted.note:
        notes.append(predicted.note)
    if cfg.model.lean_recompute and predicted.auto is not None and predicted.auto.policy == "none":
        notes.append("--lean-recompute does nothing here: --checkpointing auto chose none (nothing is recomputed)")
    return predicted


def _model_source(name: str) -> ModelSource:
    """The model's source; a hub id with the hub unreachable is read from the local cache only (no retries), and
    its error says so."""
    from ftprof.data.hub import OFFLINE_HINT, found_unreachable, offline_unless_reachable
    from ftprof.models.source import classify_model_name

    offline = classify_model_name(name) == "hub" and offline_unless_reachable()
    try:
        return resolve_model_source(name)
    except ConfigError as exc:
        if offline and "HF_HUB_OFFLINE" not in str(exc):
            hint = OFFLINE_HINT if found_unreachable() else "HF_HUB_OFFLINE is set: the local cache only"
            raise ConfigError(f"{exc} ({hint})") from None
        raise


def _note_data(cfg: RunConfig, data, notes: list[str]) -> None:
    """What the prepared training data means for the figures: rows dropped, and data too small to fill a sequence
    (packed) or a batch (unpacked), whose repeats count as real tokens."""
    if data.stats.get("rows_dropped"):
        why = " once cut to --seq-len" if not cfg.data.packing else ""
        notes.append(f"--dataset: {data.stats['rows_dropped']} of {data.stats['rows_loaded']} rows dropped: no token "
                     f"to train on{why}")
    if cfg.data.packing and data.stats.get("tokens", cfg.data.seq_len) < cfg.data.seq_len:
        notes.append(f"--packing: the dataset holds {data.stats['tokens']} tokens, less than one sequence of "
                     f"--seq-len {cfg.data.seq_len}: its documents repeat within every sequence, and the figures "
                     "count the repeats as real tokens")
    if not cfg.data.packing and 0 < data.rows < cfg.data.batch_size:
        notes.append(f"--batch-size {cfg.data.batch_size}: the dataset holds {data.rows} row(s) to train on, fewer "
                     "than one batch: rows repeat within every batch, and the figures count the repeats as real "
                     "tokens")


def _steps_from_epochs(cfg: RunConfig, data, world: int, notes: list[str]) -> RunConfig:
    """--num-train-epochs as steps: ceil(sequences / (batch x grad accum x processes)) per epoch, times the
    epochs, rounded up. (Each rank draws its own shuffled order, so an epoch is that many sequences' worth of
    batches per rank, not each row exactly once across ranks.)"""
    t = cfg.train
    if t.num_train_epochs is None or data is None:
        return cfg
    per_epoch = math.ceil(data.stats["sequences"] / (cfg.data.batch_size * t.grad_accum * world))
    steps = max(1, math.ceil(per_epoch * t.num_train_epochs))
    notes.append(f"--num-train-epochs {t.num_train_epochs:g}: {steps} steps ({per_epoch} per epoch of "
                 f"{data.stats['sequences']} sequences)")
    resumed = cfg.save.resume_from_checkpoint
    if resumed:
        from ftprof.config.saving import read_checkpoint_state

        at = int(read_checkpoint_state(resumed).get("step", 0))
        if at >= steps:
            raise ConfigError(f"--resume-from-checkpoint {resumed}: the checkpoint is at step {at}; "
                              f"--num-train-epochs {t.num_train_epochs:g} is {steps} steps, none left to run")
    return dataclasses.replace(cfg, train=dataclasses.replace(t, max_steps=steps))


def _note_unmeasured(cfg: RunConfig, notes: list[str]) -> None:
    """Every step inside the measurement warm-up: the run trains (a smoke test, say) but has no steady figures."""
    t = cfg.train
    if t.measure_warmup_steps >= t.max_steps:
        notes.append(f"all {t.max_steps} steps are measurement warm-up (--measure-warmup-steps "
                     f"{t.measure_warmup_steps}): no steady-state figures; more steps measure the speed")


def _note_warmup(cfg: RunConfig, notes: list[str]) -> None:
    """A learning-rate warm-up longer than the run, where --num-train-epochs set the steps (known only now; a
    --max-steps run is told before anything loads: checks.length_notes)."""
    t = cfg.train
    warmup = t.lr_warmup_steps()
    if t.num_train_epochs is not None and t.lr_scheduler_type != "constant" and warmup > t.max_steps:
        notes.append(f"the learning-rate warm-up ({warmup} steps) is longer than the run ({t.max_steps} steps): "
                     "the rate never reaches --learning-rate; shorten --warmup-steps / --warmup-ratio")


def _steps_for_profiling(cfg: RunConfig, notes: list[str]) -> RunConfig:
    train, prof = cfg.train, cfg.profiling
    if prof.profile and train.max_steps < prof.total_steps:
        notes.append(f"--max-steps raised from {train.max_steps} to {prof.total_steps} so that all "
                     f"{prof.prof_repeat} profiling cycle(s) of {prof.cycle_steps} steps complete")
        return dataclasses.replace(cfg, train=dataclasses.replace(train, max_steps=prof.total_steps))
    return cfg


def _check_packages(cfg: RunConfig) -> None:
    """The packages the method, the optimizer and the exporters need are installed."""
    check_packages(cfg)


def _check_model(cfg: RunConfig, source: ModelSource) -> None:
    """The model has the positions for the sequence, and weights the method can train."""
    method, name = cfg.method.method, cfg.model.model
    if source.max_positions is not None and cfg.data.seq_len > source.max_positions:
        raise ConfigError(f"--seq-len {cfg.data.seq_len} exceeds the {source.max_positions} positions of model "
                          f"'{name}'")
    if source.is_gptq_checkpoint and method != "gptq-lora":
        raise ConfigError(f"--model '{name}' is a GPTQ checkpoint: use method gptq-lora")
    qc = getattr(source.config, "quantization_config", None)
    if qc is not None and not source.is_gptq_checkpoint and method != "qlora":
        raise ConfigError(f"--model '{name}' is already quantized; method '{method}' needs a 16-bit checkpoint")


def _check_device(cfg: RunConfig, device) -> None:
    """CUDA-only options on another device, and a memory limit above the device's memory."""
    problem = cuda_only_problem(cfg) if device.type != "cuda" else None
    if problem:
        raise ConfigError(problem)
    _check_memory_limit(cfg.output.memory_limit_gib, device)


def _check_model_options(cfg: RunConfig, source: ModelSource, device) -> None:
    """Options the model and the device must allow: checkpointed layers, the attention backend, fused kernels,
    the Triton dequantization kernel."""
    check_layer_count(cfg, getattr(source.config, "num_hidden_layers", None))
    if cfg.model.sdpa_backend != "auto":
        from ftprof.models.attention import check_backend

        check_backend(cfg.model.sdpa_backend, device.type, cfg.model.attn_implementation)
    if cfg.model.kernels == "liger":
        from ftprof.models.kernels import check_liger

        check_liger(getattr(source.config, "model_type", None))
    if cfg.method.dequant_kernel == "triton" or (cfg.method.fp8_base and cfg.method.method == "qlora" and
                                                 device.type == "cuda"):
        _check_triton()
    if cfg.method.fp8_base and device.type == "cuda":
        _check_fp8(device)


def _check_fp8(device) -> None:
    import torch

    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        raise ConfigError(f"--fp8-base needs FP8 tensor cores (compute capability 8.9+: Ada, Hopper or newer); "
                          f"{torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]}")


def _prepare_data(cfg: RunConfig, source: ModelSource):
    """Real data is loaded, checked and tokenized here, so bad data is one line before the model loads."""
    if cfg.data.dataset == "synthetic":
        return None, None
    from ftprof.data import prepare_dataset
    from ftprof.models.tokenizer import load_tokenizer

    if importlib.util.find_spec("datasets") is None:
        raise ConfigError("--dataset: real data is read through the 'datasets' package: pip install 'ftprof[data]'")

    tokenizer = load_tokenizer(source, synthetic=False)
    return tokenizer, prepare_dataset(cfg.data, tokenizer, cfg.model.model, progress=not cfg.output.quiet)


def _prepare_eval_data(cfg: RunConfig, tokenizer):
    """The eval rows (--eval-dataset, or --dataset's --eval-split), tokenized as the training rows are."""
    e = cfg.eval
    if e.eval_dataset is None and e.eval_split is None:
        return None  # none, or synthetic data's own held-out batches
    from ftprof.data import prepare_dataset

    data = eval_data_config(cfg.data, e)
    return prepare_dataset(data, tokenizer, cfg.model.model, progress=not cfg.output.quiet)  # names --eval-*


def _check_tokenizer(source: ModelSource, dataset: str) -> None:
    """checks.check_tokenizer for a model source (also run before torch by check_config)."""
    from ftprof.checks import check_tokenizer

    if source.kind == "local":
        check_tokenizer(source.name, dataset)


def _triton_dequantizes(cfg: RunConfig, device) -> bool:
    """Whether --dequant-kernel auto picks ftprof's Triton kernel: on CUDA with Triton, unless --compile-dequant
    has torch ops do the dequantizing."""
    return device.type == "cuda" and runtime.triton_installed() and not cfg.model.compile_dequant


def _check_triton() -> None:
    if not runtime.triton_installed():
        raise ConfigError("--dequant-kernel triton: Triton is not installed (pip install triton)")


def _check_host_memory(cfg: RunConfig, source: ModelSource, device, dtype: str) -> None:
    """A CPU run whose weights, gradients, Adam state and logits cannot fit in the host's available memory is
    refused with the numbers, before the model loads (ftprof/host_memory.py)."""
    if device.type != "cpu":
        return
    from ftprof.host_memory import refusal

    problem = refusal(source.config, cfg.method.method, dtype, cfg.data.batch_size, cfg.data.seq_len)
    if problem:
        raise ConfigError(problem)


def _check_memory_limit(gib: float | None, device) -> None:
    if gib is None:
        return
    import torch

    total = torch.cuda.get_device_properties(device).total_memory / GIB
    if gib > total:
        raise ConfigError(f"--memory-limit-gib {gib:g} is above the device's {total:.1f} GiB")


def _check_distributed(cfg: RunConfig, device, dtype: str) -> None:
    d = cfg.distributed
    if d.world_size == 1 and not d.fsdp_cpu_offload:
        return
    if device.type == "cuda":
        import torch

        visible = torch.cuda.device_count()
        if d.nproc_per_node > visible:
            raise ConfigError(f"--nproc-per-node {d.nproc_per_node} needs {d.nproc_per_node} GPUs; {visible} visible")
    m = cfg.method.resolved(dtype)
    if m.method == "qlora" and d.parallel == "fsdp" and m.quant_storage == "uint8":
        raise ConfigError("qlora under FSDP needs a floating --quant-storage (e.g. bfloat16) so the 4-bit weights "
                          "can be sharded beside the other parameters; or use --parallel ddp")
