"""``--save``: what the run trained, in the formats the ecosystem loads, outside the steps' time.

- lora, qlora, gptq-lora: the PEFT adapter (``save_pretrained``: adapter_config.json + adapter_model.safetensors)
  and the tokenizer in ``adapter/``. Its ``base_model_name_or_path`` names the base: the hub id or checkpoint
  directory it was trained on; for a preset (random weights that exist nowhere else) the base is saved too, in
  ``base/`` (config, weights, tokenizer; QLoRA's 4-bit weights dequantized, which re-quantize to the weights the
  adapter was trained on), so that ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base/),
  adapter/)`` rebuilds the trained model. gptq-lora's base is the GPTQ checkpoint (for a preset, ftprof's cached one).
- full: the whole model (``save_pretrained``) and tokenizer in ``model/``.

Under DDP rank 0 writes its replica; under FSDP2 every rank takes part in gathering the full state dict
(``torch.distributed.checkpoint.state_dict.get_model_state_dict`` with ``full_state_dict`` and ``cpu_offload``: the
gathered tensors land in rank 0's host memory only) and rank 0 writes. Each directory is written beside its place
and renamed into it when complete.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ftprof.config.saving import (
    ADAPTER,
    BASE,
    CHECKPOINT_PREFIX,
    CHECKPOINT_STATE,
    MERGED,
    MODEL,
    TRAINER_STATE,
    checkpoint_dirs,
    local_dataset_path,
    read_checkpoint_state,
)
from ftprof.models.dequant import dequantize, is_4bit_linear
from ftprof.results.parts import Saved
from ftprof.results.store import partial_dir, replaced_dir


def save_trained(resolved, built, run_dir: Path, log: Callable[[str], None], root: Path | None = None,
                 final_root: Path | None = None) -> Saved:
    """Write what ``built`` trained under ``root`` (default: --save-dir, else the run directory); every rank calls
    it. ``final_root``: where ``root`` will be once published (a checkpoint written in a temporary folder), the
    folder an adapter names as its base."""
    cfg = resolved.config
    if root is None:
        root = Path(cfg.save.save_dir).expanduser() if cfg.save.save_dir else Path(run_dir)
    t0 = time.perf_counter()
    model = built.model.module if isinstance(built.model, torch.nn.parallel.DistributedDataParallel) else built.model
    lora = cfg.method.method != "full"
    preset_base = lora and resolved.source.kind == "preset" and cfg.method.method != "gptq-lora"
    gathered = _gathered_state(model, adapters_only=lora and not preset_base) if resolved.shards else None
    out = Saved(saved="adapter" if lora else "model", save_dir=str(root / (ADAPTER if lora else MODEL)))
    if resolved.dist.is_main:
        if lora:
            out.save_base_dir = _save_adapter(resolved, model, gathered, root, built.tokenizer, preset_base, log,
                                              final_root or root)
        else:
            _publish(root / MODEL, lambda tmp: _save_full(model, gathered, built.tokenizer, tmp))
    if resolved.dist.enabled:
        import torch.distributed as dist

        dist.barrier()  # the files exist for every rank once save returns
    out.save_time_s = time.perf_counter() - t0
    log(f"--save: {out.saved} written to {out.save_dir} in {out.save_time_s:.1f} s")
    return out


def _gathered_state(model, adapters_only: bool) -> dict:
    """FSDP2: the full state dict, gathered into rank 0's host memory (empty on the other ranks)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=adapters_only)
    return get_model_state_dict(model, options=options)


def _publish(final: Path, write: Callable[[Path], None]) -> None:
    """``write`` into a fresh directory beside ``final``, then rename it into place (replacing an older one)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_dir(final)  # a kill leaves it: the next run's check_save_dir removes it and says so
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
    except BaseException:  # a full disk, a failed write, Ctrl-C: no partial directory is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():  # moved aside first: between two renames, not during a whole folder's removal, is final
        old = replaced_dir(final)  # absent (a kill there leaves the old folder beside it, .<name>.old-<pid>)
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def _save_tokenizer(tokenizer, where: Path) -> None:
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(where)


def _save_full(model, gathered: dict | None, tokenizer, where: Path) -> None:
    model.save_pretrained(where, state_dict=gathered, safe_serialization=True)
    _save_tokenizer(tokenizer, where)


def _save_adapter(resolved, peft_model, gathered: dict | None, root: Path, tokenizer, preset_base: bool,
                  log: Callable[[str], None], final_root: Path) -> str | None:
    """The adapter (and, for a preset, its base); returns the base's directory or name (under ``final_root``:
    a checkpoint's adapter named its temporary folder, gone once published)."""
    base_dir = None
    if preset_base:
        if gathered is not None and resolved.config.method.method == "qlora":
            log("--save: the base of a qlora preset under FSDP is not saved (its 4-bit weights are sharded); "
                "the adapter is")
        else:
            state = base_state(peft_model, gathered)
            _publish(root / BASE, lambda tmp: _save_base(resolved.source.config, state, tokenizer, tmp))
            base_dir = str((final_root / BASE).resolve())
    name = base_dir or _base_name(peft_model, resolved)
    config = peft_model.peft_config["default"]
    before, config.base_model_name_or_path = config.base_model_name_or_path, name
    try:
        # save_embedding_layers=False: ftprof never resizes the vocabulary, so the base's embeddings have nothing to
        # add; PEFT's "auto" read the base's config.json to find out, warning at every checkpoint (the base is
        # published after the adapter)
        _publish(root / ADAPTER, lambda tmp: (peft_model.save_pretrained(tmp, state_dict=gathered,
                                                                         save_embedding_layers=False),
                                              _save_tokenizer(tokenizer, tmp)))
    finally:
        config.base_model_name_or_path = before
    return name


