"""One A matmul for the adapters of projections that share an input (models/lora_fused_a.py): PEFT's numbers, fewer
matmuls, each group member's own A wherever the shared form does not apply, and one compiled graph for all layers."""

import pytest
import torch

from ftprof import metrics
from tests.conftest import build_run, tiny_config
from tests.models.test_lora_addmm import loss_and_grads
from tests.tolerances import COMPILED_LOSS, GRADIENTS, SAME_OPS


def _matmuls(ops: list[str]) -> int:
    return sum(ops.count(op) for op in ("mm", "addmm", "matmul", "linear", "bmm"))


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_shared_a_computes_what_peft_computes(tmp_path, method):
    built, loss, grads, ops = loss_and_grads(tmp_path / "fused", method, nonzero_b=True, lora_fused_a=True)
    _, peft_loss, peft_grads, peft_ops = loss_and_grads(tmp_path / "peft", method, nonzero_b=True, lora_fused_a=False)
    layers = len(metrics.decoder_layers(built.model))
    assert _matmuls(ops) == _matmuls(peft_ops) - 3 * layers  # q/k/v: 3 A matmuls become 1, gate/up: 2 become 1
    assert all(m._ftprof_slice is None for m in built.model.modules() if hasattr(m, "_ftprof_slice"))
    torch.testing.assert_close(loss, peft_loss, **SAME_OPS)
    assert grads.keys() == peft_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, peft_grads[name], **GRADIENTS, msg=name)


def test_a_member_called_alone_applies_its_own_a(tmp_path):
    """k_proj without q_proj before it (or on another input) must not take a stale slice."""
    plan, built = build_run(tiny_config(tmp_path, "lora", lora_fused_a=True, seq_len=16))
    attn = metrics.decoder_layers(built.model)[0].self_attn
    x, other = torch.randn(2, 8, attn.q_proj.base_layer.in_features), torch.randn(2, 8, attn.q_proj.in_features)
    with torch.no_grad():
        torch.nn.init.normal_(attn.k_proj.lora_B["default"].weight)
        alone = attn.k_proj(other)
        attn.q_proj(x)  # hands k_proj and v_proj their slices of x
        after = attn.k_proj(other)  # another input: its own A again, and the slice of x is dropped
        expected = attn.k_proj.base_layer(other) + attn.k_proj.lora_B["default"](
            attn.k_proj.lora_A["default"](other)) * attn.k_proj.scaling["default"]
    torch.testing.assert_close(alone, expected)
    torch.testing.assert_close(after, expected)
    assert attn.k_proj._ftprof_slice is None and attn.v_proj._ftprof_slice is not None


@pytest.mark.slow
def test_one_compiled_graph_serves_every_layer(tmp_path):
    """The slice handed between siblings is empty when a compiled block starts, so the blocks do not recompile per
    layer (a recompile per layer would soon exceed dynamo's limit and run the rest eager)."""
    from torch._dynamo.utils import counters

    import ftprof
    from tests.data_files import save_checkpoint

    model = save_checkpoint(tmp_path / "six-layers", layers=6)
    eager = ftprof.train(tiny_config(tmp_path / "e", "lora", model=model, max_steps=3, seq_len=32))
    counters.clear()
    fused = ftprof.train(tiny_config(tmp_path / "f", "lora", model=model, max_steps=3, seq_len=32, compile=True,
                                     lora_fused_a=True))
    assert fused.status == "ok" and fused.compile.outcome.blocks == 6
    if fused.compile.outcome.compiled:
        # The first block (its input needs no gradient), the others, and the loss: not one graph per layer.
        assert counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])
        assert fused.throughput.loss_last == pytest.approx(eager.throughput.loss_last, rel=COMPILED_LOSS)


def test_the_option_is_on_by_default_except_beside_addmm_or_the_textbook_recipe():
    from ftprof.config import RunConfig
    from ftprof.errors import ConfigError
    from ftprof.results.load import option_defaults

    def resolved(**flat):
        return RunConfig.from_flat(flat).method.resolved("float32").lora_fused_a

    assert resolved(method="lora") is True and resolved(method="gptq-lora") is True
    assert resolved(method="lora", lora_addmm=True) is False and resolved(method="qlora", kbit_prepare=True) is False
    assert resolved(method="qlora", kbit_prepare=True, lora_fused_a=True) is True  # asked for: it runs
    assert resolved(method="lora", lora_fused_a=False) is False
    assert option_defaults("lora")["lora_fused_a"] is False  # a run from before the default ran without it
    assert option_defaults("full")["lora_fused_a"] is None
    with pytest.raises(ConfigError, match="pick one"):
        RunConfig.from_flat({"method": "lora", "lora_addmm": True, "lora_fused_a": True})
    with pytest.raises(ConfigError, match="--lora-fused-a is a lora option"):
        RunConfig.from_flat({"method": "full", "lora_fused_a": True})
