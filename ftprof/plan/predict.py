"""A candidate -> its Prediction (result.json's ``prediction`` record): the one entry point for ``ftprof plan``,
``--checkpointing auto``, ``--memory-limit-gib`` and the prediction every run records.

Memory: the probe's parts (probe.py) by the memory model (memory.py), activations times the calibration's factor
for the run's class. Speed: FLOPs per token (speed.py) over the calibrated rate of the target GPU
(calibration.py); None where nothing calibrates that GPU, and the record says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ftprof import metrics
from ftprof.config import RunConfig, declarations
from ftprof.plan import calibration, host, memory, speed
from ftprof.plan.candidates import Candidate
from ftprof.plan.probe import ProbeResult, probe
from ftprof.results.parts import Prediction


@dataclass(frozen=True)
class Target:
    """What a prediction is for: the GPU by the name torch gives it ("cpu" on CPU), how many of them and whether
    FSDP2 shards the model over them."""

    device_name: str
    world_size: int = 1
    shards: bool = False
    capability: tuple | None = None  # CUDA compute capability (None: the CPU, or not known)


def option_costs(cand: Candidate, kept_share: float = 1.0) -> float:
    """What the candidate's options measured costing (their declarations' ``speed_cost``), as a factor on tokens/s:
    priced so where the calibration has no run of the candidate's own options to rate it by. ``kept_share``: the
    share of the layers that keep their activations, where an option's cost is paid (``kept_layers_only``)."""
    factor = 1.0
    for name, value in cand.options:
        declared = declarations.BY_NAME.get(name)
        if declared is not None and declared.speed_cost and declarations.is_on(value):
            factor *= 1.0 - declared.speed_cost * (kept_share if declared.kept_layers_only else 1.0)
    return factor


# Below this share of the calibrated GPU model's speed a prediction is at the host's edge (host.tokens_per_s): it
# says so and widens its error band.
HOST_EDGE = 0.97


