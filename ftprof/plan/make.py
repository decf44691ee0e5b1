"""``ftprof plan``: every candidate configuration for a model and shape, predicted and ranked against a memory
budget, without training the model (``make_plan``).

Ranking: the configurations that fit the budget (less auto's margin) first, fastest predicted first (those without
a speed prediction after, least memory first); then the ones that do not fit, least memory first, each with why.
For full checkpointing the fewest layers that fit the budget are added to the candidates (the partial policy
``--checkpointing auto`` would pick), and for selective checkpointing the same (the rest of the layers as none).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from ftprof.config import RunConfig
from ftprof.errors import ConfigError
from ftprof.metrics import GIB
from ftprof.plan import budget, calibration, candidates
from ftprof.plan.candidates import Candidate
from ftprof.plan.predict import Planner, Target, planner
from ftprof.results.parts import Prediction


@dataclass(frozen=True)
class PlanRequest:
    cfg: RunConfig  # the common options; its method is the first of ``methods``
    methods: tuple[str, ...]
    gpu: str | None = None  # --gpu NAME: plan for this card instead of this machine's
    gpus: int = 1  # GPUs per run (FSDP2 shards the model over them)
    top: int = 5  # the sweep file's configurations
    notes: tuple[str, ...] = ()  # lines for the plan's header: methods left out, packages this machine lacks
    needs_here: tuple[tuple[str, str], ...] = ()  # (method, package): rows kept for --gpu that need it installed
    pins: tuple[tuple[str, Any], ...] = ()  # (option, value): candidate options given, the only value planned

    def needs(self, method: str) -> str:
        """The package a run of ``method`` needs that this machine lacks ('' when none is missing)."""
        return dict(self.needs_here).get(method, "")


@dataclass
class Row:
    candidate: Candidate
    prediction: Prediction
    fits: bool
    headroom_bytes: int  # budget less the predicted peak (negative: over)
    why_not: str = ""  # why a configuration does not make the list
    tie: str = ""  # how it was ranked against rows whose predictions it is within the error of


@dataclass
class Plan:
    request: PlanRequest
    target: Target
    usable_bytes: int  # memory a run may use per GPU: --memory-limit-gib, the card's, or what is free here
    usable_from: str  # where that figure came from
    margin_bytes: int
    rows: list[Row] = field(default_factory=list)
    layer_count: int = 0  # the model's decoder layers
    seconds: float = 0.0
    probe_seconds: float = 0.0  # the probes' own time (0 when every probe came from the cache)
    peers: list[dict] = field(default_factory=list)  # other trainers' runs in the store at this shape (calibration)

    @property
    def budget_bytes(self) -> int:
        return self.usable_bytes - self.margin_bytes

    @property
    def fitting(self) -> list[Row]:
        return [r for r in self.rows if r.fits]


def make_plan(req: PlanRequest) -> Plan:
    started = time.perf_counter()
    cfg, source, target, dtype, usable, usable_from = _context(req)
    records = calibration.load_records()  # read once: ftprof's runs calibrate, other trainers' are listed
    p = planner(cfg, source, dtype, target, records)
    margin = budget.margin_for(usable)
    plan = Plan(req, target, usable, usable_from, margin, layer_count=p.layer_count)
    on_gpu, pins = target.device_name != "cpu", dict(req.pins)
    pool = candidates.for_target(list(req.methods), p.layer_count, cfg.data.batch_size, cfg.train.grad_accum,
                                 on_gpu, target.capability, pins, target.shards, target.world_size > 1)
    if not p.host_embedding_bytes:  # tied embeddings: --offload-embeddings would save nothing
        pool = [c for c in pool if not c.option("offload_embeddings")]
    if not pool:  # what the CLI could not tell without torch: this machine's GPU, the model's tied embeddings
        raise ConfigError(candidates.nothing_pinned(pins, req.methods, target.device_name, on_gpu, target.capability))
    if "checkpoint_layers" not in pins:  # a pinned layer count is the only one
        pool += candidates.pinned(_fewest_layers(p, pool, plan.budget_bytes), pins)  # (--no-selective-rest, say)
    plan.rows = _rank([_row(p, c, plan.budget_bytes) for c in dict.fromkeys(pool)])
    plan.peers = calibration.peer_records(target.device_name, cfg.model.model, cfg.data.seq_len,
                                          cfg.data.batch_size * cfg.train.grad_accum, req.methods, records)
    plan.seconds = time.perf_counter() - started
    plan.probe_seconds = sum(r.seconds for r in p.probes.values())
    return plan


def _context(req: PlanRequest):
    """(config with the method resolved, model source, target, dtype, usable bytes per GPU, where from)."""
    from ftprof.models.source import resolve_model_source

    cfg = req.cfg
    source = resolve_model_source(cfg.model.model)
    limit = cfg.output.memory_limit_gib
    if req.gpu is not None:
        target, dtype, usable, usable_from = _named_card(cfg, req.gpu, req.gpus)
    else:
        target, dtype, usable, usable_from = _this_machine(cfg, req.gpus)
    if limit is not None and int(limit * GIB) <= usable:
        usable, usable_from = int(limit * GIB), f"--memory-limit-gib {limit:g}"
    elif limit is not None:  # no more than the card has (an L4 plan with 48 GiB put a 39.5 GiB row first)
        usable_from = f"{usable_from}; --memory-limit-gib {limit:g} is more than that"
    method = cfg.method.for_method(req.methods[0], dtype, preset=source.kind == "preset")
    return dataclasses.replace(cfg, method=method), source, target, dtype, usable, usable_from


def shards(cfg: RunConfig, gpus: int) -> bool:
    """Whether FSDP shards the model over a plan's ``gpus`` (--parallel ddp keeps a whole copy on each)."""
    return gpus > 1 and cfg.distributed.parallel == "fsdp"


