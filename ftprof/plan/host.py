"""The host side of a step: what launching a micro-batch's kernels costs the CPU, and when that, not the GPU, sets the
step time.

A micro-batch takes its GPU time and its host floor combined, about the longer of the two (``tokens_per_s``): the
floor is the Python, dispatch and launch work of every kernel of every decoder layer, forward and backward
(recomputation included), whatever the tokens. Small
micro-batches shrink the GPU time and leave the floor: measured on an H200, llama-8b QLoRA (full checkpointing on 1
of 32 layers, Liger, compiled) ran 1 x 2048 tokens per micro-batch at 0.272 s, 2 x 2048 at 0.296 s: the host, not
the GPU, set both (issue 38's 1 x 4 plan row, predicted +95% without this model).

    seconds per micro-batch ~ max(micro-batch tokens / GPU tokens/s,
                                  layers x host cost of a layer + recomputed layers x host cost of recomputing one)

The costs are calibrated per GPU and family of run (method, kernels, compile and its mode, speed-class options),
the cost of a layer from runs without checkpointing, of recomputing one from runs with full checkpointing, from:
- the local store's runs whose GPU was mostly idle (NVML busy below ``HOST_BOUND_BUSY``): their micro-batch time is
  the floor;
- the shipped host rows: runs of a few tokens per micro-batch on the GPU ftprof ships defaults for (H200), where
  every micro-batch is host-bound (benchmarks/sweeps/host-floor.yaml).
A GPU with neither takes the shipped GPU's rows (a floor is the host's work, not the GPU's), and selective
checkpointing, never measured host-bound, takes none's floor (it launches every kernel none does, and recomputes
some). A CPU run has no floor: the host is its device.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from dataclasses import dataclass

from ftprof.config import declarations
from ftprof.config.declarations import is_on
from ftprof.plan import calibration, epochs
from ftprof.plan.store import HOST_BOUND_BUSY, host_bound  # noqa: F401 - read as host.HOST_BOUND_BUSY too


@dataclass(frozen=True)
class Floor:
    seconds: float  # host seconds per micro-batch for the model's layers
    per_layer_s: float
    source: str
    runs: int
    measured: bool = False  # lowered to a run of the candidate's own family: its whole time (``bounded``)


def micro_batch_seconds(record: dict) -> float | None:
    """A record's measured seconds per micro-batch (on one GPU)."""
    tokens, rate, world = record.get("micro_batch_tokens"), record.get("tokens_per_s"), record.get("world_size") or 1
    try:
        return float(tokens) / (float(rate) / float(world)) if tokens and rate else None
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def _seconds(record: dict) -> float | None:
    return record.get("host_floor_s") or micro_batch_seconds(record)


def _checkpointed(record: dict) -> int:
    """Layers a record's policy recomputed (0 for none)."""
    if record.get("policy") != "full":
        return 0
    return int(record.get("checkpointed_layers") or record.get("layers") or 0)


def _family(record: dict) -> tuple:
    """What the host cost depends on besides the policy: method, kernels, compile and its mode, speed classes, and
    the options declared as host work that are on."""
    key = calibration.class_key(record)
    knobs = record.get("knobs") or {}
    mode = knobs.get("compile_mode") or "default"
    return key.method, key.kernels, key.compile, mode if key.compile else None, _with_host_work(key.options, knobs)


def _with_host_work(options: tuple, values: dict) -> tuple:
    """A family's options with the declared host-work options that are on in ``values`` among them: their runs do
    host work per micro-batch the others do not (--offload-embeddings gathers each micro-batch's rows on the host),
    so their floors are calibrated apart (the one's floor had stood in for the other: -12%, H200, 2026-12-04)."""
    extra = [(d.name, values[d.name]) for d in declarations.DECLARED
             if d.host_work and is_on(values.get(d.name)) and (d.name, values[d.name]) not in options]
    return tuple(sorted((*options, *extra))) if extra else options


def _candidate_family(key: calibration.ClassKey, compile_mode: str, options: dict | None) -> tuple:
    """``_family`` of a candidate of class ``key`` with ``compile_mode`` and option values ``options``."""
    return (key.method, key.kernels, key.compile, compile_mode if key.compile else None,
            _with_host_work(key.options, options or {}))


def _usable(record: dict) -> bool:
    try:
        return bool(_seconds(record)) and int(record.get("layers") or 0) > 0
    except (TypeError, ValueError):
        return False


