"""One declaration per option that changes how a run computes (fast paths, numerics, what is saved): where it
applies, what it needs and excludes, what it changes, how it is spelled. Everything that asks what such an option
means reads it here:

- config validation (``problems``): an option given where it cannot apply, without what it needs, or beside what
  it excludes is refused in one line;
- the effective configuration (ftprof/results/effective.py): where an option does not apply or does nothing, it
  is dropped, so it never tells two runs apart;
- the planner (ftprof/plan): its candidates try ``planner_values`` where the option applies (the target GPU's
  capability included), its calibration keys (``calibration_defaults``, ``activation_options``, speed classes) and
  its probe cache key (``probe_options``) come from here;
- report labels (ftprof/results/labels.py): ``spell``.

Adding a fast path: its field in config/model.py or config/method.py, its declaration here, its code, its tests.

No torch, no pandas: the CLI validates before anything heavy loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ftprof.config.options import CUDA_GRAPH_MODES, LORA_METHODS, METHODS
from ftprof.metrics import some_layers_keep

ON = "on"  # in ``When.values``: any value that is on (True, or a set non-empty value)
# What an option can change. "activations": what autograd saves (the planner's activation factor is calibrated per
# value); "weights": what stays resident (the planner sizes it from layouts); "numerics": the arithmetic.
EFFECTS = frozenset({"speed", "activations", "weights", "numerics"})
# Derived facts the checks read beside the options (RunConfig.declared_values computes them).
SHARDED = "fsdp_shards"  # FSDP shards the model: --parallel fsdp over several processes or with CPU offload
SEVERAL = "several_processes"  # more than one training process (DDP or FSDP over several GPUs)
METHOD_NAMES = {"full": "full", "lora": "LoRA", "qlora": "QLoRA", "gptq-lora": "GPTQ-LoRA"}


def holds_all(when, values: Mapping[str, Any]) -> bool:
    """A planner_avoid condition: one When, or a tuple of them that must all hold."""
    return all(w.holds(values) for w in when) if isinstance(when, tuple) else when.holds(values)


def is_on(value: Any) -> bool:
    return value is not None and value is not False and value != "" and value != 0


@dataclass(frozen=True)
class When:
    """A condition on another option: it holds where ``option``'s value is one of ``values`` (ON: any on value)."""

    option: str
    values: tuple

    def holds(self, values: Mapping[str, Any]) -> bool:
        value = values.get(self.option)
        return (ON in self.values and is_on(value)) or value in self.values


@dataclass(frozen=True)
class Excludes:
    """Another option this one cannot run beside. ``message`` takes {flag} (this option, with its value when it is
    not a yes/no) and {other} (the other's flag)."""

    when: When
    message: str