def _base_name(peft_model, resolved) -> str:
    """The base a non-preset adapter loads on: the checkpoint it was trained on (gptq-lora: the GPTQ one)."""
    path = getattr(peft_model.get_base_model().config, "_name_or_path", "") or ""
    return path if resolved.config.method.method == "gptq-lora" and path else resolved.source.name


def _clean(name: str) -> str:
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


def base_state(peft_model, gathered: dict | None) -> dict[str, torch.Tensor]:
    """The frozen base's weights under plain transformers names (no LoRA, 4-bit weights dequantized)."""
    if gathered is not None:
        return {_clean(k): v for k, v in gathered.items() if "lora_" not in k}
    state: dict[str, torch.Tensor] = {}
    for mname, module in peft_model.get_base_model().named_modules():
        if "lora_" in mname:
            continue
        prefix = _clean(mname) + "." if mname else ""
        if is_4bit_linear(module):
            state[prefix + "weight"] = dequantize(module, "bitsandbytes").detach().cpu()
            if module.bias is not None:
                state[prefix + "bias"] = module.bias.detach().cpu()
            continue
        for pname, tensor in module.named_parameters(recurse=False):
            state[prefix + pname] = tensor.detach().cpu()
        for bname, tensor in module.named_buffers(recurse=False):
            if bname not in module._non_persistent_buffers_set:
                state[prefix + bname] = tensor.detach().cpu()
    return state


def _save_base(config, state: dict[str, torch.Tensor], tokenizer, where: Path) -> None:
    """A plain transformers checkpoint of ``config`` with ``state``'s weights (built on the meta device: no
    weights are initialized just to be replaced)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"--save: the base's weights do not match its architecture (missing "
                           f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]})")
    if tied:
        model.tie_weights()
    model.save_pretrained(where, safe_serialization=True)
    _save_tokenizer(tokenizer, where)


# --- checkpoints during the run (--save-steps) and resuming from one (--resume-from-checkpoint) -----------------


def write_checkpoint(resolved, built, run_dir: Path, step: int, log: Callable[[str], None]) -> Path:
    """``<run_dir>/checkpoint-<step>/``: what --save writes (adapter/, base/ for a preset, or model/), the optimizer,
    scheduler and RNG states, and the step and data position (ftprof_checkpoint.json). Written into a hidden
    directory beside it and renamed in whole; one process (resolve_resume refuses several)."""
    import random

    import numpy as np

    from ftprof.results.store import write_json_atomic

    cfg = resolved.config
    t0 = time.perf_counter()
    final = Path(run_dir) / f"{CHECKPOINT_PREFIX}{step}"

    def write(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        save_trained(resolved, built, run_dir, lambda message: None, root=tmp, final_root=final)
        rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
               "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        torch.save({"optimizer": built.optimizer.state_dict(),
                    "scheduler": built.scheduler.state_dict() if built.scheduler is not None else None,
                    "rng": rng}, tmp / TRAINER_STATE)
        options = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.to_flat().items()}
        write_json_atomic(tmp / CHECKPOINT_STATE, {
            "step": step, "batches_taken": step * cfg.train.grad_accum, "method": cfg.method.method,
            "saved": ADAPTER if cfg.method.method != "full" else MODEL, "options": options,
            "dataset_path": local_dataset_path(cfg.data.dataset), "data_hash": data_hash(resolved)})

    _publish(final, write)
    log(f"--save-steps: {final.name} written in {time.perf_counter() - t0:.1f} s")
    return final


def prune_checkpoints(run_dir: Path, limit: int | None, log: Callable[[str], None]) -> None:
    """Keep the newest ``limit`` checkpoints of the run (all when None)."""
    if limit is None:
        return
    found = checkpoint_dirs(run_dir)
    for _, path in found[:max(0, len(found) - limit)]:
        shutil.rmtree(path, ignore_errors=True)
        log(f"--save-total-limit {limit}: removed {path.name}")


def data_hash(resolved) -> str | None:
    """The content hash of the real data a run trains on (None for synthetic data, which its seed makes)."""
    return resolved.data.content_hash if resolved.data is not None else None


def load_checkpoint(resolved, built, path: Path, log: Callable[[str], None]) -> int:
    """Put ``built`` where the checkpoint left its run: trained weights, optimizer, scheduler, the data stream's
    position (the batches it took are drawn again and dropped) and the RNG states. Returns the checkpoint's step."""
    import random

    import numpy as np

    path = Path(path)
    info = read_checkpoint_state(path)
    model = built.model.module if isinstance(built.model, torch.nn.parallel.DistributedDataParallel) else built.model
    if resolved.config.method.method == "full":
        _load_full(model, path / MODEL)
    else:
        _load_adapter(model, path / ADAPTER)
    try:
        state = torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=False)  # our own file
    except Exception as exc:  # noqa: BLE001 - truncated, overwritten: the checkpoint is damaged, said as that
        from ftprof.errors import ConfigError

        raise ConfigError(f"--resume-from-checkpoint {path}: cannot read {TRAINER_STATE} ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}); resume from another checkpoint") from None
    peak_lrs = [group.get("initial_lr", group["lr"]) for group in built.optimizer.param_groups]  # this run's --lr
    built.optimizer.load_state_dict(state["optimizer"])
    if built.scheduler is not None and state["scheduler"] is not None:
        built.scheduler.load_state_dict(state["scheduler"])
        _this_runs_schedule(built.scheduler, built.optimizer, peak_lrs)
    for _ in range(int(info["batches_taken"])):
        next(built.batches)
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    log(f"--resume-from-checkpoint: resumed from {path} at step {info['step']}")
    return int(info["step"])


