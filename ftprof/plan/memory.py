"""Peak memory per GPU of a candidate, from the probe's exact parts (ftprof/plan/probe.py).

    peak = weights + optimizer state + max(activations + transients, gradients)   (one micro-batch per step)
    peak = weights + optimizer state + gradients + activations + transients      (gradient accumulation)

- weights, gradients, optimizer state: the probe's bytes outside the layers plus L times one layer's (GPTQ-LoRA:
  its layers' 4-bit linears re-sized to GPTQ's layout). Under FSDP2 each GPU holds 1/world of them, plus one
  layer's weights gathered at a time.
- activations: bytes per token for the policy times the micro-batch's tokens; with full checkpointing on N of L
  layers, N layers at full's rate and L - N at none's (at selective's under --selective-rest). A fused loss
  (Liger's fused linear cross entropy) saves none of the loss's logits, only the gradient of its input, which it
  computes in the forward. Times the
  calibration's factor for this kind of run on a GPU (compile and fused kernels save less than the eager probe
  measured; ftprof/plan/calibration.py). A CPU run saves what the CPU probe measured: no factor.
- --lean-activations, --lean-norms: less the SwiGLU product, the norms' outputs of each layer that keeps its activations
  (``lean_bytes``).
- transients: the larger of the loss backward's fp32 logits gradients (none with a fused loss; one logits-sized
  gradient in the run dtype with the compiled loss) and, under full
  checkpointing, the layer being recomputed (its activations at none's rate, for QLoRA/GPTQ-LoRA its dequantized
  weights): the loss backward is over before the first layer is recomputed.
- gradients land as activations are freed: without accumulation the peak is the larger of the two ends of
  backward; with accumulation the previous micro-batches' gradients are there during the next forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftprof.config import declarations
from ftprof.metrics import keeping_layers, logits_gradient_bytes
from ftprof.plan.candidates import REST, Candidate
from ftprof.plan.probe import ProbeResult, gptq_bytes, nf4_bytes


@dataclass(frozen=True)
class MemoryPrediction:
    peak_bytes: int
    static_bytes: int  # weights + gradients + optimizer state
    weights: int
    gradients: int
    optimizer_state: int
    activation_bytes: int  # calibrated
    probed_activation_bytes: int  # before the factor
    activation_factor: float
    transient_bytes: int


@dataclass(frozen=True)
class Shape:
    """What the memory of a candidate depends on besides the candidate itself."""

    seq_len: int
    vocab: int
    world_size: int = 1
    shards: bool = False  # FSDP2 (several GPUs, full or LoRA methods sharded)
    gptq_bits: int = 4
    gptq_group_size: int = 128
    keeps_dequantized: bool = True  # QLoRA's --keep-dequantized under full checkpointing
    double_quant: bool = True  # QLoRA's --double-quant
    fused_loss_bytes_per_token: int = 0  # a fused loss's gradient of its input, computed in the forward and kept
    compile_loss: bool = True  # --compile-loss: with --compile (and an unfused loss) the loss is compiled too
    dtype_bytes: int = 2  # the run dtype's width (the logits' when the compiled loss keeps them)
    fp8_base: bool = False  # --fp8-base: LoRA keeps each base weight's e4m3 rows and their transpose
    layer_input_bytes_per_token: int = 0  # a decoder layer's input (hidden size x the run dtype's width)
    host_embedding_bytes: int = 0  # the input embedding table --offload-embeddings moves to the host (0: tied)
    mlp_product_bytes_per_token: int = 0  # one SwiGLU product (intermediate size x the run dtype's width)
    lean_norm_bytes_per_token: int = 0  # --lean-norms' two norm outputs a layer (0 where no shared A matmul)


def static_parts(probe: ProbeResult, cand: Candidate, shape: Shape) -> tuple[int, int, int]:
    """(weights, gradients, optimizer state) per GPU."""
    layers = probe.layers
    per_layer_weights = probe.per_layer.weights
    if cand.method == "qlora":
        packed = sum(nf4_bytes(i, o, shape.double_quant) for i, o in probe.linear_shapes)
        per_layer_weights += packed - probe.linear_bytes
    elif cand.method == "gptq-lora":
        packed = sum(gptq_bytes(i, o, shape.gptq_bits, shape.gptq_group_size) for i, o in probe.linear_shapes)
        per_layer_weights += packed - probe.linear_bytes
    if shape.fp8_base and cand.method in ("lora", "qlora"):
        per_layer_weights += sum(fp8_buffer_bytes(i, o, cand.method) for i, o in probe.linear_shapes)
    weights = probe.outside.weights + layers * per_layer_weights
    if cand.option("offload_embeddings"):
        weights -= shape.host_embedding_bytes
    grads = probe.outside.gradients + layers * probe.per_layer.gradients
    state = probe.outside.optimizer_state + layers * probe.per_layer.optimizer_state
    if shape.shards and shape.world_size > 1:
        # FSDP2: a shard of everything, and one layer's weights gathered while it runs
        n = shape.world_size
        weights, grads, state = weights // n + per_layer_weights, grads // n, state // n
    return weights, grads, state


def fp8_buffer_bytes(in_features: int, out_features: int, method: str) -> int:
    """What --fp8-base keeps beside a base linear (models/fp8_base.py): fp32 row scales and a row of fp32 ones;
    LoRA also the e4m3 rows and their transpose, one byte a value twice (+13.0 GiB measured on an H200 for
    llama-8b: 66.33 against 53.32 GiB peak); QLoRA the row scales' inverses (its e4m3 rows are made on each use)."""
    common = 4 * (out_features + in_features)
    if method == "lora":
        return common + 2 * in_features * out_features
    return common + 4 * out_features


