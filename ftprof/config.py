"""Run configuration: small dataclasses that validate themselves.

Every option is defined once, here, as a dataclass field with its help text. The CLI builds its argument groups
from these fields (``ftprof/cli/common.py``) and sweep files use the same names in snake_case, so a field name is
also its long option name (``lora_r`` <-> ``--lora-r``). Names are unique across sections so a flat mapping
(``RunConfig.from_flat``) is unambiguous.

Nothing here imports torch or argparse, and nothing here touches the filesystem: checks that need I/O (does the
dataset exist, does the sequence fit the model) live in ``ftprof.preflight``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from ftprof.errors import ConfigError, did_you_mean

SCHEMA_VERSION = 1

METHODS = ("full", "lora", "qlora", "gptq-lora")
LORA_METHODS = ("lora", "qlora", "gptq-lora")
DTYPES = ("auto", "float32", "bfloat16", "float16")
OPTIMIZERS = ("adamw", "paged_adamw_8bit")
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Aliases accepted for memory logging: the names users of the earlier benchmark scripts know.
MEMORY_LOGGING_ALIASES = {"nvidia": "nvml", "huggingface": "torch"}
MEMORY_LOGGING = ("none", "torch", "nvml", "all")
CHECKPOINTING = ("none", "full", "selective", "auto")
KERNELS = ("eager", "liger")
SDPA_BACKENDS = ("auto", "flash", "efficient", "cudnn")  # models/attention.py says what each means
# torch.compile's modes, by torch's names; engine/compile.py says what each does to a decoder block.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")
TRACKERS = ("tensorboard", "wandb", "mlflow")


def option(default: Any = None, help: str = "", *, choices: tuple | None = None, metavar: str | None = None,
           default_factory: Any = None) -> Any:
    """A dataclass field that also describes its command-line option."""
    meta = {"help": help, "choices": choices, "metavar": metavar}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _one_of(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}: '{value}' is not one of {', '.join(map(str, allowed))}"
                          f"{did_you_mean(value, allowed)}")


@dataclass
class ModelConfig:
    model: str = option("tiny", "built-in preset name, local checkpoint directory, or hub id", metavar="NAME|DIR|ID")
    dtype: str = option("auto", "parameter/compute dtype; auto = float32 on CPU, bfloat16 on CUDA", choices=DTYPES)
    checkpointing: Optional[str] = option(
        None, "activation checkpointing: none; full (each decoder layer's forward recomputed in backward); "
        "selective (matmul and attention outputs saved, the cheap ops between them recomputed); auto (the fastest "
        "of these whose estimated peak fits the device's memory with a margin; result.json says which and why) "
        "(default none)", choices=CHECKPOINTING)
    checkpoint_layers: Optional[int] = option(
        None, "with --checkpointing full or selective: checkpoint only the first N decoder layers; the others keep "
        "their activations (faster, more memory). Default: all. auto picks N itself when selective does not fit")
    gradient_checkpointing: Optional[bool] = option(None, "the HF spelling: --gradient-checkpointing = "
                                                    "--checkpointing full, --no-gradient-checkpointing = none")
    kernels: str = option("eager", "eager (PyTorch/transformers ops), or liger: Liger-Kernel's fused RMSNorm, "
                          "SwiGLU, RoPE and fused linear cross entropy (Llama and Mistral; CUDA)", choices=KERNELS)
    compile: bool = option(False, "torch.compile each decoder block (not the whole model); a block that does not "
                           "compile runs eager, with a note; compile time is reported apart from step time")
    compile_loss: bool = option(True, "with --compile: compile transformers' loss too (the fp32 upcast of the "
                                "logits and cross entropy, forward and backward); not when --kernels liger computes "
                                "the loss")
    compile_dequant: bool = option(False, "with --compile: QLoRA's 4-bit weights are dequantized by torch ops that "
                                   "inductor fuses inside the compiled block instead of by bitsandbytes' kernel "
                                   "(same bits). Measured on an H200: the compiler then keeps every layer's 16-bit "
                                   "weights for backward (+13 GiB, +0.8% tokens/s without checkpointing; -4.4% "
                                   "under full checkpointing); off by default")
    compile_tuning: bool = option(False, "with --compile: inductor tunes each Triton kernel it generates (block "
                                  "sizes, warps) by coordinate descent, timing candidates on the device: what "
                                  "max-autotune adds besides its GEMM templates (GEMMs stay cuBLAS); longer "
                                  "compile. Changes nothing on CPU")
    compile_mode: str = option("default", "with --compile: torch.compile's mode. max-autotune-no-cudagraphs "
                               "benchmarks Triton GEMM templates (with fused epilogues) against cuBLAS for each "
                               "matmul shape (slower to compile); reduce-overhead and max-autotune also replay "
                               "each block as a CUDA graph", choices=COMPILE_MODES)
    attn_implementation: str = option("sdpa", "attention kernel passed to transformers",
                                      choices=("sdpa", "eager", "flash_attention_2"))
    sdpa_backend: str = option("auto", "the kernel behind --attn-implementation sdpa: auto (PyTorch's own "
                               "order), or flash, efficient, cudnn put first (CUDA only); result.json's "
                               "sdpa_backend_used says which one ran", choices=SDPA_BACKENDS)

    def __post_init__(self) -> None:
        _require(bool(self.model), "--model must not be empty")
        _one_of("--dtype", self.dtype, DTYPES)
        _one_of("--kernels", self.kernels, KERNELS)
        _one_of("--sdpa-backend", self.sdpa_backend, SDPA_BACKENDS)
        _one_of("--compile-mode", self.compile_mode, COMPILE_MODES)
        _require(self.compile or self.compile_mode == "default",
                 f"--compile-mode {self.compile_mode} needs --compile")
        _require(self.compile or not self.compile_dequant, "--compile-dequant needs --compile")
        _require(self.compile or not self.compile_tuning, "--compile-tuning needs --compile")
        if self.checkpointing is not None:
            _one_of("--checkpointing", self.checkpointing, CHECKPOINTING)
        # One policy, two spellings: gradient_checkpointing is kept as the derived yes/no (None while auto decides).
        if self.gradient_checkpointing is not None:
            implied = "full" if self.gradient_checkpointing else "none"
            given = self.checkpointing
            _require(given in (None, implied) or (self.gradient_checkpointing and given == "selective"),
                     f"--{'no-' if not self.gradient_checkpointing else ''}gradient-checkpointing contradicts "
                     f"--checkpointing {given}")
            self.checkpointing = given or implied
        self.checkpointing = self.checkpointing or "none"
        self.gradient_checkpointing = None if self.checkpointing == "auto" else self.checkpointing != "none"
        if self.checkpoint_layers is not None:
            _require(self.checkpoint_layers >= 1, f"--checkpoint-layers must be at least 1, got "
                     f"{self.checkpoint_layers} (--checkpointing none checkpoints no layer)")
            _require(self.checkpointing in ("full", "selective"), "--checkpoint-layers applies to --checkpointing "
                     f"full or selective, not {self.checkpointing}" + (" (auto picks the count itself)"
                                                                       if self.checkpointing == "auto" else ""))


DEQUANT_KERNELS = ("auto", "bitsandbytes", "triton")
DATA_FORMATS = ("auto", "text", "instruction", "chat")
TRAIN_ON = ("completion", "prompt")


@dataclass
class DataConfig:
    dataset: str = option("synthetic", "'synthetic' (learnable token stream), a data file (.txt, .json, .jsonl, .csv, "
                          ".parquet), a folder written by datasets' save_to_disk, or a hub dataset name",
                          metavar="synthetic|FILE|DIR|NAME")
    dataset_config: Optional[str] = option(None, "configuration (subset) of a hub dataset", metavar="NAME")
    dataset_split: str = option("train", "split to train on; datasets' slicing works too, e.g. 'train[:1000]'")
    data_format: str = option("auto", "how rows become tokens: text (one text column), instruction (prompt "
                              "template + response column), chat (a messages column rendered with the tokenizer's "
                              "chat template); auto picks chat if the messages column exists, else instruction if "
                              "the response column exists, else text", choices=DATA_FORMATS)
    text_field: str = option("text", "text format: the column holding the text")
    prompt_template: Optional[str] = option(None, "instruction format: the prompt, with {column} placeholders "
                                            "(default: the Alpaca template over 'instruction' and, where present, "
                                            "'input')", metavar="TEMPLATE")
    response_field: str = option("output", "instruction format: the column holding the response")
    messages_field: str = option("messages", "chat format: the column holding the list of {role, content} turns")
    train_on: str = option("completion", "instruction and chat formats: completion = loss only on the response "
                           "(the assistant turns); prompt = loss on the prompt too (every token of the sequence)",
                           choices=TRAIN_ON)
    dataset_num_proc: Optional[int] = option(None, "processes that tokenize the dataset (default: up to 8 of the "
                                             "machine's cores for 10,000 rows or more, else 1)")
    seq_len: int = option(128, "tokens per sequence")
    batch_size: int = option(2, "sequences per micro-batch (per device)")
    packing: bool = option(False, "concatenate documents into full sequences instead of padding each one")
    prefetch: bool = option(True, "make the next step's first micro-batch and queue its copy to the device while "
                            "the GPU runs this step, instead of after it (the host's work then stays out of the "
                            "step's time)")

    def __post_init__(self) -> None:
        _require(self.seq_len >= 2, f"--seq-len must be at least 2, got {self.seq_len}")
        _require(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        _require(bool(self.dataset), "--dataset must not be empty")
        _require(bool(self.dataset_split), "--dataset-split must not be empty")
        _one_of("--data-format", self.data_format, DATA_FORMATS)
        _one_of("--train-on", self.train_on, TRAIN_ON)
        if self.dataset_num_proc is not None:
            _require(self.dataset_num_proc >= 1, f"--dataset-num-proc must be at least 1, got {self.dataset_num_proc}")
        if self.prompt_template is not None:
            _require(bool(template_fields(self.prompt_template)),
                     "--prompt-template needs at least one {column} placeholder")
        for name in ("text_field", "response_field", "messages_field"):
            _require(bool(getattr(self, name)), f"--{name.replace('_', '-')} must not be empty")


def template_fields(template: str) -> list[str]:
    """The {column} placeholders of a prompt template; one line naming the problem if it does not parse."""
    import string

    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ConfigError(f"--prompt-template: {exc}") from None
    _require(all(n.isidentifier() for n in names), f"--prompt-template: placeholders must be column names, got "
             f"{[n for n in names if not n.isidentifier()]}")
    return names


# Method options by the methods they apply to: (methods, option names). MethodConfig rejects the others; the CLI
# leaves them out of a method's --help.
METHOD_OPTION_GROUPS = {
    "lora": (LORA_METHODS, ("lora_r", "lora_alpha", "lora_dropout", "lora_targets", "lora_addmm", "lora_fused_a")),
    "bitsandbytes": (("qlora",), ("quant_type", "double_quant", "compute_dtype", "quant_storage",
                                   "keep_dequantized", "dequant_kernel")),
    "quantized-base": (("qlora", "gptq-lora"), ("kbit_prepare",)),
    "GPTQ": (("gptq-lora",), ("gptq_bits", "gptq_group_size", "gptq_backend", "gptq_calibration_samples",
                             "gptq_quantizer")),
}


def inapplicable_options(method: str) -> set[str]:
    """The method options that ``method`` does not accept."""
    return {n for methods, names in METHOD_OPTION_GROUPS.values() if method not in methods for n in names}


@dataclass
class MethodConfig:
    method: str = option("qlora", "fine-tuning method", choices=METHODS)
    lora_r: Optional[int] = option(None, "LoRA rank (default 16)")
    lora_alpha: Optional[float] = option(None, "LoRA alpha (default 2 * rank)")
    lora_dropout: Optional[float] = option(None, "LoRA dropout (default 0.0)")
    lora_targets: Optional[tuple[str, ...]] = option(
        None, "comma-separated module names to adapt, or all-linear (default: the seven projections)",
        metavar="NAMES")
    lora_addmm: Optional[bool] = option(
        None, "add each adapter's output inside its second matmul (one addmm, the scale on the rank side) instead "
        "of PEFT's separate scaled add over the whole output (default off: 1.3-1.5% slower than PEFT's add under "
        "--compile on an H200)")
    lora_fused_a: Optional[bool] = option(
        None, "one down-projection (A) matmul for the adapters of projections that read the same input (q, k, v; "
        "gate, up) instead of one each: the input read once, one input gradient written; PEFT's numbers, "
        "+1.1-1.8% on an H200 (default on, except beside --lora-addmm and in the textbook recipe of the quantized "
        "methods, which runs PEFT as it is)")
    quant_type: Optional[str] = option(None, "bitsandbytes 4-bit type (qlora; default nf4)", choices=("nf4", "fp4"))
    double_quant: Optional[bool] = option(None, "quantize the quantization constants too (qlora; default on)")
    compute_dtype: Optional[str] = option(None, "dtype of the 4-bit matmuls (qlora; default: the run dtype)",
                                          choices=DTYPES[1:])
    quant_storage: Optional[str] = option(None, "storage dtype of packed 4-bit weights (qlora; default: the run "
                                          "dtype, so FSDP can shard them beside the other parameters)",
                                          choices=("uint8",) + DTYPES[1:])
    keep_dequantized: Optional[bool] = option(
        None, "under full checkpointing, a layer's recomputation keeps its dequantized 16-bit weights for its "
        "backward (one layer's at a time) instead of bitsandbytes dequantizing them again (qlora; default on)")
    dequant_kernel: Optional[str] = option(
        None, "what dequantizes the 4-bit weights for their matmuls: bitsandbytes' kernel, or triton: ftprof's "
        "one-pass Triton kernel, the same bits, 1.8x faster per weight on an H200 (CUDA); auto: triton where it "
        "runs, else bitsandbytes (qlora; default auto)", choices=DEQUANT_KERNELS)
    kbit_prepare: Optional[bool] = option(None, "apply PEFT's prepare_model_for_kbit_training (the textbook recipe: "
                                          "upcasts lm_head, embeddings and norms to fp32; slower, for comparison; "
                                          "qlora/gptq-lora; default off)")
    gptq_bits: Optional[int] = option(None, "GPTQ bits (gptq-lora; default 4)", choices=(2, 3, 4, 8))
    gptq_group_size: Optional[int] = option(None, "GPTQ group size (gptq-lora; default 128, -1 = per channel)")
    gptq_backend: Optional[str] = option(None, "GPTQModel kernel (gptq-lora; default gptq_torch, which trains)",
                                         choices=("gptq_torch", "gptq_triton", "auto_trainable", "gptq_exllama_v2",
                                                  "gptq_marlin"))
    gptq_calibration_samples: Optional[int] = option(None, "calibration sequences when quantizing a preset "
                                                     "(gptq-lora; default 32)")
    gptq_quantizer: Optional[str] = option(
        None, "how a 16-bit model is quantized (gptq-lora): gptq (calibrated, error-compensating) or rtn "
        "(round-to-nearest through GPTQModel's mock path: same checkpoint format and kernels, no error "
        "compensation); "
        "default rtn for presets, whose random weights make calibration meaningless, gptq otherwise",
        choices=("gptq", "rtn"))

    def __post_init__(self) -> None:
        _one_of("method", self.method, METHODS)
        if isinstance(self.lora_targets, str):
            self.lora_targets = tuple(t.strip() for t in self.lora_targets.split(",") if t.strip())
        elif isinstance(self.lora_targets, list):
            self.lora_targets = tuple(self.lora_targets)
        self._check_applicable()
        if self.lora_r is not None:
            _require(self.lora_r >= 1, f"--lora-r must be at least 1, got {self.lora_r}")
        if self.lora_dropout is not None:
            _require(0.0 <= self.lora_dropout < 1.0, f"--lora-dropout must be in [0, 1), got {self.lora_dropout}")
        if self.lora_targets is not None:
            _require(len(self.lora_targets) > 0, "--lora-targets must name at least one module")
        _require(not (self.lora_addmm and self.lora_fused_a), "--lora-addmm and --lora-fused-a each replace PEFT's "
                 "adapter forward: pick one")
        if self.gptq_group_size is not None:
            _require(self.gptq_group_size == -1 or self.gptq_group_size >= 16,
                     f"--gptq-group-size must be -1 or >= 16, got {self.gptq_group_size}")
        if self.gptq_calibration_samples is not None:
            _require(self.gptq_calibration_samples >= 1, "--gptq-calibration-samples must be at least 1")

    def _fused_a(self) -> bool:
        """--lora-fused-a as it runs: on unless asked off, or --lora-addmm (which replaces the same forward), or
        --kbit-prepare (the textbook recipe runs PEFT's forward as it is)."""
        if self.lora_fused_a is not None:
            return self.lora_fused_a
        return not (self.lora_addmm or self.kbit_prepare)

    def _check_applicable(self) -> None:
        """Reject options that the chosen method would silently ignore."""
        for label, (methods, names) in METHOD_OPTION_GROUPS.items():
            if self.method in methods:
                continue
            given = [n for n in names if getattr(self, n) is not None]
            if given:
                flag = "--" + given[0].replace("_", "-")
                raise ConfigError(f"{flag} is a {label} option and does not apply to method '{self.method}'")

    def resolved(self, run_dtype: str, preset: bool = False, triton: bool = False) -> MethodConfig:
        """Fill method defaults (done once the run dtype and the model source are known) so config.json records
        what ran. ``triton``: whether --dequant-kernel auto can pick the Triton kernel here."""
        values = dataclasses.asdict(self)
        if self.method in LORA_METHODS:
            r = self.lora_r or 16
            values.update(lora_r=r, lora_alpha=self.lora_alpha if self.lora_alpha is not None else 2.0 * r,
                          lora_dropout=self.lora_dropout or 0.0,
                          lora_targets=self.lora_targets or DEFAULT_LORA_TARGETS,
                          lora_addmm=bool(self.lora_addmm), lora_fused_a=self._fused_a())
        if self.method in ("qlora", "gptq-lora"):
            values.update(kbit_prepare=bool(self.kbit_prepare))
        if self.method == "qlora":
            values.update(quant_type=self.quant_type or "nf4",
                          double_quant=True if self.double_quant is None else self.double_quant,
                          compute_dtype=self.compute_dtype or run_dtype,
                          quant_storage=self.quant_storage or run_dtype,
                          keep_dequantized=self.keep_dequantized is not False,
                          dequant_kernel=self.dequant_kernel if self.dequant_kernel in DEQUANT_KERNELS[1:]
                          else "triton" if triton else "bitsandbytes")
        if self.method == "gptq-lora":
            values.update(gptq_bits=self.gptq_bits or 4, gptq_group_size=self.gptq_group_size or 128,
                          gptq_backend=self.gptq_backend or "gptq_torch",
                          gptq_calibration_samples=self.gptq_calibration_samples or 32,
                          gptq_quantizer=self.gptq_quantizer or ("rtn" if preset else "gptq"))
        return MethodConfig(**values)


@dataclass
class TrainConfig:
    grad_accum: int = option(1, "micro-batches per optimizer step")
    max_steps: int = option(10, "optimizer steps to run")
    warmup_steps: int = option(2, "measurement warm-up: first steps left out of the steady-state figures (reported "
                               "separately); not a learning-rate warm-up, the learning rate is constant")
    lr: float = option(2e-4, "learning rate (constant)")
    weight_decay: float = option(0.0, "AdamW weight decay")
    max_grad_norm: float = option(0.0, "clip gradients to this norm; 0 disables clipping")
    optimizer: str = option("adamw", "adamw (fused on CUDA) or bitsandbytes' paged 8-bit AdamW", choices=OPTIMIZERS)
    seed: int = option(0, "seed for weights, data and dropout")

    def __post_init__(self) -> None:
        _require(self.grad_accum >= 1, f"--grad-accum must be at least 1, got {self.grad_accum}")
        _require(self.max_steps >= 1, f"--max-steps must be at least 1, got {self.max_steps}")
        _require(self.warmup_steps >= 0, f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        _require(self.lr > 0, f"--lr must be positive, got {self.lr}")
        _require(self.weight_decay >= 0, f"--weight-decay must be >= 0, got {self.weight_decay}")
        _require(self.max_grad_norm >= 0, f"--max-grad-norm must be >= 0, got {self.max_grad_norm}")
        _one_of("--optimizer", self.optimizer, OPTIMIZERS)


@dataclass
class OutputConfig:
    output_dir: str = option("runs", "parent directory of run directories")
    run_name: Optional[str] = option(None, "run directory name (default: <method>-<model>-<timestamp>)")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    memory_limit_gib: Optional[float] = option(
        None, "cap what PyTorch may allocate on the GPU at this many GiB (torch's per-process memory fraction): "
        "the run fails for memory as on a smaller card (which would also hold the CUDA context, ~0.5 GiB), and "
        "--checkpointing auto plans for the cap; CUDA only", metavar="GIB")
    memory_logging: str = option("torch", "memory sources to record: torch (allocator stats), nvml (device "
                                 "sampler), all, none; aliases: huggingface=torch, nvidia=nvml",
                                 choices=MEMORY_LOGGING + tuple(MEMORY_LOGGING_ALIASES))
    alloc_conf: Optional[str] = option(None, "PYTORCH_ALLOC_CONF for the run (default: the environment's, else "
                                       "expandable_segments:True); recorded in env.json")
    quiet: bool = option(False, "no progress bar or summary table")
    report_to: Optional[tuple[str, ...]] = option(
        None, "experiment trackers that receive per-step figures, the final result and the config (main rank "
        "only), as the HF Trainer spells them: comma-separated tensorboard, wandb, mlflow, or all, or none "
        "(default none)", metavar="NAMES")

    def __post_init__(self) -> None:
        self.report_to = normalize_report_to(self.report_to)
        self.memory_logging = MEMORY_LOGGING_ALIASES.get(self.memory_logging, self.memory_logging)
        _one_of("--memory-logging", self.memory_logging, MEMORY_LOGGING)
        if self.memory_limit_gib is not None:
            _require(math.isfinite(self.memory_limit_gib) and self.memory_limit_gib > 0,
                     f"--memory-limit-gib must be a positive number of GiB, got {self.memory_limit_gib}")
        dev = self.device
        ok = dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())
        _require(ok, f"--device: '{dev}' is not auto, cpu, cuda or cuda:N")
        if self.run_name is not None:
            _require(bool(self.run_name) and "/" not in self.run_name and self.run_name not in (".", ".."),
                     f"--run-name: '{self.run_name}' is not a plain directory name")


def normalize_report_to(value) -> tuple[str, ...] | None:
    """'tensorboard,mlflow' / a list / 'all' / 'none' -> a tuple of tracker names, or None for no tracker."""
    if value is None:
        return None
    names = [n.strip() for n in (value.split(",") if isinstance(value, str) else value) if str(n).strip()]
    if names in (["none"], []):
        return None
    if names == ["all"]:
        return TRACKERS
    for name in names:
        _one_of("--report-to", name, TRACKERS)
    return tuple(dict.fromkeys(names))


PARALLEL = ("fsdp", "ddp")
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2", "static")  # torchrun's


@dataclass
class DistributedConfig:
    """Several GPUs or nodes: ftprof relaunches itself through torchrun (torch.distributed.run), or joins it."""

    nproc_per_node: int = option(1, "processes (GPUs) per node; above 1 ftprof relaunches itself under torchrun")
    nnodes: int = option(1, "nodes")
    node_rank: int = option(0, "this node's rank (multi-node)")
    rdzv_endpoint: Optional[str] = option(None, "rendezvous host:port (needed with --nnodes > 1)")
    rdzv_backend: str = option("c10d", "rendezvous backend", choices=RDZV_BACKENDS)
    parallel: str = option("fsdp", "data parallelism: FSDP2 (fully_shard, sharded) or DDP (replicated)",
                           choices=PARALLEL)
    fsdp_reshard_after_forward: bool = option(True, "FSDP: free gathered parameters after forward (less memory, "
                                              "one more all-gather in backward)")
    fsdp_cpu_offload: bool = option(False, "FSDP: keep sharded parameters, gradients and optimizer state on CPU "
                                    "(on one GPU too: FSDP2 then runs in the one process)")

    def __post_init__(self) -> None:
        _require(self.nproc_per_node >= 1, f"--nproc-per-node must be at least 1, got {self.nproc_per_node}")
        _require(self.nnodes >= 1, f"--nnodes must be at least 1, got {self.nnodes}")
        _require(0 <= self.node_rank < self.nnodes, f"--node-rank {self.node_rank} must be in [0, --nnodes)")
        _require(self.nnodes == 1 or bool(self.rdzv_endpoint), "--nnodes > 1 needs --rdzv-endpoint host:port")
        _one_of("--parallel", self.parallel, PARALLEL)
        _one_of("--rdzv-backend", self.rdzv_backend, RDZV_BACKENDS)
        _require(not (self.fsdp_cpu_offload and self.parallel != "fsdp"),
                 "--fsdp-cpu-offload applies to --parallel fsdp only")
        if self.rdzv_endpoint is not None:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            _require(bool(host) and port.isdigit() and 1 <= int(port) <= 65535,
                     f"--rdzv-endpoint '{self.rdzv_endpoint}' must be host:port, the port a number from 1 to 65535")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


PROFILER_ACTIVITIES = ("cpu", "cuda")


@dataclass
class ProfilingConfig:
    """torch.profiler settings. Steps are optimizer steps. Any --prof-* option given to `train` turns profiling on."""

    profile: bool = option(False, "run under torch.profiler (always on for `ftprof profile`)")
    prof_wait_steps: int = option(1, "steps skipped at the start of each cycle")
    prof_warmup_steps: int = option(1, "profiler warm-up steps per cycle (recorded, then discarded)")
    prof_active_steps: int = option(2, "recorded steps per cycle")
    prof_repeat: int = option(1, "profiling cycles")
    prof_output_dir: Optional[str] = option(None, "artifact directory (default: <run dir>/profile)")
    prof_activities: str = option("auto", "comma-separated: cpu, cuda; auto = cpu plus cuda when on a GPU")
    prof_record_shapes: bool = option(False, "record operator input shapes and dtypes")
    prof_with_stack: bool = option(False, "record Python stacks (flame-graph stacks file; larger traces)")
    prof_profile_memory: bool = option(False, "record tensor allocations in the trace")
    prof_memory_timeline: bool = option(False, "export a memory timeline (turns on shapes, stacks and memory)")
    prof_memory_snapshot: bool = option(False, "record the CUDA allocator history over the active window and dump "
                                        "a snapshot for pytorch.org/memory_viz")
    prof_ranks: str = option("0", "ranks that profile: 'all' or comma-separated ranks")
    prof_max_trace_mb: float = option(512.0, "trace size budget per cycle; past it the costly options are turned off")

    def __post_init__(self) -> None:
        _require(self.prof_wait_steps >= 0, "--prof-wait-steps must be >= 0")
        _require(self.prof_warmup_steps >= 0, "--prof-warmup-steps must be >= 0")
        _require(self.prof_active_steps >= 1, "--prof-active-steps must be at least 1")
        _require(self.prof_repeat >= 1, "--prof-repeat must be at least 1")
        _require(self.prof_max_trace_mb > 0, "--prof-max-trace-mb must be positive")
        if self.prof_activities != "auto":
            for act in self.activities():
                _one_of("--prof-activities", act, PROFILER_ACTIVITIES)
        if self.prof_ranks != "all":
            parts = [r.strip() for r in str(self.prof_ranks).split(",")]
            _require(all(p.isdigit() for p in parts), f"--prof-ranks: '{self.prof_ranks}' is not 'all' or a "
                     "comma-separated list of ranks")

    def activities(self) -> tuple[str, ...]:
        return tuple(a.strip() for a in self.prof_activities.split(",") if a.strip())

    @property
    def cycle_steps(self) -> int:
        return self.prof_wait_steps + self.prof_warmup_steps + self.prof_active_steps

    @property
    def total_steps(self) -> int:
        """Steps needed for every requested cycle to complete."""
        return self.cycle_steps * self.prof_repeat

    def profiles_rank(self, rank: int) -> bool:
        return self.prof_ranks == "all" or rank in {int(r) for r in str(self.prof_ranks).split(",")}


SECTIONS = {"model": ModelConfig, "data": DataConfig, "method": MethodConfig, "train": TrainConfig,
            "output": OutputConfig, "profiling": ProfilingConfig, "distributed": DistributedConfig}


@dataclass
class RunConfig:
    """Everything one run needs. ``ftprof.train(RunConfig(...))`` runs it."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.model.checkpointing == "auto" and self.distributed.parallel == "fsdp" and \
                (self.distributed.world_size > 1 or self.distributed.fsdp_cpu_offload):
            raise ConfigError("--checkpointing auto estimates one unsharded process's memory: use it on one GPU "
                              "without --fsdp-cpu-offload or with --parallel ddp, or pick a policy for FSDP runs")
        if self.model.kernels == "liger" and "lm_head" in (self.method.lora_targets or ()):
            raise ConfigError("--lora-targets lm_head: Liger's fused linear cross entropy computes the loss from "
                              "lm_head's weight directly and would skip its adapter; use --kernels eager")
        _require(not (self.model.compile_dequant and self.method.dequant_kernel == "triton"),
                 "--compile-dequant and --dequant-kernel triton each dequantize the 4-bit weights: pick one")
        _require(self.train.warmup_steps < self.train.max_steps or self.train.max_steps == 1,
                 f"--warmup-steps ({self.train.warmup_steps}) must be below --max-steps ({self.train.max_steps}) "
                 "so that some steps are measured")

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> RunConfig:
        """Build from option names (snake_case long names, as in sweep files and argparse namespaces)."""
        owner = flat_field_owners()
        unknown = [k for k in values if k not in owner]
        if unknown:
            raise ConfigError(f"unknown option '{unknown[0]}'{did_you_mean(unknown[0], owner)}")
        parts: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
        for key, value in values.items():
            parts[owner[key]][key] = _check_type(key, value)
        try:
            return cls(**{s: SECTIONS[s](**kw) for s, kw in parts.items()})
        except TypeError as exc:  # a wrong type that slipped past the parser, e.g. from Python callers
            raise ConfigError(str(exc)) from None

    def to_flat(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for section in SECTIONS:  # fields are plain values (tuples, not nested dataclasses): no deep copy needed
            part = getattr(self, section)
            out.update({f.name: getattr(part, f.name) for f in fields(part)})
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        version = data.get("schema_version", SCHEMA_VERSION)
        _require(version <= SCHEMA_VERSION, f"config schema_version {version} is newer than this ftprof "
                 f"({SCHEMA_VERSION})")
        flat: dict[str, Any] = {}
        for section in SECTIONS:
            flat.update(data.get(section, {}))
        if isinstance(flat.get("lora_targets"), list):
            flat["lora_targets"] = tuple(flat["lora_targets"])
        return cls.from_flat(flat)

    def cli_args(self) -> list[str]:
        """The command-line words that rebuild this config (``ftprof train`` after the method: options that differ
        from their defaults). The one place where a config is spelled as a command line: command.sh uses it; child
        processes get the config as a file instead."""
        defaults = _default_flat()
        values = self.to_flat()
        args = [values.pop("method")]
        for key, value in values.items():
            # profile and gradient_checkpointing are implied by other options (--prof-*, --checkpointing)
            if value == defaults.get(key) or key in ("profile", "gradient_checkpointing") or value is None:
                continue
            args += option_words(key, value)
        if values.get("profile") and not any(a.startswith("--prof-") for a in args):
            args += ["--prof-active-steps", str(values["prof_active_steps"])]  # any --prof-* option turns it on
        return args

    def replace(self, **flat: Any) -> RunConfig:
        """A copy with some options changed, by flat name."""
        values = self.to_flat()
        values.update(flat)
        return RunConfig.from_flat(values)


@functools.cache
def _default_flat() -> dict[str, Any]:
    return RunConfig().to_flat()


def option_words(key: str, value: Any) -> list[str]:
    """One option as command-line words: --flag / --no-flag for booleans, comma-joined lists, str() otherwise."""
    flag = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + key.replace("_", "-")]
    if isinstance(value, (list, tuple)):
        return [flag, ",".join(map(str, value))]
    return [flag, str(value)]


@functools.cache
def _field_types() -> dict[str, Any]:
    """Each option's type hint, resolved once (typing.get_type_hints is slow; sweeps check thousands of values)."""
    import typing

    return {name: hint for cls in SECTIONS.values() for name, hint in typing.get_type_hints(cls).items()}


def _check_type(key: str, value: Any) -> Any:
    """Values from YAML or Python callers: the right type, or one line naming the option (ints pass as floats)."""
    import types
    import typing

    hint = _field_types()[key]
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None and type(None) in args:
        return value
    base = next(a for a in args if a is not type(None))
    base = tuple if typing.get_origin(base) is tuple else base
    if base is tuple and isinstance(value, (list, tuple, str)):
        return value
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if base is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"--{key.replace('_', '-')} must be a finite number, got {value}")
    if isinstance(value, base) and not (base is int and isinstance(value, bool)):
        return value
    name = getattr(base, "__name__", str(base))
    raise ConfigError(f"option '{key}' must be {name}, got {type(value).__name__} ({value!r})")


def flat_field_owners() -> dict[str, str]:
    """Map each option name to its section."""
    return dict(_owners())


@functools.cache
def _owners() -> dict[str, str]:
    return {f.name: section for section, cls in SECTIONS.items() for f in fields(cls)}
