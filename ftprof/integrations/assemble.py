"""A measured run's files: config.json, steps.csv, memory_stages.csv, result.json and env.json, the same as
ftprof's own runs write, every figure through ``ftprof.metrics`` (one FLOP count, one steady window); with a
profiler window, profile/ as ``ftprof profile`` writes it (integrations/window.py)."""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any

import torch

from ftprof import metrics
from ftprof.engine.result import memory_record, record_steady_state
from ftprof.integrations.describe import Described, attention_config
from ftprof.integrations.recorder import Recorder, _now
from ftprof.results import run_dir as files
from ftprof.results.env import collect_env
from ftprof.results.parts import Failure, Flops, Memory, NvmlSummary, RunIdentity
from ftprof.results.schema import RunResult
from ftprof.results.status import Status


def write_config(rec: Recorder, described: Described, trainer: dict[str, Any]) -> dict[str, Any]:
    """config.json: the RunConfig as ftprof's runs write it, and the trainer's own settings beside it. Returns it."""
    data = described.config().to_dict()
    data["trainer"] = trainer
    rec.writer.write_config(data)
    return data


def flops(model, rec: Recorder, checkpointing: str, peak: float | None) -> Flops:
    """Parameter counts and FLOPs per token, by ftprof's one count (ftprof.metrics)."""
    counts = metrics.count_params(model)
    out = Flops(params_total=counts.total, params_trainable=counts.trainable_total,
                params_trainable_matmul=counts.trainable_matmul, params_frozen_matmul=counts.frozen_matmul,
                peak_flops=peak)
    config = attention_config(model)
    seq = rec.attention_len()
    if config is None or not seq:
        return out
    layers, attn_dim = metrics.attention_dims(config)
    out.flops_per_token = metrics.flops_per_token(counts, layers, attn_dim, seq)
    out.recompute_flops_per_token = metrics.recompute_flops_per_token(
        metrics.recomputed_params(model), layers, attn_dim, seq) if checkpointing != "none" else 0.0
    return out


def _memory(rec: Recorder, steps: list[dict], vocab: int | None) -> Memory:
    logits = metrics.logits_gradient_bytes(rec.micro_tokens, vocab) if vocab and rec.micro_tokens else None
    return memory_record(rec.memory, steps, rec.first.static, rec.first.saved_activations, logits)


def _nvml(res: RunResult, rec: Recorder, steps: list[dict]) -> None:
    nvml = rec.nvml
    if nvml.note:
        res.notes.append(nvml.note)
    if not nvml.ran:
        return
    summary = nvml.summary
    res.memory.nvml_device_used_peak = summary.get("device_used_peak")
    res.memory.nvml_process_used_peak = summary.get("process_used_peak")
    res.memory.non_torch_overhead = metrics.gap(res.memory.nvml_process_used_peak, res.memory.torch_peak_reserved)
    res.nvml = NvmlSummary(summary, metrics.energy_per_token(summary.get("energy_j"), metrics.energy_steps(steps)))
    res.artifacts["nvml"] = nvml.file


