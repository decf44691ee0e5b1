"""FP8 matmuls for the frozen base weights (models/fp8_base.py, --fp8-base): the scaling algebra exact against the
dequantized e4m3 operands, the result within e4m3's rounding of the 16-bit matmul, 4-bit weights dequantized
straight into e4m3, every base linear converted in a run, and the options it refuses."""

import pytest
import torch
from torch import nn

from ftprof import metrics
from ftprof.models import fp8_base
from ftprof.models.fp8_kernels import quantize_rows
from tests.conftest import assert_train_refuses, build_run, tiny_config
from tests.models.test_lora_addmm import loss_and_grads

# e4m3 keeps 3 mantissa bits: one rounding is within 2**-4 of a value (relative). A product of two rounded operands,
# summed over K terms of random sign, lands within a few percent of the exact result (Frobenius, relative).
E4M3_ROUNDING = 2.0 ** -4
FP8_MATMUL = 0.08
BF16_OUTPUT = {"rtol": 2.0 ** -7, "atol": 1e-5}  # the GEMM writes bf16: one rounding of the fp32 sum


def _linear(out_features=96, in_features=160, seed=0) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=False)
    layer.weight.data.mul_(torch.logspace(-2, 1, out_features).view(-1, 1))  # rows of very different scales
    layer.requires_grad_(False)
    return layer


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_fp8_matmul_is_the_scaled_e4m3_product_forward_and_backward():
    layer = _linear()
    assert fp8_base.convert([layer]) == 1
    weight, scale = layer.fp8_weight, layer.fp8_scale
    x = torch.randn(4, 8, 160, requires_grad=True)
    out = layer(x)
    grad = torch.randn_like(out)
    out.backward(grad)
    # forward: the dequantized operands' product
    xq, xs = quantize_rows(x.detach().reshape(-1, 160).bfloat16())
    expected = (xq.float() * xs) @ (weight.float() * scale.view(-1, 1)).t()
    torch.testing.assert_close(out.reshape(-1, 96), expected.to(torch.bfloat16).float(), **BF16_OUTPUT)
    # backward: dy * s_W quantized by rows, times the e4m3 weight (no second scale on the weight)
    gq, gs = quantize_rows(grad.reshape(-1, 96).bfloat16(), column_scale=scale)
    expected_grad = (gq.float() * gs) @ weight.float()
    torch.testing.assert_close(x.grad.reshape(-1, 160), expected_grad.to(torch.bfloat16).float(), **BF16_OUTPUT)
    assert torch.equal(layer.fp8_transposed, weight.t().contiguous())
    assert not any(name.startswith("fp8_") for name in layer.state_dict())  # not saved with the model


def test_fp8_matmul_is_close_to_the_16_bit_one_and_really_rounded():
    layer = _linear(seed=1)
    reference = _linear(seed=1)
    fp8_base.convert([layer])
    x = torch.randn(64, 160)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, ref = layer(x1), reference(x2)
    grad = torch.randn_like(ref)
    out.backward(grad)
    ref.backward(grad)
    for ours, exact in ((out, ref), (x1.grad, x2.grad)):
        error = _relative(ours.detach(), exact.detach())
        assert 1e-3 < error < FP8_MATMUL, error  # FP8's rounding, not a 16-bit matmul and not a wrong one


def test_only_frozen_linears_of_fitting_shapes_are_converted():
    trained = nn.Linear(32, 32)
    odd = nn.Linear(24, 40, bias=False).requires_grad_(False)  # not multiples of 16
    frozen = nn.Linear(32, 48).requires_grad_(False)  # with a bias: added after the GEMM
    assert fp8_base.convert([nn.ModuleList([trained, odd, frozen])]) == 1
    converted = [fp8_base.converted(m) for m in (frozen, trained, odd)]
    assert converted == [True, False, False]
    x = torch.randn(16, 32)
    assert _relative(frozen(x), nn.functional.linear(x, frozen.weight, frozen.bias)) < FP8_MATMUL