@dataclass
class Planner:
    """Predictions for one model and shape (a resolved RunConfig, its model source and dtype) on one target."""

    cfg: RunConfig
    source: object  # ftprof.models.source.ModelSource
    dtype: str
    target: Target
    records: list = field(default_factory=list)  # the calibration store's records, read once
    probes: dict = field(default_factory=dict)  # method -> ProbeResult, measured (or read from the cache) once
    calibrate_memory: bool = True  # False: the probe's activations as they are (deriving the calibration itself)

    def probe(self, method: str) -> ProbeResult:
        if method not in self.probes:
            cfg = dataclasses.replace(self.cfg, method=self.cfg.method.for_method(method, self.dtype, preset=True))
            self.probes[method] = probe(cfg, self.source, self.dtype)
        return self.probes[method]

    def predict(self, cand: Candidate) -> Prediction:
        result = self.probe(cand.method)
        key = calibration.ClassKey(cand.method, cand.checkpointing, cand.kernels, cand.compile,
                                   calibration.speed_class_options(cand.values()))
        # Speed-class options save what the base class saves (FP8 base matmuls: neither keeps its input for a frozen
        # weight, 44.00 against 43.99 GiB allocated, QLoRA on an H200): the base class's activation factor serves
        micro_tokens = cand.batch_size * self.cfg.data.seq_len
        at = calibration.Shape(self.cfg.model.model, self.cfg.data.seq_len, micro_tokens, cand.checkpoint_layers)
        factor = self.factor(key.base, at)
        # Partial checkpointing: the layers left unchecked save what none saves (selective under --selective-rest),
        # calibrated as that policy is.
        rest = self.factor(dataclasses.replace(key.base, policy=memory.rest_policy(cand)), dataclasses.replace(
            at, checkpointed_layers=None)) if cand.checkpoint_layers else factor
        mem = memory.predict_memory(result, cand, self.shape(cand), factor.activation_ratio, rest.activation_ratio)
        flops = speed.flops_per_token(result, cand, self.cfg.data.seq_len, self.attn_dim)
        rate = self.rate(key, flops.model, micro_tokens, dict(cand.options))
        if rate and cand.checkpointing == "selective" and cand.checkpoint_layers:
            rate = self._partial_selective(rate, key, cand, flops.model, micro_tokens)
        if memory.rest_policy(cand) == "selective" and not (rate and not rate.stand_in):
            rate = self._selective_rest(key, cand, flops, micro_tokens) or rate
        band = speed.error_band(rate, micro_tokens) if rate else None
        spread = speed.spread(rate, micro_tokens) if rate else None
        measured_at = (rate.micro_batch_tokens or micro_tokens) if rate else 0  # (before the move)
        rate = speed.at_micro_batch(rate, micro_tokens, cand.compile) if rate else None
        rate = speed.capped(rate, metrics.peak_flops(self.target.device_name), bool(cand.option("fp8_base")))
        tps = speed.tokens_per_s(flops, rate.flops_per_s, self.target.world_size) if rate else None
        if tps is not None and not rate.knobs_matched:
            tps *= option_costs(cand, memory.kept_layers(result.layers, cand) / max(1, result.layers))
        floor = self.floor(key, cand) if rate else None
        if tps is not None and floor is not None:
            gpu_tps, tps = tps, host.tokens_per_s(tps, floor, micro_tokens, self.target.world_size, measured_at)
            if tps < gpu_tps * HOST_EDGE:  # at or near the host's edge: say so, where the floor came from, and how
                # much less certain it is
                where = "host-bound" if floor.seconds * gpu_tps >= micro_tokens * self.target.world_size \
                    else "at the host's edge"
                rate = dataclasses.replace(rate, source=f"{rate.source}; {where} at {micro_tokens:,} tokens per "
                                                        f"micro-batch: {floor.source}")
                band, spread = band + speed.BAND_HOST_BOUND, spread + speed.BAND_HOST_BOUND
        return Prediction(
            peak_bytes=mem.peak_bytes, static_bytes=mem.static_bytes, gradient_bytes=mem.gradients,
            activation_bytes=mem.activation_bytes,
            activation_factor=mem.activation_factor, transient_bytes=mem.transient_bytes, tokens_per_s=tps,
            memory_source=_memory_source(result, factor), speed_source=rate.source if rate else no_rate_words(
                key, self.target.device_name, self.records),
            device=self.target.device_name, candidate={**cand.flat(), "seq_len": self.cfg.data.seq_len},
            tokens_per_s_error=None if band is None else round(band, 3),
            confidence="" if band is None else speed.confidence(band),
            tokens_per_s_spread=None if spread is None else round(spread, 3))

    def floor(self, key, cand: Candidate):
        """The host floor per micro-batch (plan/host.py), no higher than a run of the candidate's own family
        measured."""
        args = (self.target.device_name, key)
        rest = (cand.checkpoint_layers, cand.option("compile_mode"), dict(cand.options))
        floor = host.host_floor(*args, self.layer_count, self.records, *rest)
        return host.bounded(floor, host.measured_ceiling(*args, self.cfg.model.model, self.layer_count,
                                                         self.records, *rest))

    def rate(self, key, flops_per_token: float, micro_tokens: int, knobs: dict | None = None):
        """The class's calibrated rate; for none or full without one, the other's per executed FLOP: the rate
        counts recomputation, and the two differ by 3.5% on an H200 (llama-8b LoRA compiled: 605 against 584
        TFLOP/s). Selective's elementwise recomputation is no counted FLOP (15,549 tokens/s against none's 16,794
        for compiled QLoRA): without a run of its class, selective stands in as a class that has both runs has it,
        relative to none (``_selective_stand_in``)."""
        rate = self._calibrated(key, flops_per_token, micro_tokens, knobs)
        if rate is not None:
            return rate
        if key.policy == "selective":
            return self._selective_stand_in(key, flops_per_token, micro_tokens, knobs)
        other = dataclasses.replace(key, policy="full" if key.policy == "none" else "none")
        rate = self._calibrated(other, flops_per_token, micro_tokens, knobs)
        if rate is None:
            return self._twin_stand_in(key, flops_per_token, micro_tokens, knobs)
        return dataclasses.replace(rate, stand_in=True, source=f"{rate.source}; no {key.describe()} run: "
                                                               f"{other.policy}'s rate per executed FLOP")

    def _calibrated(self, key, flops_per_token: float, micro_tokens: int, knobs: dict | None):
        """The rate runs of class ``key`` measured on the target's GPU (the store's, else the shipped), no stand-in."""
        return calibration.speed_rate(self.target.device_name, key, flops_per_token, micro_tokens,
                                      records=self.records, knobs=knobs, world_size=self.target.world_size)

    def _partial_selective(self, rate, key, cand: Candidate, flops_per_token: float, micro_tokens: int):
        """Selective checkpointing on N of L layers: N layers at selective's rate, the rest at none's. Neither rate
        counts selective's recomputation (elementwise ops, no FLOPs counted), so unlike partial full checkpointing
        the FLOPs alone cannot tell N layers from L; each layer's time is its policy's, added."""
        none = self.rate(dataclasses.replace(key, policy="none"), flops_per_token, micro_tokens, dict(cand.options))
        if none is None or none.flops_per_s <= rate.flops_per_s or cand.checkpoint_layers >= self.layer_count:
            return rate
        share = cand.checkpoint_layers / self.layer_count
        flops_per_s = _mixed_rate([(share, rate.flops_per_s), (1 - share, none.flops_per_s)])
        return dataclasses.replace(rate, flops_per_s=flops_per_s, source=f"{rate.source}; on {cand.checkpoint_layers}"
                                   f" of {self.layer_count} layers, the rest at none's rate ({none.source})")

    def _selective_rest(self, key, cand: Candidate, flops: speed.FlopsPerToken, micro_tokens: int):
        """Full checkpointing on N of L layers, selective on the rest (--selective-rest), before a run of its own
        class is measured: the N layers' share of the model FLOPs and all the recomputation at full's rate, the rest
        at selective's (each layer's time is its policy's, added, as ``_partial_selective`` adds them). Neither rate
        was measured with this option: the prediction says so (its band widens as for an unmatched option)."""
        plain = dataclasses.replace(key, options=tuple(o for o in key.options if o[0] != "selective_rest"))
        knobs = {k: v for k, v in cand.options if k != "selective_rest"}
        full = self.rate(plain, flops.model, micro_tokens, knobs)
        selective = self.rate(dataclasses.replace(plain, policy="selective"), flops.model, micro_tokens, knobs)
        if full is None or selective is None:
            return None
        share = cand.checkpoint_layers / self.layer_count
        flops_per_s = _mixed_rate([(share * flops.model + flops.recomputed, full.flops_per_s),
                                   ((1 - share) * flops.model, selective.flops_per_s)])
        return dataclasses.replace(full, flops_per_s=flops_per_s, knobs_matched=False,
                                   stand_in=full.stand_in or selective.stand_in,
                                   source=f"{full.source}; full on {cand.checkpoint_layers} of {self.layer_count} "
                                          f"layers, the rest at selective's rate ({selective.source})")

    def _twin_stand_in(self, key, flops_per_token: float, micro_tokens: int, knobs: dict | None):
        """A class measured only as a twin that differs in one way (the other kernel set, compiled or not, with or
        without CUDA graphs, another adapter method): the twin's rate times what that difference does where both
        sides were measured (``_twins``). Liger + FP8 + CUDA graphs, say, from eager + FP8 + CUDA graphs times Liger
        against eager; uncompiled FP8 from compiled FP8 times uncompiled against compiled in 16 bits."""
        for twin_key, mine_key, theirs_key, words in _twins(key):
            twin, mine, theirs = (self._calibrated(k, flops_per_token, micro_tokens, knobs)
                                  for k in (twin_key, mine_key, theirs_key))
            if twin is not None and mine is not None and theirs is not None:
                share = mine.flops_per_s / theirs.flops_per_s
                return dataclasses.replace(twin, flops_per_s=twin.flops_per_s * share, stand_in=True,
                                           source=f"{twin.source}; no {key.describe()} run: x{share:.2f}, {words}")
        return None

    def _selective_stand_in(self, key, flops_per_token: float, micro_tokens: int, knobs: dict | None):
        """This class's none rate times selective / none of the nearest class that has both
        (``_selective_references``)."""
        none = self.rate(dataclasses.replace(key, policy="none"), flops_per_token, micro_tokens, knobs)
        if none is None:
            return None
        for other in _selective_references(key):
            selective, base = (self._calibrated(k, flops_per_token, micro_tokens, knobs)
                               for k in (other, dataclasses.replace(other, policy="none")))
            if selective is not None and base is not None:
                # at most none's: the pair's none may be an older, slower measurement than its selective (x1.05
                # for QLoRA compiled with Liger, none measured before prefetching), and selective does what none does
                share = min(1.0, selective.flops_per_s / base.flops_per_s)
                return dataclasses.replace(
                    none, flops_per_s=none.flops_per_s * share, stand_in=True,
                    source=f"{none.source}; no {key.describe()} run: x{share:.2f}, selective against none for "
                           f"{other.describe()}")
        return None

    def factor(self, key, at: calibration.Shape | None = None) -> calibration.Factor:
        """measured / probed activations for runs of this class on a GPU; a CPU run saves what the probe saw."""
        if not self.calibrate_memory:
            return calibration.Factor(1.0, "probe (uncalibrated)", 0)
        if self.target.device_name == "cpu":
            return calibration.Factor(1.0, "probe (a CPU run saves what the CPU probe measures)", 0)
        return calibration.activation_factor(key, records=self.records, at=at)

    def shape(self, cand: Candidate) -> memory.Shape:
        from ftprof.runtime import torch_dtype

        m, config = self.cfg.method, self.source.config
        fp8 = bool(cand.option("fp8_base")) and cand.method in ("lora", "qlora")
        return memory.Shape(self.cfg.data.seq_len, config.vocab_size, self.target.world_size,
                            self.target.shards, m.gptq_bits or 4, m.gptq_group_size or 128,
                            m.keep_dequantized is not False and not fp8, m.double_quant is not False,
                            config.hidden_size * torch_dtype(self.dtype).itemsize, bool(self.cfg.model.compile_loss),
                            torch_dtype(self.dtype).itemsize, fp8,
                            config.hidden_size * torch_dtype(self.dtype).itemsize, self.host_embedding_bytes,
                            (getattr(config, "intermediate_size", 0) or 0) * torch_dtype(self.dtype).itemsize,
                            2 * config.hidden_size * torch_dtype(self.dtype).itemsize if m.fused_a_runs() else 0)

    @property
    def host_embedding_bytes(self) -> int:
        """What --offload-embeddings takes off the device: the input table in the run dtype, unless the output layer
        shares it (models/host_embedding.py)."""
        from ftprof.runtime import torch_dtype

        config = self.source.config
        if getattr(config, "tie_word_embeddings", False):
            return 0
        return config.vocab_size * config.hidden_size * torch_dtype(self.dtype).itemsize

    @property
    def attn_dim(self) -> int:
        from ftprof.metrics import attention_dims

        return attention_dims(self.source.config)[1]

    @property
    def layer_count(self) -> int:
        return self.source.config.num_hidden_layers