@dataclass(frozen=True)
class Declared:
    name: str  # the config field (the flag is --name-with-dashes)
    section: str  # the RunConfig section holding it: "method" or "model" (or "data")
    effects: frozenset  # of EFFECTS
    default: Any  # the value a run takes when it is not given, as runs today: the calibration's baseline
    methods: tuple = METHODS  # the methods it applies to
    needs: tuple = ()  # When's that must hold for it to apply (e.g. compile's options need --compile)
    void_when: tuple = ()  # When's under which it applies but does nothing (dropped, never refused)
    excludes: tuple = ()  # Excludes: refused beside these
    refuse: frozenset = frozenset()  # "methods", "needs": given (off its default) where those fail -> refused
    cuda_values: tuple = ()  # values that need a CUDA device (ON: any value that is on)
    min_capability: tuple | None = None  # CUDA compute capability it needs when on
    word: str = ""  # its label word (report labels, the plan's rows); default: the name
    planner_values: tuple = ()  # the values the planner tries where it applies (empty: not a candidate option)
    planner_devices: tuple = ("cuda", "cpu")  # where the planner tries it (an option that only moves GPU memory: cuda)
    # (When or a tuple of Whens, value): a value the planner does not try where the When holds (all of them): measured
    # bad, or doing nothing there
    planner_avoid: tuple = ()
    speed_class: bool = False  # runs with it on are calibrated apart (their rate differs by more than knobs' do)
    host_work: bool = False  # on, it adds host work per micro-batch: host floors are calibrated apart (plan/host.py)
    family: str = ""  # how a refusal names the methods it belongs to ("a lora option"); default: the methods
    unprobed: bool = False  # the planner's probe is built without it: its saving is computed (plan/memory.py)
    # the share of tokens/s it measured lost, priced where no run of it is in the calibration (plan/predict.py)
    speed_cost: float = 0.0
    # it acts in the layers that keep their activations alone (metrics.keeping_layers): the planner does not try it
    # where none does, and prices its cost (measured with every layer keeping them) by their share of the layers
    kept_layers_only: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def applies(self, values: Mapping[str, Any]) -> bool:
        """Whether the option does something in a run of these option values."""
        return (values.get("method") in self.methods and all(w.holds(values) for w in self.needs)
                and not any(w.holds(values) for w in self.void_when))

    def spell(self, value: Any) -> str:
        """One value as a label word: fp8 / no-fp8; compile-reduce-overhead."""
        word = self.word or self.name
        if isinstance(value, bool):
            return word if value else f"no-{word}"
        return f"{word}-{value}"

    def avoided(self, value: Any, values: Mapping[str, Any]) -> bool:
        """Whether the planner does not try ``value`` among these option values (``planner_avoid``)."""
        if self.kept_layers_only and is_on(value) and not some_layers_keep(
                values.get("checkpointing"), values.get("checkpoint_layers"), bool(values.get("selective_rest"))):
            return True
        return any(value == avoid and holds_all(when, values) for when, avoid in self.planner_avoid)

    def needs_cuda(self, value: Any) -> bool:
        return (ON in self.cuda_values and is_on(value)) or value in self.cuda_values


