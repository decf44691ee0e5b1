"""``FtprofCallback``: any HF Trainer run (``transformers.Trainer``, TRL's SFTTrainer with or without packing, their
subclasses) written as a standard ftprof run directory that ``ftprof report`` and ``--baseline`` read.

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[FtprofCallback("runs/my-run")])
    trainer.train()

A step is one optimizer step (gradient accumulation included), timed from ``on_step_begin`` to ``on_step_end``
with device synchronisation (CUDA events); the Trainer fetches a step's batches before ``on_step_begin``, so data
loading, logging, evaluation and saving are outside the step times (result.json's notes say how long they took).
``profile=True`` (or a ProfilingConfig) adds ``ftprof profile``'s profiler window: traces and their summary under
<run dir>/profile.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.utils import logging

from ftprof.integrations.assemble import finish
from ftprof.integrations.describe import (
    Described,
    base_config,
    method_options,
    model_name,
    train_options,
    training_args_dict,
    unwrap,
    weights_dtype,
)
from ftprof.integrations.recorder import Recorder
from ftprof.integrations.window import ProfileWindow, profiling_config, window_notes

logger = logging.get_logger(__name__)


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _dataset_name(dataloader) -> str:
    dataset = getattr(dataloader, "dataset", None)
    info = getattr(dataset, "info", None)
    name = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None)
    return str(name) if name else "trainer-dataset"


class FtprofCallback(TrainerCallback):
    """Measures a Trainer's run into ``run_dir`` (default: ``<output_dir>/ftprof``). ``measure_warmup_steps``: the
    first steps, left out of the steady-state figures. ``model_name``: the name recorded (default: the model's
    name or path, else its class). ``trainer_name``: how the trainer is recorded (default: from the arguments'
    class: ``hf-trainer`` for TrainingArguments, ``trl-sft`` for TRL's SFTConfig). ``profile``: a profiler window
    as ``ftprof profile`` runs it: True for its defaults (wait 1, warm-up 1, active 2 steps), a ProfilingConfig, or
    a mapping of its ``prof_*`` fields; off by default."""

    def __init__(self, run_dir: str | Path | None = None, *, measure_warmup_steps: int = 2,
                 model_name: str | None = None, trainer_name: str | None = None, profile=None):
        self.run_dir = run_dir
        self.profile = profiling_config(profile)  # a bad window is refused here, before training
        self.measure_warmup_steps = measure_warmup_steps
        self.model_name = model_name
        self.trainer_name = trainer_name
        self.recorder: Recorder | None = None
        self.result = None  # the RunResult, after training
        self._model = None
        self._args = None
        self._dataset = "trainer-dataset"

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        window = ProfileWindow(self.profile, args.process_index, self.model_name) if self.profile else None
        if self.profile is not None and 0 < state.max_steps < self.profile.total_steps:
            logger.warning("ftprof: %s", window_notes(self.profile, state.max_steps)[0])
        self.recorder = Recorder(self.run_dir or Path(args.output_dir) / "ftprof",
                                 measure_warmup_steps=self.measure_warmup_steps, window=window)
        self._model, self._args = model, args
        self._dataset = _dataset_name(train_dataloader)
        self.recorder.start(model, state.max_steps)
        if getattr(args, "packing", False) and getattr(args, "max_length", None):
            self.recorder.lengths.packed_len = int(args.max_length)  # TRL's packs: each is a sequence of max_length

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        if self.recorder is not None:
            groups = getattr(optimizer, "param_groups", None)
            self.recorder.begin_step(groups[0]["lr"] if groups else None)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.recorder is not None and self.recorder.in_step:
            self.recorder.before_optimizer_step()

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if self.recorder is not None and self.recorder.in_step:
            self.recorder.after_optimizer_step(optimizer)

    def on_step_end(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self.recorder.end_step()

    def on_train_end(self, args, state, control, **kwargs):
        if self.recorder is None or self.recorder.model is None:
            return
        rec, self.recorder = self.recorder, None
        try:
            self.result = finish(rec, unwrap(self._model), self.describe(rec, state), self.trainer_section(),
                                 world_size=args.world_size, write=args.process_index == 0)
        except Exception:  # noqa: BLE001 - the training is done: a failed write must not lose the trainer's result
            logger.exception("ftprof: writing the run directory %s failed", rec.run_dir)

    # ------------------------------------------------------------------------------------------------ config
    def describe(self, rec: Recorder, state) -> Described:
        """The run's configuration in ftprof's options."""
        args, model = self._args, unwrap(self._model)
        dtype = weights_dtype(model)
        method = method_options(model, dtype)
        train = train_options(args, state.max_steps, args.world_size)
        flat = {**method.flat, **train.flat, "model": self.model_name or model_name(model), "dtype": dtype,
                "seq_len": max(2, rec.seq_len() or int(getattr(args, "max_length", 0) or 0)),
                "dataset": self._dataset, "measure_warmup_steps": self.measure_warmup_steps,
                "output_dir": str(rec.run_dir.parent), "run_name": rec.run_dir.name,
                "device": "cuda" if rec.device.type == "cuda" else "cpu",
                "memory_logging": "nvml" if rec.device.type == "cuda" else "torch",
                "attn_implementation": _attention(model)}
        if getattr(model, "is_gradient_checkpointing", False):
            flat["checkpointing"] = "full"
        flat.update(rec.window.options())
        notes = method.notes + train.notes
        if args.bf16 or args.fp16:
            notes.append(f"{'bf16' if args.bf16 else 'fp16'} mixed precision (autocast) over {dtype} weights")
        if not rec.loss_seen:
            notes.append("the model's output carried no loss (computed outside the model): steps.csv's loss is empty "
                         "and the loss was not checked finite")
        return Described(flat, notes)

    def trainer_section(self) -> dict[str, Any]:
        """config.json's ``trainer``: which trainer ran, its library versions and its arguments as given."""
        args = self._args
        cls = type(args)
        name = self.trainer_name or ("trl-sft" if cls.__name__ == "SFTConfig" else
                                     "trl" if cls.__module__.startswith("trl") else "hf-trainer")
        return {"name": name, "args_class": f"{cls.__module__}.{cls.__name__}",
                "versions": {k: _version(k) for k in ("transformers", "trl", "peft", "accelerate")},
                "training_args": training_args_dict(args)}


def _attention(model) -> str:
    value = getattr(base_config(model), "_attn_implementation", None)
    return value if isinstance(value, str) and value else "sdpa"


__all__ = ["FtprofCallback"]
