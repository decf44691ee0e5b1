"""What the peer recipes share: reading the cell, the model checkpoint, the data rows, the Trainer's arguments, the
callback, and how a recipe's process ends (its exit status; a failure recorded as a result, as ftprof's worker does).

transformers is imported only inside functions: Unsloth must be imported before it (recipes/unsloth.py).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftprof.bench.sweep import TRAINER_NAMES  # how config.json's trainer section names each recipe
from ftprof.config import RunConfig
from ftprof.errors import ConfigError
from ftprof.lifetime import StoppedBySignal, answer_ctrl_c

VERSIONS = ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "liger-kernel", "unsloth")


@dataclass
class Cell:
    """A peer cell as bench wrote it: its validated configuration and where its run directory is."""

    recipe: str
    config: RunConfig
    run_dir: Path
    trainer: dict[str, Any] = field(default_factory=dict)  # config.json's trainer section as bench wrote it


@dataclass
class Setup:
    """Where and how the cell trains: device, dtype, the checkpoint directory the recipe loads, its tokenizer."""

    device: Any  # torch.device
    dtype: Any  # torch.dtype
    dtype_name: str
    checkpoint: str  # a directory (a preset: written once into ftprof's cache) or a cached hub id
    tokenizer: Any
    vocab_size: int
    preset: bool


def read_cell(argv: list[str] | None, recipe: str) -> Cell:
    parser = argparse.ArgumentParser(prog=f"python -m ftprof.integrations.recipes.{recipe}",
                                     description=f"Run one ftprof bench cell with the {recipe} recipe, measured "
                                                 "by FtprofCallback into --run-dir")
    parser.add_argument("--config", required=True, help="the cell's validated configuration (peer_config.json)")
    parser.add_argument("--run-dir", required=True, help="the run directory FtprofCallback writes")
    args = parser.parse_args(argv)
    try:
        data = json.loads(Path(args.config).read_text(encoding="utf-8"))
        config = RunConfig.from_dict(data)
    except (OSError, ValueError) as exc:  # ConfigError is a ValueError
        raise ConfigError(f"cannot load the cell's configuration {args.config}: {exc}") from None
    trainer = data.get("trainer") if isinstance(data.get("trainer"), dict) else {}
    return Cell(recipe, config, Path(args.run_dir), trainer)


# ------------------------------------------------------------------------------------------------ the model
def device_and_dtype(cfg: RunConfig):
    import torch

    want = cfg.output.device
    if want.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {want}: no CUDA device here")
    cuda = want != "cpu" and torch.cuda.is_available()
    device = torch.device(want if want.startswith("cuda:") else "cuda" if cuda else "cpu")
    name = cfg.model.dtype if cfg.model.dtype != "auto" else "bfloat16" if cuda else "float32"
    return device, getattr(torch, name), name


def preset_checkpoint(name: str, seed: int, device, dtype, dtype_name: str) -> Path:
    """A preset as a checkpoint directory (random weights, ftprof's seed and initialisation, the built-in tokenizer),
    written once into ftprof's cache: the recipes load it as users load theirs (QLoRA quantizes it on the fly)."""
    from ftprof.checks import cache_base
    from ftprof.models.materialize import build_random_model
    from ftprof.models.presets import preset_config
    from ftprof.models.tokenizer import build_tokenizer

    root = cache_base() / "recipe-checkpoints"
    path = root / f"{name}-seed{seed}-{dtype_name}"
    if (path / "config.json").is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=root))
    try:
        model = build_random_model(preset_config(name), device, dtype, seed=seed)
        model.save_pretrained(tmp)
        build_tokenizer().save_pretrained(tmp)
        del model
        try:
            os.replace(tmp, path)  # atomic: a concurrent writer of the same preset leaves one whole copy
        except OSError:
            if not (path / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        _empty_cache()
    return path


def _empty_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def setup(cfg: RunConfig) -> Setup:
    """Device, dtype, the checkpoint the recipe loads and its tokenizer (nothing is downloaded)."""
    from ftprof.models.source import resolve_model_source
    from ftprof.models.tokenizer import load_tokenizer

    device, dtype, dtype_name = device_and_dtype(cfg)
    source = resolve_model_source(cfg.model.model)
    tokenizer = load_tokenizer(source, cfg.data.dataset == "synthetic", log=lambda msg: print(msg, file=sys.stderr))
    if source.kind == "preset":
        checkpoint = str(preset_checkpoint(source.name, cfg.train.seed, device, dtype, dtype_name))
    else:
        checkpoint = source.name
    return Setup(device, dtype, dtype_name, checkpoint, tokenizer, int(source.config.vocab_size),
                 source.kind == "preset")


def method(cfg: RunConfig, s: Setup):
    """The method with its defaults filled as ftprof's runs record them (LoRA rank 16, alpha 2 x rank, the seven
    projections, NF4 with double quantization)."""
    return cfg.method.resolved(s.dtype_name, preset=s.preset)


def bnb_config(cfg: RunConfig, s: Setup):
    """bitsandbytes 4-bit as the QLoRA recipes write it (the storage dtype left at bitsandbytes' default)."""
    import torch
    from transformers import BitsAndBytesConfig

    m = method(cfg, s)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=m.quant_type,
                              bnb_4bit_use_double_quant=m.double_quant,
                              bnb_4bit_compute_dtype=getattr(torch, m.compute_dtype))


