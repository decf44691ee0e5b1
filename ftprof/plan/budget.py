"""What fits a memory budget: ``--checkpointing auto``'s choice, ``--memory-limit-gib``'s check, and the closest
configuration that fits when the asked one does not. Everything here is a prediction (predict.py), made before
the model loads.

auto takes the first of none > selective > full on the fewest layers that fit > full on every layer whose
predicted peak fits the budget: selective recomputes no matmul, and checkpointing only as many layers as needed
recomputes less than checkpointing all of them.
"""

from __future__ import annotations

import dataclasses

from ftprof.metrics import GIB, budget_margin
from ftprof.plan.candidates import POLICIES, Candidate, micro_batches
from ftprof.plan.predict import Planner
from ftprof.results.parts import AutoChoice, Prediction


def margin_for(available: int) -> int:
    """The budget margin (ftprof.metrics, the one definition the report uses too)."""
    return budget_margin(available)


def fewest_layers(planner: Planner, cand: Candidate, budget: int) -> int | None:
    """The fewest decoder layers (1 .. L-1) under full checkpointing whose predicted peak fits ``budget``."""
    for layers in range(1, planner.layer_count):
        if planner.predict(dataclasses.replace(cand, checkpointing="full", checkpoint_layers=layers)).peak_bytes \
                <= budget:
            return layers
    return None


def auto_policy(planner: Planner, cand: Candidate, available: int) -> tuple[Candidate, Prediction, AutoChoice,
                                                                             bool]:
    """(the chosen candidate, its prediction, auto's record, whether it fits). ``cand``'s policy is ignored."""
    margin = margin_for(available)
    budget = available - margin
    fits = (f"fits {budget / GIB:.1f} GiB ({available / GIB:.1f} GiB available less a {margin / GIB:.1f} GiB "
            "margin)")
    by_policy = {p: dataclasses.replace(cand, checkpointing=p, checkpoint_layers=None)
                 for p in POLICIES}
    predicted = {p: planner.predict(c) for p, c in by_policy.items()}
    order: list[tuple[Candidate, str]] = [(by_policy["none"], "none"), (by_policy["selective"], "selective; none "
                                                                        "did not")]
    layers = fewest_layers(planner, cand, budget)
    if layers is not None:
        order.append((dataclasses.replace(by_policy["full"], checkpoint_layers=layers),
                      f"full on {layers} of {planner.layer_count} layers; none and selective did not"))
    order.append((by_policy["full"], "full; faster policies did not"))
    for choice, why in order:
        pred = planner.predict(choice)
        if pred.peak_bytes <= budget:
            reason = f"{why.split(';')[0]}: predicted peak {pred.peak_bytes / GIB:.1f} GiB {fits}" + (
                f"; {why.split('; ', 1)[1]}" if "; " in why else "")
            return choice, pred, _record(choice, reason, predicted, available, margin), True
    full = predicted["full"]
    reason = (f"no policy fits {budget / GIB:.1f} GiB: full, the least memory, is predicted at "
              f"{full.peak_bytes / GIB:.1f} GiB")
    return by_policy["full"], full, _record(by_policy["full"], reason, predicted, available, margin), False


def _record(choice: Candidate, reason: str, predicted: dict[str, Prediction], available: int,
            margin: int) -> AutoChoice:
    return AutoChoice(choice.checkpointing, reason, choice.checkpoint_layers,
                      {p: v.peak_bytes for p, v in predicted.items()},
                      {p: v.activation_bytes / max(1, _tokens(v)) for p, v in predicted.items()},
                      predicted["none"].static_bytes, available, margin,
                      max(0, predicted["full"].transient_bytes))


def _tokens(pred: Prediction) -> int:
    c = pred.candidate
    return int(c.get("batch_size", 1)) * int(c.get("seq_len", 1))


def closest_fit(planner: Planner, cand: Candidate, budget: int, methods: tuple[str, ...]) -> list[tuple[
        Candidate, Prediction]]:
    """What fits ``budget`` near ``cand``: the closest (another policy first, then another micro-batch at the same
    tokens per step, then the fused kernels, then another method; the fastest predicted at the first distance that
    has any), then, if it is faster by more than 10%, the fastest that fits at any distance. Empty: nothing fits."""
    fits: list[tuple[Candidate, Prediction]] = []
    for group in _neighbours(planner, cand, methods):
        fitting = [(c, planner.predict(c)) for c in dict.fromkeys(group) if c != cand]
        fitting = [(c, p) for c, p in fitting if p.peak_bytes <= budget]
        if fitting:
            fits.append(max(fitting, key=_speed_then_memory))
    if not fits:
        return []
    fastest = max(fits, key=_speed_then_memory)
    closest_speed, best_speed = fits[0][1].tokens_per_s or 0.0, fastest[1].tokens_per_s or 0.0
    return [fits[0]] + ([fastest] if best_speed > 1.1 * closest_speed else [])


def _speed_then_memory(pair: tuple[Candidate, Prediction]) -> tuple[float, int]:
    return pair[1].tokens_per_s or 0.0, -pair[1].peak_bytes


def _neighbours(planner: Planner, cand: Candidate, methods: tuple[str, ...]) -> list[list[Candidate]]:
    """Candidates by distance from ``cand``: policies, micro-batches, fused kernels (GPU only), methods."""
    kernel_sets = (cand.kernels,) if planner.target.device_name == "cpu" else (cand.kernels, "liger")
    batches = micro_batches(cand.batch_size, cand.grad_accum)
    policies = POLICIES

    def variant(**changes) -> Candidate:
        return dataclasses.replace(cand, checkpoint_layers=None, **changes)

    return [
        [variant(checkpointing=p) for p in policies],
        [variant(checkpointing=p, batch_size=b, grad_accum=a) for b, a in batches for p in policies],
        [variant(checkpointing=p, kernels="liger", batch_size=b, grad_accum=a) for b, a in batches for p in policies
         if "liger" in kernel_sets],
        [variant(method=m, checkpointing=p, kernels=k, batch_size=b, grad_accum=a) for m in methods
         if m != cand.method for k in kernel_sets for b, a in batches for p in policies],
    ]


def describe_change(base: Candidate, other: Candidate) -> str:
    """The options that turn ``base`` into ``other``, as flags."""
    flags = []
    for key, value in other.flat().items():
        if base.flat().get(key) != value:
            flag = "--" + key.replace("_", "-")
            flags.append(flag if value is True else f"--no-{key.replace('_', '-')}" if value is False
                         else f"{flag} {value}")
    if base.checkpoint_layers is not None and other.checkpoint_layers is None and other.checkpointing != "none":
        flags.append("(all layers)")
    return " ".join(flags)
