"""The parts a RunResult is made of, each written by the code that measured it, and the fixed-key records they hold.

result.json stays flat. A part's fields are result.json keys (the ``key`` metadata names one whose field reads
better under another name); a part inside a part adds its keys in place; a record is one JSON object under its
key, ``{}`` when nothing was measured (None here). Open-ended maps (keys named after stages, GPUs, ranks,
artifacts) stay plain dicts.
"""

from __future__ import annotations

import copy
from dataclasses import Field, asdict, dataclass, field, fields
from typing import Any, ClassVar, Optional

from ftprof.config.options import CUDA_GRAPH_MODES


class Record:
    """A result.json object whose keys are fixed, as a dataclass (mixed into one). Keys a reader does not know are
    skipped; keys a file lacks take the field's default."""

    # Whether keys absent from the measurement stay absent: a sparse record leaves its None fields out of the dict.
    sparse: ClassVar[bool] = False

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        return {k: v for k, v in out.items() if v is not None} if self.sparse else out

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def record(cls: type[Record], key: str | None = None) -> Any:
    """A field holding a ``Record`` (None until measured: ``{}`` in result.json)."""
    return field(default=None, metadata={"record": cls, **({"key": key} if key else {})})


def part(cls: type[Part], *, required: bool = False) -> Any:
    """A field holding a ``Part``, whose keys result.json holds in place of the field."""
    return field(metadata={"part": cls}) if required else field(default_factory=cls, metadata={"part": cls})


def _key(f: Field) -> str:
    return f.metadata.get("key", f.name)