def load_model(cfg: RunConfig, s: Setup):
    """``AutoModelForCausalLM.from_pretrained`` on the cell's device: 16-bit (or the cell's dtype), or 4-bit for
    qlora."""
    from transformers import AutoModelForCausalLM

    quant = bnb_config(cfg, s) if cfg.method.method == "qlora" else None
    return AutoModelForCausalLM.from_pretrained(s.checkpoint, dtype=s.dtype, quantization_config=quant,
                                                device_map={"": str(s.device)}, local_files_only=True,
                                                attn_implementation=cfg.model.attn_implementation)


def lora_config(cfg: RunConfig, s: Setup):
    from peft import LoraConfig

    m = method(cfg, s)
    return LoraConfig(r=m.lora_r, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout,
                      target_modules=list(m.lora_targets), bias="none", task_type="CAUSAL_LM")


# ------------------------------------------------------------------------------------------------ the data
def steps_rows(cfg: RunConfig) -> int:
    """Sequences the run consumes: batch x accumulation x steps."""
    return cfg.data.batch_size * cfg.train.grad_accum * cfg.train.max_steps


def fixed_rows(cfg: RunConfig, s: Setup, count: int | None = None) -> list[dict]:
    """ftprof's own training stream (the synthetic token stream, or the dataset padded or packed to --seq-len, as
    ftprof's loop is fed), cut into rows of ``input_ids``, ``attention_mask`` and ``labels``."""
    from ftprof.data.batches import make_batches

    prepared = None
    if cfg.data.dataset != "synthetic":
        from ftprof.data.prepare import prepare_dataset

        prepared = prepare_dataset(cfg.data, s.tokenizer, cfg.model.model, progress=False)
    stream = make_batches(cfg.data, s.tokenizer, s.vocab_size, cfg.train.seed, prepared)
    count = count or steps_rows(cfg)
    rows: list[dict] = []
    while len(rows) < count:
        batch = next(stream)
        rows += [{k: v[i] for k, v in batch.items()} for i in range(batch["input_ids"].shape[0])]
    return rows[:count]


def document_rows(cfg: RunConfig, s: Setup) -> dict[str, list]:
    """The dataset's documents tokenized by ftprof's rules (format, template, train_on) for a trainer that pads or
    packs them itself (TRL): ``input_ids`` and, for real data, ``completion_mask`` (1 where ftprof's labels take a
    loss). Synthetic data: the synthetic stream's full-length rows."""
    if cfg.data.dataset == "synthetic":
        return {"input_ids": [r["input_ids"].tolist() for r in fixed_rows(cfg, s)]}
    from ftprof.data.formats import IGNORE_INDEX
    from ftprof.data.prepare import prepare_dataset

    prepared = prepare_dataset(cfg.data, s.tokenizer, cfg.model.model, progress=False)
    off = prepared.offsets
    ids = [prepared.ids[off[j]:off[j + 1]].tolist() for j in range(prepared.rows)]
    masks = [(prepared.labels[off[j]:off[j + 1]] != IGNORE_INDEX).astype("int64").tolist()
             for j in range(prepared.rows)]
    return {"input_ids": ids, "completion_mask": masks}


class RowsDataset:
    """A map-style dataset of fixed-shape rows; ``info.dataset_name`` is what FtprofCallback records as the data."""

    def __init__(self, rows: list[dict], name: str):
        from types import SimpleNamespace

        self.rows = rows
        self.info = SimpleNamespace(dataset_name=name)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


def hf_dataset(columns: dict[str, list], name: str):
    """A ``datasets.Dataset`` whose info names the cell's data (FtprofCallback records it)."""
    import datasets

    return datasets.Dataset.from_dict(columns, info=datasets.DatasetInfo(dataset_name=name))


# ------------------------------------------------------------------------------------------------ the Trainer
def optimizer_name(cfg: RunConfig, s: Setup) -> str:
    """ftprof's adamw is torch's fused AdamW on CUDA: the Trainer's ``adamw_torch_fused`` there, ``adamw_torch``
    elsewhere; paged_adamw_8bit is the same name in both."""
    if cfg.train.optimizer == "paged_adamw_8bit":
        return "paged_adamw_8bit"
    return "adamw_torch_fused" if s.device.type == "cuda" else "adamw_torch"


