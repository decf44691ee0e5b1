"""The configurations a plan predicts for one model and shape: method (where several are allowed), checkpointing
(none, selective, full, and full on part of the layers), kernels, compile, micro-batch x gradient accumulation at
the same tokens per optimizer step, and every declared option with ``planner_values`` where it applies
(config/declarations.py: the compile mode with CUDA graphs, --lora-fused-projections, --fp8-base on GPUs with FP8
tensor cores). A new fast path becomes a candidate by its declaration alone.

A candidate is a set of train options (``flat``): the sweep YAML of the top K, ``--verify`` and the run's own
prediction all speak the same option names.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ftprof.config import RunConfig, declarations

POLICIES = ("none", "selective", "full")
KERNEL_SETS = ("eager", "liger")
PARTIAL_FRACTIONS = (0.25, 0.5, 0.75)  # full checkpointing on this share of the layers, besides the fewest that fit


@dataclass(frozen=True)
class Candidate:
    method: str
    checkpointing: str  # none | selective | full
    checkpoint_layers: int | None  # checkpointed decoder layers (None: all of them; only with full)
    kernels: str
    compile: bool
    batch_size: int  # micro-batch per GPU
    grad_accum: int
    options: tuple = ()  # (name, value) of the declared candidate options off their defaults, sorted

    def flat(self) -> dict:
        """The candidate as train options (RunConfig.from_flat names)."""
        out = asdict(self)
        del out["options"]
        out.update(self.options)
        if out["checkpoint_layers"] is None:
            del out["checkpoint_layers"]
        return out

    def option(self, name: str):
        """A declared option's value in this candidate (its default when the candidate leaves it)."""
        return dict(self.options).get(name, declarations.BY_NAME[name].default)

    def value(self, name: str):
        """Any option's value in this candidate: its own fields (checkpointing, kernels, ...) or a declared one."""
        return getattr(self, name) if name in FIELDS else self.option(name)

    def values(self) -> dict:
        """The option values the declarations read (config/declarations.py): its declared options and fields."""
        return {**dict(self.options), "method": self.method, "kernels": self.kernels, "compile": self.compile,
                "checkpointing": self.checkpointing, "checkpoint_layers": self.checkpoint_layers}

    def with_option(self, name: str, value=True) -> Candidate:
        """This candidate with a declared option set, the options sorted as of_config makes them."""
        return dataclasses.replace(self, options=tuple(sorted({**dict(self.options), name: value}.items())))

    def without(self, name: str) -> Candidate:
        """This candidate with a declared option back at its default."""
        return dataclasses.replace(self, options=tuple(o for o in self.options if o[0] != name))

    @property
    def label(self) -> str:
        ckpt = self.checkpointing if self.checkpoint_layers is None else \
            f"{self.checkpointing} x{self.checkpoint_layers}"
        parts = [self.method, f"ckpt {ckpt}", self.kernels]
        if self.compile:
            parts.append("compiled")
        parts += [declarations.BY_NAME[n].spell(v) for n, v in self.options]
        parts.append(f"{self.batch_size}x{self.grad_accum}")
        return " ".join(parts)


FIELDS = frozenset(f.name for f in dataclasses.fields(Candidate)) - {"options"}
REST = "selective_rest"  # the option whose words are the policy's (``policy_words``), not an option's


def policy_words(cand: Candidate, layer_count: int) -> str:
    """"full", "selective on 20 of 32 layers", "full on 6 of 32 layers, selective on the rest"."""
    if cand.checkpoint_layers is None:
        return cand.checkpointing
    words = f"{cand.checkpointing} on {cand.checkpoint_layers} of {layer_count} layers"
    return f"{words}, selective on the rest" if cand.option(REST) else words


def of_config(cfg: RunConfig) -> Candidate:
    """The candidate a run's configuration is (auto's policy left as the caller resolves it)."""
    m = cfg.model
    policy = m.checkpointing or ("full" if m.gradient_checkpointing else "none")
    layers = m.checkpoint_layers if policy in ("full", "selective") else None
    values = cfg.declared_values()
    options = tuple(sorted((d.name, values[d.name]) for d in declarations.DECLARED
                           if d.planner_values and d.name != "compile" and d.applies(values)
                           and values.get(d.name) is not None and values[d.name] != d.default))
    return Candidate(cfg.method.method, policy, layers, m.kernels, bool(m.compile), cfg.data.batch_size,
                     cfg.train.grad_accum, options)


def option_sets(method: str, kernels: str, compiled: bool, cuda: bool, capability: tuple | None,
                policy: str = "none", shards: bool = False, several: bool = False) -> list[tuple]:
    """Every combination of the declared candidate options for a (method, kernels, compile, checkpointing policy) on
    this target (``shards``: FSDP shards the model; ``several``: more than one process): the values each option
    applies with, combinations the declarations refuse or the planner avoids left out."""
    values = {"method": method, "kernels": kernels, "compile": compiled, "checkpointing": policy,
              declarations.SHARDED: shards, declarations.SEVERAL: several}
    choices = []
    for d in declarations.planner_options(values, capability if cuda else None):
        if ("cuda" if cuda else "cpu") not in d.planner_devices:
            continue
        tried = [v for v in d.planner_values if (cuda or not d.needs_cuda(v)) and not d.avoided(v, values)]
        choices.append([(d.name, v) for v in tried])
    out = []
    for combo in itertools.product(*choices):
        chosen = {**values, **dict(combo)}
        # (avoided again beside the combination's other options: --lean-recompute's beside --fp8-base, say)
        if declarations.problems(chosen) or any(declarations.BY_NAME[n].avoided(v, chosen) for n, v in combo):
            continue
        out.append(tuple(sorted((n, v) for n, v in combo if v != declarations.BY_NAME[n].default)))
    return list(dict.fromkeys(out))


