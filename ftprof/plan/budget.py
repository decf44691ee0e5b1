"""What fits a memory budget: ``--checkpointing auto``'s choice, ``--memory-limit-gib``'s check, and the closest
configuration that fits when the asked one does not. Everything here is a prediction (predict.py), made before
the model loads.

auto takes the first of none > selective > full whose predicted peak fits the budget: selective recomputes no
matmul. Under full it takes, among the ways full fits, the one predicted fastest, and at equal speed the one that
recomputes the fewest layers, then the one without the offload: full on the fewest layers that fit, or on every
layer; on a CUDA target also both with ``--offload-checkpoints`` (the checkpointed layers' inputs wait in pinned
host memory: less device memory, so fewer layers may need recomputing). The speed model prices the offload at full's
speed (same class and FLOPs; 11,385 tokens/s with it, 11,383 without, on an H200; only runs of it in the calibration
store, preferred as the candidate's own options, could move its rate), so in practice the offload is taken where it
lets fewer layers be recomputed, or where only it fits. On the CPU the offload is a plain copy (its declaration's
``planner_devices``): auto does not try it there. ``--offload-embeddings`` (the input embedding table in host memory)
is tried the same way, and before that with none and selective: a policy that recomputes nothing wins over one that
does wherever the table's gigabyte is the difference (llama-8b: 1.0 GiB). Full on part of the layers is also tried
with selective on the rest (``--selective-rest``): fewer layers recomputed whole in the same memory, priced by
each layer's policy (plan/predict.py). Every way full fits is tried with ``--lean-recompute`` where it applies and
the planner does not avoid it (LoRA and QLoRA in 16 bits, not under FSDP): the same memory, fewer FLOPs
recomputed (+5.7% measured, llama-8b QLoRA on an H100). No checkpointing is also tried with ``--lean-activations``
(the layers keep no SwiGLU product: 7 GiB less for llama-8b QLoRA at 4 x 2048, 2.1-2.7% slower on an H100), then
``--lean-norms`` (the norms keep their input, not their output: 4 GiB less, 4.6% slower), after the embedding
table, and with all of them: recomputing nothing wins where that is the difference.
"""

from __future__ import annotations

import dataclasses

from ftprof.config import declarations
from ftprof.config.options import CUDA_GRAPH_MODES
from ftprof.metrics import GIB, budget_margin
from ftprof.plan.candidates import POLICIES, REST, Candidate, micro_batches, policy_words
from ftprof.plan.predict import Planner
from ftprof.results.parts import AutoChoice, Prediction

OFFLOAD = "offload_checkpoints"
OFFLOAD_WORDS = "with --offload-checkpoints (the checkpointed layers' inputs wait in pinned host memory)"
EMBED = "offload_embeddings"
EMBED_WORDS = "with --offload-embeddings (the input embedding table in host memory)"
LEAN = "lean_recompute"
LEAN_WORDS = "--lean-recompute too (the recomputation leaves out the output projection's base matmul: the same memory)"
LEAN_ACT = "lean_activations"
LEAN_NORMS = "lean_norms"
TAKEN_WORDS = {EMBED: EMBED_WORDS, LEAN_ACT: "with --lean-activations (the layers keep no SwiGLU product)",
                 LEAN_NORMS: "with --lean-norms (the norms keep their input, not their output)"}


def margin_for(available: int) -> int:
    """The budget margin (ftprof.metrics, the one definition the report uses too)."""
    return budget_margin(available)


def fewest_layers(planner: Planner, cand: Candidate, budget: int, policy: str = "full") -> int | None:
    """The fewest decoder layers (1 .. L-1) under ``policy`` (full or selective) whose predicted peak fits
    ``budget``. The peak falls as layers are checkpointed, except where the layer being recomputed sets it (it
    rises by one layer's input per layer there): bisection finds the first that fits where the last one does,
    and a step back confirms it; otherwise (or where local runs of this model and sequence may calibrate one
    count apart from the others) every count is tried, fewest first, unless what stays resident (the least any
    count can peak at) is over. (A plan asks this of every configuration under full and selective:
    15,000 predictions of a 24 GiB llama-8b plan's 18,000 when each count was tried in turn.)"""
    def peak(layers: int) -> Prediction:
        return planner.predict(dataclasses.replace(cand, checkpointing=policy, checkpoint_layers=layers))

    def fits(layers: int) -> bool:
        return peak(layers).peak_bytes <= budget

    last = planner.layer_count - 1
    if last < 1:
        return None
    at_last = peak(last)
    if at_last.static_bytes > budget:  # weights, gradients and optimizer state alone: no layer count fits
        return None
    if at_last.peak_bytes > budget or _counts_measured(planner):
        return next((n for n in range(1, last) if fits(n)), None)
    low, high = 1, last  # high fits
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle + 1, high)
    while high > 1 and fits(high - 1):  # (where the peak is not monotone in the layers)
        high -= 1
    return high