def _this_runs_schedule(scheduler, optimizer, peak_lrs: list[float]) -> None:
    """From the checkpoint's step on, this run's --lr and schedule: the loaded states carry the checkpoint's run's
    peak lr and the lr its schedule set for the next step (a run extended from 5 to 10 steps ran step 6 at the
    5-step schedule's 0.0, and a new --lr was never used). Where nothing changed, the same lr as before."""
    scheduler.base_lrs = list(peak_lrs)
    lrs = [peak * factor(scheduler.last_epoch) for peak, factor in zip(peak_lrs, scheduler.lr_lambdas, strict=True)]
    for group, peak, lr in zip(optimizer.param_groups, peak_lrs, lrs, strict=True):
        group["initial_lr"], group["lr"] = peak, lr
    scheduler._last_lr = lrs  # (what get_last_lr() reports)


def _safetensors_state(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a save_pretrained folder (one file or shards)."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(file)))
    if not state:
        raise RuntimeError(f"--resume-from-checkpoint: no weights in {folder}")
    return state


def _load_full(model, folder: Path) -> None:
    state = _safetensors_state(folder)
    missing, unexpected = model.load_state_dict(state, strict=False)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    lost = (set(missing) & trainable) - tied
    if lost or unexpected:
        raise RuntimeError(f"--resume-from-checkpoint: {folder}'s weights do not match the model (missing "
                           f"{sorted(lost)[:3]}, unexpected {sorted(unexpected)[:3]})")


def _load_adapter(peft_model, folder: Path) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(peft_model, _safetensors_state(folder))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise RuntimeError(f"--resume-from-checkpoint: {folder}'s adapter does not match the model (unexpected "
                           f"{sorted(unexpected)[:3]})")


# --- --save-merged: the adapters merged into the base, a plain transformers checkpoint ------------------------------
def save_merged(resolved, built, run_dir: Path, log: Callable[[str], None]) -> Path:
    """``merged/`` under --save-dir (default the run directory): the base's weights (QLoRA's dequantized, as its
    forward computed with them) plus each LoRA layer's delta (``get_delta_weight``: B @ A x scaling), in the base's
    dtype, with the model's config and tokenizer: ``AutoModelForCausalLM.from_pretrained(merged/)`` computes what
    the adapted model computes. The trained model is left as it is."""
    cfg = resolved.config
    root = Path(cfg.save.save_dir).expanduser() if cfg.save.save_dir else Path(run_dir)
    t0 = time.perf_counter()
    model = built.model.module if isinstance(built.model, torch.nn.parallel.DistributedDataParallel) else built.model
    final = root / MERGED
    if resolved.dist.is_main:
        state = merged_state(model)
        _publish(final, lambda tmp: _save_base(resolved.source.config, state, built.tokenizer, tmp))
    if resolved.dist.enabled:
        import torch.distributed as dist

        dist.barrier()
    log(f"--save-merged: merged model written to {final} in {time.perf_counter() - t0:.1f} s")
    return final


@torch.no_grad()
def merged_state(peft_model) -> dict[str, torch.Tensor]:
    """The base's weights under plain transformers names with every LoRA delta added (in float32, then back to
    the weight's dtype)."""
    state = base_state(peft_model, None)
    merged = 0
    for name, module in peft_model.get_base_model().named_modules():
        adapters = getattr(module, "lora_A", None)
        if not isinstance(adapters, torch.nn.ModuleDict) or "default" not in adapters:
            continue
        if not hasattr(module, "get_delta_weight"):
            raise RuntimeError(f"--save-merged: {name} is a LoRA layer this PEFT version cannot merge")
        key = _clean(name) + ".weight"
        delta = module.get_delta_weight("default").detach().to("cpu", torch.float32)
        weight = state[key]
        state[key] = (weight.to(torch.float32) + delta.reshape(weight.shape)).to(weight.dtype)
        merged += 1
    if not merged:
        raise RuntimeError("--save-merged: the model has no LoRA layer to merge")
    return state