def _costs(rows: list[dict]) -> tuple[float | None, float | None, float | None]:
    """(host seconds per layer without recomputation, extra per recomputed layer, per layer with every layer
    recomputed) from a family's host-bound rows."""
    plain = [_seconds(r) / int(r["layers"]) for r in rows if _checkpointed(r) == 0 and r.get("policy") == "none"]
    every = [r for r in rows if _checkpointed(r) and _checkpointed(r) == int(r["layers"])]
    per_layer = statistics.median(plain) if plain else None
    full = statistics.median(_seconds(r) / int(r["layers"]) for r in every) if every else None
    recomputed = [(_seconds(r) - int(r["layers"]) * per_layer) / _checkpointed(r)
                  for r in rows if per_layer is not None and _checkpointed(r)]
    return per_layer, (statistics.median(recomputed) if recomputed else None), full


def _ratio(rows: list[dict], plain: float, recompute: float) -> float | None:
    """The median of each row's host seconds over what ``plain`` and ``recompute`` (another family's costs) give
    for its layers and recomputed layers."""
    floors = [(_seconds(r), int(r["layers"]) * plain + _checkpointed(r) * recompute) for r in rows]
    ratios = [seconds / floor for seconds, floor in floors if floor > 0]  # a noisy relative can give none
    return statistics.median(ratios) if ratios else None


def _subsets(options: tuple) -> list[tuple]:
    """The proper subsets of a family's options, largest first (the nearest families first)."""
    return [sub for size in range(len(options) - 1, -1, -1) for sub in itertools.combinations(options, size)]


def _family_costs(rows: list[dict], family: tuple) -> tuple[tuple, str]:
    """(per layer, per recomputed layer, per layer with every layer recomputed) for ``family``, and how they were
    found. Where the family's own rows lack a cost (a speed-class option measured only under full checkpointing,
    say, or an option never measured host-bound), the nearest family with fewer options that has both costs stands
    in, scaled by what the family's own rows (or its nearest measured relative's) show against it: e.g. --fp8-base
    measured only under full checkpointing scales the 16-bit costs by the ratio of their full-checkpointing rows."""
    by_family: dict[tuple, list[dict]] = {}
    for r in rows:
        by_family.setdefault(_family(r), []).append(r)
    nearest = [family] + [family[:4] + (sub,) for sub in _subsets(family[4])]  # itself, then its relatives
    costs = {fam: _costs(by_family.get(fam, [])) for fam in nearest}
    own = costs[family]
    if (own[0] is not None and own[1] is not None) or not family[4]:
        return own, ""
    base = next((fam for fam in nearest[1:] if costs[fam][0] is not None and costs[fam][1] is not None), None)
    if base is None:  # no relative with both costs: the nearest with any, as it is, where the family has no rows
        some = next((fam for fam in nearest[1:] if any(c is not None for c in costs[fam])), None)
        if by_family.get(family) or some is None:
            return own, ""
        return costs[some], f"; as the family with {', '.join(f'{n}={v}' for n, v in some[4]) or 'no options'}"
    plain, recompute, _ = costs[base]
    # The family's own rows (or its nearest measured relative's), each against the base's floor for its policy: any
    # policy answers, partial checkpointing included (FP8 eager, full on 4 and 8 of 32 layers, H200, 2026-12-04)
    anchor = next((by_family[fam] for fam in nearest[:nearest.index(base)] if by_family.get(fam)), [])
    ratio = _ratio(anchor, plain, recompute) or 1.0
    words = ", ".join(f"{n}={v}" for n, v in base[4]) or "no options"
    return (plain * ratio, recompute * ratio, (plain + recompute) * ratio), \
        f"; scaled x{ratio:.2f} from the family with {words}"