def training_kwargs(cfg: RunConfig, s: Setup, output_dir: str) -> dict[str, Any]:
    """The cell's steps, shape, learning rate and schedule, optimizer, precision and checkpointing as
    TrainingArguments (and SFTConfig) keywords; logging, saving and evaluation off."""
    import dataclasses

    import torch
    from transformers import TrainingArguments

    t, cuda = cfg.train, s.device.type == "cuda"
    # transformers 5.24 renamed gradient_checkpointing_kwargs (the old name warns, and goes in v6)
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    ckpt_kwargs = "activation_checkpointing_kwargs" if "activation_checkpointing_kwargs" in names else \
        "gradient_checkpointing_kwargs"
    return dict(output_dir=output_dir, max_steps=t.max_steps, per_device_train_batch_size=cfg.data.batch_size,
                gradient_accumulation_steps=t.grad_accum, learning_rate=t.lr, lr_scheduler_type=t.lr_scheduler_type,
                warmup_steps=t.lr_warmup_steps(t.max_steps), weight_decay=t.weight_decay,
                max_grad_norm=t.max_grad_norm, optim=optimizer_name(cfg, s), seed=t.seed, data_seed=t.seed,
                bf16=cuda and s.dtype == torch.bfloat16, fp16=cuda and s.dtype == torch.float16,
                gradient_checkpointing=cfg.model.checkpointing == "full",
                logging_strategy="no", save_strategy="no", eval_strategy="no", report_to=[], disable_tqdm=True,
                dataloader_num_workers=0, use_cpu=not cuda, use_liger_kernel=cfg.model.kernels == "liger",
                **{ckpt_kwargs: {"use_reentrant": False}})


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def callback(cell: Cell):
    """FtprofCallback writing the cell's run directory, with the recipe, its interpreter and its libraries' versions
    in config.json's trainer section."""
    from ftprof.integrations.hf_trainer import FtprofCallback

    class RecipeCallback(FtprofCallback):
        def trainer_section(self) -> dict[str, Any]:
            out = super().trainer_section()
            out["recipe"] = cell.recipe
            out["python"] = sys.executable
            out["versions"] = {k: _version(k) for k in VERSIONS}
            return out

    cfg = cell.config
    return RecipeCallback(cell.run_dir, measure_warmup_steps=cfg.train.measure_warmup_steps,
                          model_name=cfg.model.model, trainer_name=TRAINER_NAMES[cell.recipe])


def scratch_dir() -> str:
    """The Trainer's output_dir: it saves nothing there (save_strategy no), and the run directory stays ftprof's."""
    return tempfile.mkdtemp(prefix="ftprof-recipe-")


# ------------------------------------------------------------------------------------------------ the process
def _stop(signum, frame) -> None:
    raise StoppedBySignal(signum)


def _failure_status(exc: BaseException) -> str:
    import torch

    if isinstance(exc, torch.OutOfMemoryError) or "CUDA out of memory" in str(exc):
        return "oom_device"
    return "oom_host" if isinstance(exc, MemoryError) else "error"


def record_failure(cell: Cell, exc: BaseException) -> str:
    """A recipe that raised leaves a result like any failed run: its status (oom_device for a CUDA out-of-memory),
    the error's first line and the traceback's tail; config.json stays bench's (the cell as configured)."""
    from ftprof.results import run_dir as files
    from ftprof.results.run_dir import RunDirWriter
    from ftprof.results.schema import failure_result

    status = _failure_status(exc)
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    tail = "".join(traceback.format_exception(exc))[-4000:]
    res = failure_result(cell.config, cell.run_dir, status, type(exc).__name__, first, tail,
                         f"recorded by the {cell.recipe} recipe: it raised {type(exc).__name__}")
    writer = RunDirWriter(cell.run_dir)
    if not (cell.run_dir / files.CONFIG).is_file():
        data = cell.config.to_dict()
        data["trainer"] = {"name": TRAINER_NAMES[cell.recipe], "recipe": cell.recipe, "python": sys.executable}
        writer.write_config(data)
    writer.write_result(res)
    return status


def run(recipe: str, argv: list[str] | None, body: Callable[[Cell], Any]) -> int:
    """A recipe's process: read the cell, train it through ``body`` (which returns the FtprofCallback), and exit
    with the run's status code (0 ok, 1 error, 3 out of memory, 5 not trained, 130 interrupted); bad input is one
    line and exit 2, as for ftprof's commands."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    answer_ctrl_c()  # bench stops a cell with SIGINT, whatever our parent left ignored or blocked
    signal.signal(signal.SIGTERM, _stop)  # and SIGTERM (bench dying: its parent-death signal) stops it the same way
    try:
        return _run(recipe, argv, body)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(recipe: str, argv: list[str] | None, body: Callable[[Cell], Any]) -> int:
    from ftprof.results.status import exit_code

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a recipe never downloads: presets are built, checkpoints local
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cell = None
    try:
        cell = read_cell(argv, recipe)
        cell.run_dir.mkdir(parents=True, exist_ok=True)
        cb = body(cell)
    except ConfigError as exc:
        print(f"ftprof: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print(f"ftprof: the {recipe} recipe was interrupted", file=sys.stderr, flush=True)
        return 130
    except BaseException as exc:  # noqa: BLE001 - every failure is recorded as a result, then shown
        traceback.print_exc()
        if cell is None:
            return 1
        status = record_failure(cell, exc)
        return exit_code(status)
    result = getattr(cb, "result", None)
    if result is None:
        print(f"ftprof: the {recipe} recipe finished but FtprofCallback wrote no result (see the log above)",
              file=sys.stderr, flush=True)
        return 1
    return exit_code(result.status)
