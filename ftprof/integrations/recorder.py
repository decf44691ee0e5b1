"""The measurement behind the HF Trainer callback and the plain-loop context manager: a step log timed with device
synchronisation, tokens counted where the model is called, memory by stage, the proof of training, NVML.

The trainer's own loop drives it through five calls: ``begin_step``, the model's forward (seen through a forward
pre-hook and hook on the outermost module, so it counts whatever batch a Trainer, TRL's SFTTrainer with or without
packing, or a subclass feeds), ``before_optimizer_step``, ``after_optimizer_step`` and ``end_step``; ``finish``
writes the run directory. An optional profiler window (integrations/window.py) follows the same calls.

Everything read from the device inside a step (real-token counts, a padding-free batch's document lengths
(integrations/lengths.py), the loss, a gradient norm) stays a device tensor until ``end_step``'s synchronisation, so
measuring adds no synchronisation of its own.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import time
from pathlib import Path
from typing import Any

import torch

from ftprof.data.formats import IGNORE_INDEX
from ftprof.engine.proof import TrainingCheck, grad_norm
from ftprof.engine.trackers import FirstStepMemory, NvmlTracker, StepLog
from ftprof.integrations.lengths import Lengths
from ftprof.profiling.memory import MemoryTracker, SavedActivations
from ftprof.results.run_dir import RunDirWriter
from ftprof.results.schema import StepRecord

FORWARD, BACKWARD, OPTIMIZER = "ftprof/forward", "ftprof/backward", "ftprof/optimizer_step"  # ftprof's loop's labels

# steps.csv is rewritten (atomically, fsync'd) every this many steps and at the end: outside step time, but the
# trainer's wall time all the same.
FLUSH_EVERY = 10


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class _Steps(StepLog):
    """ftprof's step log, flushed every FLUSH_EVERY steps (ftprof's loop flushes every step of a short run)."""

    def end(self, record: StepRecord) -> None:
        self.steps.append(record)
        if record.step % FLUSH_EVERY == 0:
            self.writer.write_steps(self.steps)


def model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        if p.device.type != "meta":
            return torch.device("cuda", torch.cuda.current_device()) if p.device.type == "cuda" else p.device
    return torch.device("cpu")


def _tensor(value) -> torch.Tensor | None:
    return value if isinstance(value, torch.Tensor) else None


def _loss_of(output) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.dim() == 0 else None
    loss = output.get("loss") if hasattr(output, "get") else getattr(output, "loss", None)
    return _tensor(loss)


class NoWindow:
    """No profiler window (the default): each call does nothing."""

    enabled = False

    def start(self, model, device, run_dir) -> None:
        return None

    def stage(self, name: str | None) -> None:
        return None

    def phase(self, index: int) -> str:
        return ""

    def step(self, rec) -> None:
        return None

    def close(self) -> None:
        return None

    def options(self) -> dict:
        return {}

    def record(self, res, steps: list[dict], taken: int) -> None:
        return None

    def summarize(self, res, run_dir: Path, run_config: dict) -> None:
        return None


class Recorder:
    """One measured run. ``start`` before the first step, the step calls during it, ``finish`` after the last.
    ``window``: a profiler window (integrations/window.py), none by default."""

    def __init__(self, run_dir: str | Path, *, measure_warmup_steps: int = 2, window=None):
        self.window = window or NoWindow()
        self.run_dir = Path(run_dir).expanduser()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.writer = RunDirWriter(self.run_dir)
        self.measure_warmup_steps = measure_warmup_steps
        self.model: torch.nn.Module | None = None
        self.index = 0  # the step being measured (1-based); 0 before the first
        self.in_step = False
        self.overhead_s: list[float] = []  # the recorder's own time inside each step
        self.started_at = ""
        self.notes: list[str] = []
        self.loss_seen = True
        self._hooks: list[Any] = []
        self._step_cost = 0.0

    # -------------------------------------------------------------------------------------------- set-up
    def start(self, model: torch.nn.Module, max_steps: int) -> None:
        """Hook the model, sample its weights for the proof, start NVML where it exists. Before the first step."""
        self.model = model
        self.device = model_device(model)
        self.max_steps = max_steps
        self.memory = MemoryTracker(self.device)
        self.steps = _Steps(self.writer, self.memory, self.device, max_steps)
        self.first = FirstStepMemory(True, self.device.type)
        self.check = TrainingCheck(model, max_steps)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.nvml = NvmlTracker(_NvmlWanted(self.device), self.device, self.run_dir, None, self.steps)
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(self.memory)
        self._stack.enter_context(self.steps)
        self._stack.enter_context(self.nvml)
        self.window.start(model, self.device, self.run_dir)  # last in, first out: stopped before the trackers
        self._stack.callback(self.window.close)
        self._hooks = [model.register_forward_pre_hook(self._pre_forward, with_kwargs=True),
                       model.register_forward_hook(self._post_forward, with_kwargs=True)]
        self.started_at = _now()
        self.lengths = Lengths()  # the widths and padding-free documents fed: seq_len and the attention length
        self.micro_tokens: int | None = None  # positions of the first micro-batch (the logits' size)
        self.micro_rows = 0  # rows of the first micro-batch (its documents, where it was padding-free)

    # -------------------------------------------------------------------------------------------- a step
    def begin_step(self, lr: float | None = None) -> None:
        t0 = time.perf_counter()
        self.index += 1
        self.in_step = True
        self.lr = float(lr) if lr is not None else math.nan
        self.tokens = 0
        self.real: torch.Tensor | int = 0
        self.loss: torch.Tensor | None = None
        self.loss_is_sum = False
        self.micro = 0
        self.norm: torch.Tensor | None = None
        self._stage: tuple[str, int] | None = None
        self._meter = None
        self._step_cost = 0.0
        self.lengths.begin_step()
        self._step_cost += time.perf_counter() - t0  # before the timer: the recorder's own
        self.started = self.steps.begin(self.index)

    def _open_stage(self, name: str) -> None:
        if self.memory.cuda:
            torch.cuda.synchronize(self.device)  # sync point: the stage's "before" excludes queued work
        self._stage = (name, self.memory.allocated())
        self.memory.reset_peak()

    def _close_stage(self) -> None:
        if self._stage is not None:
            self.memory.close_stage(self._stage[0], self._stage[1])
            self._stage = None

    def _pre_forward(self, module, args, kwargs) -> None:
        if not self.in_step or not module.training:
            return
        t0 = time.perf_counter()
        self.window.stage(FORWARD)
        ids = _tensor(kwargs.get("input_ids")) if "input_ids" in kwargs else _tensor(args[0] if args else None)
        if ids is None:
            ids = _tensor(kwargs.get("inputs_embeds"))
            ids = ids[..., 0] if ids is not None else None
        if ids is not None:
            n, width = ids.numel(), ids.shape[-1]
            self.tokens += n
            self.lengths.forward(kwargs, ids, first=self.micro_tokens is None)
            self.micro_tokens = self.micro_tokens or n
            self.micro_rows = self.micro_rows or n // max(1, width)
            self.real = self.real + self._real_tokens(kwargs, n, ids)
        self.loss_is_sum = kwargs.get("num_items_in_batch") is not None
        if self.index == 1 and self.micro == 0:
            self._open_stage("first_forward")
            self._meter = SavedActivations(module).__enter__()
        self._step_cost += time.perf_counter() - t0

    @staticmethod
    def _real_tokens(kwargs, n: int, ids: torch.Tensor):
        """Positions that carry a label after the causal shift (a device tensor: not read until the step ends)."""
        shifted = _tensor(kwargs.get("shift_labels"))
        if shifted is not None:
            return (shifted != IGNORE_INDEX).sum()
        labels = _tensor(kwargs.get("labels"))
        if labels is not None:
            return (labels[..., 1:] != IGNORE_INDEX).sum()
        mask = _tensor(kwargs.get("attention_mask"))
        if mask is not None and mask.dim() == 2:
            return mask[..., 1:].sum()
        return n - (ids.numel() // max(1, ids.shape[-1]))

    def _post_forward(self, module, args, kwargs, output) -> None:
        if not self.in_step or not module.training:
            return
        t0 = time.perf_counter()
        self.window.stage(BACKWARD)  # and whatever runs before the next forward or the optimizer step
        loss = _loss_of(output)
        if loss is not None:
            loss = loss.detach().float()
            self.loss = loss if self.loss is None else self.loss + loss
        if self._meter is not None:
            self._meter.__exit__(None, None, None)
            self.first.saved_activations = self._meter.bytes
            self._meter = None
            self._close_stage()
            self._open_stage("first_backward")  # the other micro-batches' forward and backward too
        self.micro += 1
        self._step_cost += time.perf_counter() - t0

    def before_optimizer_step(self) -> None:
        """Gradients are final (clipped where the trainer clips): a norm on check steps, the first step's stage."""
        t0 = time.perf_counter()
        self.window.stage(OPTIMIZER)
        if self.index == 1:
            self._close_stage()
            self._open_stage("first_optimizer_step")
        if self.in_step and self.check.wants_grad_norm(self.index):
            self.norm = grad_norm(self.params)
        self._step_cost += time.perf_counter() - t0

    def after_optimizer_step(self, optimizer) -> None:
        """Gradients and optimizer state both exist (before they are zeroed): the first step sizes them."""
        self.window.stage(None)
        if self.index == 1 and self.first.static is None and optimizer is not None:
            optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
            self.first.after_optimizer_step(self.model, optimizer)
            self._close_stage()

    def end_step(self, loss: float | torch.Tensor | None = None) -> StepRecord | None:
        """Stop the step's timer (device sync), read what the step left on the device, log the step."""
        if not self.in_step:
            return None
        if self._meter is not None:  # a forward that never returned to its hook
            self._meter.__exit__(None, None, None)
            self._meter = None
        self._close_stage()
        self.window.stage(None)
        seconds = self.steps.timer.stop()
        t0 = time.perf_counter()
        self.in_step = False
        causes = self.steps.causes()
        mem = self.memory.current()
        self.lengths.end_step()  # after the sync: the step's document lengths, read once
        if self.index == 1 and self.lengths.first_docs:
            self.micro_rows = self.lengths.first_docs  # a padding-free micro-batch: its documents are its rows
        step_loss = self._step_loss(loss)
        record = StepRecord(step=self.index, loss=step_loss, step_time_s=seconds, tokens=self.tokens,
                            real_tokens=int(self.real), lr=self.lr, warmup=self.index <= self.measure_warmup_steps,
                            profiler_phase=self.window.phase(self.index), started_unix=self.started,
                            mem_allocated=mem["allocated"], mem_peak_allocated=mem["peak_allocated"],
                            mem_reserved=mem["reserved"],
                            mem_peak_reserved=mem["peak_reserved"], **causes)
        self.steps.end(record)
        if math.isnan(step_loss) and not self.loss_seen:
            if self.norm is not None:  # the proof's gradient norm, without a loss to check
                self.check.norms.append((self.index, float(self.norm)))
        else:
            self.check.observe(self.index, step_loss, self.norm)
        self.overhead_s.append(self._step_cost + time.perf_counter() - t0)
        self.window.step(self)  # after the step's figures: the profiler's export is not the step's time
        return record

    def _step_loss(self, given) -> float:
        if given is not None:
            return float(given)
        if self.loss is None:
            self.loss_seen = False
            return math.nan
        return float(self.loss if self.loss_is_sum or not self.micro else self.loss / self.micro)

    # -------------------------------------------------------------------------------------------- the end
    def stop(self) -> None:
        """Unhook the model and stop the trackers (the steady stage closes, steps.csv is written)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._meter is not None:
            self._meter.__exit__(None, None, None)
            self._meter = None
        self.in_step = False
        self._stack.close()

    def wall_s(self) -> float:
        """Wall seconds from the first step's start to the last step's end."""
        if not self.steps.steps:
            return 0.0
        last = self.steps.steps[-1]
        return last.started_unix + last.step_time_s - self.steps.steps[0].started_unix

    def seq_len(self) -> int:
        """The longest sequence fed (the shape a fixed-length run trains at): the widest row, the longest document of
        padding-free batches, or TRL's packed length (integrations/lengths.py)."""
        return self.lengths.seq_len()

    def attention_len(self) -> float:
        """The sequence length the attention FLOPs count with: the token-weighted mean width (or document length in
        padding-free batches), so batches padded to their longest row count what they ran."""
        return self.lengths.attention_len()


class _NvmlWanted:
    """What NvmlTracker reads of a RunConfig: NVML sampling wherever the run is on a GPU."""

    def __init__(self, device: torch.device):
        self.output = type("Output", (), {"memory_logging": "nvml" if device.type == "cuda" else "torch"})()