def host_floor(device_name: str, key: calibration.ClassKey, layers: int, records: list[dict],
               checkpointed: int | None = None, compile_mode: str = "default",
               options: dict | None = None) -> Floor | None:
    """The host floor per micro-batch of a run of class ``key`` with ``layers`` decoder layers, ``checkpointed`` of
    them recomputed (default: all under full, none otherwise), on ``device_name``: layers x the cost of a layer plus
    the recomputed layers x the cost of recomputing one, from the local store's host-bound runs of its family (or
    its nearest relative, scaled: _family_costs), else the shipped host rows; None where neither has what it
    needs."""
    if key.policy == "selective":  # no run measures it: none's, which it does and then recomputes elementwise ops
        floor = host_floor(device_name, dataclasses.replace(key, policy="none"), layers, records, 0, compile_mode,
                           options)
        return None if floor is None else dataclasses.replace(
            floor, source=f"{floor.source}; selective's at least: none's, as it launches all of none's kernels")
    checkpointed = (layers if key.policy == "full" else 0) if checkpointed is None else checkpointed
    family = _candidate_family(key, compile_mode, options)
    shipped = calibration.shipped().get("host", [])
    # (the shipped rows hold no row of older code: benchmarks/shipped_calibration.py leaves them out)
    for origin, rows, device in (("local host-bound run(s)", [r for r in epochs.current(records) if host_bound(r)],
                                  device_name),
                                 ("shipped runs of a few tokens per micro-batch", shipped, device_name),
                                 *_other_gpus(shipped, device_name)):
        rows = [r for r in rows if r.get("device_name") == device and _usable(r)]
        for borrowed, same in _RELATIVES:  # the family's own runs, else its nearest relatives' (host costs alike)
            matched = [{**r, "method": key.method, "kernels": key.kernels} for r in rows if same(_family(r), family)]
            (per_layer, recompute, full), scaled = _family_costs(matched, family)
            if per_layer is None and full is not None:  # measured under full checkpointing only (uncompiled runs)
                per_layer, recompute = full * NONE_OF_FULL, full * (1 - NONE_OF_FULL)
                scaled += f"; a layer without recomputation x{NONE_OF_FULL:g} of one with it"
            if per_layer is not None and (checkpointed == 0 or recompute is not None):
                seconds = layers * per_layer + checkpointed * (recompute or 0.0)
            elif full is not None and checkpointed == layers:
                seconds = layers * full
            else:
                continue
            origin = origin.replace(" runs ", " run ", 1) if len(matched) == 1 else origin
            return Floor(seconds, seconds / layers, f"host floor {seconds * 1e3:.0f} ms per micro-batch "
                                                    f"({len(matched)} {origin}{borrowed}{scaled})", len(matched))
    return None


# A layer's host cost without recomputation against with it, where a family was measured host-bound under full
# checkpointing only: the least ratio of the families measured both ways (llama-1b QLoRA, Liger, compiled, H200:
# 7.01 / 11.33 ms = 0.62 in 16 bits, 5.76 / 10.42 = 0.55 with --fp8-base), so the floor stays a floor.
NONE_OF_FULL = 0.55


def _other_gpus(shipped: list[dict], device_name: str) -> list[tuple[str, list[dict], str]]:
    """For a GPU with no host calibration of its own: the shipped GPU's host rows, said to be another GPU's. A floor
    is the host's work (Python, dispatch, launches), not the GPU's, so another machine's is nearer than none (a
    tiny model's plan for an H100 predicted 300 million tokens/s without one); its error band is the GPU model's."""
    if device_name == "cpu":
        return []
    others = sorted({r.get("device_name") for r in shipped if r.get("device_name") not in (None, device_name)})
    return [(f"shipped runs of a few tokens per micro-batch on {other}, no host-bound run on {device_name}", shipped,
             other) for other in others]


def measured_ceiling(device_name: str, key: calibration.ClassKey, model: str, layers: int, records: list[dict],
                     checkpointed: int | None = None, compile_mode: str = "default",
                     options: dict | None = None) -> float | None:
    """The least seconds per micro-batch measured by a run of the candidate's own family, model and recomputed
    layers (the local store's and the shipped speed rows), or None. A micro-batch takes the longer of its GPU time
    and its floor, so no floor exceeds what such a run measured, at any micro-batch size: a floor scaled from a
    relative's runs of a few tokens said 841 ms for a configuration measured at 629 (llama-8b FP8 QLoRA, both host
    levers, H200, 2026-12-04), and put it 25% under its own measurement."""
    recomputed = (layers if key.policy == "full" else 0) if checkpointed is None else checkpointed
    family = _candidate_family(key, compile_mode, options)
    seconds = [micro_batch_seconds(r) for r in [*epochs.current(records), *calibration.shipped().get("speed", [])]
               if r.get("device_name") == device_name and r.get("model") == model
               and str(r.get("policy")) == key.policy  # (class_key's policy; the family last: it costs most)
               and (r.get("checkpointed_layers") or (layers if r.get("policy") == "full" else 0)) == recomputed
               and _family(r) == family]
    seconds = [s for s in seconds if s]
    return min(seconds) if seconds else None


