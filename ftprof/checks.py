"""Checks that need neither torch nor a model: run by the CLI before it imports the engine, and by sweeps for each
experiment, so bad input is one line and exit status 2 in a fraction of a second.

``check_config`` reads only the configuration (and the model's config file); ``check_host`` also looks at this
machine (output paths writable, a GPU for CUDA profiling).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ftprof.config import RunConfig, alloc_conf
from ftprof.config.declarations import BY_NAME
from ftprof.config.evaluation import eval_data_config
from ftprof.config.saving import ADAPTER, BASE, MERGED, MODEL
from ftprof.data.source import check_dataset, locate
from ftprof.errors import ConfigError
from ftprof.models.modules import decoder_layers, hidden_size, lora_target_problem, max_positions
from ftprof.models.source import (
    classify_model_name,
    default_targets_problem,
    local_config_problem,
    read_local_config,
    unknown_model_message,
    weights_problem,
)
from ftprof.results.store import check_writable_dir, remove_partial_dirs

CACHE_ENV = "FTPROF_CACHE_DIR"
STORE_ENV = "FTPROF_CALIBRATION"
SAVED_DIRS = (ADAPTER, MODEL, BASE, MERGED)  # what --save and --save-merged write under their root (engine/save)


def check_model(name: str) -> None:
    """Presets and directories are checked now; a hub id only for whether it can be had at all (in the local cache,
    or the hub reachable): the run reads its config."""
    kind = classify_model_name(name)
    if kind is None:
        raise ConfigError(f"--model: {unknown_model_message(name)}")
    if kind == "hub":
        _check_hub_model(name)
    if kind == "local":
        path = Path(name).expanduser()
        if not path.is_dir():
            raise ConfigError(f"--model: '{name}' is not a directory")
        if not (path / "config.json").is_file():
            raise ConfigError(f"--model: '{name}' has no config.json (not a transformers checkpoint)")
        problem = local_config_problem(name, read_local_config(path))
        if problem:
            raise ConfigError(problem)


def _check_hub_model(name: str) -> None:
    """A hub id that is neither in the local cache nor reachable: refused before torch (it was refused after the
    run had imported torch and transformers)."""
    from huggingface_hub import try_to_load_from_cache

    from ftprof.data.hub import OFFLINE_HINT, found_unreachable, offline_unless_reachable

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except Exception:  # noqa: BLE001 - a name the cache cannot hold: the run's own load says what is wrong
        return
    if isinstance(cached, str) or not offline_unless_reachable():
        return
    why = OFFLINE_HINT if found_unreachable() else "HF_HUB_OFFLINE is set"
    raise ConfigError(f"--model: hub id '{name}' is not in the local cache ({why}); give a preset, a checkpoint "
                      "directory, or run where the hub is reachable")


def check_config(cfg: RunConfig) -> None:
    check_model(cfg.model.model)
    check_tokenizer(cfg.model.model, cfg.data.dataset)
    _check_lora_targets(cfg)
    check_memory_limit(cfg.output.memory_limit_gib)
    check_environment_alloc_conf()
    _check_model_shape(cfg)
    if cfg.data.dataset != "synthetic":
        locate(cfg.data)  # a file or save_to_disk folder that exists, or a hub name (its content: check_dataset)
    if cfg.eval.eval_dataset is not None:
        locate(eval_data_config(cfg.data, cfg.eval))  # its problems name --eval-dataset
    _check_profiling(cfg)


# Files that make a directory loadable by AutoTokenizer (fast tokenizer, or the slow ones' vocabularies).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def check_tokenizer(model: str, dataset: str) -> None:
    """A text dataset is tokenized with the checkpoint's own tokenizer: a local checkpoint without one is refused
    before anything loads (train, bench's cells, and plan, whose commands would all fail). Synthetic data needs
    none; a preset brings its own."""
    if dataset == "synthetic" or classify_model_name(model) != "local":
        return
    if not any((Path(model).expanduser() / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"--dataset '{dataset}' needs a tokenizer, and --model '{model}' has no tokenizer "
                          f"files (tokenizer.json or tokenizer_config.json); use --dataset synthetic or save one")


def _check_lora_targets(cfg: RunConfig) -> None:
    m = cfg.method  # (its targets are names: MethodConfig checks that)
    if m.method in ("lora", "qlora", "gptq-lora"):
        problem = lora_target_problem(cfg.model.model, m.lora_targets)
        if problem is None and m.lora_targets is None and classify_model_name(cfg.model.model) == "local":
            problem = default_targets_problem(cfg.model.model, read_local_config(Path(cfg.model.model).expanduser()))
        if problem:
            raise ConfigError(problem)


def _check_model_shape(cfg: RunConfig) -> None:
    """Options bounded by the model's shape, where it is known without torch (a preset, a local config.json)."""
    check_layer_count(cfg, decoder_layers(cfg.model.model))
    limit = max_positions(cfg.model.model)
    if limit is not None and cfg.data.seq_len > limit:
        raise ConfigError(f"--seq-len {cfg.data.seq_len} exceeds the {limit} positions of model '{cfg.model.model}'")
    # every adapted projection has the hidden size on one side: a rank above it adds parameters and no capacity
    hidden, rank = hidden_size(cfg.model.model), cfg.method.lora_r
    if hidden and rank and cfg.method.method != "full" and rank > hidden:
        raise ConfigError(f"--lora-r {rank} exceeds the hidden size {hidden} of model '{cfg.model.model}' (every "
                          "adapted projection has it on one side: a larger rank adds parameters, not capacity)")


def check_layer_count(cfg: RunConfig, layers: int | None) -> None:
    """The options bounded by the model's decoder layers (``layers``; None where not known yet)."""
    if cfg.model.checkpoint_layers is not None and layers and cfg.model.checkpoint_layers > layers:
        raise ConfigError(f"--checkpoint-layers {cfg.model.checkpoint_layers}: '{cfg.model.model}' has {layers} "
                          "decoder layers")
    if cfg.model.selective_rest and layers and (cfg.model.checkpoint_layers or 0) >= layers:
        raise ConfigError(f"--selective-rest: --checkpoint-layers {cfg.model.checkpoint_layers} covers all of "
                          f"'{cfg.model.model}''s {layers} decoder layers, leaving none to be selective")


def _check_profiling(cfg: RunConfig) -> None:
    prof = cfg.profiling
    if prof.profile and "cuda" in prof.activities() and cfg.output.device == "cpu":
        raise ConfigError("--prof-activities cuda: the run is on --device cpu")
    if prof.profile and prof.prof_ranks != "all":
        world = cfg.distributed.world_size
        beyond = [int(r) for r in str(prof.prof_ranks).split(",") if int(r) >= world]
        if beyond:
            raise ConfigError(f"--prof-ranks: rank {beyond[0]} does not exist in a run of {world} process(es) "
                              f"(ranks 0..{world - 1})")


def check_environment_alloc_conf() -> None:
    """The environment's allocator settings: torch aborts at import on a value it cannot parse (whatever
    --alloc-conf says: the process imports torch before it pins the run's setting)."""
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        value = os.environ.get(name)
        why = alloc_conf.problem(value) if value is not None else None
        if why:
            raise ConfigError(f"{name}='{value}' in the environment: {why} (fix or unset it)")


MEMORY_LIMIT_MARGIN = 2  # --memory-limit-gib above this many times the largest GPU ftprof knows: a typo


def check_memory_limit(limit: float | None) -> None:
    """--memory-limit-gib caps one GPU's memory: more than any GPU has (with a margin for cards newer than the
    catalogue) is refused, not planned as a budget nothing can have."""
    if limit is None:
        return
    from ftprof.gpus import CATALOGUE

    gpu = max(CATALOGUE.values(), key=lambda g: g.memory_gib)
    if limit > MEMORY_LIMIT_MARGIN * gpu.memory_gib:
        raise ConfigError(f"--memory-limit-gib {limit:g}: no GPU has that much memory (the largest ftprof knows, "
                          f"{gpu.name}, has {gpu.memory_gib:g} GiB); give the GiB one GPU may use")


def host_has_cuda() -> bool:
    """An NVIDIA driver is loaded on this machine (checked without importing torch)."""
    return os.path.exists("/proc/driver/nvidia/version")


def cuda_only_problem(cfg: RunConfig) -> str | None:
    """The refusal for the first option of ``cfg`` that needs a CUDA device, or None. Said without torch where the
    run cannot be on a GPU (``check_device``), and by preflight once the device is known."""
    m = cfg.model
    if cfg.train.optimizer == "paged_adamw_8bit":
        return "--optimizer paged_adamw_8bit needs a CUDA device (paged memory is CUDA unified memory)"
    if m.attn_implementation == "flash_attention_2":
        return "--attn-implementation flash_attention_2 needs a CUDA device"
    if cfg.output.memory_limit_gib is not None:
        return "--memory-limit-gib caps GPU memory: it needs a CUDA device"
    if BY_NAME["compile_mode"].needs_cuda(m.compile_mode):  # its CUDA-only values: the declaration's
        return (f"--compile-mode {m.compile_mode} replays blocks as CUDA graphs: it needs a CUDA device "
                "(max-autotune-no-cudagraphs works on CPU)")
    if m.sdpa_backend != "auto":
        return f"--sdpa-backend {m.sdpa_backend} needs a CUDA device; use --sdpa-backend auto on CPU"
    if m.kernels == "liger":
        return ("--kernels liger needs a CUDA device (Liger-Kernel's kernels are Triton GPU kernels); use --kernels "
                "eager on CPU")
    if cfg.method.dequant_kernel == "triton":
        return ("--dequant-kernel triton runs a Triton kernel: it needs a CUDA device (bitsandbytes' kernel runs "
                "everywhere)")
    if cfg.distributed.fsdp_cpu_offload:
        return "--fsdp-cpu-offload moves shards between GPU and host: it needs a CUDA device"
    return None


def cpu_host_memory_problem(cfg: RunConfig) -> str | None:
    """A CPU run that cannot fit in host memory, refused from the model's config without torch where it is known
    (a preset, a local config.json); preflight checks the others once the config is read."""
    from types import SimpleNamespace

    from ftprof.host_memory import refusal
    from ftprof.models.modules import model_config_dict

    shape = model_config_dict(cfg.model.model)
    if not shape:
        return None
    dtype = "float32" if cfg.model.dtype == "auto" else cfg.model.dtype  # (runtime.resolve_dtype_name on CPU)
    return refusal(SimpleNamespace(**shape), cfg.method.method, dtype, cfg.data.batch_size, cfg.data.seq_len)


def check_device(cfg: RunConfig) -> None:
    """Options that need a GPU, on a run that cannot have one (--device cpu, or no NVIDIA driver here): one line
    before torch. (Where a GPU may be there, preflight checks once torch has found it.)"""
    device, gpu_here = cfg.output.device, host_has_cuda()
    if device.startswith("cuda") and not gpu_here:
        raise ConfigError(f"--device {device}: this machine has no NVIDIA GPU")
    if device == "cpu" or not gpu_here:
        problem = cuda_only_problem(cfg) or cpu_host_memory_problem(cfg)
        if problem:
            raise ConfigError(problem)
    if cfg.profiling.profile and "cuda" in cfg.profiling.activities() and not gpu_here:
        raise ConfigError("--prof-activities cuda: this machine has no NVIDIA GPU (use cpu)")


def check_host(cfg: RunConfig) -> None:
    check_device(cfg)
    for option, value in (("--output-dir", cfg.output.output_dir), ("--save-dir", cfg.save.save_dir),
                          ("--prof-output-dir", cfg.profiling.prof_output_dir)):
        if value is not None and not str(value).strip():
            raise ConfigError(f"{option} is empty: give a directory (or leave the option out)")
    check_writable_dir(cfg.output.output_dir, "--output-dir")
    if cfg.output.run_name:
        check_writable_dir(Path(cfg.output.output_dir).expanduser() / cfg.output.run_name, "--run-name")
    prof = cfg.profiling
    if prof.profile and prof.prof_output_dir:
        check_writable_dir(prof.prof_output_dir, "--prof-output-dir")
    check_save_dir(cfg)
    check_cache_dir()


def save_root(cfg: RunConfig) -> Path | None:
    """Where --save and --save-merged write (adapter/, model/, base/, merged/): --save-dir, else the run directory
    (None: not known before the run names it, or neither option)."""
    if not (cfg.save.save or cfg.save.save_merged):
        return None
    if cfg.save.save_dir:
        return Path(cfg.save.save_dir).expanduser()
    if cfg.output.run_name:
        return Path(cfg.output.output_dir).expanduser() / cfg.output.run_name
    return None


def check_save_dir(cfg: RunConfig, clean: bool = True) -> None:
    """--save's directory can be written (before training, not after it). With ``clean``, what a save killed midway
    left there (a hidden ``.adapter.tmp-<pid>``) is removed and named in a line on stderr."""
    root = save_root(cfg)
    if root is None:
        return
    check_writable_dir(root, "--save-dir" if cfg.save.save_dir else "--output-dir")
    written = ([ADAPTER if cfg.method.method != "full" else MODEL] if cfg.save.save else []) + \
        ([MERGED] if cfg.save.save_merged else [])
    taken = [name for name in written if (root / name).exists()]
    if cfg.save.save_dir and taken and not cfg.output.overwrite_output_dir:  # (a run directory is new: nothing there)
        raise ConfigError(f"--save-dir '{cfg.save.save_dir}' already holds {taken[0]}/ from another save; give "
                          "another --save-dir, or --overwrite-output-dir to replace it")
    if not clean:
        return
    for path in remove_partial_dirs(root, SAVED_DIRS):
        import sys

        print(f"ftprof: removed {path}: a partial save left by a run that stopped while saving", file=sys.stderr,
              flush=True)


def cache_base() -> Path:
    """ftprof's cache directory: $FTPROF_CACHE_DIR, else ~/.cache/ftprof (the GPTQ cache, the planner's probes, the
    calibration store). The one resolver: ftprof.models.gptq.cache_root is its gptq/ folder."""
    value = os.environ.get(CACHE_ENV, "").strip()
    return Path(value).expanduser() if value else Path.home() / ".cache" / "ftprof"


def check_cache_dir() -> None:
    """ftprof's cache directory and the calibration store can be written: one line naming the path and what to set
    otherwise, before anything heavy starts (``ftprof train`` and ``ftprof plan`` write both)."""
    value = os.environ.get(CACHE_ENV, "").strip()
    try:
        root = cache_base()
    except (RuntimeError, KeyError):  # ~user of no user, or no HOME and no password entry
        raise ConfigError(f"{CACHE_ENV} '{value}': no such user's home directory" if value.startswith("~") else
                          f"no cache directory: HOME is not set; set {CACHE_ENV} to a writable directory") from None
    try:
        check_writable_dir(root, CACHE_ENV if value else "cache directory")
    except ConfigError as exc:
        hint = "" if value else f" (HOME is {Path.home()}); set {CACHE_ENV} to a writable directory"
        raise ConfigError(f"{exc}{hint}") from None
    store = os.environ.get(STORE_ENV, "").strip()
    if not store or store.lower() == "off":
        return
    try:
        path = Path(store).expanduser()
    except RuntimeError:
        raise ConfigError(f"{STORE_ENV} '{store}': no such user's home directory") from None
    if path.is_dir():
        raise ConfigError(f"{STORE_ENV} '{store}' is a directory; give a file (calibration.jsonl), or off")
    check_writable_dir(path.parent, STORE_ENV)


def _need_package(module: str, what: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"{what} needs the '{module}' package: pip install 'ftprof[{extra}]'")


METHOD_PACKAGES = {"qlora": ("bitsandbytes", "all"), "gptq-lora": ("gptqmodel", "gptq")}  # module, ftprof extra


def missing_method_package(method: str) -> tuple[str, str] | None:
    """(module, how to install it) of the package ``method`` needs that is not installed here (found, not
    imported); None when nothing is missing."""
    need = METHOD_PACKAGES.get(method)
    if need is None or importlib.util.find_spec(need[0]) is not None:
        return None
    return need[0], f"pip install 'ftprof[{need[1]}]'"


def method_package_line(method: str, missing: tuple[str, str]) -> str:
    """The one line a run of ``method`` gets when its package is ``missing`` (missing_method_package)."""
    return f"method '{method}' needs the '{missing[0]}' package: {missing[1]}"


def check_packages(cfg: RunConfig, method_packages: bool = True) -> None:
    """The packages the method (unless ``method_packages`` is False: its rows run elsewhere), the optimizer and
    the trackers need are installed (found, not imported)."""
    from ftprof.exporters import check_exporters

    method = cfg.method.method
    missing = missing_method_package(method) if method_packages else None
    if missing:
        raise ConfigError(method_package_line(method, missing))
    if cfg.train.optimizer == "paged_adamw_8bit":
        _need_package("bitsandbytes", "method 'paged_adamw_8bit'", "all")
    check_exporters(cfg.output.report_to)


def check_data(cfg: RunConfig, checked: set[str] | None = None) -> None:
    """The training and eval data's content, as far as it can be read without a tokenizer (``check_rows``: a
    corrupt file, a missing column, a chat row without an assistant turn). ``checked``: data already read (a
    sweep's cells share datasets), updated."""
    from ftprof.data import check_rows

    checked = set() if checked is None else checked
    sources = [(cfg.data, "")]
    if cfg.eval.eval_dataset is not None or cfg.eval.eval_split is not None:
        sources.append((eval_data_config(cfg.data, cfg.eval), "eval data: "))
    for data, prefix in sources:
        if data.dataset == "synthetic" or repr(data) in checked:
            continue
        try:
            check_dataset(data)  # reads a data file through (a .jsonl line by line)
            check_rows(data)
        except ConfigError as exc:
            raise ConfigError(f"{prefix}{exc}") from None
        checked.add(repr(data))


def check_before_load(cfg: RunConfig, checked: set[str] | None = None, method_packages: bool = True,
                      weights: bool = True) -> None:
    """Everything a run checks before its model loads that needs no torch and no GPU of this machine: ``ftprof
    train`` runs it, and bench (``--dry-run`` too) for every cell; ``ftprof plan`` for another GPU leaves out the
    method's packages (``method_packages``), and a plan that trains nothing a local checkpoint's weights
    (``weights``: its probe needs config.json alone)."""
    check_config(cfg)
    if weights and classify_model_name(cfg.model.model) == "local":
        problem = weights_problem(Path(cfg.model.model).expanduser())
        if problem:
            raise ConfigError(problem)
    check_packages(cfg, method_packages)
    check_data(cfg, checked)


def check_before_run(cfg: RunConfig) -> None:
    check_before_load(cfg)  # before torch is imported
    check_host(cfg)


MANY_EPOCHS = 1000  # more passes over the data than any fine-tuning makes: a typo, most likely


def length_notes(cfg: RunConfig) -> list[str]:
    """Notes on the run's length the user may want to act on, known before anything loads: an LR warm-up longer
    than the run (the learning rate never reaches --lr), an epoch count no fine-tuning needs. (A warm-up longer than
    the steps --num-train-epochs comes to is known only once the data is read: preflight's to say.)"""
    t, notes = cfg.train, []
    if t.num_train_epochs is None and t.warmup_steps > t.max_steps and t.lr_scheduler_type != "constant":
        notes.append(f"--warmup-steps {t.warmup_steps} is longer than the run (--max-steps {t.max_steps}): the "
                     f"learning rate rises for the whole run and its last step runs at "
                     f"{(t.max_steps - 1) / t.warmup_steps:.0%} of --lr; "
                     "lower --warmup-steps to reach it")
    save_steps = cfg.save.save_steps
    if save_steps and t.num_train_epochs is None and save_steps > t.max_steps:
        notes.append(f"--save-steps {save_steps} is beyond --max-steps {t.max_steps}: no checkpoint is written during "
                     "the run (--save saves what it trained at the end)")
    if t.num_train_epochs is not None and t.num_train_epochs > MANY_EPOCHS:
        notes.append(f"--num-train-epochs {t.num_train_epochs:g}: that many passes over the data takes as many "
                     "times an epoch's steps; fine-tuning takes a few (stop it with Ctrl-C: what ran is kept)")
    return notes
