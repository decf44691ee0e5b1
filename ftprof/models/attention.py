"""Which kernel runs scaled-dot-product attention (``--sdpa-backend auto|flash|efficient|cudnn``).

PyTorch's SDPA picks the first backend in its priority order that supports the inputs. ``auto`` keeps torch's own
order; naming a backend moves it to the front for the run, the others staying behind it as fallbacks, so inputs it
cannot handle still run. ``probe`` asks SDPA which backend it picks for the model's own training shape, and the
run records that answer (``sdpa_backend_used``): measured on an H200 with torch 2.11, ``auto`` already runs cuDNN's
attention for llama-8b (batch 4 x 2048), so ``auto`` and ``cudnn`` train at the same speed there (15,100 and 15,095
tokens/s, QLoRA with compiled blocks); the option is for comparing kernels and for builds that order them
differently.

The order is global state read when SDPA dispatches, and when torch.compile traces a block: it is set before the
model's first forward and put back when the run ends.
"""

from __future__ import annotations

import contextlib

from ftprof.errors import ConfigError

_ENUM_NAMES = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
               "math": "MATH"}


def check_backend(name: str, device_type: str, attn_implementation: str) -> None:
    """One line, before anything loads, when the chosen backend cannot run here."""
    if name == "auto":
        return
    if device_type != "cuda":
        raise ConfigError(f"--sdpa-backend {name} needs a CUDA device; use --sdpa-backend auto on CPU")
    if attn_implementation != "sdpa":
        raise ConfigError(f"--sdpa-backend {name} applies to --attn-implementation sdpa, not "
                          f"{attn_implementation}")


def _backend(name: str):
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, _ENUM_NAMES[name])


@contextlib.contextmanager
def preferred(name: str):
    """For the duration of a run, put backend ``name`` first in SDPA's priority order (auto: change nothing)."""
    if name == "auto":
        yield
        return
    import torch

    before = torch._C._get_sdp_priority_order()
    first = int(_backend(name))
    torch._C._set_sdp_priority_order([first, *(b for b in before if b != first)])
    try:
        yield
    finally:
        torch._C._set_sdp_priority_order(before)


def probe(model_config, seq_len: int, device, dtype) -> str | None:
    """The backend SDPA picks for this model's causal training attention (no mask, grouped KV heads as
    transformers passes them), or None when it cannot be asked (not CUDA, or an architecture without these
    fields). One sequence of the run's length and the real head shape (the choice depends on head size, sequence
    length, dtype, heads and masking, not on the batch), so the probe stays small whatever the batch."""
    heads = getattr(model_config, "num_attention_heads", None)
    hidden = getattr(model_config, "hidden_size", None)
    if device.type != "cuda" or not heads or not hidden:
        return None
    import torch

    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    head_dim = getattr(model_config, "head_dim", None) or hidden // heads
    q = torch.empty(1, heads, seq_len, head_dim, device=device, dtype=dtype, requires_grad=True)
    kv = torch.empty(1, kv_heads, seq_len, head_dim, device=device, dtype=dtype, requires_grad=True)
    try:
        choice = torch._fused_sdp_choice(q, kv, kv, None, 0.0, True, enable_gqa=kv_heads != heads)
    except (RuntimeError, TypeError):
        return None
    from torch.nn.attention import SDPBackend

    names = {int(getattr(SDPBackend, enum)): key for key, enum in _ENUM_NAMES.items()}
    return names.get(int(choice), str(int(choice)))
