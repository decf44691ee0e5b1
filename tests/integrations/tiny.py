"""A tiny Llama, a tiny dataset and a Trainer run with ftprof's callback, for the integration tests."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers import TrainerCallback

VOCAB = 256


def tiny_llama(lora: bool = False, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB)
    model = LlamaForCausalLM(config)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                 task_type="CAUSAL_LM"))
    return model


def token_rows(rows: int, seq_len: int, seed: int = 0, ragged: bool = False) -> dict[str, list]:
    """Random token rows (ids 3..VOCAB-1; 0 is padding), all ``seq_len`` long or, ``ragged``, 1/2 to all of it."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (rows, seq_len), generator=g).tolist()
    if ragged:
        ids = [row[:seq_len // 2 + (i * 7) % (seq_len // 2 + 1)] for i, row in enumerate(ids)]
    return {"input_ids": ids}


def training_args(out: Path, steps: int = 6, batch_size: int = 8, **kw):
    from transformers import TrainingArguments

    values = dict(max_steps=steps, per_device_train_batch_size=batch_size, report_to=[], logging_steps=1000,
                  save_strategy="no", learning_rate=1e-3, use_cpu=True, disable_tqdm=True, seed=0)
    values.update(kw)
    return TrainingArguments(str(out), **values)


class StepClock(TrainerCallback):
    """The step times a bare callback sees (on_step_begin to on_step_end, perf_counter): the reference without
    ftprof's measurement."""

    def __init__(self):
        self.times: list[float] = []
        self._t0 = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._t0)


def run_trainer(tmp: Path, run_dir: Path | None, lora: bool, seq_len: int = 128, steps: int = 6,
                extra_callbacks: list | None = None, **kw):
    """A Trainer run on a tiny Llama (fixed-length rows); returns (trainer output, callback or None)."""
    import datasets
    from transformers import Trainer, default_data_collator

    from ftprof.integrations import FtprofCallback

    rows = token_rows(64, seq_len)
    rows["labels"] = rows["input_ids"]
    callbacks = [FtprofCallback(run_dir)] if run_dir is not None else []
    trainer = Trainer(model=tiny_llama(lora), args=training_args(tmp / "hf-out", steps, **kw),
                      train_dataset=datasets.Dataset.from_dict(rows), data_collator=default_data_collator,
                      callbacks=callbacks + (extra_callbacks or []))
    output = trainer.train()
    return output, (callbacks[0] if callbacks else None)
