"""The saving section: what the run trained, written where the ecosystem loads it from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ftprof.config.options import option, require


@dataclass
class SaveConfig:
    save: bool = option(False, "after the last step, save what was trained: the PEFT adapter (save_pretrained) for "
                        "lora, qlora and gptq-lora, the whole model and tokenizer for full; for a preset also its "
                        "base model, so that the adapter can be reloaded; timed apart from the steps")
    save_dir: Optional[str] = option(None, "where --save writes (default: the run directory)", metavar="DIR")

    def __post_init__(self) -> None:
        require(self.save_dir is None or bool(self.save_dir.strip()), "--save-dir must not be empty")
        require(self.save_dir is None or self.save, "--save-dir needs --save")