def gather_ranks(steps: list[dict], world_size: int) -> list[dict]:
    """Every rank's tokens summed into each step, and the slowest rank's step time (one collective, at the end);
    the steps as they are in one process."""
    if world_size <= 1 or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return steps
    device = "cuda" if torch.cuda.is_available() and torch.distributed.get_backend() == "nccl" else "cpu"
    counts = torch.tensor([[s["tokens"], s["real_tokens"]] for s in steps], dtype=torch.float64, device=device)
    times = torch.tensor([s["step_time_s"] for s in steps], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(counts)
    torch.distributed.all_reduce(times, op=torch.distributed.ReduceOp.MAX)
    return [s | {"tokens": int(c[0]), "real_tokens": int(c[1]), "step_time_s": float(t)}
            for s, c, t in zip(steps, counts.tolist(), times.tolist(), strict=True)]


def overhead(rec: Recorder, steps: list[dict]) -> dict[str, float | None]:
    """The recorder's own time inside the steady steps, as a share of their time."""
    steady = {s["step"] for s in metrics.steady_window(steps)[0]}
    own = [c for s, c in zip(steps, rec.overhead_s, strict=False) if s["step"] in steady]
    secs = sum(s["step_time_s"] for s in steps if s["step"] in steady)
    share = sum(own) / secs if own and secs else None
    return {"measure_s_per_step": sum(own) / len(own) if own else None, "measure_overhead": share}


def result(rec: Recorder, run: RunIdentity, model, checkpointing: str, world_size: int,
           exc: BaseException | None = None) -> RunResult:
    """The run's RunResult: each part from what measured it (``ftprof.engine.result`` does the same for ftprof's
    loop)."""
    own = rec.steps.dicts()
    steps = gather_ranks(own, world_size)
    run.steps_completed = len(steps)
    peak = metrics.peak_flops(run.device_name) if rec.device.type == "cuda" else None
    reason = rec.check.verdict() if steps and exc is None else None
    status = Status.ERROR if exc is not None else Status.NOT_TRAINED if reason else Status.OK
    res = RunResult(status=status.value, run_dir=str(rec.run_dir), run=run, flops=flops(model, rec, checkpointing,
                                                                                        peak))
    if steps:
        res.throughput.loss_first, res.throughput.loss_last = steps[0]["loss"], steps[-1]["loss"]
        res.throughput.tokens_per_step = own[-1]["tokens"]
    res.throughput.warmup_step_times_s = [s["step_time_s"] for s in steps if s["warmup"]]
    steady, left_out = metrics.steady_window(steps)
    note = metrics.steady_window_note(steady, left_out)  # (the profiler window's steps, as ftprof's own runs say)
    if note:
        res.notes.append(note)
    if not record_steady_state(res, steps, steady, world_size) and steps:
        res.notes.append("every step was a warm-up step: no steady-state figures")
    config = attention_config(model)
    res.memory = _memory(rec, own, getattr(config, "vocab_size", None))
    res.artifacts = {"config": files.CONFIG, "env": files.ENV, "steps": files.STEPS}
    _nvml(res, rec, own)
    if rec.check.trainable_changed is not None:
        res.training_proof = rec.check.record(reason)
    if exc is not None:
        message = str(exc).strip()
        res.failure = Failure(type(exc).__name__, (message.splitlines()[0] if message else type(exc).__name__)[:500],
                              "".join(traceback.format_exception(exc)[-8:])[-4000:])
    res.profiling = overhead(rec, own)
    rec.window.record(res, own, rec.index)
    res.notes.extend(rec.notes)
    return res


def write_run(rec: Recorder, res: RunResult) -> None:
    """steps.csv (already written by the step log), memory_stages.csv, env.json, result.json last: a directory
    with a result.json is complete."""
    rec.writer.write_memory_stages(rec.memory.stage_rows())
    rec.writer.write_env(collect_env())
    res.run = dataclasses.replace(res.run, finished_at=_now())
    rec.writer.write_result(res)


def finish(rec: Recorder, model, described: Described, trainer: dict[str, Any], *, world_size: int = 1,
           write: bool = True, exc: BaseException | None = None) -> RunResult:
    """Stop measuring and write the run directory (``write``: this process writes it; the others only join the one
    collective that sums their tokens)."""
    rec.stop()
    flat = described.flat
    checkpointing = flat.get("checkpointing", "none")
    device_name = torch.cuda.get_device_name(rec.device) if rec.device.type == "cuda" else "cpu"
    run = RunIdentity(method=flat["method"], model=flat["model"], device=str(rec.device), device_name=device_name,
                      world_size=world_size, parallel=flat.get("parallel") if world_size > 1 else None,
                      started_at=rec.started_at, seq_len=flat["seq_len"], batch_size=flat.get("batch_size", 0),
                      grad_accum=flat.get("grad_accum", 1))
    res = result(rec, run, model, checkpointing, world_size, exc)
    res.notes.extend(described.notes)
    res.notes.extend(rec.lengths.notes())  # how seq_len was read: varied widths, padding-free documents, packs
    if rec.steps.steps:
        secs = sum(s.step_time_s for s in rec.steps.steps)
        wall = rec.wall_s()
        res.notes.append(f"time outside the measured steps (data loading, logging, evaluation, saving): "
                         f"{max(0.0, wall - secs):.3f} s of {wall:.3f} s from the first step's start to the last's end")
    if write:
        config = write_config(rec, described, trainer)
        rec.window.summarize(res, rec.run_dir, config)  # before result.json: the summaries are its artifacts
        write_run(rec, res)
        from ftprof.plan import calibration

        # the store keeps it beside ftprof's runs, marked with its trainer: the plan shows what other trainers
        # measured at its shape, and calibrates ftprof's own loop from ftprof's runs only
        calibration.record_run(rec.run_dir)
    return res