def _counts_measured(planner: Planner) -> bool:
    """Whether the local store holds runs of the planned model and sequence length: a run's activation factor
    answers at its own layer count only (calibration._transferring), so the peak need not fall with the count."""
    model, seq = planner.cfg.model.model, planner.cfg.data.seq_len
    return any(r.get("model") == model and r.get("seq_len") == seq for r in planner.records)


def rest_applies(cand: Candidate) -> bool:
    """Whether full checkpointing on part of ``cand``'s layers may run the rest under selective (--selective-rest):
    under full, where the declarations refuse nothing of it, and not under the CUDA-graph modes the planner avoids
    under checkpointing (config/declarations.py)."""
    d = declarations.BY_NAME[REST]
    values = {**cand.values(), "checkpoint_layers": 1, REST: True}
    graphs = cand.compile and cand.option("compile_mode") in CUDA_GRAPH_MODES
    return cand.checkpointing == "full" and d.applies(values) and not graphs and not declarations.problems(values)


def offload_applies(planner: Planner, cand: Candidate, name: str = OFFLOAD) -> bool:
    """Whether auto tries the memory option ``name`` (--offload-checkpoints, --offload-embeddings) for ``cand``: on
    a CUDA target (the declaration's planner_devices: on the CPU host memory is the device's), not already on,
    applying to it (the embedding table only where it is not tied to the output layer), and refused by nothing the
    run has (FSDP, several processes, a compile mode with CUDA graphs: config/declarations.py)."""
    d = declarations.BY_NAME[name]
    if planner.target.device_name == "cpu" or "cuda" not in d.planner_devices or cand.option(name):
        return False
    if name == EMBED and not planner.host_embedding_bytes:
        return False
    return option_applies(planner, cand, name)


def option_applies(planner: Planner, cand: Candidate, name: str) -> bool:
    """Whether the yes/no option ``name`` may be switched on for ``cand``: not on already, applying to it, refused by
    nothing the run has, and not where the planner avoids it (its declaration's planner_avoid)."""
    d = declarations.BY_NAME[name]
    values = {**planner.cfg.declared_values(), **cand.values(), declarations.SHARDED: planner.target.shards,
              declarations.SEVERAL: planner.target.world_size > 1}
    if cand.option(name) or not d.applies({**values, name: True}):
        return False
    if d.avoided(True, values):
        return False
    without = set(declarations.problems({**values, name: False}))
    return not set(declarations.problems({**values, name: True})) - without


def memory_variants(planner: Planner, cand: Candidate, names: tuple[str, ...]) -> list[Candidate]:
    """``cand``, then with each applicable memory option of ``names`` on, then with all of them."""
    names = tuple(n for n in names if offload_applies(planner, cand, n))
    out = [cand] + [cand.with_option(n) for n in names]
    if len(names) > 1:
        both = cand
        for n in names:
            both = both.with_option(n)
        out.append(both)
    return out


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
    chosen = _without_recomputation(planner, by_policy, budget) or best_full(planner, by_policy["full"], budget)
    if chosen is not None:
        choice, pred, why = chosen
        head = choice.checkpointing if choice.checkpointing != "full" else describe_full(choice, planner.layer_count)
        reason = f"{head}: predicted peak {pred.peak_bytes / GIB:.1f} GiB {fits}" + (f"; {why}" if why else "")
        reason += f"; {LEAN_WORDS}" if choice.checkpointing == "full" and choice.option(LEAN) else ""
        kept = [w for n, w in TAKEN_WORDS.items() if n != EMBED and choice.option(n)]
        if choice.checkpointing == "full" and kept:
            reason += f"; {' and '.join(kept)} on the layers left unchecked"
        return choice, pred, _record(choice, reason, predicted, available, margin), True
    least = lean(planner, by_policy["full"])
    way, least_pred = min(((w, planner.predict(w)) for w in memory_variants(planner, least, (OFFLOAD, EMBED))),
                          key=lambda pair: pair[1].peak_bytes)
    reason = (f"no policy fits {budget / GIB:.1f} GiB: {describe_full(way, planner.layer_count)}, the least memory, "
              f"is predicted at {least_pred.peak_bytes / GIB:.1f} GiB")
    return way, least_pred, _record(way, reason, predicted, available, margin), False