_COMPILED = When("compile", (True,))
_BASE = "each decide how the base weights are multiplied: pick one"
_ADAPTER = "each replace PEFT's adapter forward: pick one"
_DEQUANT = "each dequantize the 4-bit weights: pick one"
DECLARED: tuple[Declared, ...] = (
    Declared("dtype", "model", frozenset({"speed", "activations", "weights", "numerics"}), "bfloat16", word="dtype"),
    Declared("sdpa_backend", "model", frozenset({"speed"}), "auto", word="attn",
             void_when=(When("attn_implementation", ("eager", "flash_attention_2")),)),
    Declared("prefetch", "data", frozenset({"speed"}), True),
    Declared("compile", "model", frozenset({"speed", "activations"}), False, word="compile",
             planner_values=(False, True)),
    Declared("compile_mode", "model", frozenset({"speed"}), "default", needs=(_COMPILED,),
             refuse=frozenset({"needs"}), cuda_values=CUDA_GRAPH_MODES, word="compile",
             planner_values=("default", "reduce-overhead"),  # reduce-overhead: CUDA graphs
             # a class of its own: CUDA graphs take the host off the step (1 x 4 QLoRA, H200: 16,632 tokens/s with
             # them; the default mode's rate stood in for them and the reverse, 2026-12-03)
             speed_class=True,
             # CUDA graphs under full or selective checkpointing: 9,268 tokens/s against 20,917 without (QLoRA,
             # H200, 2026-12-02), and QLoRA + --fp8-base + full aborted ("invalid device pointer", 2026-12-03)
             # (with micro-batches accumulating they once failed in the first step: autograd adopted a graph output
             # as .grad, which the next replay overwrote; engine/loop._own_gradients gives gradients their own buffers)
             planner_avoid=((When("checkpointing", ("full", "selective")), "reduce-overhead"),)),
    Declared("compile_loss", "model", frozenset({"speed", "activations"}), True, needs=(_COMPILED,),
             void_when=(When("kernels", ("liger",)),)),  # Liger computes the loss itself
    Declared("compile_dequant", "model", frozenset({"speed", "activations"}), False, methods=("qlora",),
             needs=(_COMPILED,), refuse=frozenset({"needs"}),
             excludes=(Excludes(When("fp8_base", (ON,)), "{flag} and {other} " + _DEQUANT),
                       Excludes(When("dequant_kernel", ("triton",)), "{flag} and {other} triton " + _DEQUANT))),
    Declared("compile_tuning", "model", frozenset({"speed"}), False, needs=(_COMPILED,),
             refuse=frozenset({"needs"})),
    Declared("lora_addmm", "method", frozenset({"speed", "activations"}), False, methods=LORA_METHODS, family="lora",
             refuse=frozenset({"methods"}),
             excludes=(Excludes(When("lora_fused_a", (ON,)), "{flag} and {other} " + _ADAPTER),
                       Excludes(When("lora_fused_projections", (ON,)), "{flag} and {other} " + _ADAPTER))),
    Declared("lora_fused_a", "method", frozenset({"speed", "activations"}), True, methods=LORA_METHODS, family="lora",
             refuse=frozenset({"methods"})),
    # the SwiGLU product (models/lean_mlp.py) and the norms' outputs (models/lean_norm.py) formed again in backward
    # rather than kept: memory saved only where a layer keeps its activations, so the planner leaves them off where
    # every layer is full-checkpointed (and the engine applies them to the layers that keep their activations
    # alone). Measured on an H200 with their Triton kernels (llama-8b QLoRA 4 x 2048, Liger, CUDA graphs, no
    # checkpointing, round 30): the product 40.85 -> 33.85 GiB, -1.1% tokens/s; both 29.91 GiB, -2.3%
    Declared("lean_activations", "method", frozenset({"speed", "activations"}), False, methods=LORA_METHODS,
             family="lora", refuse=frozenset({"methods"}), word="lean-act", planner_values=(False, True), unprobed=True,
             speed_cost=0.011, kept_layers_only=True,
             excludes=(Excludes(When("lora_addmm", (ON,)), "{flag} and {other} " + _ADAPTER),)),
    Declared("lean_norms", "method", frozenset({"speed", "activations"}), False, methods=LORA_METHODS,
             family="lora", refuse=frozenset({"methods"}), word="lean-norm", planner_values=(False, True),
             unprobed=True, speed_cost=0.012, kept_layers_only=True,
             # the norm hands its A slices to the group's shared A matmul, which joined projections do not take
             void_when=(When("lora_fused_a", (False,)), When("lora_fused_projections", (True,))),
             excludes=(Excludes(When("lora_addmm", (ON,)), "{flag} and {other} " + _ADAPTER),)),
    # GPTQ-LoRA's quantized bases keep their own kernels: its projections are not joined
    Declared("lora_fused_projections", "method", frozenset({"speed"}), False, methods=("lora", "qlora"),
             refuse=frozenset({"methods"}), word="fused-proj", planner_values=(False, True),
             excludes=(Excludes(When(SHARDED, (True,)), "{flag} joins base weights into one buffer, which FSDP "
                                "cannot shard per parameter: use --parallel ddp or leave it off"),)),
    Declared("fp8_base", "method", frozenset({"speed", "weights", "numerics"}), False, methods=("lora", "qlora"),
             refuse=frozenset({"methods"}), min_capability=(8, 9), word="fp8", planner_values=(False, True),
             speed_class=True,
             excludes=(Excludes(When("lora_fused_projections", (ON,)), "{flag} and {other} " + _BASE),
                       Excludes(When("kbit_prepare", (ON,)), "{flag} and {other} " + _BASE),
                       Excludes(When("keep_dequantized", (True,)), "{flag} and {other} " + _BASE),
                       Excludes(When(SHARDED, (True,)), "{flag} keeps e4m3 copies of whole base weights, which FSDP "
                                "shards: use --parallel ddp or leave it off"))),
    Declared("kbit_prepare", "method", frozenset({"speed", "activations", "numerics"}), False,
             methods=("qlora", "gptq-lora"), family="quantized-base", refuse=frozenset({"methods"})),
    # what full checkpointing's recomputation keeps: nothing to keep under another policy
    Declared("keep_dequantized", "method", frozenset({"activations"}), True, methods=("qlora",),
             family="bitsandbytes", refuse=frozenset({"methods"}),
             void_when=(When("checkpointing", ("none", "selective", "auto", None)),)),
    Declared("dequant_kernel", "method", frozenset({"speed"}), "triton", methods=("qlora",), family="bitsandbytes",
             refuse=frozenset({"methods"})),
    # full checkpointing on the first --checkpoint-layers, selective on the rest (models/checkpointing.py): a class of
    # its own, priced until it is measured as its layers' policies' rates combined (plan/predict.py)
    Declared("selective_rest", "model", frozenset({"speed", "activations"}), False,
             needs=(When("checkpointing", ("full",)), When("checkpoint_layers", (ON,))), refuse=frozenset({"needs"}),
             word="selective-rest", planner_values=(False, True), speed_class=True),
    # full checkpointing's recomputation without the output projection's base matmul (models/recompute.py): fewer
    # recomputed FLOPs, priced as such (plan/speed.py)
    Declared("lean_recompute", "model", frozenset({"speed"}), False, methods=("lora", "qlora"),
             needs=(When("checkpointing", ("full", "selective", "auto")),), refuse=frozenset({"needs"}),
             word="lean-recompute", planner_values=(False, True),
             # compiled selective checkpointing never kept the projection's output: the same run, a second row.
             # Under --fp8-base the skipped matmul is an e4m3 one (half the time a FLOP) run as an opaque op: llama-8b
             # QLoRA, full checkpointing, both host offloads, 4 x 2048, H100: 14,046 tokens/s with it (p50 +1.6%,
             # p90/p50 1.19), 14,180 without, priced +5.8% (2026-12-05); 16 bits there: +5.7%, priced +6.2%
             planner_avoid=(((When("checkpointing", ("selective",)), When("compile", (True,))), True),
                            (When("fp8_base", (True,)), True)),
             excludes=(Excludes(When("method", ("full", "gptq-lora")), "{flag} is a LoRA and QLoRA option (a full "
                                "fine-tune trains the weight it would leave out, GPTQ-LoRA's kernels are their own): "
                                "leave it off with methods 'full' and 'gptq-lora'"),
                       Excludes(When(SHARDED, (True,)), "{flag} is not tried under FSDP, which gathers each layer's "
                                "weights around its forward: use --parallel ddp or leave it off"))),
    # full checkpointing's saved layer inputs held in pinned host memory (models/offload.py)
    Declared("offload_checkpoints", "model", frozenset({"speed", "activations"}), False,
             needs=(When("checkpointing", ("full",)),), refuse=frozenset({"needs"}), word="offload",
             planner_values=(False, True), planner_devices=("cuda",),  # on the CPU the offload is a plain copy
             excludes=(Excludes(When(SHARDED, (True,)), "{flag} is not tried under FSDP, whose hooks gather and free "
                                "each layer's weights around it: use --parallel ddp or leave it off"),
                       Excludes(When("compile_mode", CUDA_GRAPH_MODES),
                                "{flag} copies on a side stream, outside the CUDA graphs of {other} reduce-overhead "
                                "and max-autotune: use --compile-mode default or max-autotune-no-cudagraphs"))),
    # the frozen input embedding table in host memory, each micro-batch's rows gathered there (models/host_embedding.py)
    Declared("offload_embeddings", "model", frozenset({"speed", "weights"}), False, methods=LORA_METHODS,
             word="host-embed", planner_values=(False, True),
             planner_devices=("cuda",),  # on the CPU the table is in host memory already
             # each micro-batch's rows gathered on the host: 12,118 tokens/s with it, 13,405 without (llama-8b QLoRA,
             # CUDA graphs, FP8, 1 x 8 x 1,024 tokens, H200)
             host_work=True,
             excludes=(Excludes(When("method", ("full",)), "{flag} is a LoRA, QLoRA and GPTQ-LoRA option (a full "
                                "fine-tune trains the embedding table): leave it off with method 'full'"),
                       Excludes(When(SEVERAL, (True,)), "{flag} keeps one process's table in host memory: not tried "
                                "with several processes (DDP and FSDP sync or shard every weight); leave it off"))),
)
BY_NAME: dict[str, Declared] = {d.name: d for d in DECLARED}


