"""GPTQ 4-bit bases through GPTQModel: quantize a model once (cached), load a GPTQ checkpoint with a kernel that trains.

Known traps this module steps around (measured):
- GPTQModel's thread pool raises on a 2-core machine unless GPTQMODEL_CPU_WORKERS >= 2.
- Quantizing needs a tokenizer saved beside the model.
- BACKEND.AUTO picks Machete on Hopper, which downloads CUTLASS at first use and fails offline: we always name
  the backend, and default to gptq_torch, the kernel whose backward works on torch 2.11 (triton and
  auto_trainable fail there with "returned an incorrect number of gradients").
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ftprof.config import MethodConfig
from ftprof.lifetime import preexec_die_with
from ftprof.runtime import quiet_import

CACHE_ENV = "FTPROF_CACHE_DIR"
QUANTIZER_VERSION = 1  # bump when the way ftprof quantizes changes, so old cache entries are not reused


def cache_root() -> Path:
    """The GPTQ cache: gptq/ in ftprof's cache directory ($FTPROF_CACHE_DIR, else ~/.cache/ftprof; resolved, and
    checked before a run, by ftprof.checks)."""
    from ftprof.checks import cache_base

    return cache_base() / "gptq"


def ensure_workers() -> None:
    os.environ["GPTQMODEL_CPU_WORKERS"] = str(max(2, int(os.environ.get("GPTQMODEL_CPU_WORKERS", "0") or 0)))


def cache_key(config, method: MethodConfig, seed: int, seq_len: int) -> str:
    """Hash of everything that determines the quantized weights."""
    arch = config.to_dict()
    for volatile in ("_name_or_path", "transformers_version", "dtype", "torch_dtype", "architectures"):
        arch.pop(volatile, None)
    payload = json.dumps({"arch": arch, "bits": method.gptq_bits, "group_size": method.gptq_group_size,
                          "samples": method.gptq_calibration_samples, "calib_len": seq_len, "seed": seed,
                          "quantizer": method.gptq_quantizer, "v": QUANTIZER_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def ensure_quantized(build_model, tokenizer, label: str, key: str, method: MethodConfig, calibration,
                     device: torch.device, log=print) -> Path:
    """Return the cached GPTQ checkpoint for ``key``, quantizing ``build_model()`` with GPTQ first if needed.

    The directory is written under a temporary name and renamed into place, so an interrupted quantization never
    leaves a half checkpoint that a later run would trust.
    """
    target = cache_root() / f"{label}-{key}"
    if (target / "quantize_config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Another process (a bench experiment beside this one, a baseline script) may be quantizing the same model:
    # wait for it, then use its result, rather than quantize twice and race for the rename.
    lock = target.with_name(target.name + ".lock")
    with _exclusive(lock, log):
        if not (target / "quantize_config.json").is_file():
            _quantize(build_model, tokenizer, label, target, method, calibration, device, log)
        # Safe to remove once the checkpoint exists: every process checks for it after taking the lock, so one
        # that locks this (now unlinked) file, or a new file of the same name, finds the checkpoint and leaves
        # (removing the file it made: one that came between the first check and the unlink makes a new one).
        lock.unlink(missing_ok=True)
    return target


@contextlib.contextmanager
def _exclusive(lock_path: Path, log):
    with open(lock_path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another process that is quantizing the same model ({lock_path})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _quantize(build_model, tokenizer, label: str, target: Path, method: MethodConfig, calibration,
              device: torch.device, log) -> None:
    """Build and save the 16-bit model here, quantize it in a child process (ftprof.models.gptq_quantize says why),
    and move the finished checkpoint into place."""
    work = Path(tempfile.mkdtemp(prefix=f".{label}-", dir=target.parent))
    try:
        src, out = work / "fp", work / "gptq"
        model = build_model()
        model.save_pretrained(src)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        tokenizer.save_pretrained(src)  # GPTQModel needs a tokenizer beside the model
        sequences = calibration()
        torch.save([ids.cpu() for ids in sequences], work / "calibration.pt")
        log(f"quantizing {label} to {method.gptq_bits}-bit GPTQ ({method.gptq_quantizer}, group "
            f"{method.gptq_group_size}, {len(sequences)} calibration sequences); cached at {target}")
        spec = {"bits": method.gptq_bits, "group_size": method.gptq_group_size, "quantizer": method.gptq_quantizer,
                "backend": method.gptq_backend, "device": str(device), "calibration": str(work / "calibration.pt"),
                "logs": str(work / "logs")}
        run_quantizer(src, out, spec, work / "quantize.log")
        if (work / "logs").is_dir():  # per-module quantization logs travel with the checkpoint
            shutil.move(str(work / "logs"), str(out / "quantize_logs"))
        shutil.move(str(work / "quantize.log"), str(out / "quantize.log"))
        os.replace(out, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_quantizer(src: Path, out: Path, spec: dict, log_path: Path) -> None:
    """Run ``python -m ftprof.models.gptq_quantize``; its output goes to ``log_path``. A failure raises with the
    child's last line (the log itself goes away with the work folder)."""
    with open(log_path, "w") as fh:  # the child sets GPTQModel's worker count itself (gptq_quantize.quantize)
        proc = subprocess.run([sys.executable, "-m", "ftprof.models.gptq_quantize", str(src), str(out),
                               json.dumps(spec)], stdout=fh, stderr=subprocess.STDOUT,
                              preexec_fn=preexec_die_with(os.getpid()), check=False)
    if proc.returncode != 0:
        lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
        last = lines[-1].strip()[:300] if lines else "no output"
        raise RuntimeError(f"GPTQ quantization failed (exit {proc.returncode}): {last}")