def _named_card(cfg: RunConfig, name: str, gpus: int):
    """(target, dtype, usable bytes, where from) for --gpu NAME: the dtype a run on a CUDA device resolves to
    (torch.device only names the device type: no GPU is needed here)."""
    import torch

    from ftprof.gpus import gpu_named
    from ftprof.runtime import resolve_dtype_name

    gpu = gpu_named(name)
    dtype = resolve_dtype_name(cfg.model.dtype, torch.device("cuda"))
    return (Target(gpu.name, gpus, shards(cfg, gpus), gpu.capability), dtype, gpu.usable_bytes,
            f"{gpu.name}: {gpu.memory_gib:.1f} GiB less the CUDA context")


def _this_machine(cfg: RunConfig, gpus: int):
    from ftprof.runtime import available_memory, resolve_device, resolve_dtype_name

    device = resolve_device(cfg.output.device)
    if device.type == "cuda":
        import torch

        name = torch.cuda.get_device_name(device)
        visible = torch.cuda.device_count()
        if gpus > visible:
            raise ConfigError(f"--gpus {gpus}: this machine has {visible} GPU(s); plan for another machine with "
                              "--gpu NAME --gpus N")
        capability = tuple(torch.cuda.get_device_capability(device))
        return (Target(name, gpus, shards(cfg, gpus), capability), resolve_dtype_name(cfg.model.dtype, device),
                available_memory(device), f"{name}: free now")
    if gpus > 1:
        raise ConfigError(f"--gpus {gpus}: this machine has no GPU; plan for one with --gpu NAME --gpus {gpus}")
    return (Target("cpu"), resolve_dtype_name(cfg.model.dtype, device), available_memory(device),
            "this machine's available host memory")


def _fewest_layers(p: Planner, pool: list[Candidate], budget_bytes: int) -> list[Candidate]:
    """For each (method, kernels, compile, micro-batch) whose none and selective do not fit: full checkpointing on
    the fewest layers that do; where none does not fit, selective on the fewest layers that do (the rest run as
    none: faster than selective on all, and than full on fewer layers in the same memory, as selective costs less
    per GiB it saves). Full also with --lean-activations (and --lean-norms) on the layers it leaves. Only from the
    pool's candidates of that policy: their options are those the declarations allow under it (CUDA graphs are not
    under full, say), where none's may not be."""
    out, counts = [], {}
    for cand in {dataclasses.replace(c, checkpoint_layers=None) for c in pool
                 if c.checkpointing in ("full", "selective")}:
        ways = [cand] + ([cand.with_option(budget.REST)] if budget.rest_applies(cand) else [])
        ways += budget.kept_lean(p, cand) if cand.checkpointing == "full" else []  # (trimming the layers left)
        for way in ways:
            same = _same_memory(way)
            if same not in counts:
                counts[same] = budget.fewest_layers(p, same, budget_bytes, cand.checkpointing)
            if counts[same] is not None:
                out.append(dataclasses.replace(way, checkpoint_layers=counts[same]))
    return sorted(out, key=lambda c: c.label)


def _same_memory(cand: Candidate) -> Candidate:
    """``cand`` without --lean-recompute where it saves the same tensors (full checkpointing's layers, and compiled
    selective: plan/memory.py): the fewest layers that fit are the same, searched once."""
    selective_eager = not cand.compile and (cand.checkpointing == "selective" or cand.option(budget.REST))
    if selective_eager or not cand.option("lean_recompute"):
        return cand
    return cand.without("lean_recompute")


