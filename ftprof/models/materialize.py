"""Build a model from a config with random weights directly on the target device.

Parameters are created on the meta device first (buffers such as rotary frequencies stay real), then each one is
allocated and initialised on the device. An optional ``replace_linear`` hook may swap a freshly initialised linear
layer for another module (QLoRA quantizes it to 4 bits there), so a 70B model never exists in 16-bit form: peak
memory is the quantized model plus one layer's weight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch
from torch import nn

LinearHook = Callable[[str, nn.Linear], Optional[nn.Module]]


def _init_(name: str, module: nn.Module, param: torch.Tensor, std: float, gen: torch.Generator,
           module_name: str = "") -> None:
    """HF-style init: normal(0, std) for matmul/embedding weights, zero biases, ones for norm scales; LoRA's B
    starts at zero so the adapted model starts as the base model."""
    with torch.no_grad():
        if ".lora_B." in f".{module_name}.":
            param.zero_()
        elif isinstance(module, (nn.Linear, nn.Embedding)) and name == "weight":
            param.normal_(0.0, std, generator=gen)
        elif name == "weight" and param.dim() == 1:
            param.fill_(1.0)
        else:
            param.zero_()


def empty_model(config, dtype: torch.dtype, attn_implementation: str = "sdpa") -> nn.Module:
    """The model with parameters on the meta device (no memory) and real buffers (rotary tables)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    # init_empty_weights loses the lm_head <-> embedding tie (seen with transformers 5.23): restore it while the
    # parameters are still meta, so the tied weight is materialized once.
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model


def build_random_model(config, device: torch.device, dtype: torch.dtype, *, seed: int = 0,
                       attn_implementation: str = "sdpa", replace_linear: LinearHook | None = None,
                       init: bool = True) -> nn.Module:
    """``init=False``: parameters are allocated and left as they are (the planner's probe measures sizes, which no
    value changes: drawing a 2-layer llama-8b's 1.5 billion random values took half of its probe's time)."""
    model = empty_model(config, dtype, attn_implementation)
    gen = torch.Generator(device=device).manual_seed(seed)
    std = float(getattr(config, "initializer_range", 0.02))
    # Tied parameters (lm_head <-> embeddings) are materialized once. Only those are remembered: holding every new
    # parameter here would keep each replaced linear's 16-bit weight alive to the end (a 70B QLoRA build then
    # needs the 140 GB it exists to avoid).
    uses: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        uses[id(param)] = uses.get(id(param), 0) + 1
    tied: dict[int, nn.Parameter] = {}
    for mod_name, module in list(model.named_modules()):
        for p_name, param in list(module.named_parameters(recurse=False)):
            if id(param) in tied:
                module._parameters[p_name] = tied[id(param)]
                continue
            if not param.is_meta:
                continue
            new = nn.Parameter(torch.empty(param.shape, dtype=dtype, device=device), requires_grad=param.requires_grad)
            if init:
                _init_(p_name, module, new, std, gen)
            if uses[id(param)] > 1:
                tied[id(param)] = new
            module._parameters[p_name] = new
        for b_name, buf in list(module.named_buffers(recurse=False)):
            module._buffers[b_name] = buf.to(device)
        if replace_linear is not None and isinstance(module, nn.Linear):
            replacement = replace_linear(mod_name, module)
            if replacement is not None:
                parent_name, _, child = mod_name.rpartition(".")
                setattr(model.get_submodule(parent_name) if parent_name else model, child, replacement)
                module._parameters.clear()  # the list above still holds the old module: drop its 16-bit weight
    return model


def materialize_sharded(model: nn.Module, device: torch.device, *, std: float = 0.02, seed: int = 0,
                        params_on: torch.device | None = None) -> None:
    """Allocate and initialise a model whose parameters are still on the meta device after FSDP2 sharding.

    Each rank allocates only its shards (DTensor local tensors) and fills them; non-persistent buffers (rotary
    tables) are real tensors built at construction, which ``to_empty`` would wipe, so they are kept and restored on
    ``device``, where the forward runs. ``params_on`` puts the shards elsewhere: FSDP2's CPU offload wants them in
    host memory (it refuses GPU-materialized parameters), while buffers, which FSDP does not move, stay on the GPU.
    """
    buffers = {name: buf for name, buf in model.named_buffers() if not buf.is_meta}
    home = params_on or device
    model.to_empty(device=home)
    gen = torch.Generator(device=home).manual_seed(seed)
    for mod_name, module in model.named_modules():
        for p_name, param in module.named_parameters(recurse=False):
            local = param.to_local() if hasattr(param, "to_local") else param
            _init_(p_name, module, local, std, gen, module_name=mod_name)
    for name, buf in buffers.items():
        parent, _, leaf = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        owner._buffers[leaf] = buf.to(device)