@pytest.mark.parametrize("nested", [True, False])
def test_4bit_weights_dequantize_into_e4m3_rows(nested):
    bnb = pytest.importorskip("bitsandbytes")
    import bitsandbytes.functional as bf

    torch.manual_seed(0)
    weight = torch.randn(96, 256) * torch.logspace(-2, 1, 96).view(-1, 1)
    layer = bnb.nn.Linear4bit(256, 96, bias=False, compute_dtype=torch.float32, compress_statistics=nested,
                              quant_type="nf4")
    layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, compress_statistics=nested, quant_type="nf4")
    layer = layer.to("cpu")
    layer.weight.data, layer.weight.quant_state = bf.quantize_4bit(weight, blocksize=64, compress_statistics=nested,
                                                                   quant_type="nf4")
    dense = bf.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float()
    # the row scale comes from the blocks' absmax alone, and is each row's true largest value
    torch.testing.assert_close(fp8_base._row_absmax(layer), dense.abs().amax(dim=1), rtol=1e-6, atol=0)
    assert fp8_base.convert([layer]) == 1
    rows = fp8_base.rows(layer)
    assert rows.dtype == torch.float8_e4m3fn and rows.shape == (96, 256)
    scale = layer.fp8_scale.view(-1, 1)
    back = rows.float() * scale
    assert torch.all((back - dense).abs() <= E4M3_ROUNDING * dense.abs() + 1e-2 * scale)
    x = torch.randn(8, 256, requires_grad=True)  # and the layer multiplies by those rows, both ways
    out = layer(x)
    out.backward(torch.ones_like(out))
    xq, xs = quantize_rows(x.detach().bfloat16())
    expected = ((xq.float() * xs) @ back.t()).to(torch.bfloat16).float()
    torch.testing.assert_close(out.detach().float(), expected, **BF16_OUTPUT)
    gq, gs = quantize_rows(torch.ones(8, 96, dtype=torch.bfloat16), column_scale=layer.fp8_scale)
    torch.testing.assert_close(x.grad, ((gq.float() * gs) @ rows.float()).to(torch.bfloat16).float(),
                               **BF16_OUTPUT)


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_a_run_multiplies_every_base_linear_in_e4m3(tmp_path, method):
    built, loss, grads, _ = loss_and_grads(tmp_path / "fp8", method, nonzero_b=True, fp8_base=True)
    _, ref_loss, ref_grads, _ = loss_and_grads(tmp_path / "ref", method, nonzero_b=True)
    layers = metrics.decoder_layers(built.model)
    converted = [m for block in layers for m in block.modules() if fp8_base.converted(m)]
    assert len(converted) == 7 * len(layers)  # the seven projections' bases
    assert abs(float(loss) / float(ref_loss) - 1) < 0.01
    diff = torch.sqrt(sum(((grads[k] - g) ** 2).sum() for k, g in ref_grads.items()))
    norm = torch.sqrt(sum((g ** 2).sum() for g in ref_grads.values()))
    assert 1e-4 < float(diff / norm) < 0.1, float(diff / norm)


@pytest.mark.slow  # two training runs: about 3 s
def test_training_with_fp8_bases_follows_the_16_bit_run(tmp_path):
    import ftprof

    runs = {f: ftprof.train(tiny_config(tmp_path / str(f), "qlora", max_steps=6, fp8_base=f)) for f in (False, True)}
    assert all(r.status == "ok" for r in runs.values())
    import json
    from pathlib import Path

    config = json.loads((Path(runs[True].run_dir) / "config.json").read_text())
    assert config["method"]["keep_dequantized"] is False  # e4m3 rows are dequantized on each use
    first, last = runs[False].throughput.loss_first, runs[False].throughput.loss_last
    assert abs(runs[True].throughput.loss_last - last) < 0.1 * abs(first - last) + 0.01 * abs(last)