def activations_per_token(probe: ProbeResult, cand: Candidate, shape: Shape) -> float:
    """Bytes per token the forward saves under the candidate's policy and kernel set."""
    from ftprof.models.kernels import fuses_loss

    outside, layer, policy = probe.outside, probe.per_layer, cand.checkpointing
    checkpointed = _checkpointed_layers(probe, cand)
    total = (outside.activations[policy] + checkpointed * layer.activations[policy]
             + (probe.layers - checkpointed) * layer.activations[rest_policy(cand)])
    if cand.option("lean_recompute") and not cand.compile:
        # eager selective no longer keeps the output projection's output (models/recompute.py); compiled, the
        # partitioner never kept it (backward does not read it: the same saved bytes measured with and without)
        total -= _selective_layers(probe, cand) * shape.layer_input_bytes_per_token
    if fuses_loss(cand.kernels):
        total += shape.fused_loss_bytes_per_token - outside.loss_activations
    elif compiled_loss(cand, shape):
        # the compiled loss keeps the logits in the run dtype, not their fp32 upcast and log-softmax (measured on
        # an H200, llama-8b 4 x 2048: 4.08 GiB saved with full checkpointing against the eager probe's 6.04)
        total += shape.vocab * shape.dtype_bytes - outside.loss_activations
    return max(total, 0.0)


def compiled_loss(cand: Candidate, shape: Shape) -> bool:
    from ftprof.models.kernels import fuses_loss

    return cand.compile and shape.compile_loss and not fuses_loss(cand.kernels)


def activations_fixed(probe: ProbeResult, cand: Candidate) -> float:
    """Bytes the forward saves once whatever its length (adapters cast to the run dtype), under the policy."""
    outside, layer, policy = probe.outside, probe.per_layer, cand.checkpointing
    checkpointed = _checkpointed_layers(probe, cand)
    return max(0.0, outside.activations_fixed[policy] + checkpointed * layer.activations_fixed[policy]
               + (probe.layers - checkpointed) * layer.activations_fixed[rest_policy(cand)])


# Liger's fused linear cross entropy works through the logits in chunks of about tokens x hidden values (its chunk
# rows are tokens / ceil(vocab / hidden)), upcast and differentiated in fp32: measured 0.83-0.85 GiB above the saved
# activations for mistral-7b QLoRA at 4 x 2048 (H200, partial checkpointing, where no recomputed layer outweighs it),
# 13.6 times the 64 MiB of one layer input. The llama-8b 12 GiB cell (1 x 4, no checkpointing, H100) peaked at the
# 11.13 GiB this predicts with 2,048-token chunks, at 10.88 GiB with Liger's own and with ftprof's 1,024-token
# chunks (models/kernels.py; round 32): the prediction is 0.25 GiB high there, on the safe side.
FUSED_LOSS_WORKSET = 13.6
OFFLOADED_SHARE = 0.92  # of the checkpointed layers' inputs, what --offload-checkpoints takes off the peak (measured)