class Part:
    """A dataclass (mixed into one) of result.json keys; ``flat`` and ``from_flat`` convert."""

    def flat(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if "part" in f.metadata:
                out.update(value.flat())
            elif "record" in f.metadata:
                out[_key(f)] = value.to_dict() if value is not None else {}
            else:
                out[_key(f)] = copy.deepcopy(value)
        return out

    @classmethod
    def from_flat(cls, data: dict[str, Any]):
        values: dict[str, Any] = {}
        for f in fields(cls):
            if "part" in f.metadata:
                values[f.name] = f.metadata["part"].from_flat(data)
            elif _key(f) in data:
                value = data[_key(f)]
                if "record" in f.metadata:
                    value = f.metadata["record"].from_dict(value) if value else None
                values[f.name] = value
        return cls(**values)

    @classmethod
    def key_paths(cls, prefix: str = "") -> dict[str, str]:
        """Each result.json key -> the attribute path that holds it."""
        out: dict[str, str] = {}
        for f in fields(cls):
            if "part" in f.metadata:
                out.update(f.metadata["part"].key_paths(f"{prefix}{f.name}."))
            else:
                out[_key(f)] = prefix + f.name
        return out

    @classmethod
    def flat_annotations(cls) -> dict[str, str]:
        """Each result.json key, with its value's annotation there (a record is a dict)."""
        out: dict[str, str] = {}
        for f in fields(cls):
            if "part" in f.metadata:
                out.update(f.metadata["part"].flat_annotations())
            else:
                out[_key(f)] = "dict[str, Any]" if "record" in f.metadata else str(f.type)
        return out


# ---------------------------------------------------------------------------------------------------- records
@dataclass
class HostTimeTotals(Record):
    """The steady steps' host time by cause (ftprof.metrics.host_time), in seconds."""

    compile_s: Optional[float] = None
    gc_s: Optional[float] = None
    data_s: Optional[float] = None
    alloc_retries: Optional[int] = None  # the allocator's retries: a count
    steps_s: Optional[float] = None  # the steps' own total


@dataclass
class MemoryBreakdown(Record):
    """Exact bytes on this rank (ftprof.metrics.memory_breakdown). Each key is there only when measured."""

    sparse: ClassVar[bool] = True

    weights_frozen: Optional[int] = None
    weights_trainable: Optional[int] = None
    gradients: Optional[int] = None
    optimizer_state: Optional[int] = None
    offloaded: Optional[int] = None  # host bytes under --fsdp-cpu-offload, outside the device's peak
    activations_saved: Optional[int] = None  # one micro-batch's forward
    logits_gradients: Optional[int] = None  # estimated: the loss backward's fp32 logits gradients
    transients: Optional[int] = None  # CUDA: training_peak minus the parts above
    explained: Optional[float] = None  # CUDA: parts / training_peak
    training_peak: Optional[int] = None  # CUDA: the peak of training alone (loading excluded)


@dataclass
class AutoChoice(Record):
    """What ``--checkpointing auto`` chose and why (result.json's ``checkpointing_auto``)."""

    policy: str = ""
    reason: str = ""
    layers: Optional[int] = None  # under full: how many decoder layers are checkpointed (None: all)
    estimated_peak: dict[str, int] = field(default_factory=dict)  # bytes, per policy
    activations_per_token: dict[str, float] = field(default_factory=dict)  # bytes, per policy
    static_bytes: int = 0
    available_bytes: int = 0
    margin_bytes: int = 0
    kept_weight_bytes: int = 0  # QLoRA under full: the recomputed layer's dequantized weights (in the full estimate)
    offload: bool = False  # under full: --offload-checkpoints chosen too (CUDA only; files without the key: False)
    host_embeddings: bool = False  # --offload-embeddings chosen too (CUDA only; files without the key: False)
    selective_rest: bool = False  # under full on some layers: the rest selective-checkpointed (files without: False)
    lean_recompute: bool = False  # under full: --lean-recompute chosen too (files without the key: False)
    lean_activations: bool = False  # without checkpointing: --lean-activations chosen too (files without: False)
    lean_norms: bool = False  # without checkpointing: --lean-norms chosen too (files without: False)


# The memory options --checkpointing auto may choose, each with the AutoChoice field that records the choice: the
# one vocabulary the store's records (plan/records.py) and the reports' effective configuration read it by.
AUTO_OPTIONS = (("offload_checkpoints", "offload"), ("offload_embeddings", "host_embeddings"),
                ("selective_rest", "selective_rest"), ("lean_recompute", "lean_recompute"),
                ("lean_activations", "lean_activations"), ("lean_norms", "lean_norms"))


def auto_chosen(checkpointing_auto: dict | None) -> list[str]:
    """The options a run's ``checkpointing_auto`` (result.json) says auto chose: it ran with them on."""
    auto = checkpointing_auto or {}
    return [option for option, field_name in AUTO_OPTIONS if auto.get(field_name)]


@dataclass
class Prediction(Record):
    """What ftprof.plan predicted for this run before it loaded anything (result.json's ``prediction``): peak memory
    per GPU from arithmetic plus a measured probe, tokens/s from FLOPs and a calibrated rate (ftprof/plan)."""

    peak_bytes: int = 0  # predicted training peak of torch's allocator per GPU (loading excluded)
    static_bytes: int = 0  # weights as stored, gradients, optimizer state (per GPU)
    gradient_bytes: int = 0  # the gradients among them: at the peak only with gradient accumulation (ftprof/plan)
    activation_bytes: int = 0  # what autograd keeps for backward over one micro-batch: probe x activation_factor
    activation_factor: float = 1.0  # the calibration's measured / probed activations for this kind of run (compile,
    # kernels); 1.0 where nothing calibrates it
    transient_bytes: int = 0  # the loss backward's logits gradients, a recomputed layer, kept dequantized weights
    tokens_per_s: Optional[float] = None  # global; None without a calibration for the device
    memory_source: str = ""  # how the memory figure was reached (probe, calibration factor and its origin)
    speed_source: str = ""  # where the rate came from: the local calibration store, shipped defaults, or none
    device: str = ""  # the GPU the prediction is for ("cpu" on CPU)
    candidate: dict[str, Any] = field(default_factory=dict)  # the configuration predicted (ftprof.plan.candidates)
    tokens_per_s_error: Optional[float] = None  # the speed prediction's error band: relative half-width (0.05: +-5%)
    confidence: str = ""  # high | medium | low: the band's class (ftprof/plan/speed.py says how it is set)
    tokens_per_s_spread: Optional[float] = None  # the part of the band that differs between one plan's rows (the
    # error common to every row on that GPU, such as scaling from another GPU's peak, left out): what ties read


@dataclass
class CompileOutcome(Record):
    """What ``--compile`` did (result.json's ``compile``)."""

    blocks: int = 0
    compiled: bool = False
    compile_time_s: Optional[float] = None  # the warm-up forward + backward, compilation included
    fallback: Optional[str] = None  # why the run went eager, if it did
    scope: str = "block"  # "block", or "block inside its checkpoint" for the blocks full checkpointing covers
    mode: str = "default"  # torch.compile's mode (--compile-mode)
    loss: bool = False  # whether the causal-LM loss was compiled too (--compile-loss; not when a kernel set fuses it)
    tuning: bool = False  # inductor's coordinate-descent tuning of its Triton kernels (--compile-tuning)
    dequant: int = 0  # QLoRA: 4-bit linears dequantized by torch ops in the compiled code (--compile-dequant)

    @property
    def cudagraphs(self) -> bool:
        """Whether compiled blocks replay as CUDA graphs (torch's CUDA graph trees then need step marks)."""
        return self.compiled and self.mode in CUDA_GRAPH_MODES


@dataclass
class DataStats(Record):
    """Real data's stats, as ``ftprof.data.prepare`` computes them (result.json's ``data``; {} for synthetic)."""

    dataset: Optional[str] = None
    split: Optional[str] = None
    format: Optional[str] = None
    train_on: Optional[str] = None
    fingerprint: Optional[str] = None  # of the rows as loaded
    tokenized_fingerprint: Optional[str] = None  # of the tokenized rows kept
    rows_loaded: Optional[int] = None
    rows: Optional[int] = None  # kept: with a token to train on
    rows_dropped: Optional[int] = None
    tokenize_processes: Optional[int] = None
    tokenize_s: Optional[float] = None
    mean_seq_len: Optional[float] = None  # tokens per row, after the cut to --seq-len unless packing
    max_seq_len: Optional[int] = None
    tokens: Optional[int] = None
    sequences: Optional[int] = None  # the sequences the model sees
    padding_fraction: Optional[float] = None
    label_fraction: Optional[float] = None


@dataclass
class TrainingProof(Record):
    """What the loop checked to prove the run trained (ftprof.engine.proof), and the numbers it saw."""

    passed: bool = False
    reason: Optional[str] = None  # why the run did not train (its status is then not_trained)
    checked: list[str] = field(default_factory=list)  # the checks that ran
    sample_elements: int = 0  # values sampled per tensor, before the first step and after the last
    trainable_tensors: int = 0
    trainable_changed: Optional[int] = None  # trainable tensors whose sample changed (at least one must)
    frozen_tensors: int = 0
    frozen_changed: int = 0  # frozen tensors whose sample changed (none may)
    frozen_changed_names: list[str] = field(default_factory=list)  # the first ten of them
    loss_steps_checked: int = 0  # steps whose loss was checked finite
    grad_norm_steps: list[int] = field(default_factory=list)  # steps whose gradient norm was read
    grad_norm_first: Optional[float] = None
    grad_norm_last: Optional[float] = None
    grad_norm_min: Optional[float] = None
    grad_norm_max: Optional[float] = None


# ---------------------------------------------------------------------------------------------------- parts
@dataclass
class RunIdentity(Part):
    """What ran, and when: from the run's configuration, the device, the ranks."""

    method: str
    model: str
    device: str
    device_name: str
    world_size: int = 1
    parallel: Optional[str] = None  # fsdp | ddp when world_size > 1
    started_at: str = ""
    finished_at: str = ""
    steps_completed: int = 0
    seq_len: int = 0
    batch_size: int = 0
    grad_accum: int = 1


@dataclass
class Throughput(Part):
    """Per-step work and the steady state's speed (warm-up steps excluded): the step log."""

    tokens_per_step: int = 0  # per rank
    tokens_per_s: Optional[float] = None  # global = sum over ranks
    tokens_per_s_per_gpu: Optional[float] = None
    real_tokens_per_s: Optional[float] = None
    real_tokens_per_s_per_gpu: Optional[float] = None
    step_time_p50_s: Optional[float] = None
    step_time_p90_s: Optional[float] = None
    step_time_mean_s: Optional[float] = None
    step_time_std_s: Optional[float] = None
    steady_steps: int = 0
    warmup_step_times_s: list[float] = field(default_factory=list)
    loss_first: Optional[float] = None
    loss_last: Optional[float] = None


@dataclass
class HostTime(Part):
    """Host time inside the steps by cause, and the slow steps with the likeliest cause of each."""

    totals: Optional[HostTimeTotals] = record(HostTimeTotals, key="host_time")  # the steady steps'
    # the steps (warm-up ones too) at least 1.2x the steady median: ftprof.metrics.slow_steps's rows, as is
    slow_steps: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Flops(Part):
    """Parameter counts, FLOPs per token, the device's peak, and the utilization they give."""

    params_total: Optional[int] = None
    params_trainable: Optional[int] = None
    params_trainable_matmul: Optional[int] = None
    params_frozen_matmul: Optional[int] = None
    flops_per_token: Optional[float] = None
    recompute_flops_per_token: Optional[float] = None
    peak_flops: Optional[float] = None
    mfu: Optional[float] = None
    hfu: Optional[float] = None


@dataclass
class Memory(Part):
    """Memory in bytes: torch's allocator peaks, the host's, NVML's, the gaps between them, stages, breakdown."""

    torch_peak_allocated: Optional[int] = None
    torch_peak_reserved: Optional[int] = None
    host_peak_rss: Optional[int] = None
    nvml_device_used_peak: Optional[int] = None
    nvml_process_used_peak: Optional[int] = None
    non_torch_overhead: Optional[int] = None  # nvml_process - torch_reserved
    fragmentation: Optional[int] = None  # torch_reserved - torch_allocated
    memory_stages: dict[str, int] = field(default_factory=dict)  # open: mem_<stage>_delta and mem_<stage>_peak
    memory_breakdown: Optional[MemoryBreakdown] = record(MemoryBreakdown)


@dataclass
class NvmlSummary(Part):
    """The NVML sampler's summary and the energy it measured."""

    # open: per-GPU peaks/means/energy (gpu<N>_...), samples, device/process peaks, energy_j; a distributed run's:
    # ranks, energy_j, device_used_peak
    summary: dict[str, Any] = field(default_factory=dict, metadata={"key": "nvml"})
    energy_per_token_j: Optional[float] = None  # NVML energy over the steady steps / their tokens (all GPUs)


@dataclass
class Checkpointing(Part):
    """The activation checkpointing that ran (config.json says what was asked)."""

    checkpointing_policy: Optional[str] = None  # none | full | selective (--checkpointing auto resolved)
    checkpointed_layers: Optional[int] = None  # decoder layers the policy applies to (None: all of them)
    checkpointing_auto: Optional[AutoChoice] = record(AutoChoice)  # auto's estimates, budget and reason
    kept_dequantized: Optional[int] = None  # QLoRA under full: 4-bit linears whose recomputation keeps the weight
    split_layers: Optional[int] = None  # --lean-recompute with --offload-checkpoints: layers checkpointed as halves


@dataclass
class Compile(Part):
    """The kernels that ran: fused kernels patched in, compiled blocks, the attention kernel SDPA picked."""

    kernels_applied: list[str] = field(default_factory=list)  # --kernels liger: which fused kernels were patched in
    outcome: Optional[CompileOutcome] = record(CompileOutcome, key="compile")  # --compile: blocks, compiled, fallback
    sdpa_backend_used: Optional[str] = None  # the attention kernel SDPA picks for the training shape (CUDA only)
    compile_time_s: Optional[float] = None  # the compile warm-up (first forward + backward), apart from step times
    # --kernels liger: the most tokens a chunk of its fused loss holds (0: Liger's own sizing; models/kernels.py)
    loss_chunk_tokens: Optional[int] = None


@dataclass
class Distributed(Part):
    """A distributed run's per-rank figures, and how far the slowest/largest rank is from the fastest/smallest."""

    per_rank: dict[str, dict[str, Any]] = field(default_factory=dict)  # open: rank -> aggregate.RANK_FIELDS
    step_time_skew: Optional[float] = None  # max/min - 1 of the ranks' median step times
    memory_skew: Optional[float] = None  # max/min - 1 of the ranks' peak allocated memory


@dataclass
class Failure(Part):
    """Why a run failed (all None for a run that finished)."""

    error_type: Optional[str] = None
    error_message: Optional[str] = None
    error_tail: Optional[str] = None


@dataclass
class Evaluation(Part):
    """Eval loss over the run (--eval-steps, --eval-dataset, --eval-split): each evaluation is outside the steps'
    time; steps.csv has each one's loss and time in its step's row."""

    eval_loss_first: Optional[float] = None
    eval_loss_last: Optional[float] = None
    eval_loss_best: Optional[float] = None  # the lowest
    eval_loss_best_step: Optional[int] = None
    eval_runs: int = 0  # how many evaluations ran
    eval_time_s: Optional[float] = None  # all of them together
    eval_tokens: Optional[int] = None  # label tokens one evaluation scores


@dataclass
class Saved(Part):
    """What --save wrote, where, and how long it took (outside the steps' time)."""

    saved: Optional[str] = None  # "adapter" (PEFT) or "model" (full fine-tuning)
    save_dir: Optional[str] = None  # the adapter or model directory
    save_base_dir: Optional[str] = None  # the base model a saved adapter loads on (saved there for presets)
    save_time_s: Optional[float] = None