@contextlib.contextmanager
def logs_in(folder: Path):
    """GPTQModel writes its per-module quantization logs to ``./logs`` in the caller's working directory: point
    that at ``folder`` instead, so a run leaves nothing in the user's folder."""
    try:
        from gptqmodel.looper import loop_processor
    except ImportError:  # a GPTQModel without that module: nothing to redirect
        yield
        return
    before = getattr(loop_processor, "_PROJECT_LOG_DIR", None)
    loop_processor._PROJECT_LOG_DIR = folder
    try:
        yield
    finally:
        loop_processor._PROJECT_LOG_DIR = before


def load_gptq(path: str | Path, backend: str, device: torch.device):
    """Load a GPTQ checkpoint as a transformers model whose linears are GPTQModel QuantLinear modules."""
    ensure_workers()
    with quiet_import():
        from gptqmodel import BACKEND, GPTQModel

        gm = GPTQModel.load(str(path), device=str(device), backend=BACKEND(backend))
    return gm.model


class _FrozenDequantMatmul(torch.autograd.Function):
    """``module(x)`` for a frozen GPTQ linear, saving nothing weight-sized for backward.

    GPTQModel's torch kernel computes ``x @ dequantize(W)`` with plain autograd, which keeps every layer's
    dequantized 16-bit weight alive until backward: without activation checkpointing that is the whole model in
    16 bits again (measured on an H200, llama-8b 4 x 2048: GPTQ-LoRA's peak 4.3 GiB above LoRA's). Here backward
    dequantizes once more instead, as bitsandbytes does for QLoRA: one extra dequantization per layer, no copy.
    """

    @staticmethod
    def forward(ctx, x, module, forward):
        ctx.module = module
        return forward(x)

    @staticmethod
    def backward(ctx, grad_out):
        module = ctx.module
        w = module.dequantize_weight().to(grad_out.dtype)  # (in_features, out_features)
        grad_x = grad_out.reshape(-1, w.shape[1]) @ w.t()
        return grad_x.reshape(*grad_out.shape[:-1], w.shape[0]), None, None


def lean_backward(model: torch.nn.Module) -> int:
    """Route every plain GPTQ linear of ``model`` through ``_FrozenDequantMatmul``. Returns how many.

    Left alone: linears with a bias that trains, GPTQModel's own adapters, or online rotations (their input
    gradient is not ``grad @ W.T``)."""
    count = 0
    for module in model.modules():
        if not (hasattr(module, "qweight") and hasattr(module, "dequantize_weight")):
            continue
        bias = getattr(module, "bias", None)
        if getattr(module, "adapter", None) is not None or getattr(module, "online_full_had", False) \
                or getattr(module, "online_partial_had", False) or (bias is not None and bias.requires_grad):
            continue
        module.forward = _lean_forward(module, module.forward)
        count += 1
    return count


def _lean_forward(module, forward):
    def lean(x):
        if not (torch.is_grad_enabled() and x.requires_grad):
            return forward(x)
        return _FrozenDequantMatmul.apply(x, module, forward)

    return lean

