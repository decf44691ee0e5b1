"""How QLoRA's 4-bit weights are dequantized (models/dequant.py). Under full checkpointing the recomputation's
dequantized weights serve backward: the same numbers as bitsandbytes' own matmul, one dequantization fewer per
linear in backward, only where the layer is checkpointed, and auto's full estimate holds the kept layer. Under
--compile torch ops dequantize: bitsandbytes' exact bits, and the compiled run trains as the eager one."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ftprof
from ftprof import metrics
from ftprof.models import dequant, dequant_kernels
from tests.conftest import assert_train_refuses, build_run, tiny_config
from tests.tolerances import COMPILED_LOSS, LOSS_AFTER_STEPS, SAME_OPS


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
    plan, built = build_run(tiny_config(tmp_path, "qlora", keep_dequantized=keep, seq_len=16, **flat))
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
        torch.testing.assert_close(kept_grads[name], g, **SAME_OPS, msg=name)


def test_only_checkpointed_layers_keep_their_weights(tmp_path):
    plan, built = build_run(tiny_config(tmp_path / "partial", "qlora", checkpointing="full", checkpoint_layers=1))
    per_layer = [sum(dequant.is_4bit_linear(m) for m in b.modules()) for b in metrics.decoder_layers(built.model)]
    assert len(per_layer) > 1 and built.kept_dequantized == per_layer[0]
    _, unchecked = build_run(tiny_config(tmp_path / "none", "qlora", checkpointing="none"))
    assert unchecked.kept_dequantized == 0  # without checkpointing each kept weight would stay until backward


@pytest.mark.slow  # several CPU runs: over 5 s on the 2-core machine
def test_a_run_records_what_it_kept_and_trains_as_before(tmp_path):
    runs = {keep: ftprof.train(tiny_config(tmp_path / str(keep), "qlora", checkpointing="full", max_steps=3,
                                           keep_dequantized=keep)) for keep in (True, False)}
    assert runs[True].status == runs[False].status == "ok"
    assert runs[True].checkpointing.kept_dequantized > 0 and runs[False].checkpointing.kept_dequantized is None
    assert runs[True].throughput.loss_last == pytest.approx(runs[False].throughput.loss_last, rel=LOSS_AFTER_STEPS)


def test_the_option_is_qlora_only():
    from ftprof.config import RunConfig
    from ftprof.errors import ConfigError

    with pytest.raises(ConfigError, match="--keep-dequantized is a bitsandbytes option"):
        RunConfig.from_flat({"method": "lora", "keep_dequantized": False})
    assert RunConfig.from_flat({"method": "qlora"}).method.resolved("float32").keep_dequantized is True


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_ops_dequantize_to_bitsandbytes_bits(quant_type, nested, dtype):
    import bitsandbytes.functional as bf

    torch.manual_seed(0)
    weight = (torch.randn(96, 640) * torch.logspace(-3, 1, 640)).to(dtype)  # blocks of very different scales
    packed, state = bf.quantize_4bit(weight, blocksize=64, compress_statistics=nested, quant_type=quant_type,
                                     quant_storage=torch.bfloat16)
    assert state.nested == nested
    theirs = bf.dequantize_4bit(packed, state)
    for ours in (dequant_kernels.torch_dequantize(packed, state),
                 dequant_kernels.triton_dequantize(packed, state)):  # the op: torch ops off CUDA
        assert ours.dtype == theirs.dtype == dtype and ours.shape == theirs.shape == weight.shape
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("nested", [True, False])
def test_the_dequantize_op_passes_torch_library_checks(nested):
    """ftprof::dequantize_4bit's schema, fake (meta) kernel and dispatch as torch.compile relies on them."""
    import bitsandbytes.functional as bf

    packed, state = bf.quantize_4bit(torch.randn(64, 128), blocksize=64, compress_statistics=nested,
                                     quant_storage=torch.bfloat16)
    args = (packed, *dequant_kernels.state_args(state), list(state.shape), torch.bfloat16, False)
    torch.library.opcheck(torch.ops.ftprof.dequantize_4bit.default, args)


