"""--lean-activations (models/lean_mlp.py): the MLP keeps gate and up but not their SwiGLU product, which backward
forms again for the down projection's adapter. The gradients are the eager MLP's, bit for bit; what a layer keeps
drops by the product (and the eager MLP's silu(gate)); MLPs the op does not cover are left alone; the planner
takes the saving off the layers that keep their activations."""

import dataclasses

import pytest
import torch

import ftprof
from ftprof.models import lean_mlp
from ftprof.profiling.memory import SavedActivations
from tests.conftest import assert_train_refuses, build_run, tiny_config, two_step_grads
from tests.tolerances import COMPILED_LOSS


@pytest.mark.parametrize("method, checkpointing", [("lora", "none"), ("qlora", "none"), ("lora", "full")])
def test_the_gradients_are_the_eager_mlps(tmp_path, method, checkpointing):
    """fp32 on the CPU: the op's backward is autograd's formulas in autograd's order, so the same bits."""
    _, eager = two_step_grads(tmp_path / "e", method, checkpointing, dtype="float32")
    built, lean = two_step_grads(tmp_path / "l", method, checkpointing, dtype="float32", lean_activations=True)
    assert sum(getattr(m, lean_mlp.MARK, False) for m in built.model.modules()) == 2  # the tiny preset's layers
    assert eager[0].keys() == lean[0].keys() and any("down_proj.lora_A" in k for k in eager[0])
    for before, after in zip(eager, lean, strict=True):
        assert all(torch.equal(before[k], after[k]) for k in before), [k for k in before
                                                                        if not torch.equal(before[k], after[k])]


def _saved_bytes(tmp_path, **flat) -> tuple[int, object]:
    _, built = build_run(tiny_config(tmp_path, "lora", dtype="bfloat16", **flat))
    ids = torch.randint(0, built.model.config.vocab_size, (2, 32))
    with SavedActivations(built.model) as meter, torch.autocast("cpu", dtype=torch.bfloat16):
        built.model(input_ids=ids, labels=ids)
    return meter.bytes, built.model.config


def test_each_layer_keeps_less_by_its_products(tmp_path):
    """HF's eager MLP keeps silu(gate) and the product (2 bytes each in bf16): both go, per token and layer."""
    plain, config = _saved_bytes(tmp_path / "p")
    lean, _ = _saved_bytes(tmp_path / "l", lean_activations=True)
    tokens = 2 * 32
    assert plain - lean == config.num_hidden_layers * tokens * 2 * config.intermediate_size * 2


def test_mlps_it_does_not_cover_are_left_alone(tmp_path):
    import transformers

    from ftprof import metrics

    _, built = build_run(tiny_config(tmp_path / "t", "lora", lora_targets="q_proj,v_proj,up_proj"))
    assert lean_mlp.attach(metrics.decoder_layers(built.model)) == 0  # down_proj not adapted
    import peft

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, vocab_size=64, hidden_act="gelu")
    model = peft.get_peft_model(transformers.LlamaForCausalLM(config),
                                peft.LoraConfig(r=4, target_modules=["down_proj"]))
    mlp = metrics.decoder_layers(model)[0].mlp
    assert not lean_mlp.eligible(mlp)  # not a SiLU gate
    mlp.act_fn = torch.nn.SiLU()
    assert lean_mlp.eligible(mlp)


def test_an_adapter_call_it_does_not_cover_runs_the_mlps_own_forward(tmp_path, monkeypatch):
    from ftprof import metrics

    calls = []
    real = lean_mlp.swiglu_lora_a
    monkeypatch.setattr(lean_mlp, "swiglu_lora_a", lambda *args: calls.append(1) or real(*args))
    _, built = build_run(tiny_config(tmp_path, "lora", dtype="float32", lean_activations=True))
    mlp = metrics.decoder_layers(built.model)[0].mlp
    x = torch.randn(1, 4, built.model.config.hidden_size)
    with torch.no_grad():
        mlp(x)
        assert len(calls) == 1
        mlp.down_proj.enable_adapters(False)  # a call without the adapter: not the op's
        plain = mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
        assert torch.equal(mlp(x), plain) and len(calls) == 1


@pytest.mark.parametrize("argv, fragment", [
    (["--lean-activations", "--lora-addmm"], "--lean-activations and --lora-addmm"),
])
def test_refused_beside_another_adapter_forward(tmp_path, capsys, argv, fragment):
    assert_train_refuses(tmp_path, capsys, "lora", argv, fragment)


def test_refused_for_a_full_fine_tune(tmp_path, capsys):
    assert_train_refuses(tmp_path, capsys, "full", ["--lean-activations"], "does not apply to method 'full'")


def test_the_planner_takes_the_products_off_the_layers_that_keep_theirs():
    from ftprof.plan.predict import Target
    from tests.plan.planners import planner_for

    p, lean = planner_for("tiny", "lora", seq_len=64, batch_size=2, target=Target("cpu"), checkpointing="full",
                          checkpoint_layers=1, lean_activations=True)
    config = p.source.config
    plain = lean.without("lean_activations")
    a, b = p.predict(plain), p.predict(lean)
    product = 2 * 64 * config.intermediate_size * 2  # tokens x intermediate x bf16, per layer kept
    assert a.activation_bytes - b.activation_bytes == 2 * product  # one layer keeps its own: eager, two products
    whole = [p.predict(dataclasses.replace(c, checkpoint_layers=None)) for c in (plain, lean)]
    assert whole[0].activation_bytes == whole[1].activation_bytes  # every layer checkpointed: nothing kept to trim


@pytest.mark.slow
def test_compiled_keeps_one_product_less_and_trains_as_eager(tmp_path):
    """The compiler left silu(gate) unsaved already: compiled, the op saves the product alone."""
    runs = {(lean, c): ftprof.train(tiny_config(tmp_path / f"{lean}{c}", "lora", lean_activations=lean, compile=c,
                                                 max_steps=3, dtype="float32"))
            for lean in (False, True) for c in (False, True)}
    assert all(r.status == "ok" for r in runs.values()), {k: r.failure for k, r in runs.items()}
    assert runs[(True, True)].compile.outcome.compiled  # (this needs a C++ compiler, as CI's machine has)
    saved = {k: r.memory.memory_breakdown.activations_saved for k, r in runs.items()}
    config = build_run(tiny_config(tmp_path / "c", "lora"))[1].model.config
    product = 4 * 32 * config.intermediate_size * 4  # batch x seq x intermediate x fp32
    assert saved[(False, False)] - saved[(True, False)] == config.num_hidden_layers * 2 * product
    assert saved[(False, True)] - saved[(True, True)] == config.num_hidden_layers * product
    assert runs[(True, True)].throughput.loss_last == pytest.approx(runs[(False, False)].throughput.loss_last,
                                                                    rel=COMPILED_LOSS)


def test_a_run_with_it_calibrates_no_activation_factor(tmp_path):
    """The probe is built without it, so a run with it would teach the planner a factor with its saving in, which
    the planner then takes off again (measured: a 30.0 GiB prediction for a 37.0 GiB run, 2026-12-05)."""
    from ftprof.plan import calibration, probe

    assert "lean_activations" in calibration.MEMORY_KNOBS
    assert calibration.memory_options_off({"policy": "none", "knobs": {"lean_activations": True}}) == \
        {"lean_activations"}
    cfg = tiny_config(tmp_path, "lora", lean_activations=True)
    assert probe._probe_config(cfg, "bfloat16").method.lean_activations is False
