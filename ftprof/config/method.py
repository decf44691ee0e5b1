"""The method section: full, LoRA, QLoRA or GPTQ-LoRA, and each method's own options with their defaults."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

from ftprof.config import declarations
from ftprof.config.options import (
    DEFAULT_LORA_TARGETS,
    DEQUANT_KERNELS,
    DTYPES,
    LORA_METHODS,
    METHODS,
    check_types,
    one_of,
    option,
    require,
)
from ftprof.errors import ConfigError

# Method options by the methods they apply to: (methods, option names). MethodConfig rejects the others; the CLI
# leaves them out of a method's --help. The options declared in config/declarations.py come from there.
_UNDECLARED_GROUPS = {
    "lora": (LORA_METHODS, ("lora_r", "lora_alpha", "lora_dropout", "lora_targets")),
    "bitsandbytes": (("qlora",), ("quant_type", "double_quant", "compute_dtype", "quant_storage")),
    "GPTQ": (("gptq-lora",), ("gptq_bits", "gptq_group_size", "gptq_backend", "gptq_calibration_samples",
                             "gptq_quantizer")),
}


def _method_option_groups() -> dict[str, tuple[tuple, tuple]]:
    groups = dict(_UNDECLARED_GROUPS)
    for label, (methods, names) in declarations.method_groups().items():
        known, before = groups.get(label, (methods, ()))
        assert set(known) == set(methods), f"{label}: declared for {methods}, grouped for {known}"
        groups[label] = (known, before + names)
    return groups


METHOD_OPTION_GROUPS = _method_option_groups()


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
    lora_fused_projections: Optional[bool] = option(
        None, "one GEMM for each group of adapted projections that read the same input (q, k, v; gate, up), the "
        "adapters' B matmuls inside it: base weights side by side, no full-size adapter output or add (lora, "
        "qlora; gptq-lora bases keep their own; not under FSDP; default off)")
    lean_activations: Optional[bool] = option(
        None, "in layers that keep their activations, the MLP keeps gate and up but not their SwiGLU product, "
        "which backward forms again for the down projection's adapter (one elementwise pass): intermediate_size "
        "values less per token and layer, a fifth of a llama-8b LoRA layer's; 2-3% slower on an H100 "
        "(Llama-style MLPs; default off)")
    lean_norms: Optional[bool] = option(
        None, "in layers that keep their activations, each norm feeding a shared adapter A matmul (--lora-fused-a) "
        "keeps its input but not its output, which backward forms again: 2 x hidden_size values less per token and "
        "layer; about 5% slower on an H100 (the norm runs outside the compiled kernels; Llama-style layers; "
        "default off)")
    fp8_base: Optional[bool] = option(
        None, "run the frozen base weights' matmuls (forward and input gradient) as rowwise-scaled e4m3 GEMMs, "
        "twice the bf16 tensor-core rate on Hopper and Ada; adapters, attention and the loss stay 16-bit: FP8's "
        "numerics, checked against eager on the GPU (lora, qlora; CUDA compute capability 8.9+, or the CPU; not "
        "under FSDP; default off)")
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
        check_types(self)
        one_of("method", self.method, METHODS)
        if isinstance(self.lora_targets, str):
            self.lora_targets = tuple(t.strip() for t in self.lora_targets.split(",") if t.strip())
        elif isinstance(self.lora_targets, list):
            self.lora_targets = tuple(self.lora_targets)
        self._check_applicable()
        if self.lora_r is not None:
            require(self.lora_r >= 1, f"--lora-r must be at least 1, got {self.lora_r}")
        if self.lora_alpha is not None:  # (0 trains nothing, a negative alpha flips every adapter's sign)
            require(math.isfinite(self.lora_alpha) and self.lora_alpha > 0,
                    f"--lora-alpha must be a positive number, got {self.lora_alpha}")
        if self.lora_dropout is not None:
            require(0.0 <= self.lora_dropout < 1.0, f"--lora-dropout must be in [0, 1), got {self.lora_dropout}")
        if self.lora_targets is not None:
            require(len(self.lora_targets) > 0, "--lora-targets must name at least one module")
            bad = next((t for t in self.lora_targets if not isinstance(t, str)), None)
            require(bad is None, f"--lora-targets: module names (strings), got {type(bad).__name__} {bad!r} among "
                    "them")
        for problem in declarations.problems(dataclasses.asdict(self), sections=("method",)):
            raise ConfigError(problem)
        if self.gptq_group_size is not None:
            require(self.gptq_group_size == -1 or self.gptq_group_size >= 16,
                     f"--gptq-group-size must be -1 or >= 16, got {self.gptq_group_size}")
        if self.gptq_calibration_samples is not None:
            require(self.gptq_calibration_samples >= 1, "--gptq-calibration-samples must be at least 1")

    def for_method(self, method: str, run_dtype: str, preset: bool = False) -> MethodConfig:
        """The same settings for another method (``ftprof plan`` compares methods): the options that apply to
        both are kept, the others dropped, and the new method's defaults filled in."""
        values = dataclasses.asdict(self)
        values.update({name: None for name in inapplicable_options(method)}, method=method)
        return MethodConfig(**values).resolved(run_dtype, preset=preset)

    def fused_a_runs(self) -> bool:
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
                          lora_addmm=bool(self.lora_addmm), lora_fused_a=self.fused_a_runs(),
                          lean_activations=bool(self.lean_activations), lean_norms=bool(self.lean_norms))
        if self.method in ("lora", "qlora"):
            values.update(lora_fused_projections=bool(self.lora_fused_projections), fp8_base=bool(self.fp8_base))
        if self.method in ("qlora", "gptq-lora"):
            values.update(kbit_prepare=bool(self.kbit_prepare))
        if self.method == "qlora":
            values.update(quant_type=self.quant_type or "nf4",
                          double_quant=True if self.double_quant is None else self.double_quant,
                          compute_dtype=self.compute_dtype or run_dtype,
                          quant_storage=self.quant_storage or run_dtype,
                          keep_dequantized=self.keep_dequantized is not False and not self.fp8_base,
                          dequant_kernel=self.dequant_kernel if self.dequant_kernel in DEQUANT_KERNELS[1:]
                          else "triton" if triton else "bitsandbytes")
        if self.method == "gptq-lora":
            values.update(gptq_bits=self.gptq_bits or 4, gptq_group_size=self.gptq_group_size or 128,
                          gptq_backend=self.gptq_backend or "gptq_torch",
                          gptq_calibration_samples=self.gptq_calibration_samples or 32,
                          gptq_quantizer=self.gptq_quantizer or ("rtn" if preset else "gptq"))
        return MethodConfig(**values)
