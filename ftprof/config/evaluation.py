"""The evaluation section: which rows to evaluate on, how often, how many batches."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Optional

from ftprof.config.data import DataConfig
from ftprof.config.options import check_types, option, require


@dataclass
class EvalConfig:
    eval_dataset: Optional[str] = option(
        None, "data to evaluate on: a file, save_to_disk folder or hub name, read like --dataset (default: "
        "--dataset's --eval-split)", metavar="FILE|DIR|NAME")
    eval_split: Optional[str] = option(
        None, "split of --eval-dataset (default train) or, without it, of --dataset (e.g. 'test', "
        "'train[-200:]')")
    eval_steps: Optional[int] = option(
        None, "evaluate every N optimizer steps, and after the last (default with eval data: after the last step "
        "only); synthetic data evaluates on held-out batches of its own stream", metavar="N")
    eval_batches: Optional[int] = option(
        None, "evaluate on at most this many batches of --batch-size (default: the whole eval split; synthetic "
        "data: 4)", metavar="N")

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("eval_dataset", "eval_split"):
            value = getattr(self, name)
            require(value is None or bool(value.strip()), f"--{name.replace('_', '-')} must not be empty")
        if self.eval_steps is not None:
            require(self.eval_steps >= 1, f"--eval-steps must be at least 1, got {self.eval_steps}")
        if self.eval_batches is not None:
            require(self.eval_batches >= 1, f"--eval-batches must be at least 1, got {self.eval_batches}")
            require(self.enabled, "--eval-batches: nothing is evaluated; add --eval-steps N (synthetic data), "
                    "--eval-dataset or --eval-split")

    @property
    def enabled(self) -> bool:
        return self.eval_steps is not None or self.eval_dataset is not None or self.eval_split is not None


@dataclasses.dataclass
class EvalSplitData(DataConfig):
    """--dataset's --eval-split: its problems name --eval-split where they are the split's."""
    RENAMED: ClassVar[dict[str, str]] = {"dataset_split": "--eval-split"}


@dataclasses.dataclass
class EvalFileData(DataConfig):
    """--eval-dataset (split --eval-split): its problems name those options, not --dataset's."""
    RENAMED: ClassVar[dict[str, str]] = {"dataset": "--eval-dataset", "dataset_split": "--eval-split"}


def eval_data_config(data: DataConfig, e: EvalConfig) -> DataConfig:
    """The data section that reads the eval rows: --eval-dataset (split --eval-split, default train) or --dataset's
    --eval-split; formats, columns and lengths as for training. Its ``option()`` names the eval options."""
    fields = {f.name: getattr(data, f.name) for f in dataclasses.fields(data)}
    if e.eval_dataset is None:
        return EvalSplitData(**{**fields, "dataset_split": e.eval_split or data.dataset_split})
    return EvalFileData(**{**fields, "dataset": e.eval_dataset, "dataset_split": e.eval_split or "train",
                           "dataset_config": None})
