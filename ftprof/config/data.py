"""The data section: which dataset, how rows become tokens, sequence length and batch size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from ftprof.config.options import DATA_FORMATS, TRAIN_ON, check_types, one_of, option, require
from ftprof.errors import ConfigError


@dataclass
class DataConfig:
    # how the command line spells a field when it is not --<field> (the eval data's: config/evaluation.py)
    RENAMED: ClassVar[dict[str, str]] = {}
    dataset: str = option("synthetic", "'synthetic' (learnable token stream), a data file (.txt, .json, .jsonl, .csv, "
                          ".parquet), a folder written by datasets' save_to_disk, or a hub dataset name",
                          metavar="synthetic|FILE|DIR|NAME")
    dataset_config: Optional[str] = option(None, "configuration (subset) of a hub dataset", metavar="NAME")
    dataset_split: str = option("train", "split to train on; datasets' slicing works too, e.g. 'train[:1000]'")
    data_format: str = option("auto", "how rows become tokens: text (one text column), instruction (prompt "
                              "template + response column), chat (a messages column rendered with the tokenizer's "
                              "chat template); auto picks chat if the messages column exists, else instruction if "
                              "the response column exists, else text", choices=DATA_FORMATS)
    text_field: str = option("text", "text format: the column holding the text")
    prompt_template: Optional[str] = option(None, "instruction format: the prompt, with {column} placeholders "
                                            "(default: the Alpaca template over 'instruction' and, where present, "
                                            "'input')", metavar="TEMPLATE")
    response_field: str = option("output", "instruction format: the column holding the response")
    messages_field: str = option("messages", "chat format: the column holding the list of {role, content} turns")
    train_on: str = option("completion", "instruction and chat formats: completion = loss only on the response "
                           "(the assistant turns); prompt = loss on the prompt too (every token of the sequence)",
                           choices=TRAIN_ON)
    dataset_num_proc: Optional[int] = option(None, "processes that tokenize the dataset (default: up to 8 of the "
                                             "machine's cores for 10,000 rows or more, else 1)")
    seq_len: int = option(128, "tokens per sequence")
    batch_size: int = option(2, "sequences per micro-batch (per device)")
    packing: bool = option(False, "concatenate documents into full sequences instead of padding each one")
    prefetch: bool = option(True, "make the next step's first micro-batch and queue its copy to the device while "
                            "the GPU runs this step, instead of after it (the host's work then stays out of the "
                            "step's time)")

    def option(self, name: str) -> str:
        """The command-line option that set field ``name`` (``--dataset``; for eval data ``--eval-dataset``)."""
        return self.RENAMED.get(name) or "--" + name.replace("_", "-")

    def __post_init__(self) -> None:
        check_types(self)
        require(self.seq_len >= 2, f"--seq-len must be at least 2, got {self.seq_len}")
        require(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        require(bool(self.dataset), "--dataset must not be empty")
        require(bool(self.dataset_split), "--dataset-split must not be empty")
        one_of("--data-format", self.data_format, DATA_FORMATS)
        one_of("--train-on", self.train_on, TRAIN_ON)
        if self.dataset_num_proc is not None:
            require(self.dataset_num_proc >= 1, f"--dataset-num-proc must be at least 1, got {self.dataset_num_proc}")
        if self.prompt_template is not None:
            require(bool(template_fields(self.prompt_template)),
                     "--prompt-template needs at least one {column} placeholder")
        for name in ("text_field", "response_field", "messages_field"):
            require(bool(getattr(self, name)), f"--{name.replace('_', '-')} must not be empty")
        self._check_format_options()

    def _check_format_options(self) -> None:
        """Options of the instruction and chat formats where the format is known to be another: synthetic data
        is a token stream, --data-format text one text column (they were silently ignored)."""
        fmt = "synthetic data" if self.dataset == "synthetic" else "--data-format text" \
            if self.data_format == "text" else None
        if fmt is None:
            return
        require(self.dataset != "synthetic" or self.data_format in ("auto", "text"),
                f"--data-format {self.data_format} reads rows of a data file; {fmt} has none (give --dataset FILE)")
        require(self.prompt_template is None, f"--prompt-template applies to --data-format instruction, not {fmt}")
        require(self.train_on == "completion", f"--train-on {self.train_on} applies to the instruction and chat "
                f"formats (a prompt to leave out of the loss); {fmt} trains on every token already")


def template_fields(template: str) -> list[str]:
    """The {column} placeholders of a prompt template; one line naming the problem if it does not parse."""
    import string

    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ConfigError(f"--prompt-template: {exc}") from None
    require(all(n.isidentifier() for n in names), f"--prompt-template: placeholders must be column names, got "
             f"{[n for n in names if not n.isidentifier()]}")
    return names