def bounded(floor: Floor | None, ceiling: float | None) -> Floor | None:
    """``floor`` no higher than ``ceiling`` (measured_ceiling), saying so where it was lowered."""
    if floor is None or ceiling is None or floor.seconds <= ceiling:
        return floor
    return Floor(ceiling, ceiling * floor.per_layer_s / floor.seconds,
                 f"{floor.source}; at most {ceiling * 1e3:.0f} ms, as a run of it measured", floor.runs, measured=True)


# Whose host-bound runs may give a family its floor, nearest first: its own; the same method and compile mode with
# the other kernel set; any method with the same compile mode. What sets a micro-batch's host time is the compile
# mode above all: CUDA graphs replay a layer in one launch, while compiled blocks without them were host-bound at
# 1 x 2048 tokens (llama-8b QLoRA, H200: 0.272 s per micro-batch), eager kernels or Liger's alike.
_RELATIVES = (
    ("", lambda f, g: f[:4] == g[:4]),
    (" of the other kernel set", lambda f, g: (f[0], f[2], f[3]) == (g[0], g[2], g[3])),
    (" of another method", lambda f, g: f[2:4] == g[2:4]),
)


# How sharply a micro-batch's time turns from its GPU time to its host floor where the two are close: seconds =
# (gpu^P + host^P)^(1/P), within 2% of the longer of the two where the shorter is under half of it, 19% over it
# where they are equal. The host launches while the GPU runs, but each step's synchronisation empties the GPU's
# queue, and a host that barely keeps ahead leaves the GPU waiting at every step's start and after every slow
# launch. Measured on an H200 (llama-8b FP8 QLoRA, 2 x 2 x 2048, compiled, full on 2 and on 4 of 32 layers,
# 2026-12-04): 250 and 241 ms per micro-batch where the GPU model said 210 and 215 and the floor 194 and 203 (the
# longer of the two: 16-18% fast); P = 4 gives 242 and 249 ms (within 3.5%).
EDGE_SHARPNESS = 4
# The least share of a calibration run's measured time that is taken as its GPU's own: below it the run was
# host-bound, and its GPU time is not known (a llama-8b FP8 run at 1 x 2048 tokens had its GPU 48% busy).
MIN_GPU_SHARE = 0.7


def tokens_per_s(gpu_tokens_per_s: float, floor: Floor | None, micro_batch_tokens: int, world_size: int,
                 measured_at: int = 0) -> float:
    """Global tokens/s once the host floor is taken into account: each GPU's micro-batch takes its GPU time and
    its floor combined (``EDGE_SHARPNESS``). ``measured_at``: the micro-batch tokens of the runs behind
    ``gpu_tokens_per_s`` (0: it is the GPU's own rate): their measured time held the same loss, which is taken out
    first (with this candidate's floor standing in for theirs), so that a configuration predicted from its own
    measurement is predicted at it. A floor bounded by a run of the candidate's own family (``bounded``) is that
    run's whole time: the longer of the two answers."""
    if floor is None:
        return gpu_tokens_per_s
    gpu_s = micro_batch_tokens * world_size / gpu_tokens_per_s
    if floor.measured:
        return micro_batch_tokens * world_size / max(gpu_s, floor.seconds)
    if measured_at:  # (their time per micro-batch taken as proportional to its tokens)
        gpu_s *= _gpu_share(gpu_s * measured_at / micro_batch_tokens, floor.seconds)
    return micro_batch_tokens * world_size / _combined(gpu_s, floor.seconds)


def _combined(gpu_s: float, host_s: float) -> float:
    return (gpu_s ** EDGE_SHARPNESS + host_s ** EDGE_SHARPNESS) ** (1 / EDGE_SHARPNESS)


def _gpu_share(measured_s: float, host_s: float) -> float:
    """The share of a measured micro-batch time that was its GPU's own: the inverse of ``_combined``."""
    if measured_s <= host_s:
        return MIN_GPU_SHARE
    return max(MIN_GPU_SHARE, (1 - (host_s / measured_s) ** EDGE_SHARPNESS) ** (1 / EDGE_SHARPNESS))
