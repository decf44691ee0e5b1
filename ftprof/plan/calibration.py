"""The calibration store: what the planner's tokens/s, and its activation memory factor, are calibrated from.

Every finished run appends one record (one JSON line) to a local store (``record_run``, called by the engine once a
run ends; ``ftprof profile`` runs add their trace summary's per-bucket TFLOP/s). Where the store has nothing for a
device and kind of run, the shipped defaults answer (shipped_calibration.json, derived from the measurements under
docs/measurements by benchmarks/shipped_calibration.py), then the shipped defaults of another GPU scaled by the
ratio of dense bf16 peaks.

Units: a rate is FLOP/s per GPU counting model + recomputed FLOPs (HFU's numerator, README "Definitions"):
(flops_per_token + recompute_flops_per_token) * tokens_per_s / world_size, tokens_per_s being global (all ranks).
Memory is in bytes. torch is not imported at module level: the planner imports this before torch loads.

FTPROF_CALIBRATION: the store's path; ``off`` stops recording and local look-ups (shipped defaults still apply).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftprof.config import declarations
from ftprof.metrics import peak_flops
from ftprof.plan.epochs import stale
from ftprof.plan.records import DEFAULT_KNOBS, model_layers, option_values, run_knobs, run_record  # noqa: F401
from ftprof.plan.store import (  # noqa: F401 - the store's I/O, read and written under these names too
    OFF,
    STORE_ENV,
    STORE_NAME,
    _warn,
    append_record,
    enabled,
    host_bound,
    load_records,
    store_path,
)
from ftprof.results.load import OWN_TRAINER

SHIPPED = Path(__file__).with_name("shipped_calibration.json")
MEMORY_KNOBS = declarations.activation_options()  # change what is saved


@dataclass(frozen=True)
class ClassKey:
    """What, beyond FLOPs, sets a run's speed and its activation memory."""

    method: str  # full | lora | qlora | gptq-lora
    policy: str  # none | selective | full   (full on N of L layers is still "full")
    kernels: str  # the run's --kernels: eager | liger
    compile: bool  # whether the blocks ran compiled (a compile that fell back to eager is False)
    # the declared speed-class options that are on, as (name, value) sorted: --fp8-base's e4m3 base matmuls
    # (+6% to +27% on an H200) are a class of their own
    options: tuple = ()

    def describe(self) -> str:
        text = f"{self.method} {self.policy} {self.kernels} {'compiled' if self.compile else 'uncompiled'}"
        return " ".join([text, *(declarations.BY_NAME[n].spell(v) for n, v in self.options)])

    @property
    def base(self) -> ClassKey:
        """The same class without its speed-class options (what they save is what the base saves)."""
        return dataclasses.replace(self, options=())


def speed_class_options(values: dict) -> tuple:
    """The (name, value) pairs of the declared speed-class options that apply and are on in ``values``."""
    out = []
    for name in declarations.speed_classes():
        d = declarations.BY_NAME[name]
        value = values.get(name)
        if value is not None and value != d.default and d.applies(values):
            out.append((name, value))
    return tuple(sorted(out))


@dataclass(frozen=True)
class Rate:
    flops_per_s: float  # achieved (model + recomputed) FLOP/s per GPU
    source: str  # one human line: where the rate came from
    runs: int
    micro_batch_tokens: int = 0  # the micro-batch the rate was measured at (the chosen runs' median)
    origin: str = "local"  # local | shipped | scaled (another GPU's shipped rows times the ratio of peaks)
    distance: float = 0.0  # how far the chosen runs are: log-distance in (model FLOPs per token, micro-batch tokens)
    knobs_matched: bool = True  # whether the chosen runs had the candidate's own options (compile mode, ...)
    stand_in: bool = False  # another policy's rate per executed FLOP stood in (no run of this policy)
    # the share of a micro-batch's time at micro_batch_tokens that does not scale with its tokens, measured on this
    # class and model at a second micro-batch size (None: the default assumption, speed.MICRO_BATCH_OVERHEAD)
    fixed_share: float | None = None
    # half the range of the chosen runs' rates over their median: how far runs of the same configuration fell apart
    # (0 for one run); the prediction's band widens by it
    scatter: float = 0.0
    host_bound: bool = False  # a chosen run's GPU waited on its host (NVML busy under HOST_BOUND_BUSY)


