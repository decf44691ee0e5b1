"""The HF Trainer + PEFT recipe as documentation and most scripts write it, measured by FtprofCallback:

``AutoModelForCausalLM.from_pretrained`` (a preset: its random-init checkpoint), for qlora a bitsandbytes 4-bit NF4
``BitsAndBytesConfig`` and PEFT's ``prepare_model_for_kbit_training`` (the textbook recipe; ``kbit_prepare: false``
leaves it out), ``get_peft_model`` with the cell's LoRA, ``transformers.Trainer`` on ftprof's own data stream
(fixed-shape rows: the synthetic stream, or the dataset padded or packed to the sequence length) with the cell's
TrainingArguments.

    python -m ftprof.integrations.recipes.hf --config RUN_DIR/peer_config.json --run-dir RUN_DIR
"""

from __future__ import annotations

import sys

from ftprof.integrations.recipes import common


def train(cell: common.Cell):
    from peft import get_peft_model, prepare_model_for_kbit_training
    from transformers import Trainer, TrainingArguments, default_data_collator

    cfg = cell.config
    s = common.setup(cfg)
    model = common.load_model(cfg, s)
    checkpointing = cfg.model.checkpointing == "full"
    if cfg.method.method == "qlora" and cfg.method.kbit_prepare is not False:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.method.method != "full":
        model = get_peft_model(model, common.lora_config(cfg, s))
    data = common.RowsDataset(common.fixed_rows(cfg, s), cfg.data.dataset)
    args = TrainingArguments(**common.training_kwargs(cfg, s, common.scratch_dir()))
    callback = common.callback(cell)
    Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator,
            callbacks=[callback]).train()
    return callback


def main(argv: list[str] | None = None) -> int:
    return common.run("hf", argv, train)


if __name__ == "__main__":
    sys.exit(main())