def _mixed_rate(parts: list[tuple[float, float]]) -> float:
    """The FLOP/s of layers that run at different rates: each part's (FLOPs, FLOP/s), their times added."""
    return sum(flops for flops, _ in parts) / sum(flops / rate for flops, rate in parts)


GRAPHS = ("compile_mode", "reduce-overhead")  # the speed-class option CUDA graphs are
ADAPTERS = ("qlora", "lora")  # methods whose options' effects stand in for each other's (and GPTQ-LoRA's)


def _twins(key) -> list[tuple]:
    """(twin, mine, theirs, words) for each one-way difference a class may stand in across: the twin is ``key``
    changed that way, and mine / theirs is what the change does to the class without the options (for a class
    without options: to the same class of another adapter method)."""
    kernels = "eager" if key.kernels == "liger" else "liger"
    changes = [lambda k: dataclasses.replace(k, kernels=kernels)]
    if "compile_mode" not in dict(key.options):  # compiled or not (a CUDA-graph mode needs compile)
        changes.append(lambda k: dataclasses.replace(k, compile=not k.compile))
    if key.options:
        if key.compile and dict(key.options).get("compile_mode") in (None, GRAPHS[1]):
            changes.append(_graphs_toggled)
        out = [(change(key), key.base, change(key.base)) for change in changes]
        if key.method in (*ADAPTERS, "gptq-lora"):  # the options' effect as another adapter method measured it
            out += [(dataclasses.replace(key, method=m), key.base, dataclasses.replace(key.base, method=m))
                    for m in ADAPTERS if m != key.method]
    elif key.method in (*ADAPTERS, "gptq-lora"):
        out = [(change(key), dataclasses.replace(key, method=m), dataclasses.replace(change(key), method=m))
               for m in ADAPTERS if m != key.method for change in changes]
    else:
        return []
    return [(twin, mine, theirs, f"{mine.describe()} against {theirs.describe()}") for twin, mine, theirs in out]