@dataclass(frozen=True)
class Factor:
    activation_ratio: float  # measured activations / probed activations for runs of this class
    source: str
    runs: int


# ---------------------------------------------------------------------------------------------------- the store
def record_run(run_dir: str | Path) -> bool:
    """Append the record of a finished run (status ok, with steady-state figures) to the local store. False, with
    nothing written, for any other run, a run already recorded, or FTPROF_CALIBRATION=off. Never raises: a broken
    store costs one warning line on stderr."""
    try:
        if not enabled():
            return False
        record = run_record(run_dir)
        return record is not None and append_record(record)
    except Exception as exc:  # the run is over and recorded in its own directory: the store must not fail it
        _warn(f"ftprof: calibration store not updated ({type(exc).__name__}: {exc})")
        return False


def _own_loop(record: dict) -> bool:
    """A record of ftprof's own loop (records from before the trainer field are)."""
    return record.get("trainer", OWN_TRAINER) == OWN_TRAINER


def own_records(records: list[dict] | None = None) -> list[dict]:
    """The store's records of ftprof's own loop, the ones the planner calibrates from (runs measured through
    ftprof.integrations' callback, peer recipes included, carry their trainer and stay out of it)."""
    return [r for r in (load_records() if records is None else records) if _own_loop(r)]


def peer_records(device_name: str, model: str, seq_len: int, sequences_per_step: int, methods: tuple[str, ...],
                 records: list[dict] | None = None) -> list[dict]:
    """Runs of other trainers (the HF Trainer, TRL, Unsloth: bench's peer cells, a callback in a user's script) in
    the store at this device, model, sequence length and sequences per optimizer step, for ``methods``: the newest
    of each (trainer, method, policy), fastest first."""
    newest: dict[tuple, dict] = {}
    for r in load_records() if records is None else records:
        if _own_loop(r) or r.get("device_name") != device_name:
            continue
        per_step = (r.get("batch_size") or 0) * (r.get("grad_accum") or 1)
        if (r.get("model"), r.get("seq_len"), per_step) != (model, seq_len, sequences_per_step) \
                or r.get("method") not in methods:
            continue
        key = (r["trainer"], r.get("method"), r.get("policy"))
        if key not in newest or str(r.get("finished_at")) > str(newest[key].get("finished_at")):
            newest[key] = r
    return sorted(newest.values(), key=lambda r: -(r.get("tokens_per_s") or 0))


def off_default(record: dict) -> dict[str, Any]:
    """The record's options that are not at today's defaults."""
    knobs = record.get("knobs") or {}
    return {k: v for k, v in knobs.items() if k in DEFAULT_KNOBS and v is not None and v != DEFAULT_KNOBS[k]}


def memory_options_off(record: dict) -> set[str]:
    """The record's options off today's defaults that change what is saved (keep_dequantized only matters where
    layers are recomputed)."""
    off = set(off_default(record)) & MEMORY_KNOBS
    if record.get("policy") != "full":
        off.discard("keep_dequantized")
    return off


def class_key(record: dict) -> ClassKey:
    values = option_values(record)
    return ClassKey(str(record.get("method")), str(record.get("policy")), str(record.get("kernels")),
                    bool(record.get("compile")), speed_class_options(values))


_BY_CLASS: dict[int, tuple[list, int, dict]] = {}


def by_class(rows: list[dict]) -> dict[ClassKey, list[dict]]:
    """``rows`` grouped by class key, computed once per list: a plan looks up thousands of candidates in the same
    records (4.9 million class keys for one llama-8b plan before). Keyed by the list's identity and length (the
    planner's lists are read once and never edited in place)."""
    hit = _BY_CLASS.get(id(rows))
    if hit is not None and hit[0] is rows and hit[1] == len(rows):
        return hit[2]
    index: dict[ClassKey, list[dict]] = {}
    for r in rows:
        index.setdefault(class_key(r), []).append(r)
    if len(_BY_CLASS) >= 8:
        _BY_CLASS.clear()
    _BY_CLASS[id(rows)] = (rows, len(rows), index)
    return index