@pytest.mark.parametrize("method, argv, fragment", [
    ("lora", ["--fp8-base", "--lora-fused-projections"], "--fp8-base and --lora-fused-projections"),
    ("qlora", ["--fp8-base", "--keep-dequantized"], "--fp8-base and --keep-dequantized"),
    ("qlora", ["--fp8-base", "--kbit-prepare"], "--fp8-base and --kbit-prepare"),
    ("gptq-lora", ["--fp8-base"], "--fp8-base is a LoRA and QLoRA option"),
    ("full", ["--fp8-base"], "--fp8-base is a LoRA and QLoRA option"),
])
def test_refused_combinations_are_one_line(tmp_path, capsys, method, argv, fragment):
    assert_train_refuses(tmp_path, capsys, method, argv, fragment)


def test_fp8_base_is_refused_under_sharding_and_off_by_default(tmp_path):
    from ftprof.config import RunConfig
    from ftprof.errors import ConfigError

    with pytest.raises(ConfigError, match="--fp8-base keeps e4m3 copies"):
        RunConfig.from_flat(dict(method="lora", fp8_base=True, parallel="fsdp", nproc_per_node=2))
    plan, built = build_run(tiny_config(tmp_path, "lora"))  # off by default: nothing converted
    assert not any(fp8_base.converted(m) for m in built.model.modules())


def test_buffer_names_are_the_models_own_names_for_the_e4m3_tensors():
    dense, packed_free = nn.Linear(32, 48, bias=False).requires_grad_(False), nn.Linear(32, 32)
    model = nn.Sequential(nn.ModuleList([dense, packed_free]))
    fp8_base.convert([model[0]])
    names = fp8_base.buffer_names(model)
    assert sorted(names) == [f"0.0.fp8_{n}" for n in ("ones", "scale", "transposed", "weight")]
    assert set(names) <= dict(model.named_buffers()).keys()


@pytest.mark.slow  # two processes under torchrun: about 13 s each on the 2-core machine
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_ddp_leaves_the_e4m3_buffers_alone(tmp_path, method):
    """DDP broadcasts buffers before every forward: the e4m3 copies are left out (gloo refused their dtype: the run
    failed with "Invalid scalar type" before; on the GPU they would have gone over the wire every step)."""
    import ftprof

    result = ftprof.train(tiny_config(tmp_path, method, fp8_base=True, nproc_per_node=2, parallel="ddp",
                                      max_steps=3, measure_warmup_steps=1))
    assert result.status == "ok", result.failure.error_message
    assert result.run.world_size == 2 and result.run.parallel == "ddp"


@pytest.mark.slow  # (over 2 s a case: CI's tier)
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_compiled_fp8_linears_quantize_an_input_shared_by_projections_once(tmp_path, monkeypatch, method):
    """Compiled, no op's Python body runs in a step: inputs are quantized by traced torch ops, which the compiler
    computes once for q, k and v and once for gate and up (four e4m3 conversions a layer forward, not seven), the
    backward's kernels launch from the compiled code; the numbers are eager FP8's (4-bit weights included)."""
    from ftprof.engine.compile import eager_rounding
    from ftprof.models import fp8_kernels

    torch._dynamo.reset()  # (see _compiled_layer_forward)
    with eager_rounding(True):  # as a run compiles: the traced quantization reads the norm's bf16 output, as eager
        plan, built = build_run(tiny_config(tmp_path / "compiled", method, seq_len=16, fp8_base=True, compile=True,
                                            compile_loss=False))
    if not built.compiled.compiled:
        pytest.skip(f"no compiler here: {built.compiled.fallback}")
    batch = next(built.batches)
    with built.autocast():
        loss = built.model(**batch).loss
    loss.backward()  # (compiles: the ops' bodies are traced now, with fake tensors)
    grads = {n: p.grad.clone() for n, p in built.model.named_parameters() if p.requires_grad}
    calls = {"inputs": 0, "gradients": 0}  # what the ops quantize: inputs forward, gradients (scaled) backward
    quantize = fp8_kernels._quantize_rows

    def counted(t, column_scale, traced=False):
        calls["inputs" if column_scale is None else "gradients"] += 1
        return quantize(t, column_scale, traced)

    monkeypatch.setattr(fp8_kernels, "_quantize_rows", counted)
    with built.autocast():
        built.model(**batch).loss.backward()  # the compiled step: no op's Python body runs
    assert calls == {"inputs": 0, "gradients": 0}, calls
    monkeypatch.undo()
    _, eager_loss, eager_grads, _ = loss_and_grads(tmp_path / "eager", method, fp8_base=True)
    assert abs(float(loss.detach()) / float(eager_loss) - 1) < 1e-3
    errors = {name: _relative(grads[name], grad) for name, grad in eager_grads.items() if grad.norm() > 0}
    assert max(errors.values()) < 1e-4, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    if method == "lora":  # (a 4-bit weight's dequantization converts to e4m3 too)
        assert _e4m3_conversions_per_layer_forward(tmp_path / "graph") == 4


