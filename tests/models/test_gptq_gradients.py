"""GPTQ-LoRA's backward is correct: gradients through GPTQModel's gptq_torch kernel match a dequantized reference."""

import contextlib

import pytest
import torch

from tests.conftest import build_run, tiny_config
from tests.requires import requires_run

pytestmark = requires_run("gptq-lora")  # every test here quantizes and trains through GPTQModel


def _gptq_lora_layers(tmp_path, device="cpu", dtype="float32"):
    plan, built = build_run(tiny_config(tmp_path, "gptq-lora", device=device, dtype=dtype,
                                       gptq_calibration_samples=4))
    layers = [m for m in built.model.modules() if type(m).__name__ == "GPTQLoraLinear"]
    assert layers, "no GPTQ LoRA layers found"
    return built, layers


def _check_layer(layer, dtype, rtol, autocast=contextlib.nullcontext):
    torch.manual_seed(0)
    base = layer.base_layer
    with torch.no_grad():  # LoRA B starts at zero; give it values so every gradient is non-trivial
        layer.lora_B["default"].weight.normal_(0, 0.05)
    w = base.dequantize_weight().T.to(dtype)  # (out, in): the weight the 4-bit kernel stands for
    assert w.shape == (base.out_features, base.in_features)
    a, b = layer.lora_A["default"], layer.lora_B["default"]
    scale = layer.scaling["default"]
    x = torch.randn(6, base.in_features, dtype=dtype, device=w.device, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    grad_out = torch.randn(6, base.out_features, dtype=dtype, device=w.device)

    layer.zero_grad()
    with autocast():  # as the trainer runs it: fp32 adapters, matmuls in the run dtype
        out = layer(x)
    out.backward(grad_out)
    got = (x.grad, a.weight.grad.clone(), b.weight.grad.clone())

    a.weight.grad = b.weight.grad = None
    ref_out = x_ref @ w.T + (x_ref.to(a.weight.dtype) @ a.weight.T @ b.weight.T).to(dtype) * scale
    ref_out.backward(grad_out)
    want = (x_ref.grad, a.weight.grad, b.weight.grad)
    for g, r in zip(got, want, strict=True):
        err = (g.float() - r.float()).norm() / r.float().norm()
        assert err < rtol, float(err)


@pytest.mark.slow  # GPTQ quantization: seconds per test on the 2-core machine
def test_gptq_lora_gradients_match_dequantized_reference(tmp_path):
    _, layers = _gptq_lora_layers(tmp_path)
    for layer in layers[:4]:
        _check_layer(layer, torch.float32, rtol=1e-4)


@pytest.mark.gpu
def test_gptq_lora_gradients_on_gpu_bf16(tmp_path):
    built, layers = _gptq_lora_layers(tmp_path, device="cuda", dtype="bfloat16")
    for layer in layers[:4]:
        _check_layer(layer, torch.bfloat16, rtol=2e-2, autocast=built.autocast)


@pytest.mark.slow  # GPTQ quantization: seconds per test on the 2-core machine
@pytest.mark.parametrize("quantizer", ["rtn", "gptq"])
def test_quantizers_round_within_their_bounds(tmp_path, quantizer, monkeypatch):
    """rtn rounds every weight to its group's nearest level: within half a step, or one step at a group's edge
    where the rounded zero point clips it. gptq trades that bound for error compensation across columns, so some
    weights move several steps. Both give the same checkpoint format and train through the same kernel."""
    from ftprof.models.gptq import cache_root
    from ftprof.models.materialize import build_random_model
    from ftprof.models.presets import preset_config

    monkeypatch.chdir(tmp_path)
    plan, built = build_run(tiny_config(tmp_path, "gptq-lora", gptq_calibration_samples=4,
                                       gptq_quantizer=quantizer, seed=7 if quantizer == "rtn" else 8))
    assert plan.config.method.gptq_quantizer == quantizer
    # GPTQModel's per-module logs go beside the checkpoint, not into the working directory
    assert not (tmp_path / "logs").exists()
    assert any((entry / "quantize_logs").is_dir() for entry in cache_root().iterdir())
    original = build_random_model(preset_config("tiny"), torch.device("cpu"), torch.float32,
                                  seed=plan.config.train.seed)
    worst = 0.0
    for name, module in built.model.named_modules():
        if type(module).__name__ != "GPTQLoraLinear":
            continue
        base = module.base_layer
        w = original.get_submodule(name.split("model.", 2)[-1].replace(".base_layer", "")).weight.detach()
        deq = base.dequantize_weight().T.float()
        group = base.group_size if base.group_size > 0 else base.in_features
        step = base.scales.float().T.repeat_interleave(group, dim=1)[:, :w.shape[1]]  # (out, in)
        worst = max(worst, float(((w - deq).abs() / step).max()))
    if quantizer == "rtn":
        assert worst <= 1.01, worst
    else:
        assert worst > 1.5, worst


@pytest.mark.slow  # GPTQ quantization: seconds per test on the 2-core machine
def test_backward_keeps_no_dequantized_weight(tmp_path):
    """Autograd saves activations for the GPTQ linears, never their dequantized 16-bit weights."""
    built, layers = _gptq_lora_layers(tmp_path)
    shapes = {tuple(layer.base_layer.dequantize_weight().shape) for layer in layers}
    saved: list[tuple[int, ...]] = []

    def pack(t):
        # A frozen dequantized weight needs no gradient; the adapters' own weights (the shared A matmul's
        # concatenation can have a GPTQ weight's shape) do.
        if not t.requires_grad:
            saved.append(tuple(t.shape))
        return t

    batch = next(built.batches)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = built.model(**batch).loss
    loss.backward()
    assert saved and not shapes & set(saved), shapes & set(saved)
    assert all(p.grad is not None for p in built.params)


@pytest.mark.slow  # GPTQ quantization: seconds to a minute on the 2-core machine
@pytest.mark.parametrize("checkpointing", [False, True])
def test_lean_backward_only_without_checkpointing(tmp_path, checkpointing):
    """Under checkpointing a dequantized weight lives only while its layer is recomputed: no re-dequantization."""
    _, built = build_run(tiny_config(tmp_path, "gptq-lora", gptq_calibration_samples=4,
                                     gradient_checkpointing=checkpointing))
    quant = [m for m in built.model.modules() if hasattr(m, "qweight")]
    lean = [m for m in quant if "forward" in vars(m)]
    assert quant and len(lean) == (0 if checkpointing else len(quant))