def activation_ratio(record: dict) -> float | None:
    """measured / probed activations of a recorded run (bytes): measured = training peak - what the prediction
    held resident under the activations (static bytes, less the gradients unless gradients accumulate) - its
    transients; probed = predicted activations / the factor they were scaled by. None without a CUDA peak or a
    prediction, or where gradients, not activations, set the predicted peak (full fine-tuning, small batches)."""
    prediction = record.get("prediction") or {}
    peak, activations = record.get("training_peak"), prediction.get("activation_bytes")
    factor = prediction.get("activation_factor")
    if record.get("device_name") == "cpu" or not peak or not activations or not factor or factor <= 0:
        return None
    grads = prediction.get("gradient_bytes") or 0
    accumulates = int((prediction.get("candidate") or {}).get("grad_accum") or 1) > 1
    resident = (prediction.get("static_bytes") or 0) - (0 if accumulates else grads)
    transients = prediction.get("transient_bytes") or 0
    if prediction.get("peak_bytes") != resident + activations + transients:
        return None
    measured = peak - resident - transients
    probed = activations / factor
    return measured / probed if measured > 0 and probed > 0 else None


# ---------------------------------------------------------------------------------------------------- shipped
@functools.lru_cache(maxsize=1)
def shipped() -> dict[str, list[dict]]:
    """The shipped defaults: {"speed": [...], "memory": [...], "host": [...]}, rows shaped like local records
    ("host": runs of a few tokens per micro-batch, ftprof/plan/host.py)."""
    try:
        data = json.loads(SHIPPED.read_text())
        return {kind: list(data.get(kind) or []) for kind in ("speed", "memory", "host")}
    except (OSError, ValueError, AttributeError) as exc:
        _warn(f"ftprof: shipped calibration {SHIPPED} unreadable ({exc}); not used", once="shipped")
        return {"speed": [], "memory": [], "host": []}


# ---------------------------------------------------------------------------------------------------- look-ups
def _speed_point(record: dict) -> tuple[float, float, float] | None:
    """(model FLOPs per token, micro-batch tokens, FLOP/s per GPU) of a record usable for speed, else None."""
    try:
        point = (float(record["flops_per_token"]), float(record["micro_batch_tokens"]), float(record["flops_per_s"]))
    except (KeyError, TypeError, ValueError):
        return None
    return point if all(math.isfinite(x) and x > 0 for x in point) else None


def _distance(row: dict, flops_per_token: float, micro_batch_tokens: int) -> float:
    """How far a record is from what is asked: log-distance in (model FLOPs per token, micro-batch tokens)."""
    flops, tokens, _ = _speed_point(row)
    return math.hypot(math.log(flops / flops_per_token), math.log(tokens / micro_batch_tokens))


def _nearest(rows: list[dict], flops_per_token: float, micro_batch_tokens: int,
             knobs: dict | None = None) -> list[dict]:
    """The rows of the configuration nearest in (log model FLOPs per token, log micro-batch tokens); among them
    those whose options match ``knobs`` (the candidate's: its compile mode, fused projections) most, then those
    with the fewest options off today's defaults."""
    def distance(row: dict) -> float:
        return _distance(row, flops_per_token, micro_batch_tokens)

    def matches(row: dict) -> int:
        have = row.get("knobs") or {}
        return sum(1 for k, v in (knobs or {}).items() if v is not None and v != DEFAULT_KNOBS.get(k)
                   and have.get(k) == v)

    best = min(map(distance, rows))
    near = [r for r in rows if distance(r) <= best + 1e-9]
    most = max(map(matches, near))
    near = [r for r in near if matches(r) == most]
    fewest = min(len(off_default(r)) for r in near)
    return [r for r in near if len(off_default(r)) == fewest]


def _knobs_matched(rows: list[dict], knobs: dict | None) -> bool:
    wanted = {k: v for k, v in (knobs or {}).items() if v is not None and v != DEFAULT_KNOBS.get(k)}
    return all((r.get("knobs") or {}).get(k) == v for r in rows for k, v in wanted.items())


def _describe(rows: list[dict], key: ClassKey) -> str:
    """llama-8b qlora none eager compiled, 8192 tokens/micro-batch[, 2 GPUs (processes on a CPU)][, off defaults:
    ...]."""
    models = "/".join(sorted({str(r.get("model")) for r in rows}))
    tokens = "/".join(str(t) for t in sorted({int(r["micro_batch_tokens"]) for r in rows}))
    out = f"{models} {key.describe()}, {tokens} tokens/micro-batch"
    worlds = sorted({int(r.get("world_size") or 1) for r in rows} - {1})
    if worlds:
        unit = "processes" if all(r.get("device_name") == "cpu" for r in rows) else "GPUs"
        out += f", {'/'.join(map(str, worlds))} {unit}"
    off = {k: v for r in rows for k, v in off_default(r).items()}
    if off:
        out += ", off defaults: " + " ".join(f"{k}={v}" for k, v in sorted(off.items()))
    return out


