"""--lean-recompute (models/recompute.py): full checkpointing's recomputation leaves the output projection's base
matmul out. The same loss and gradients bit for bit as plain full checkpointing, eager and compiled; the matmul
runs in the forward and not in the recomputation; only full-checkpointed layers' projections are marked; the FLOP
count and the planner's price follow."""

import dataclasses

import pytest
import torch

import ftprof
from ftprof import metrics
from ftprof.models import recompute
from tests.conftest import assert_train_refuses, build_run, tiny_config


@pytest.fixture
def multiplications(monkeypatch):
    """How many times the output projection's matmul ran, forward and recomputation together."""
    calls = []
    real = recompute._multiply
    monkeypatch.setattr(recompute, "_multiply", lambda x, w: calls.append(x.shape) or real(x, w))
    return calls


@pytest.fixture
def skips(monkeypatch):
    """How many times the recomputation skipped it."""
    calls = []
    real = recompute.skipped
    monkeypatch.setattr(recompute, "skipped", lambda x, *rest: calls.append(x.shape) or real(x, *rest))
    return calls


def _grads(method: str, tmp_path, **flat):
    from tests.conftest import run_one_step

    cfg = tiny_config(tmp_path, method, checkpointing="full", seq_len=32, batch_size=2, **flat)
    plan, built = build_run(cfg)
    run_one_step(plan, built)
    return {n: p.grad.clone() for n, p in built.model.named_parameters() if p.grad is not None}, built


@pytest.mark.parametrize("method, flat", [("lora", {}), ("qlora", {}), ("lora", {"fp8_base": True}),
                                          ("qlora", {"fp8_base": True})])
def test_the_gradients_are_the_same_bits_and_the_recomputation_skips_the_matmul(method, flat, tmp_path,
                                                                                  multiplications, skips):
    plain, _ = _grads(method, tmp_path / "plain", **flat)
    assert multiplications == skips == []  # not routed without the option
    lean, built = _grads(method, tmp_path / "lean", lean_recompute=True, **flat)
    layers = len(metrics.decoder_layers(built.model))
    assert len(skips) == layers  # skipped in each layer's recomputation
    assert len(multiplications) == (0 if flat else layers)  # (FP8's e4m3 matmul is its own op's)
    assert lean.keys() == plain.keys() and all(torch.equal(lean[n], g) for n, g in plain.items())


def test_only_the_full_checkpointed_layers_are_marked(tmp_path):
    _, built = _grads("lora", tmp_path, checkpoint_layers=1, selective_rest=True, lean_recompute=True)
    first, second = metrics.decoder_layers(built.model)
    marked = [[n for n, m in block.named_modules() if recompute.marked(m)] for block in (first, second)]
    assert marked == [["mlp.down_proj.base_layer"], []]


def test_the_recomputed_flops_leave_the_output_projection_out(tmp_path):
    built = {lean: build_run(tiny_config(tmp_path / str(lean), "lora", checkpointing="full",
                                         lean_recompute=lean))[1] for lean in (False, True)}
    plain, lean = (built[k].flops.recompute_per_token for k in (False, True))
    down = sum(m.in_features * m.out_features for n, m in built[True].model.named_modules()
               if n.endswith("down_proj.base_layer"))
    assert plain - lean == pytest.approx(2 * down)  # 2 FLOPs a weight a token, every layer
    assert built[True].flops.per_token == built[False].flops.per_token


@pytest.mark.slow
@pytest.mark.parametrize("flat", [{}, {"fp8_base": True}])
def test_compiled_the_same_numbers_and_the_recomputation_skips_at_run_time(tmp_path, skips, flat):
    """The compiled layer calls the op at run time: the recomputation, the same compiled code, skips."""
    lean = ftprof.train(tiny_config(tmp_path / "c", "lora", checkpointing="full", compile=True, max_steps=3,
                                    lean_recompute=True, **flat))
    assert lean.status == "ok" and skips
    plain = ftprof.train(tiny_config(tmp_path / "p", "lora", checkpointing="full", compile=True, max_steps=3,
                                     **flat))
    assert plain.status == "ok"
    if lean.compile.outcome.compiled:  # (a CPU without a C++ compiler runs eager, and says so)
        assert lean.throughput.loss_last == plain.throughput.loss_last


def test_the_planner_prices_fewer_recomputed_flops():
    from ftprof.config import RunConfig
    from ftprof.models.source import resolve_model_source
    from ftprof.plan import speed
    from ftprof.plan.candidates import of_config
    from ftprof.plan.predict import Planner, Target

    cfg = RunConfig.from_flat({"model": "tiny", "method": "lora", "seq_len": 64, "batch_size": 2,
                               "checkpointing": "full", "lean_recompute": True})
    cfg = dataclasses.replace(cfg, method=cfg.method.resolved("bfloat16", preset=True))
    p = Planner(cfg, resolve_model_source("tiny"), "bfloat16", Target("cpu"), [])
    lean = of_config(cfg)
    assert lean.option("lean_recompute") is True
    plain = dataclasses.replace(lean, options=())
    probe = p.probe("lora")
    flops = {c: speed.flops_per_token(probe, c, 64, p.attn_dim) for c in (lean, plain)}
    assert flops[lean].model == flops[plain].model
    assert 0 < flops[lean].recomputed < flops[plain].recomputed
    assert probe.per_layer.matmul_recomputed - probe.per_layer.matmul_recomputed_lean > 0


def test_other_methods_are_refused(tmp_path, capsys):
    assert_train_refuses(tmp_path, capsys, "full", ["--lean-recompute", "--checkpointing", "full"],
                         "--lean-recompute is a LoRA and QLoRA option")