def micro_batches(batch_size: int, grad_accum: int) -> list[tuple[int, int]]:
    """(micro-batch, accumulation) pairs with the same sequences per optimizer step, largest micro-batch first."""
    total = batch_size * grad_accum
    return [(b, total // b) for b in range(total, 0, -1) if total % b == 0]


def enumerate_candidates(methods: list[str], layer_count: int, batch_size: int, grad_accum: int,
                         kernel_sets: tuple[str, ...] = KERNEL_SETS, compile_options: tuple[bool, ...] = (False, True),
                         policies: tuple[str, ...] = POLICIES, cuda: bool = False,
                         capability: tuple | None = None, shards: bool = False,
                         several: bool = False) -> list[Candidate]:
    """Every combination worth predicting. Partial checkpointing (full on N of L layers) is listed at a few
    shares of the layers; ``plan`` adds the fewest layers that fit each budget on top. ``cuda``/``capability``:
    the target (options that need a CUDA device or FP8 tensor cores are tried only where the target has them, and
    options FSDP or several processes refuse only where they are not: ``shards``, ``several``)."""
    out: list[Candidate] = []
    for method in methods:
        for kernels in kernel_sets:
            for compiled in compile_options:
                for policy in policies:
                    layer_counts = [None] + (partial_layers(layer_count) if policy == "full" else [])
                    sets = option_sets(method, kernels, compiled, cuda, capability, policy, shards, several)
                    for micro, accum in micro_batches(batch_size, grad_accum):
                        for options in sets:
                            out += [Candidate(method, policy, layers, kernels, compiled, micro, accum, options)
                                    for layers in layer_counts]
    return out


def for_target(methods: list[str], layer_count: int, batch_size: int, grad_accum: int, cuda: bool,
               capability: tuple | None, pins: Mapping[str, Any], shards: bool = False,
               several: bool = False) -> list[Candidate]:
    """The candidates a plan predicts on its target (on the CPU: eager kernels, uncompiled, no CUDA-only option),
    pinned to the options the user gave (``pinned``)."""
    pool = enumerate_candidates(methods, layer_count, batch_size, grad_accum,
                                kernel_sets=KERNEL_SETS if cuda else ("eager",),
                                compile_options=(False, True) if cuda else (False,), cuda=cuda, capability=capability,
                                shards=shards, several=several)
    return pinned(pool, pins)


def pinned(pool: list[Candidate], pins: Mapping[str, Any]) -> list[Candidate]:
    """The candidates with each option of ``pins`` at its value: an option the plan chooses among, given on the
    command line, is the user's choice, and the plan compares the others. A pinned layer count is every full
    checkpointing candidate's (the pool lists partial checkpointing at a few shares of the layers only)."""
    layers = pins.get("checkpoint_layers")
    if layers is not None:
        pool = [dataclasses.replace(c, checkpoint_layers=layers) for c in pool if c.checkpointing == "full"]
        if pins.get(REST):  # (it needs the layer count: the pool never lists it)
            pool = [c.with_option(REST) for c in pool]
    return [c for c in dict.fromkeys(pool) if all(c.value(name) == value for name, value in pins.items())]


def pin_words(pins: Mapping[str, Any]) -> str:
    """The pinned options as flags: --checkpointing full --no-compile."""
    words = []
    for name, value in pins.items():
        flag = "--" + name.replace("_", "-")
        words.append(flag if value is True else f"--no-{flag[2:]}" if value is False else f"{flag} {value}")
    return " ".join(words)


def nothing_pinned(pins: Mapping[str, Any], methods: tuple[str, ...], target: str, cuda: bool,
                   capability: tuple | None) -> str:
    """The one line refusing pins that no candidate of the plan's target has, with why where it is the target's."""
    newer = [d for d in map(declarations.BY_NAME.get, pins) if d and d.min_capability and capability
             and tuple(capability) < d.min_capability]
    why = (" (on a CPU it tries eager kernels, uncompiled, without the options that need a GPU; plan for one with "
           "--gpu NAME)" if not cuda else f" ({newer[0].flag} needs compute capability "
           f"{'.'.join(map(str, newer[0].min_capability))}; the target has {'.'.join(map(str, capability))})"
           if newer else "")
    return (f"{pin_words(pins)}: ftprof plan tries no configuration of {', '.join(methods)} on {target} with "
            f"{'that' if len(pins) == 1 else 'those together'}{why}; leave {'it' if len(pins) == 1 else 'some'} "
            "out, and the plan compares every value")


def partial_layers(layer_count: int) -> list[int]:
    """A few partial layer counts (1 .. L-1), without repeats."""
    counts = {max(1, min(layer_count - 1, round(f * layer_count))) for f in PARTIAL_FRACTIONS}
    return sorted(c for c in counts if 0 < c < layer_count)