def _rate(rows: list[dict], key: ClassKey, flops_per_token: float, micro_batch_tokens: int,
          source: Callable[[list[dict], str], str], scale: float = 1.0, knobs: dict | None = None,
          origin: str = "local", sizes: list[dict] | None = None) -> Rate:
    """The rate of the runs in ``rows`` nearest to what is asked; ``sizes``: the runs whose times at other
    micro-batch sizes may give the fixed share (default ``rows``)."""
    chosen = _nearest(rows, flops_per_token, micro_batch_tokens, knobs)
    rates = [_speed_point(r)[2] for r in chosen]
    rate = statistics.median(rates) * scale
    tokens = int(statistics.median(_speed_point(r)[1] for r in chosen))
    # the distance to the model size asked for; the micro-batch's own distance is priced where it is scaled
    distance = abs(math.log(_speed_point(chosen[0])[0] / flops_per_token))
    return Rate(rate, source(chosen, _describe(chosen, key)), len(chosen), tokens, origin, distance,
                _knobs_matched(chosen, knobs), fixed_share=_fixed_share(rows if sizes is None else sizes, chosen),
                scatter=(max(rates) - min(rates)) / (2 * statistics.median(rates)),
                host_bound=any(host_bound(r) for r in chosen))


def _fixed_share(rows: list[dict], chosen: list[dict]) -> float | None:
    """The share of a micro-batch's time, at the chosen runs' size, that does not scale with its tokens: a line
    through the times per micro-batch of this class's runs of the same model at that size and at the nearest other
    size (same options first). QLoRA dequantizes every weight once per micro-batch whatever its tokens: with CUDA
    graphs and FP8 on an H200 (llama-8b) 2,048 tokens per micro-batch took 25% fixed time, and 1 x 8 ran 13,405
    tokens/s where a flat 5% predicted 16,606. None without such a pair, or where the line makes no sense."""
    flops, tokens, rate = (statistics.median(_speed_point(r)[i] for r in chosen) for i in range(3))
    knobs = chosen[0].get("knobs") or {}
    others = [r for r in rows if abs(math.log(_speed_point(r)[0] / flops)) < 0.02 and _speed_point(r)[1] != tokens]
    if not others:
        return None
    same = [r for r in others if (r.get("knobs") or {}) == knobs] or others
    size = min({_speed_point(r)[1] for r in same}, key=lambda m: abs(math.log(m / tokens)))
    other_rate = statistics.median(_speed_point(r)[2] for r in same if _speed_point(r)[1] == size)
    here, there = tokens / rate, size / other_rate  # time per micro-batch, in units of one FLOP per token
    slope = (there - here) / (size - tokens)
    fixed = here - slope * tokens
    return fixed / here if slope > 0 and 0 <= fixed < here else None


