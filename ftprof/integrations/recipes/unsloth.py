"""Unsloth's recipe, measured by FtprofCallback: ``FastLanguageModel.from_pretrained`` (4-bit for qlora,
``full_finetuning`` for full), ``FastLanguageModel.get_peft_model`` with the cell's LoRA and
``use_gradient_checkpointing`` from the cell's checkpointing (``"unsloth"``, its offloaded checkpointing, for full;
False for none), and TRL's SFTTrainer as Unsloth's notebooks run it (recipes/trl.py's SFTConfig and rows).

Unsloth pins its own library versions (2026.10 needs transformers <= 5.17 and datasets < 5): run its cells in an
environment of their own with ``python:`` in the sweep (benchmarks/peers.yaml). Where ``import unsloth`` fails (not
installed, no GPU) the cell is refused in one line, exit status 2.

    python -m ftprof.integrations.recipes.unsloth --config RUN_DIR/peer_config.json --run-dir RUN_DIR
"""

from __future__ import annotations

import sys

from ftprof.errors import ConfigError
from ftprof.integrations.recipes import common


def import_unsloth():
    """Unsloth, imported before transformers (it patches it); ConfigError in one line where it cannot be."""
    try:
        import unsloth  # noqa: F401 - first, so that its patches apply
        from unsloth import FastLanguageModel
    except Exception as exc:  # noqa: BLE001 - ImportError, or Unsloth's own refusal (no GPU, versions)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"trainer: unsloth: Unsloth does not import in {sys.executable} ({first}); install it "
                          "in the environment the cell's python: names (benchmarks/peers.yaml says how)") from None
    return FastLanguageModel


def train(cell: common.Cell):
    FastLanguageModel = import_unsloth()
    from ftprof.integrations.recipes.trl import sft_trainer

    cfg = cell.config
    s = common.setup(cfg)
    m = common.method(cfg, s)
    checkpointing = "unsloth" if cfg.model.checkpointing == "full" else False
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=s.checkpoint, max_seq_length=cfg.data.seq_len, dtype=s.dtype,
        load_in_4bit=m.method == "qlora", full_finetuning=m.method == "full",
        use_gradient_checkpointing=checkpointing, random_state=cfg.train.seed, local_files_only=True,
        device_map={"": str(s.device)})
    if m.method != "full":
        model = FastLanguageModel.get_peft_model(
            model, r=m.lora_r, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout,
            target_modules=list(m.lora_targets), bias="none", use_gradient_checkpointing=checkpointing,
            random_state=cfg.train.seed)
    s.tokenizer = tokenizer
    # Unsloth checkpoints the model itself (use_gradient_checkpointing above): the Trainer's own switch stays off
    trainer, callback = sft_trainer(cell, model, s, None, gradient_checkpointing=False)
    trainer.train()
    return callback


def main(argv: list[str] | None = None) -> int:
    return common.run("unsloth", argv, train)


if __name__ == "__main__":
    sys.exit(main())
