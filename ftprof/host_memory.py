"""What a CPU run needs of host memory, from the model's config alone, before anything loads.

    weights     parameters x bytes per parameter (the run's dtype; 4-bit bases about half a byte)
    gradients   trainable parameters x bytes           (full fine-tuning: every parameter)
    Adam state  trainable parameters x bytes x 2       (exp_avg, exp_avg_sq)
    logits      batch x seq_len x vocab x 4 bytes x 2  (fp32 logits and their gradient: the loss's upcast)

This is a lower bound (activations of the decoder layers come on top), so a refusal is certain: a run refused here
could not have fit. LoRA adapters are small against the base and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 1 << 30


@dataclass(frozen=True)
class HostNeed:
    weights: int
    gradients: int
    optimizer: int
    logits: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.logits


def parameter_count(config) -> int | None:
    """Parameters of a Llama-shaped decoder from its config (None when the config lacks a field it needs)."""
    try:
        hidden, layers = int(config.hidden_size), int(config.num_hidden_layers)
        inter, vocab, heads = int(config.intermediate_size), int(config.vocab_size), int(config.num_attention_heads)
    except (AttributeError, TypeError, ValueError):
        return None
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    per_layer = attention + 3 * hidden * inter + 2 * hidden
    embeddings = vocab * hidden * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    return layers * per_layer + embeddings + hidden


def host_need(config, method: str, dtype: str, batch_size: int, seq_len: int) -> HostNeed | None:
    params = parameter_count(config)
    if params is None:
        return None
    size = DTYPE_BYTES.get(dtype, 4)
    per_weight = 0.5 if method in ("qlora", "gptq-lora") else size
    trainable = params if method == "full" else 0
    logits = batch_size * seq_len * int(config.vocab_size) * 4 * 2
    return HostNeed(int(params * per_weight), trainable * size, trainable * size * 2, logits)


def available_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - psutil missing or no /proc: no prediction
        return None


def refusal(config, method: str, dtype: str, batch_size: int, seq_len: int) -> str | None:
    """The one line refusing a CPU run that cannot fit in the host's available memory, or None."""
    need, available = host_need(config, method, dtype, batch_size, seq_len), available_bytes()
    if need is None or available is None or need.total <= available:
        return None
    parts = [f"weights {need.weights / GIB:.1f}", f"gradients {need.gradients / GIB:.1f}",
             f"Adam state {need.optimizer / GIB:.1f}", f"logits {need.logits / GIB:.1f} (batch {batch_size} x "
             f"seq {seq_len})"]
    return (f"host memory: this CPU run needs at least {need.total / GIB:.1f} GiB ({', '.join(parts)}) and "
            f"the machine has {available / GIB:.1f} GiB available; lower --batch-size or --seq-len, or use a GPU")