def _without_recomputation(planner: Planner, by_policy: dict[str, Candidate],
                           budget: int) -> tuple[Candidate, Prediction, str] | None:
    """none, else selective, that fits: each as asked, else with the embedding table in host memory, else (none)
    with --lean-activations, else --lean-norms, else with all of them (the cheapest first: 0.7%, 2.7%, 4.6%
    measured)."""
    for policy, why in (("none", ""), ("selective", "none did not")):
        for way in memory_variants(planner, by_policy[policy], (EMBED, LEAN_ACT, LEAN_NORMS)):
            pred = planner.predict(way)
            if pred.peak_bytes <= budget:
                taken = " and ".join(w for n, w in TAKEN_WORDS.items() if way.option(n))
                return way, pred, why + ("; " if why and taken else "") + (f"only {taken}" if taken else "")
    return None


def lean(planner: Planner, full: Candidate) -> Candidate:
    """``full`` with --lean-recompute where auto may take it: under full checkpointing it keeps the same tensors and
    recomputes fewer FLOPs (models/recompute.py). Not tried under selective, where it saves memory but was never
    timed on a GPU."""
    return full.with_option(LEAN) if option_applies(planner, full, LEAN) else full


def kept_lean(planner: Planner, full: Candidate) -> list[Candidate]:
    """``full`` with --lean-activations, then with --lean-norms too, where auto may take them: they trim the layers
    partial checkpointing leaves unchecked, so that fewer layers need recomputing (each priced at its measured
    cost on those layers' share: plan/predict.option_costs)."""
    partial, way, out = dataclasses.replace(full, checkpoint_layers=1), full, []
    for name in (LEAN_ACT, LEAN_NORMS):
        if not offload_applies(planner, partial, name):
            break
        partial, way = partial.with_option(name), way.with_option(name)
        out.append(way)
    return out


def describe_full(choice: Candidate, layer_count: int) -> str:
    """"full", "full on 2 of 32 layers" (", selective on the rest" under --selective-rest), each "... with
    --offload-checkpoints (...)" where the offload is on."""
    out = policy_words(choice, layer_count)
    out = f"{out} {OFFLOAD_WORDS}" if choice.option(OFFLOAD) else out
    return f"{out} {EMBED_WORDS}" if choice.option(EMBED) else out


def full_ways(planner: Planner, full: Candidate, budget: int) -> list[tuple[Candidate, Prediction]]:
    """Each way full checkpointing fits ``budget``: on the fewest layers that fit, else on every layer; as asked,
    then (where auto may try them) with the layer inputs, the embedding table or both in host memory."""
    out = []
    for base in memory_variants(planner, lean(planner, full), (OFFLOAD, EMBED)):
        for way in [base] + ([base.with_option(REST)] if rest_applies(base) else []) + kept_lean(planner, base):
            layers = fewest_layers(planner, way, budget)
            if layers is None and (way.option(REST) or way.option(LEAN_ACT)):  # both need layers left unchecked
                continue
            choice = way if layers is None else dataclasses.replace(way, checkpoint_layers=layers)
            pred = planner.predict(choice)
            if pred.peak_bytes <= budget:
                out.append((choice, pred))
    return out