def declared(name: str) -> Declared | None:
    return BY_NAME.get(name)


def methods_label(methods: tuple) -> str:
    """("lora", "qlora") -> "LoRA and QLoRA"."""
    names = [METHOD_NAMES.get(m, m) for m in methods]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _flag_with_value(d: Declared, value: Any) -> str:
    return d.flag if isinstance(value, bool) or value is None else f"{d.flag} {value}"


def _other_flag(name: str) -> str:
    derived = {SHARDED: "FSDP", SEVERAL: "several processes"}
    return derived.get(name, "--" + name.replace("_", "-"))


def _needed(when: When) -> str:
    """--compile; --checkpointing full."""
    values = [str(v) for v in when.values if v not in (ON, True, None)]
    return _other_flag(when.option) + (f" {' or '.join(values)}" if values else "")


def problems(values: Mapping[str, Any], sections: tuple[str, ...] | None = None) -> list[str]:
    """One line per refused combination among ``values`` (flat option values; the checks whose options are all
    present). ``sections``: check only the declarations of these sections (a section validating itself)."""
    out = []
    for d in DECLARED:
        if (sections is not None and d.section not in sections) or d.name not in values:
            continue
        value = values[d.name]
        if value is None:  # not given
            continue
        if "methods" in d.refuse and "method" in values and values["method"] not in d.methods:
            out.append(f"{d.flag} is a {d.family or methods_label(d.methods)} option and does not apply to method "
                       f"'{values['method']}'")
            continue
        if value == d.default:
            continue
        missing = [w for w in d.needs if w.option in values and not w.holds(values)]
        if "needs" in d.refuse and missing:
            out.append(f"{_flag_with_value(d, value)} needs {_needed(missing[0])}")
            continue
        if not is_on(value):  # an option that is off excludes nothing
            continue
        for ex in d.excludes:
            if ex.when.option in values and ex.when.holds(values):
                out.append(ex.message.format(flag=_flag_with_value(d, value), other=_other_flag(ex.when.option)))
                break
    return out