def _row(p: Planner, cand: Candidate, budget_bytes: int) -> Row:
    pred = p.predict(cand)
    headroom = budget_bytes - pred.peak_bytes
    row = Row(cand, pred, headroom >= 0, headroom)
    if not row.fits:
        row.why_not = f"over the budget by {max(-headroom / GIB, 0.01):.2f} GiB"  # (never "by 0.00")
    return row


CONFIDENCE_ORDER = {"high": 0, "medium": 1, "low": 2, "": 3}


NEAR_TIE = 0.03  # predictions this close are a tie, broken by headroom


def _bounds(r: Row) -> tuple[float, float]:
    """(low, high) tokens/s within the part of the prediction's error that can reorder rows (its spread)."""
    p = r.prediction
    speed = p.tokens_per_s
    band = p.tokens_per_s_spread if p.tokens_per_s_spread is not None else (p.tokens_per_s_error or 0.0)
    return speed * (1 - band), speed * (1 + band)


def _confidence(r: Row) -> int:
    """0 (high) .. 3 (none): the word the row shows (from its whole error band), so that the ranking's "less
    certain" is the table's. (The spread, the part of the band that can reorder rows, bounds the ties instead: a
    GPU's shared scaling error moves every row together; ranking by the spread's words put a row shown "low" above
    faster rows shown "medium", and one shown "medium" eight places above a faster one shown "high".)"""
    return CONFIDENCE_ORDER.get(r.prediction.confidence, 3)


def _surest_overlapping(first: Row, pool: list[Row]) -> Row:
    """``first``, or the most certain row (then the fastest) of those more certain than it whose bands overlap its
    own, again until none is: a row just outside the tie of a faster, less certain one (its band short of that
    row's lower bound) is still within ``first``'s error, and more certain (a "medium" row ranked 8 places above a
    faster "high" one within its band, H200 24 GiB plan)."""
    while True:
        low, high = _bounds(first)
        surer = [r for r in pool if _confidence(r) < _confidence(first)
                 and _bounds(r)[1] >= low and _bounds(r)[0] <= high]
        if not surer:
            return first
        level = min(map(_confidence, surer))
        first = max((r for r in surer if _confidence(r) == level),
                    key=lambda r: (r.prediction.tokens_per_s, r.headroom_bytes))


def _rank(rows: list[Row]) -> list[Row]:
    """Fitting rows with a speed first, then fitting rows without one (least memory first), then the rest (least
    memory first). Among the fitting: repeatedly, the fastest predicted row and every row whose error band reaches
    its lower bound are a tie; the most confident level among them goes first, so a low-confidence row never stands
    above a confident one its uncertainty overlaps. Within that level the fastest predicted is next, unless others
    are within ``NEAR_TIE`` of it: then the larger headroom (a near-tie is inside any prediction's error; a wider
    window handed the pick to slow rows with room to spare: 12,276 tokens/s measured against 15,519 for the row it
    passed, 24 GiB plan on an H200, 2026-12-03)."""
    pool = sorted((r for r in rows if r.fits and r.prediction.tokens_per_s),
                  key=lambda r: (-r.prediction.tokens_per_s, r.prediction.peak_bytes))
    ranked: list[Row] = []
    while pool:
        floor = _bounds(pool[0])[0]
        tied = [r for r in pool if _bounds(r)[1] >= floor]
        level = min(_confidence(r) for r in tied)
        fastest = max((r for r in tied if _confidence(r) == level), key=lambda r: r.prediction.tokens_per_s)
        near = [r for r in tied if _confidence(r) == level
                and r.prediction.tokens_per_s >= (1 - NEAR_TIE) * fastest.prediction.tokens_per_s]
        first = _surest_overlapping(max(near, key=lambda r: (r.headroom_bytes, r.prediction.tokens_per_s)), pool)
        passed = [r for r in pool if r.prediction.tokens_per_s > first.prediction.tokens_per_s
                  and _confidence(r) > _confidence(first) and _bounds(r)[0] <= _bounds(first)[1]]
        if passed:
            first.tie = f"ranked above {len(passed)} less certain row(s) predicted faster, within its error"
        elif len(near) > 1:
            others = len(near) - 1
            first.tie = (f"tied with {others} other row{'s' if others > 1 else ''} as certain, within "
                         f"{NEAR_TIE:.0%}: ranked first for its headroom")
        ranked.append(first)
        pool.remove(first)
    unpriced = sorted((r for r in rows if r.fits and not r.prediction.tokens_per_s),
                      key=lambda r: r.prediction.peak_bytes)
    over = sorted((r for r in rows if not r.fits), key=lambda r: r.prediction.peak_bytes)
    return ranked + unpriced + over