def best_full(planner: Planner, full: Candidate, budget: int) -> tuple[Candidate, Prediction, str] | None:
    """The way full checkpointing fits that auto takes (None: none fits): the fastest predicted (where every way
    has a speed prediction), then the fewest layers recomputed, then without the offload; and why."""
    ways = full_ways(planner, full, budget)
    if not ways:
        return None
    timed = all(p.tokens_per_s for _, p in ways)

    def key(way: tuple[Candidate, Prediction]) -> tuple:
        c, p = way
        return (-(p.tokens_per_s or 0.0) if timed else 0.0, c.checkpoint_layers or planner.layer_count,
                bool(c.option(OFFLOAD)) + bool(c.option(EMBED)), bool(c.option(OFFLOAD)), bool(c.option(REST)))

    choice, pred = min(ways, key=key)
    why = "none and selective did not" if choice.checkpoint_layers is not None else "faster policies did not"
    if choice.option(OFFLOAD) or choice.option(EMBED):
        plain = next((c for c, _ in ways if not c.option(OFFLOAD) and not c.option(EMBED)
                      and all(c.option(n) == choice.option(n) for n in (REST, LEAN_ACT, LEAN_NORMS))), None)
        if plain is None:
            why += "; without the offload full does not fit"
        else:
            more = (plain.checkpoint_layers or planner.layer_count) > (choice.checkpoint_layers or planner.layer_count)
            why += (f"; without the offload {describe_full(plain, planner.layer_count)} fits but "
                    + ("recomputes more layers" if more else "is predicted slower"))
    return choice, pred, why


def _record(choice: Candidate, reason: str, predicted: dict[str, Prediction], available: int,
            margin: int) -> AutoChoice:
    return AutoChoice(choice.checkpointing, reason, choice.checkpoint_layers,
                      {p: v.peak_bytes for p, v in predicted.items()},
                      {p: v.activation_bytes / max(1, _tokens(v)) for p, v in predicted.items()},
                      predicted["none"].static_bytes, available, margin,
                      max(0, predicted["full"].transient_bytes), offload=bool(choice.option(OFFLOAD)),
                      host_embeddings=bool(choice.option(EMBED)), selective_rest=bool(choice.option(REST)),
                      lean_recompute=choice.checkpointing == "full" and bool(choice.option(LEAN)),
                      lean_activations=bool(choice.option(LEAN_ACT)), lean_norms=bool(choice.option(LEAN_NORMS)))


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
    """Candidates by distance from ``cand``: policies, the same with the layer inputs or the embedding table in host
    memory (where auto may try them), micro-batches, fused kernels (GPU only), methods; from the micro-batches on,
    each with its host-memory ways too (within 8 GiB, llama-8b QLoRA 4 x 2048 fits only as 2 x 2 with both: auto's
    refusal had said nothing fits, H200, 2026-12-04)."""
    kernel_sets = (cand.kernels,) if planner.target.device_name == "cpu" else (cand.kernels, "liger")
    batches = micro_batches(cand.batch_size, cand.grad_accum)
    policies = POLICIES

    def variant(**changes) -> Candidate:  # (all layers: a selective rest needs a layer count)
        return dataclasses.replace(cand.without(REST), checkpoint_layers=None, **changes)

    def ways(group: list[Candidate]) -> list[Candidate]:
        return [way for c in group for way in memory_variants(planner, c, (OFFLOAD, EMBED))]

    as_asked = [variant(checkpointing=p) for p in policies]
    return [
        as_asked,
        [way for way in ways(as_asked) if way not in as_asked],
        ways([variant(checkpointing=p, batch_size=b, grad_accum=a) for b, a in batches for p in policies]),
        ways([variant(checkpointing=p, kernels="liger", batch_size=b, grad_accum=a) for b, a in batches
              for p in policies if "liger" in kernel_sets]),
        ways([variant(method=m, checkpointing=p, kernels=k, batch_size=b, grad_accum=a) for m in methods
              if m != cand.method for k in kernel_sets for b, a in batches for p in policies]),
    ]


def describe_change(base: Candidate, other: Candidate) -> str:
    """The options that turn ``base`` into ``other``, as flags."""
    flags = [f"--no-{key.replace('_', '-')}" for key, value in base.flat().items()
             if value is True and key not in other.flat()]  # an option on in base, at its default (off) in other
    for key, value in other.flat().items():
        if base.flat().get(key) != value:
            flag = "--" + key.replace("_", "-")
            flags.append(flag if value is True else f"--no-{key.replace('_', '-')}" if value is False
                         else f"{flag} {value}")
    if base.checkpoint_layers is not None and other.checkpoint_layers is None and other.checkpointing != "none":
        flags.append("(all layers)")
    return " ".join(flags)