def calibration_defaults() -> dict[str, Any]:
    """The options a calibration record keeps beside its class (the knobs), at today's defaults."""
    return {d.name: d.default for d in DECLARED if d.name != "compile"}  # compile is part of the class itself


def activation_options() -> frozenset[str]:
    """Knobs that change what autograd saves in a way the planner's probe does not reproduce (it builds the LoRA
    model, eager and uncompiled: compile's options, and options of the 4-bit methods alone, are not in it), so a
    calibration record off their default describes another activation model."""
    return frozenset(d.name for d in DECLARED if "activations" in d.effects and d.name not in ("compile", "dtype")
                     and (d.section == "model" or "lora" not in d.methods or d.unprobed))


def speed_classes() -> tuple[str, ...]:
    return tuple(d.name for d in DECLARED if d.speed_class)


def probe_excluded() -> frozenset[str]:
    """Method options the planner's probe does not measure (it builds the run's model on the CPU, eager, and
    sizes resident weights from their layouts): every other method option keys its cache, so a new option makes
    a new probe, never a stale one."""
    return frozenset(d.name for d in DECLARED if d.section == "method" and "activations" not in d.effects)


def planner_options(values: Mapping[str, Any], capability: tuple | None) -> list[Declared]:
    """The candidate options (``planner_values``) that apply to a candidate of these values on a GPU of
    ``capability`` (None: unknown or not CUDA, so options needing one are left out)."""
    out = []
    for d in DECLARED:
        if not d.planner_values or d.name == "compile" or not d.applies(values):
            continue
        if d.min_capability is not None and (capability is None or tuple(capability) < d.min_capability):
            continue
        out.append(d)
    return out


def method_groups() -> dict[str, tuple[tuple, tuple]]:
    """The declared method options by family: label -> (methods, option names)."""
    groups: dict[str, tuple[tuple, tuple]] = {}
    for d in DECLARED:
        if d.section == "method":
            label = d.family or methods_label(d.methods)
            methods, names = groups.get(label, (d.methods, ()))
            groups[label] = (methods, names + (d.name,))
    return groups
