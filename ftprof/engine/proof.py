"""Proof that a run trained: measured by the loop at almost no cost, checked at the end.

- **Weights**: before the first step, a strided sample of each parameter (``SAMPLE_ELEMENTS`` values, a copy on
  the device) is kept; after the last step each is compared with the tensor's values then. At least one trainable
  tensor must have changed and no frozen one may have.
- **Loss**: the loop already reads each step's loss as a float (steps.csv); every one must be finite.
- **Gradient norm**: on the first step, every ``GRAD_NORM_EVERY``-th and the last, the norm of every trainable
  gradient before the optimizer step: clipping's own norm when it clips, else one fused ``get_total_norm``
  (``torch._foreach_norm``). It is read after the step timer's device sync, so reading it waits for nothing; it
  must be finite and non-zero.

A run that fails a check is not ``ok`` but ``not_trained`` (``NotTrainedError``), with the reason; the record of
what was checked is result.json's ``training_proof`` either way.
"""

from __future__ import annotations

import math

import torch

from ftprof.errors import FtprofError
from ftprof.results.parts import TrainingProof

SAMPLE_ELEMENTS = 64  # values sampled per tensor, spread evenly through it
GRAD_NORM_EVERY = 25  # steps between gradient-norm checks (plus the first and the last step)


class NotTrainedError(FtprofError):
    """The run finished its steps but did not train (the reason is the message)."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's values of a parameter (FSDP2's DTensor shard, or the tensor itself)."""
    tensor = tensor.detach()
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def sample(tensor: torch.Tensor) -> torch.Tensor:
    """``SAMPLE_ELEMENTS`` values spread evenly through the tensor, copied (one small device copy), as their bits:
    compared bit for bit, since packed 4-bit weights stored in a float dtype (QLoRA's bf16 quant storage) hold bit
    patterns that read as NaN, and NaN != NaN (seen on an H200: every frozen 4-bit weight looked "changed")."""
    flat = _local(tensor).reshape(-1)
    stride = max(1, flat.numel() // SAMPLE_ELEMENTS)
    values = flat[::stride][:SAMPLE_ELEMENTS]
    if values.is_floating_point():
        values = values.view(_SAME_SIZE_INT[values.element_size()])
    return values.clone()


def grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """The total 2-norm of the parameters' gradients (0 when none has one), fused over the tensors; a device tensor."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.nn.utils.get_total_norm(grads)


def _float(norm: torch.Tensor) -> float:
    if hasattr(norm, "full_tensor"):  # FSDP2: a partial norm; every rank reads on the same steps (collective)
        norm = norm.full_tensor()
    return float(norm)


class TrainingCheck:
    """Samples the weights before training, watches each step's loss and some steps' gradient norm, and gives the
    verdict after the last step (``verdict``: None when the run trained, else the reason)."""

    def __init__(self, model: torch.nn.Module, max_steps: int):
        self.max_steps = max_steps
        self.trainable: dict[str, torch.Tensor] = {}
        self.frozen: dict[str, torch.Tensor] = {}
        self.params: dict[str, torch.nn.Parameter] = {}
        with torch.no_grad():
            for name, param in model.named_parameters():
                if _local(param).numel() == 0:  # an FSDP shard this rank does not hold
                    continue
                (self.trainable if param.requires_grad else self.frozen)[name] = sample(param)
                self.params[name] = param
        self.losses_checked = 0
        # trained float16 weights, with no fp32 master copy or loss scaling, overflow easily: a non-finite loss says so
        fp16 = any(p.dtype == torch.float16 for p in self.params.values() if p.requires_grad)
        self.overflow_hint = " (float16 weights, trained with no loss scaling, overflow: --bf16 has float32's range)" \
            if fp16 else ""
        self.bad_loss: str | None = None
        self.norms: list[tuple[int, float]] = []
        self.trainable_changed: int | None = None
        self.frozen_changed: list[str] = []

    def wants_grad_norm(self, step: int) -> bool:
        return step == 1 or step == self.max_steps or step % GRAD_NORM_EVERY == 0

    def observe(self, step: int, loss: float, norm: torch.Tensor | None) -> None:
        """After the step's timer synced the device: its loss (already a float) and, on a check step, its norm."""
        self.losses_checked += 1
        if self.bad_loss is None and not math.isfinite(loss):
            self.bad_loss = f"loss became {loss} at step {step}" + self.overflow_hint
        if norm is not None:
            self.norms.append((step, _float(norm)))

    @property
    def failed_early(self) -> bool:
        return self.bad_loss is not None

    def compare_weights(self) -> None:
        """Which sampled tensors changed: one comparison per tensor on the device, one read for all of them."""
        before = {**self.trainable, **self.frozen}
        by_device: dict[torch.device, list[str]] = {}
        for name, values in before.items():
            by_device.setdefault(values.device, []).append(name)
        changed: dict[str, bool] = {}
        with torch.no_grad():
            for names in by_device.values():
                flags = torch.stack([torch.any(sample(self.params[n]) != before[n]) for n in names])
                changed.update(zip(names, flags.tolist(), strict=True))
        self.trainable_changed = sum(changed[n] for n in self.trainable)
        self.frozen_changed = [n for n in self.frozen if changed[n]]

    def verdict(self) -> str | None:
        """Why the run did not train, or None when it did (compares the weights first)."""
        self.compare_weights()
        if self.bad_loss:
            return self.bad_loss
        for step, norm in self.norms:
            if not math.isfinite(norm):
                return f"gradient norm became {norm} at step {step}"
            if norm == 0:
                return f"gradient norm 0 at step {step}"
        if self.frozen_changed:
            more = f" (and {len(self.frozen_changed) - 1} more)" if len(self.frozen_changed) > 1 else ""
            return f"frozen parameter {self.frozen_changed[0]} changed{more}"
        if not self.trainable:
            return "no parameter is trainable"
        if not self.trainable_changed:
            return "no trainable parameter changed"
        return None

    def record(self, reason: str | None) -> TrainingProof:
        norms = [n for _, n in self.norms]
        finite = [n for n in norms if math.isfinite(n)]
        return TrainingProof(
            passed=reason is None and self.trainable_changed is not None, reason=reason,
            checked=["loss_finite", "grad_norm", "trainable_changed", "frozen_unchanged"],
            sample_elements=SAMPLE_ELEMENTS, trainable_tensors=len(self.trainable),
            trainable_changed=self.trainable_changed, frozen_tensors=len(self.frozen),
            frozen_changed=len(self.frozen_changed), frozen_changed_names=self.frozen_changed[:10],
            loss_steps_checked=self.losses_checked, grad_norm_steps=[s for s, _ in self.norms],
            grad_norm_first=norms[0] if norms else None, grad_norm_last=norms[-1] if norms else None,
            grad_norm_min=min(finite) if finite else None, grad_norm_max=max(finite) if finite else None)