def _runs(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def _shipped_origin(rows: list[dict]) -> str:
    csvs = ", ".join(sorted({str(r.get("csv")) for r in rows}))
    dates = "/".join(sorted({str(r.get("date")) for r in rows}))
    return f"{csvs}, {dates}"


def _matching(rows: list[dict], key: ClassKey, device_name: str | None = None) -> list[dict]:
    """The rows of class ``key`` (on ``device_name``) usable for speed: not timed before a change that made them
    faster (plan/epochs.py)."""
    return [r for r in by_class(rows).get(key, ()) if _speed_point(r) is not None
            and (device_name is None or r.get("device_name") == device_name) and stale(r) is None]


def speed_rate(device_name: str, key: ClassKey, flops_per_token: float, micro_batch_tokens: int,
               records: list[dict] | None = None, knobs: dict | None = None,
               world_size: int | None = None) -> Rate | None:
    """The achieved FLOP/s per GPU to expect on ``device_name`` (as torch names it; "cpu" on CPU) for a run of
    class ``key``: from the local store's records of that device and class (the nearest configuration, the
    median of its runs), else the shipped defaults for that device and class, else another GPU's shipped defaults
    scaled by the ratio of dense bf16 peaks; None when nothing applies. Records of other kernels or compile
    settings are never used (they differ by up to 40%). ``records``: the local records (default: the store);
    ``knobs``: the candidate's own options (DEFAULT_KNOBS names), preferred among the nearest configuration's runs;
    ``world_size``: the run's processes: runs of that many answer where there are any (:func:`same_world`)."""
    if not (flops_per_token > 0 and micro_batch_tokens > 0):
        raise ValueError(f"speed_rate needs positive FLOPs per token and micro-batch tokens, got "
                         f"{flops_per_token} and {micro_batch_tokens}")
    if records is None:
        records = own_records()
    local, same_device = _matching(records, key, device_name), _matching(shipped()["speed"], key, device_name)
    rate = _device_rate(device_name, key, flops_per_token, micro_batch_tokens, local, same_device, knobs, world_size)
    if rate is None or world_size in (None, 1) or any(int(r.get("world_size") or 1) == world_size
                                                      for r in [*local, *same_device]):
        return rate
    return dataclasses.replace(rate, scatter=rate.scatter + BAND_OTHER_WORLD, source=f"{rate.source}; per GPU from "
                               f"runs of another world size: {world_size} GPUs' collectives not priced")


# A per-GPU rate at a world size none of its runs had: collectives unpriced (FSDP ran llama-1b LoRA at 70% of DDP's
# rate on two H200s, BENCHMARKS.md 2026-11-30)
BAND_OTHER_WORLD = 0.10


def _device_rate(device_name: str, key: ClassKey, flops_per_token: float, micro_batch_tokens: int,
                 local: list[dict], same_device: list[dict], knobs: dict | None, world_size: int | None) -> Rate | None:
    """speed_rate's answer from the store's and the shipped runs of the class on this device, else another GPU's."""
    local, same_device = same_world(local, world_size), same_world(same_device, world_size)
    # This GPU's runs of the class, the machine's own and the shipped: a fixed share is the class's and model's,
    # whoever measured the two sizes.
    sizes = local + same_device
    if local and not _nearer(same_device, local, flops_per_token, micro_batch_tokens):
        return _rate(local, key, flops_per_token, micro_batch_tokens,
                     lambda rows, what: f"local store: {_runs(len(rows))} on {device_name} ({what})", knobs=knobs,
                     sizes=sizes)
    if same_device:
        return _rate(same_device, key, flops_per_token, micro_batch_tokens,
                     lambda rows, what: f"shipped defaults ({_shipped_origin(rows)}, {device_name}: {what})",
                     knobs=knobs, origin="shipped", sizes=sizes)
    return _scaled_rate(shipped()["speed"], device_name, key, flops_per_token, micro_batch_tokens, knobs)


def same_world(rows: list[dict], world_size: int | None) -> list[dict]:
    """The runs of ``world_size`` processes among ``rows``, where there are any (else all): a rate per GPU is not
    the same at another world size (collectives; on a CPU, two processes on two cores ran at half the rate each)."""
    if world_size is None:
        return rows
    same = [r for r in rows if int(r.get("world_size") or 1) == world_size]
    return same or rows


NEARER_BY = 0.05  # log-distance by which shipped runs must be nearer than the local ones to answer instead


def _nearer(shipped_rows: list[dict], local: list[dict], flops_per_token: float, micro_batch_tokens: int) -> bool:
    """Whether the shipped rows hold a run nearer to what is asked than any local one: then they answer. Local
    learning must not make a prediction worse: a mistral-7b plan at 2,048 tokens per micro-batch took the local
    store's llama-8b runs at 4,096 over the shipped mistral-7b runs at 2,048, and over-predicted by 13-15% (H200,
    2026-12-04)."""
    if not shipped_rows:
        return False
    here = min(_distance(r, flops_per_token, micro_batch_tokens) for r in local)
    there = min(_distance(r, flops_per_token, micro_batch_tokens) for r in shipped_rows)
    return there < here - NEARER_BY


def device_calibrated(device_name: str, records: list[dict]) -> bool:
    """Whether a speed rate answers for ``device_name``: its own runs, or a known peak (the shipped GPU's scale)."""
    if any(r.get("device_name") == device_name for r in [*records, *shipped()["speed"]]):
        return True
    return device_name != "cpu" and peak_flops(device_name) is not None


def _scaled_rate(defaults: list[dict], device_name: str, key: ClassKey, flops_per_token: float,
                 micro_batch_tokens: int, knobs: dict | None = None) -> Rate | None:
    """Another GPU's shipped defaults for ``key``, times target peak / its peak (the GPU of the nearest peak)."""
    target = peak_flops(device_name) if device_name != "cpu" else None
    if not target:
        return None
    others = {}
    for row in _matching(defaults, key):
        peak = peak_flops(row.get("device_name"))
        if peak:
            others.setdefault((row["device_name"], peak), []).append(row)
    if not others:
        return None
    (other, peak), rows = min(others.items(), key=lambda kv: (abs(math.log(kv[0][1] / target)), -len(kv[1])))

    def source(chosen: list[dict], what: str) -> str:
        return (f"shipped {other} defaults scaled by peak bf16 FLOP/s to {device_name} ({target / 1e12:,.0f}/"
                f"{peak / 1e12:,.0f} TFLOP/s; {_shipped_origin(chosen)}: {what})")

    return _rate(rows, key, flops_per_token, micro_batch_tokens, source, scale=target / peak, knobs=knobs,
                 origin="scaled")


TRANSFER_AGREEMENT = 0.05  # local ratios at several shapes within this of their median: they transfer


@dataclass(frozen=True)
class Shape:
    """Where a local activation ratio was measured, or is to be used: what the ratio may depend on beyond its
    class (the model, the sequence, the micro-batch, how many layers full checkpointing covers)."""

    model: str | None
    seq_len: int | None
    micro_batch_tokens: int | None
    checkpointed_layers: int | None = None

    @classmethod
    def of_record(cls, record: dict) -> Shape:
        return cls(record.get("model"), record.get("seq_len"), record.get("micro_batch_tokens"),
                   record.get("checkpointed_layers"))


def _transferring(local: list[tuple[dict, float]], at: Shape | None) -> tuple[list[tuple[dict, float]], str]:
    """The local (record, ratio) pairs that may answer at ``at``: those measured at that very shape; else all of
    them where they were measured at two or more shapes and agree (within TRANSFER_AGREEMENT of their median),
    which shows the ratio transfers across shapes; else none (the shipped defaults answer). A ratio learned at one
    shape and policy was seen to under-predict another shape's peak by 12% (issue: learning made memory worse)."""
    if at is None or not local:
        return local, ""
    same = [(r, x) for r, x in local if Shape.of_record(r) == at]
    if same:
        return same, "at this shape"
    shapes = {Shape.of_record(r) for r, _ in local}
    middle = statistics.median(x for _, x in local)
    if len(shapes) >= 2 and all(abs(x / middle - 1) <= TRANSFER_AGREEMENT for _, x in local):
        return local, f"{len(shapes)} shapes agreeing within {TRANSFER_AGREEMENT:.0%}"
    return [], ""


def activation_factor(key: ClassKey, records: list[dict] | None = None, at: Shape | None = None) -> Factor:
    """measured / probed activations for runs of class ``key``: the median over the local store's records (any GPU)
    that may answer at ``at`` (``_transferring``), else over the shipped defaults' memory rows, else 1.0 (the probe
    as it is)."""
    if records is None:
        records = own_records()
    local = [(r, x) for r in by_class(records).get(key, ()) if (x := activation_ratio(r)) is not None]
    local, why = _transferring(local, at)
    if local:
        models = "/".join(sorted({str(r.get("model")) for r, _ in local}))
        return Factor(statistics.median(x for _, x in local),
                      f"local store: {_runs(len(local))} ({models} {key.describe()}{', ' + why if why else ''})",
                      len(local))
    # Rows whose options change what is saved (an uncompiled loss, weights not kept) describe another model of
    # memory: a QLoRA full-checkpointing row of the uncompiled loss gave 2.9 where today's runs give about 1.
    rows = [r for r in by_class(shipped()["memory"]).get(key, ()) if r.get("activation_ratio")
            and not memory_options_off(r)]
    if rows:  # those at today's defaults where there are any (compile_loss alone moves the ratio 0.70 -> 0.55)
        fewest = min(len(off_default(r)) for r in rows)
        rows = [r for r in rows if len(off_default(r)) == fewest]
        models = "/".join(sorted({str(r.get("model")) for r in rows}))
        return Factor(statistics.median(float(r["activation_ratio"]) for r in rows),
                      f"shipped defaults ({_shipped_origin(rows)}: {models} {key.describe()})", len(rows))
    return Factor(1.0, "probe (no calibration for this kind of run)", 0)
