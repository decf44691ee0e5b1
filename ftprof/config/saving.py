"""The saving section: what the run trained, written where the ecosystem loads it from; checkpoints during the
run and resuming from one (the HF Trainer's --save_steps, --save_total_limit, --resume_from_checkpoint)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ftprof.config.options import check_types, option, require
from ftprof.errors import ConfigError

CHECKPOINT_PREFIX = "checkpoint-"  # <run dir>/checkpoint-<step>/, as the HF Trainer names them
# A saved run's and a checkpoint's folders and files (engine/save.py writes them; resolve_resume checks a checkpoint
# has them before anything loads; the report does not take them for runs)
ADAPTER, MODEL, BASE, MERGED = "adapter", "model", "base", "merged"
TRAINER_STATE = "trainer_state.pt"  # optimizer, scheduler, RNG states (torch.save)
CHECKPOINT_STATE = "ftprof_checkpoint.json"  # in each checkpoint: its step, data position and the run's options


@dataclass
class SaveConfig:
    save: bool = option(False, "after the last step, save what was trained: the PEFT adapter (save_pretrained) for "
                        "lora, qlora and gptq-lora, the whole model and tokenizer for full; for a lora or qlora preset "
                        "also its base model, so that the adapter can be reloaded (gptq-lora's adapter names its "
                        "quantized checkpoint in ftprof's cache); timed apart from the steps")
    save_dir: Optional[str] = option(None, "where --save and --save-merged write their folders (default: the run "
                                     "directory): DIR/model/ for full (a checkpoint --model can load), DIR/adapter/ "
                                     "and for a lora or qlora preset DIR/base/ otherwise, DIR/merged/ for "
                                     "--save-merged",
                                     metavar="DIR")
    save_merged: bool = option(False, "after the last step, save the model with its LoRA adapters merged into the "
                               "base (QLoRA: into the dequantized base), in the run's dtype, as a plain "
                               "transformers checkpoint with its tokenizer (merged/); lora and qlora")
    save_steps: Optional[int] = option(None, "every N steps, write a checkpoint to <run dir>/checkpoint-<step>/: "
                                       "what --save writes, and the optimizer, scheduler, RNG and data position "
                                       "that --resume-from-checkpoint needs; one process only", metavar="N")
    save_total_limit: Optional[int] = option(None, "keep at most K checkpoints (the newest; default: all)",
                                             metavar="K")
    resume_from_checkpoint: Optional[str] = option(
        None, "continue from a checkpoint-<step>/ directory (or latest: the newest in any run directory under "
        "--output-dir) up to --max-steps, with the same losses as a run that never stopped; "
        "the run writes its own run directory, its steps numbered on from the checkpoint's", metavar="PATH")

    def __post_init__(self) -> None:
        check_types(self)
        require(self.save_dir is None or bool(self.save_dir.strip()), "--save-dir must not be empty")
        require(self.save_dir is None or self.save or self.save_merged, "--save-dir needs --save or --save-merged")
        require(self.save_steps is None or self.save_steps >= 1,
                f"--save-steps must be at least 1, got {self.save_steps}")
        require(self.save_total_limit is None or self.save_total_limit >= 1,
                f"--save-total-limit must be at least 1, got {self.save_total_limit}")
        require(self.save_total_limit is None or self.save_steps is not None,
                "--save-total-limit needs --save-steps")
        require(self.resume_from_checkpoint is None or bool(self.resume_from_checkpoint.strip()),
                "--resume-from-checkpoint must not be empty")


def local_dataset_path(dataset: str) -> str | None:
    """A dataset that is a local file or folder, as its absolute path (what a resume compares: the same name from
    another directory is another file, and the same file by another name is the same); None for the others."""
    path = Path(dataset).expanduser()
    return str(path.resolve()) if dataset != "synthetic" and path.exists() else None


def checkpoint_dirs(run_dir: str | Path, finished: bool = True) -> list[tuple[int, Path]]:
    """The checkpoints in ``run_dir`` as (step, path), by step: the finished ones (with their state file), or with
    ``finished=False`` every checkpoint-<step> folder."""
    run_dir, found = Path(run_dir), []
    if run_dir.is_dir():
        for entry in run_dir.iterdir():
            step = entry.name.removeprefix(CHECKPOINT_PREFIX)
            if entry.name.startswith(CHECKPOINT_PREFIX) and step.isdigit() and entry.is_dir() and (
                    not finished or (entry / CHECKPOINT_STATE).is_file()):
                found.append((int(step), entry))
    return sorted(found)


def read_checkpoint_state(path: str | Path) -> dict:
    """A checkpoint's ftprof_checkpoint.json (its step, its options); ConfigError where it is not one of ftprof's."""
    try:
        return json.loads((Path(path) / CHECKPOINT_STATE).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--resume-from-checkpoint {path}: not an ftprof checkpoint (no readable "
                          f"{CHECKPOINT_STATE}: {exc.__class__.__name__}); --save-steps writes them") from None


# What a resumed run may change from its checkpoint's run (a new --lr, a longer run's schedule): it takes effect from
# the resumed run's first step, and its note names each change (a changed --lr ran silently)
RESUME_MAY_CHANGE = ("lr", "lr_scheduler_type", "warmup_steps", "warmup_ratio", "weight_decay", "max_grad_norm",
                     "max_steps")


def resume_changes(path: str | Path, options: dict) -> list[str]:
    """"--lr 0.01 (the checkpoint's run: 0.0002)" for each RESUME_MAY_CHANGE option ``options`` (a run's flat
    options) set otherwise than the run that wrote the checkpoint at ``path``."""
    theirs = read_checkpoint_state(path).get("options", {})
    return [f"--{k.replace('_', '-')} {options[k]} (the checkpoint's run: {theirs[k]})" for k in RESUME_MAY_CHANGE
            if k in theirs and k in options and options[k] != theirs[k]]


def check_same_data(path: str | Path, data_hash: str, dataset: str) -> None:
    """A resumed run trains on the tokens its checkpoint's run did (``data_hash``: PreparedData.content_hash): the
    batches it took are drawn again and dropped, so other data (the same file rewritten, another tokenizer) would
    silently train on rows it never saw in the places of those it did. ConfigError; checkpoints without a hash
    (written before they recorded one) are not compared."""
    saved = read_checkpoint_state(path).get("data_hash")
    if saved and saved != data_hash:
        raise ConfigError(f"--resume-from-checkpoint {path}: this run's data differs from the checkpoint's (the tokens "
                          f"of {dataset} changed since it was written); resume with the same data and tokenizer, or "
                          "start a new run")