@pytest.mark.slow  # torch.compile: inductor builds C++ kernels (tens of seconds on 2 cores)
def test_compiled_qlora_dequantizes_with_torch_ops_and_trains_as_eager(tmp_path):
    flat = dict(checkpointing="none", max_steps=3, seq_len=32)
    eager = ftprof.train(tiny_config(tmp_path / "eager", "qlora", **flat))
    compiled = ftprof.train(tiny_config(tmp_path / "compiled", "qlora", compile=True, compile_dequant=True, **flat))
    bnb_compiled = ftprof.train(tiny_config(tmp_path / "bnb", "qlora", compile=True, **flat))  # the default
    linears = 7 * 2  # the tiny preset: seven projections in each of two layers
    assert compiled.status == bnb_compiled.status == "ok" and compiled.compile.outcome.compiled
    assert compiled.compile.outcome.dequant == linears and bnb_compiled.compile.outcome.dequant == 0
    assert compiled.throughput.loss_last == pytest.approx(eager.throughput.loss_last, rel=COMPILED_LOSS)
    assert compiled.throughput.loss_last == pytest.approx(bnb_compiled.throughput.loss_last, rel=COMPILED_LOSS)


@pytest.mark.parametrize("dequantizer", ["torch", "triton"])  # (the Triton op runs torch ops off CUDA)
def test_rerouted_backward_dequantizes_without_keeping(tmp_path, dequantizer):
    """Not checkpointed and not kept: the torch-op and Triton routes save the packed weight only, like
    bitsandbytes, and give bitsandbytes' gradients."""
    plan, built = build_run(tiny_config(tmp_path, "qlora", seq_len=24))  # 96 tokens: no activation has a weight's shape
    blocks = metrics.decoder_layers(built.model)
    kept, torch_ops = dequant.route(blocks, kept=0, dequantizer=dequantizer)
    assert (kept, torch_ops) == (0, 14)
    batch = next(built.batches)
    weight_shapes = {tuple(m.weight.quant_state.shape) for m in built.model.modules() if dequant.is_4bit_linear(m)}
    saved: list[tuple] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        loss = built.model(**batch).loss
    assert saved and not weight_shapes & set(saved)  # no dequantized weight waits for backward
    loss.backward()
    grads = {n: p.grad.clone() for n, p in built.model.named_parameters() if p.requires_grad}
    built.model.zero_grad(set_to_none=True)
    assert dequant.route(blocks, kept=0) == (0, 0)  # bitsandbytes' own forward again
    built.model(**batch).loss.backward()
    for name, g in grads.items():
        torch.testing.assert_close(g, dict(built.model.named_parameters())[name].grad, **SAME_OPS)


@pytest.mark.parametrize("argv, fragment", [
    (["--dequant-kernel", "triton"], "--dequant-kernel triton runs a Triton kernel: it needs a CUDA device"),
    (["--dequant-kernel", "triton", "--compile", "--compile-dequant"], "pick one"),
    (["--dequant-kernel", "cutlass"], "invalid choice"),
])
def test_dequant_kernel_bad_input_is_one_line(tmp_path, capsys, argv, fragment):
    assert_train_refuses(tmp_path, capsys, "qlora", argv, fragment)
    with pytest.raises(Exception, match="--dequant-kernel is a bitsandbytes option"):
        ftprof.RunConfig.from_flat({"method": "lora", "dequant_kernel": "triton"})


def test_dequant_kernel_auto_picks_triton_only_where_it_runs():
    from ftprof.config import MethodConfig
    from ftprof.results.load import option_defaults

    auto = MethodConfig(method="qlora")
    assert auto.resolved("bfloat16", triton=True).dequant_kernel == "triton"
    assert auto.resolved("bfloat16", triton=False).dequant_kernel == "bitsandbytes"
    assert MethodConfig(method="qlora", dequant_kernel="auto").resolved("float32").dequant_kernel == "bitsandbytes"
    assert MethodConfig(method="qlora", dequant_kernel="bitsandbytes").resolved(
        "bfloat16", triton=True).dequant_kernel == "bitsandbytes"
    assert option_defaults("qlora")["dequant_kernel"] == "bitsandbytes"  # what runs from before the option ran


def test_a_cpu_qlora_run_records_bitsandbytes(tmp_path):
    plan, _ = build_run(tiny_config(tmp_path, "qlora", max_steps=1))
    assert plan.config.method.dequant_kernel == "bitsandbytes"  # no CUDA here: auto cannot pick the Triton kernel
