"""QLoRA under full checkpointing: the recomputation's dequantized weights serve backward (models/dequant.py).
Same numbers as bitsandbytes' own matmul, one dequantization fewer per linear in backward, only where the layer is
checkpointed, and auto's full estimate holds the kept layer."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ftprof
from ftprof import metrics
from ftprof.models import dequant
from tests.conftest import build_run, tiny_config


class CountDequantizations(TorchDispatchMode):
    """Counts the ops that dequantize a 4-bit weight: bitsandbytes' dequantize_4bit, and its gemm_4bit, which
    dequantizes inside."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "bitsandbytes" and func.__name__.split(".")[0] in ("dequantize_4bit", "gemm_4bit"):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _backward_dequantizations(tmp_path, keep: bool, **flat) -> tuple[int, int, dict]:
    """(dequantizations during one backward, 4-bit linears, LoRA gradients) for a tiny QLoRA model."""
    pre, built = build_run(tiny_config(tmp_path, "qlora", keep_dequantized=keep, seq_len=16, **flat))
    batch = {k: v for k, v in next(built.batches).items()}
    loss = built.model(**batch).loss
    with CountDequantizations() as counter:
        loss.backward()  # CPU: autograd runs backward on this thread, inside the mode
    linears = sum(dequant.is_4bit_linear(m) for m in built.model.modules())
    grads = {n: p.grad.clone() for n, p in built.model.named_parameters() if p.requires_grad}
    return counter.count, linears, grads


def test_checkpointed_layers_dequantize_once_less_with_the_same_gradients(tmp_path):
    kept, linears, kept_grads = _backward_dequantizations(tmp_path / "keep", True, checkpointing="full")
    again, _, grads = _backward_dequantizations(tmp_path / "again", False, checkpointing="full")
    assert linears > 0
    assert again == 2 * linears  # recomputation + backward's own dequantization
    assert kept == linears  # the recomputation only
    assert kept_grads.keys() == grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(kept_grads[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_only_checkpointed_layers_keep_their_weights(tmp_path):
    pre, built = build_run(tiny_config(tmp_path / "partial", "qlora", checkpointing="full", checkpoint_layers=1))
    per_layer = [sum(dequant.is_4bit_linear(m) for m in b.modules()) for b in metrics.decoder_layers(built.model)]
    assert len(per_layer) > 1 and built.kept_dequantized == per_layer[0]
    _, unchecked = build_run(tiny_config(tmp_path / "none", "qlora", checkpointing="none"))
    assert unchecked.kept_dequantized == 0  # without checkpointing each kept weight would stay until backward


def test_a_run_records_what_it_kept_and_trains_as_before(tmp_path):
    runs = {keep: ftprof.train(tiny_config(tmp_path / str(keep), "qlora", checkpointing="full", max_steps=3,
                                           keep_dequantized=keep)) for keep in (True, False)}
    assert runs[True].status == runs[False].status == "ok"
    assert runs[True].kept_dequantized > 0 and runs[False].kept_dequantized is None
    assert runs[True].loss_last == pytest.approx(runs[False].loss_last, rel=1e-5)


def test_auto_counts_the_kept_layer_in_full_estimate(tmp_path):
    pre, built = build_run(tiny_config(tmp_path, "qlora", checkpointing="auto"))
    auto = built.auto_choice
    layer = dequant.largest_layer_bytes(metrics.decoder_layers(built.model), torch.float32)
    assert auto.kept_weight_bytes == layer > 0
    cfg = pre.config
    tokens, vocab = cfg.data.batch_size * cfg.data.seq_len, pre.source.config.vocab_size
    measured = {p: auto.static_bytes + auto.activations_per_token[p] * tokens + metrics.logits_gradient_bytes(
        tokens, vocab) for p in ("none", "full")}
    assert auto.estimated_peak["none"] == int(measured["none"])
    assert auto.estimated_peak["full"] == int(measured["full"]) + layer


def test_the_option_is_qlora_only():
    from ftprof.config import RunConfig
    from ftprof.errors import ConfigError

    with pytest.raises(ConfigError, match="--keep-dequantized is a bitsandbytes option"):
        RunConfig.from_flat({"method": "lora", "keep_dequantized": False})
    assert RunConfig.from_flat({"method": "qlora"}).method.resolved("float32").keep_dequantized is True
