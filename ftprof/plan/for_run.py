"""The prediction a run is given before its model loads (result.json's ``prediction``), ``--checkpointing auto``'s
choice, and ``--memory-limit-gib``'s check: all from the one predictor (predict.py, budget.py).

Nothing fits -> a ConfigError naming the closest configuration that would (another policy, micro-batch, kernel
set or method), before anything big loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftprof.config import RunConfig
from ftprof.errors import ConfigError
from ftprof.metrics import GIB
from ftprof.plan import budget
from ftprof.plan.candidates import Candidate, of_config
from ftprof.plan.predict import Planner, planner, run_target
from ftprof.results.parts import AutoChoice, Prediction

METHODS_NEARBY = {"full": ("lora", "qlora"), "lora": ("qlora",), "qlora": ("gptq-lora",), "gptq-lora": ("qlora",)}


@dataclass(frozen=True)
class RunPrediction:
    prediction: Prediction | None
    auto: AutoChoice | None  # --checkpointing auto's choice (None when the policy was given)
    note: str | None = None  # why there is no prediction, or a warning the user should read


def predict_run(cfg: RunConfig, source, device, dtype: str, shards: bool) -> RunPrediction:
    """The run's prediction (and auto's choice); ConfigError when auto or --memory-limit-gib finds nothing fits."""
    from ftprof.runtime import available_memory

    p = planner(cfg, source, dtype, run_target(cfg, device, shards))
    cand, limit = of_config(cfg), cfg.output.memory_limit_gib
    if cfg.model.checkpointing == "auto":
        available = available_memory(device, limit)
        choice, pred, auto, fits = budget.auto_policy(p, cand, available)
        if not fits:
            raise ConfigError(_refusal("--checkpointing auto", p, choice, pred, available - auto.margin_bytes))
        return RunPrediction(pred, auto)
    try:
        pred = p.predict(cand)
    except Exception as exc:  # noqa: BLE001 - a run without a prediction still trains, and says why
        if limit is not None:
            raise
        return RunPrediction(None, None, f"no prediction for this run: {type(exc).__name__}: {exc}")
    if limit is not None and pred.peak_bytes > limit * GIB:
        raise ConfigError(_refusal(f"--memory-limit-gib {limit:g}", p, cand, pred, int(limit * GIB)))
    return RunPrediction(pred, None, _tight_note(pred, available_memory(device, limit)) if device.type == "cuda"
                         else None)


def _refusal(what: str, p: Planner, cand: Candidate, pred: Prediction, budget_bytes: int) -> str:
    from ftprof.console import fmt_gib_digits as gib

    line = (f"{what}: {cand.label} is predicted to peak at {gib(pred.peak_bytes)} GiB per GPU, over the "
            f"{gib(max(0, budget_bytes))} GiB it may use")
    fits = budget.closest_fit(p, cand, budget_bytes, METHODS_NEARBY.get(cand.method, ()))
    if not fits:
        return line + "; no policy, micro-batch, kernel set or nearby method fits either"
    names = ("closest that fits", "fastest that fits")[:len(fits)]
    return line + "".join(f"; {name}: {_described(cand, other, pred)}"
                          for name, (other, pred) in zip(names, fits, strict=True))


def _described(cand: Candidate, other: Candidate, pred: Prediction) -> str:
    from ftprof.console import fmt_gib_digits as gib

    speed = f", ~{pred.tokens_per_s:,.0f} tokens/s" if pred.tokens_per_s else ""
    return f"{budget.describe_change(cand, other)} ({gib(pred.peak_bytes)} GiB predicted{speed})"


def _tight_note(pred: Prediction, available: int) -> str | None:
    if pred.peak_bytes <= available:
        return None
    return (f"note: this run is predicted to peak at {pred.peak_bytes / GIB:.1f} GiB, over the "
            f"{available / GIB:.1f} GiB free on the GPU: expect oom_device (ftprof plan lists what fits)")
