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
from pathlib import Path

from ftprof.metrics import GIB

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

VMSTAT = "/proc/vmstat"  # the system-wide OOM-kill count (oom_kill_counts)


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
            f"the machine has {available / GIB:.1f} GiB available; {_advice(need, available, method, dtype)}")


def _advice(need: HostNeed, available: int, method: str, dtype: str) -> str:
    """What can bring the run under ``available``: only the logits shrink with --batch-size and --seq-len."""
    fixed = need.weights + need.gradients + need.optimizer
    if fixed < available:
        return "lower --batch-size or --seq-len, or use a GPU"
    if need.weights < available and method == "full":
        return ("the weights fit but their gradients and Adam state do not: train adapters only (lora or qlora), "
                "or use a smaller --model, a machine with more memory or a GPU")
    half = dtype == "float32" and need.weights / 2 + need.gradients / 2 + need.optimizer / 2 + need.logits < available
    return ("the weights alone do not fit, whatever the batch: " + ("--dtype bfloat16 halves them, or use " if half
            else "use ") + "a smaller --model, a machine with more memory, or a GPU")


def oom_kill_counts() -> dict[str, int]:
    """The kernel's counts of processes its OOM killer has killed, by where each was read: system-wide
    (``/proc/vmstat``'s ``oom_kill``) and in this process's memory cgroup (v2 ``memory.events``, v1
    ``memory.oom_control``); a source that cannot be read is left out, so an empty dict means no evidence either way.
    A count that rose while a child ran, with the child dead of SIGKILL, is the evidence that the OOM killer took it
    (dmesg, which would say so directly, is rarely readable)."""
    counts: dict[str, int] = {}
    found = _counter(Path(VMSTAT), "oom_kill")
    if found is not None:
        counts[VMSTAT] = found
    for path in _cgroup_event_files():
        found = _counter(path, "oom_kill")
        if found is not None:
            counts[str(path)] = found
    return counts


def oom_kills_between(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """The sources whose OOM-kill count rose from ``before`` to ``after`` (read with :func:`oom_kill_counts`)."""
    return [src for src, n in after.items() if src in before and n > before[src]]


def _counter(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def _cgroup_event_files() -> list[Path]:
    root = Path("/sys/fs/cgroup")
    out = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, rel = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        rel = rel.lstrip("/")
        if controllers == "":  # cgroup v2 (unified)
            for base in (root, root / "unified"):
                if (base / rel / "memory.events").is_file():
                    out.append(base / rel / "memory.events")
                    break
        elif "memory" in controllers.split(","):
            if (root / "memory" / rel / "memory.oom_control").is_file():
                out.append(root / "memory" / rel / "memory.oom_control")
    return out