def transient_bytes(probe: ProbeResult, cand: Candidate, shape: Shape, freed: int = 0) -> int:
    """What the backward holds above the saved activations at its peak: the loss's logits gradients, or the layer
    being recomputed. ``freed``: the saved activations the backward has already released when the first
    recomputation starts (those of the layers partial checkpointing leaves unchecked, the last ones: backward
    reaches them first)."""
    from ftprof.models.kernels import fuses_loss

    tokens = cand.batch_size * shape.seq_len
    if fuses_loss(cand.kernels):  # Liger's fused loss: its chunks' working set, about a fixed multiple of the input
        logits = int(FUSED_LOSS_WORKSET * tokens * shape.layer_input_bytes_per_token)
    else:
        logits = logits_gradient_bytes(tokens, shape.vocab)
    if compiled_loss(cand, shape):
        # one logits-sized gradient in the run dtype: 1.86-1.87 GiB above the other parts on an H200 (llama-8b,
        # 4 x 2048, vocab 128,256: 1.96 GiB of bf16 logits), compiled with and without checkpointing
        logits = tokens * shape.vocab * shape.dtype_bytes
    recompute = 0
    if cand.checkpointing == "full":
        recompute = int(probe.per_layer.activations["none"] * tokens)  # the layer being recomputed
        quantized = cand.method == "gptq-lora" or (cand.method == "qlora" and shape.keeps_dequantized)
        if quantized:
            recompute += probe.linear_bytes  # the layer's 4-bit weights dequantized to the run dtype
    # The loss backward runs first and is done before any layer is recomputed: the two never coexist (measured on
    # an H200, QLoRA full checkpointing: the peak above the other parts was the logits gradients alone). Under
    # partial checkpointing the unchecked layers' activations are gone by the first recomputation (mistral-7b QLoRA,
    # full on 19 of 32, H200: 0.0-0.85 GiB above the activations measured, 1.41 predicted without this).
    return max(logits, recompute - freed)


def predict_memory(probe: ProbeResult, cand: Candidate, shape: Shape, factor: float = 1.0,
                   rest_factor: float | None = None) -> MemoryPrediction:
    """``factor`` scales the policy's activations; ``rest_factor`` those of the layers partial checkpointing leaves
    unchecked (none's, or selective's under --selective-rest; default ``factor``)."""
    weights, grads, state = static_parts(probe, cand, shape)
    tokens = cand.batch_size * shape.seq_len
    probed = activations_per_token(probe, cand, shape) * tokens + activations_fixed(probe, cand)
    unchecked = 0 if cand.checkpointing == "none" else probe.layers - _checkpointed_layers(probe, cand)
    other = rest_policy(cand)
    rest = unchecked * (probe.per_layer.activations[other] * tokens + probe.per_layer.activations_fixed[other])
    rest = min(rest, probed)
    rest_saved = int(rest * (factor if rest_factor is None else rest_factor))
    activations = int((probed - rest) * factor) + rest_saved
    activations = max(0, activations - lean_bytes(probe, cand, shape) * tokens)
    transients = transient_bytes(probe, cand, shape, freed=rest_saved)
    if cand.checkpointing == "full" and cand.option("offload_checkpoints"):
        # --offload-checkpoints: the checkpointed layers' inputs wait in host memory; two of them are back on the
        # device during backward (double buffering). Measured on an H200, llama-8b QLoRA 4 x 2048: 10.30 -> 8.57
        # GiB peak allocated, 1.73 GiB, against the 1.88 GiB of inputs: OFFLOADED_SHARE of them leave the peak
        # (all of them left it 1.7-3.5% under three measured peaks)
        layer_input = tokens * shape.layer_input_bytes_per_token
        offloaded = int(OFFLOADED_SHARE * _checkpointed_layers(probe, cand) * layer_input)
        activations = max(0, activations - offloaded)
        transients += 2 * layer_input
    if cand.option("offload_embeddings"):
        # the next micro-batch's rows (prefetched) wait on the device during this one, in place of its token ids
        transients += tokens * shape.layer_input_bytes_per_token
    if cand.grad_accum > 1:
        dynamic = grads + activations + transients
    else:
        dynamic = max(activations + transients, grads)
    return MemoryPrediction(weights + state + dynamic, weights + grads + state, weights, grads, state, activations,
                            int(probed), activations / probed if probed else factor, transients)