def _graphs_toggled(key):
    """``key`` with CUDA graphs if it has none, without if it has."""
    if GRAPHS in key.options:
        return dataclasses.replace(key, options=tuple(o for o in key.options if o != GRAPHS))
    return dataclasses.replace(key, options=tuple(sorted((*key.options, GRAPHS))))


def _selective_references(key) -> list:
    """The classes whose selective / none ratio may stand in for ``key``'s, nearest first: its own without options,
    then the other kernel set compiled alike (what selective costs differs most with compile: 0.93 of none's rate
    compiled, 0.82 uncompiled with Liger, llama-8b QLoRA on an H200), then the same kernels the other way, then the
    same four for the other adapter methods (LoRA, QLoRA and GPTQ-LoRA save and recompute the same ops)."""
    other_kernels = "eager" if key.kernels == "liger" else "liger"
    pairs = ((key.kernels, key.compile), (other_kernels, key.compile), (key.kernels, not key.compile),
             (other_kernels, not key.compile))
    methods = [key.method, *(m for m in ("qlora", "lora", "gptq-lora") if m != key.method and key.method != "full")]
    refs = [dataclasses.replace(key, method=m, kernels=k, compile=c, options=()) for m in methods for k, c in pairs]
    return [r for r in refs if r != key]


def planner(cfg: RunConfig, source, dtype: str, target: Target, records: list[dict] | None = None) -> Planner:
    """A planner calibrated from ftprof's own runs among ``records`` (default: the store's)."""
    return Planner(cfg, source, dtype, target, calibration.own_records(records))


def no_rate_words(key, device_name: str, records: list[dict]) -> str:
    """Why a row has no speed: its GPU has no calibration at all, or none of its kind of run (and no stand-in)."""
    calibrated = calibration.device_calibrated(device_name, records)
    if not calibrated:
        return f"no calibration for {device_name}: run ftprof on it once, or plan with --gpu"
    return (f"no run of this kind ({key.describe()}) on {device_name} nor one to stand in for it: run it once "
            "(ftprof train with these options) to price it")


def _memory_source(result: ProbeResult, factor) -> str:
    probed = f"2-layer probe of {result.probed_as}"
    if factor.runs == 0:
        return f"{probed}; {factor.source}"
    return f"{probed} x {factor.activation_ratio:.2f} on activations ({factor.source})"


def run_target(cfg: RunConfig, device, shards: bool) -> Target:
    """The target of a run on this machine: its own GPU (or the CPU), its processes."""
    name, capability = "cpu", None
    if device.type == "cuda":
        import torch

        name, capability = torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device))
    return Target(name, cfg.distributed.world_size, shards, capability)
