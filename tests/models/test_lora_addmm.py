"""The adapter output added inside its B matmul (models/lora_addmm.py): PEFT's numbers, one addmm per adapted
linear and no full-size add, PEFT's own forward wherever the fused form does not apply."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.conftest import build_run, tiny_config
from tests.tolerances import GRADIENTS, SAME_OPS


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def loss_and_grads(tmp_path, method: str, nonzero_b: bool = False, **flat):
    """One batch's loss, LoRA gradients and dispatched ops for the tiny preset with ``flat`` options; with
    ``nonzero_b``, B starts random (PEFT's zeros would leave A without a gradient)."""
    plan, built = build_run(tiny_config(tmp_path, method, seq_len=16, **flat))
    if nonzero_b:
        with torch.no_grad():
            for name, p in built.model.named_parameters():
                if "lora_B" in name:
                    torch.nn.init.normal_(p, std=0.02)
    batch = next(built.batches)
    with built.autocast(), CountOps() as counter:
        loss = built.model(**batch).loss
    loss.backward()
    grads = {n: p.grad for n, p in built.model.named_parameters() if p.requires_grad}
    return built, loss.detach(), grads, counter.ops


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_fused_adapters_compute_what_peft_computes(tmp_path, method):
    built, loss, grads, ops = loss_and_grads(tmp_path / "fused", method, lora_addmm=True, lora_alpha=8.0)
    _, peft_loss, peft_grads, peft_ops = loss_and_grads(tmp_path / "peft", method, lora_addmm=False, lora_alpha=8.0)
    adapted = sum(1 for n, _ in built.model.named_modules() if n.endswith(".lora_A"))
    assert adapted > 0
    assert ops.count("addmm") == peft_ops.count("addmm") + adapted  # one per adapted linear
    assert ops.count("add") <= peft_ops.count("add") - adapted  # PEFT's full-size adds are gone
    torch.testing.assert_close(loss, peft_loss, **SAME_OPS)
    assert grads.keys() == peft_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, peft_grads[name], **GRADIENTS, msg=name)


def test_disabled_adapters_run_peft_forward(tmp_path):
    plan, built = build_run(tiny_config(tmp_path, "lora", seq_len=16))
    batch, model = next(built.batches), built.model
    lora_b = [m for n, m in model.named_modules() if n.endswith("lora_B.default")]
    with torch.no_grad():
        for m in lora_b:
            torch.nn.init.normal_(m.weight)  # PEFT starts B at zero: make the adapters change the output
        adapted = model(**batch).logits
        with model.disable_adapter():
            disabled = model(**batch).logits
        for m in lora_b:
            m.weight.zero_()
        base = model(**batch).logits
    assert not torch.allclose(adapted, base)
    torch.testing.assert_close(disabled, base)


def test_the_option_is_off_by_default_and_for_lora_methods_only():
    from ftprof.config import RunConfig
    from ftprof.errors import ConfigError

    assert RunConfig.from_flat({"method": "lora"}).method.resolved("float32").lora_addmm is False
    with pytest.raises(ConfigError, match="--lora-addmm is a lora option"):
        RunConfig.from_flat({"method": "full", "lora_addmm": False})