def lean_bytes(probe: ProbeResult, cand: Candidate, shape: Shape) -> int:
    """Bytes per token --lean-activations and --lean-norms leave unsaved in the layers that keep their activations,
    computed rather than probed (the probe is built without them): the SwiGLU product (models/lean_mlp.py) and,
    where a group of projections shares one A matmul and is not joined, the two norms' outputs (models/lean_norm.py).
    The product: HF's eager MLP keeps silu(gate) beside it, and the lean op keeps neither: two products a layer
    there. Beside Liger's MLP (gate and up kept) it is one; beside a compiled layer, one for llama-8b QLoRA at
    4 x 2048 (43.99 -> 36.99 GiB on an H100, 2026-12-05) and two for a 64-wide test model: one is taken, the safe
    side. The norms: each output, in the run dtype (HF's eager norm also kept an fp32 copy of its input, which the
    op replaces by the input itself: not counted, the safe side). Compiled, the layer had kept other tensors for
    the norm's backward, and the op's input takes some of what its output gave back: 76% of the outputs' bytes came
    off the tiny preset on the CPU, on the GPU 98.5% (llama-8b QLoRA 4 x 2048, 3.94 of 4.0 GiB, compiled with
    Liger, CUDA graphs, and with HF's MLPs: H100 round 29, H200 round 30). The first layer's input norm gives
    nothing back: its input, the frozen table's rows, needs no gradient, so without the op only its output was
    kept (for A), and the op keeps the input instead (63 of llama-8b's 64 norms: 98.4%)."""
    kept = _keeping(probe.layers, cand)
    products = (2 if cand.kernels == "eager" and not cand.compile else 1) if cand.option("lean_activations") else 0
    # (where the declaration voids it, beside joined projections, there is no norm output to leave)
    norms = cand.option("lean_norms") and declarations.BY_NAME["lean_norms"].applies(cand.values())
    norm_outputs = 2 * len(kept) - (1 if 0 in kept else 0) if norms else 0
    return len(kept) * products * shape.mlp_product_bytes_per_token \
        + norm_outputs * shape.lean_norm_bytes_per_token // 2


def kept_layers(layers: int, cand: Candidate) -> int:
    """Of ``layers`` decoder layers, those that keep their activations: every one under none, those partial
    checkpointing (full or selective) leaves unchecked, unless --selective-rest runs them selective."""
    return len(_keeping(layers, cand))


def _keeping(layers: int, cand: Candidate) -> range:
    return keeping_layers(layers, cand.checkpointing, cand.checkpoint_layers, rest_policy(cand) == "selective")


def _selective_layers(probe: ProbeResult, cand: Candidate) -> int:
    """The decoder layers under selective checkpointing: all or the first N under selective, the rest under
    --selective-rest."""
    checkpointed = _checkpointed_layers(probe, cand)
    if cand.checkpointing == "selective":
        return checkpointed
    return probe.layers - checkpointed if rest_policy(cand) == "selective" else 0


def rest_policy(cand: Candidate) -> str:
    """The policy of the layers partial checkpointing leaves out: selective under --selective-rest (full on the
    first N layers), else none (they keep their activations)."""
    partial_full = cand.checkpointing == "full" and cand.checkpoint_layers is not None
    return "selective" if partial_full and cand.option(REST) else "none"


def _checkpointed_layers(probe: ProbeResult, cand: Candidate) -> int:
    """Decoder layers the candidate's policy applies to (0 for none; all unless --checkpoint-layers says)."""
    if cand.checkpointing == "none":
        return 0
    return probe.layers if cand.checkpoint_layers is None else cand.checkpoint_layers