def _compiled_layer_forward(tmp_path, method: str):
    """One compiled FP8 decoder layer's forward graph as AOTAutograd's partitioner leaves it (after the
    compiler's common-subexpression pass), captured from a step of a tiny run."""
    return _compiled_layer_graphs(tmp_path, method)[0]


def _compiled_layer_graphs(tmp_path, method: str):
    """One compiled FP8 decoder layer's forward and backward graphs, as ``_compiled_layer_forward``."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    graphs = {}

    def capture(kind):
        def compiler(gm, _inputs):
            graphs.setdefault(kind, gm.graph)
            return make_boxed_func(gm.forward)
        return compiler

    # the compiler's caches and recompile counts are the process's: earlier tests in this worker may have used up
    # the layer forward's recompile limit, and this compile would fall back to eager (nothing captured)
    torch._dynamo.reset()
    plan, built = build_run(tiny_config(tmp_path, method, seq_len=16, fp8_base=True))
    block = metrics.decoder_layers(built.model)[1]
    block.compile(backend=aot_autograd(fw_compiler=capture("forward"), bw_compiler=capture("backward"),
                                       partition_fn=min_cut_rematerialization_partition))
    with built.autocast():
        built.model(**next(built.batches)).loss.backward()
    torch._dynamo.reset()
    return graphs["forward"], graphs["backward"]


def _e4m3(node) -> bool:
    value = node.meta.get("val") if hasattr(node, "meta") else None
    return isinstance(value, torch.Tensor) and value.dtype == torch.float8_e4m3fn


def _e4m3_conversions_per_layer_forward(tmp_path) -> int:
    """How many tensors one compiled FP8 (LoRA) decoder layer's forward converts to e4m3 (views of e4m3 tensors
    are not conversions)."""
    graph = _compiled_layer_forward(tmp_path, "lora")
    return sum(1 for node in graph.nodes if node.op == "call_function" and _e4m3(node)
               and not any(_e4m3(arg) for arg in node.args))


def test_compiled_4bit_fp8_linears_trace_their_dequantization_and_save_no_e4m3_weight(tmp_path):
    """Compiled, a 4-bit FP8 linear is traced forward and backward (no ftprof op is left in either graph: on CUDA
    its Triton kernels launch from the compiled code), and nothing in e4m3 is kept for the backward: neither the
    forward's rows nor the backward's transposed weight hoisted into the forward (a byte a parameter, every
    layer's)."""
    forward, backward = _compiled_layer_graphs(tmp_path, "qlora")
    for graph in (forward, backward):
        calls = [node for node in graph.nodes if node.op == "call_function"]
        opaque = [str(n.target) for n in calls if "ftprof" in str(n.target)]
        assert not opaque, opaque
        # the seven projections forward; backward their input gradients (the layer's input needs one)
        assert sum(1 for n in calls if "_scaled_mm" in str(n.target)) == 7
    saved = list(forward.nodes)[-1].args[0]
    assert not [n for n in saved if _e4m3(n)], [n.name for n in saved if _e4m3(n)]
