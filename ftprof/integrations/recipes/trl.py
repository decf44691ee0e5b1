"""TRL's SFTTrainer recipe, measured by FtprofCallback: the model loaded as the HF recipe loads it (4-bit NF4 for
qlora), ``SFTTrainer`` with the cell's LoRA as ``peft_config`` and an ``SFTConfig`` of the cell's settings
(``max_length`` the sequence length, ``packing`` as the cell says: TRL's padding-free best-fit packing), on the
cell's data as token rows that TRL collates itself (padded per batch, or packed); real data keeps ftprof's loss mask
as TRL's ``completion_mask``. PEFT's ``prepare_model_for_kbit_training`` only with ``kbit_prepare: true`` (TRL does
not apply it).

    python -m ftprof.integrations.recipes.trl --config RUN_DIR/peer_config.json --run-dir RUN_DIR
"""

from __future__ import annotations

import sys

from ftprof.errors import ConfigError
from ftprof.integrations.recipes import common


def sft_trainer(cell: common.Cell, model, s: common.Setup, peft_config, **extra):
    """SFTTrainer over the cell's rows with ``SFTConfig`` (``extra``: SFTConfig keywords a recipe sets itself)."""
    try:
        from trl import SFTConfig, SFTTrainer
    except ImportError as exc:
        raise ConfigError(f"trainer: trl needs TRL in {sys.executable} ({exc}); pip install 'ftprof[trl]' there") \
            from None
    cfg = cell.config
    columns = common.document_rows(cfg, s)
    kwargs = common.training_kwargs(cfg, s, common.scratch_dir())
    kwargs.update(max_length=cfg.data.seq_len, packing=cfg.data.packing, dataset_num_proc=cfg.data.dataset_num_proc,
                  completion_only_loss=True if "completion_mask" in columns else None, **extra)
    callback = common.callback(cell)
    trainer = SFTTrainer(model=model, args=SFTConfig(**kwargs), train_dataset=common.hf_dataset(columns,
                                                                                                cfg.data.dataset),
                         processing_class=s.tokenizer, peft_config=peft_config, callbacks=[callback])
    return trainer, callback


def train(cell: common.Cell):
    cfg = cell.config
    s = common.setup(cfg)
    model = common.load_model(cfg, s)
    if cfg.method.method == "qlora" and cfg.method.kbit_prepare:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.model.checkpointing == "full",
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
    peft_config = common.lora_config(cfg, s) if cfg.method.method != "full" else None
    trainer, callback = sft_trainer(cell, model, s, peft_config)
    trainer.train()
    return callback


def main(argv: list[str] | None = None) -> int:
    return common.run("trl", argv, train)


if __name__ == "__main__":
    sys.exit(main())
