"""--lean-activations (models/lean_mlp.py): the MLP keeps gate and up but not their SwiGLU product, which backward
forms again for the down projection's adapter; --lean-norms (models/lean_norm.py): each norm feeding a shared A
matmul keeps its input, not its output. Each op is autograd's formulas, bit for bit; what a layer keeps drops by the
product (and the eager MLP's silu(gate)) and the outputs; what the ops do not cover is left alone; the planner takes
the saving off the layers that keep their activations and prices the measured cost; auto takes them where only they
let nothing be recomputed."""

import dataclasses

import pytest
import torch

import ftprof
from ftprof import metrics
from ftprof.config import declarations
from ftprof.models import lean_mlp, lean_norm
from ftprof.profiling.memory import SavedActivations
from tests.conftest import assert_train_refuses, build_run, tiny_config, two_step_grads
from tests.tolerances import COMPILED_LOSS

ACT_COST = declarations.BY_NAME["lean_activations"].speed_cost  # their measured costs
NORM_COST = declarations.BY_NAME["lean_norms"].speed_cost


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_ops_are_autograds_formulas(dtype):
    """Each op against autograd on the computation it replaces (HF's MLP product and RMSNorm, each feeding a base
    consumer and an adapter's A): the same outputs and gradients, bit for bit."""
    torch.manual_seed(0)
    gate, up, x = (torch.randn(2, 8, n, dtype=dtype, requires_grad=True) for n in (48, 48, 64))
    a_mlp, a_norm = (torch.randn(r, n, dtype=dtype, requires_grad=True) for r, n in ((4, 48), (12, 64)))
    weight, eps = torch.rand(64, dtype=dtype) + 0.5, 1e-5

    def reference_mlp():
        product = torch.nn.functional.silu(gate) * up
        return product, torch.nn.functional.linear(product, a_mlp)

    def reference_norm():
        wide = x.to(torch.float32)
        out = weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
        return out, torch.nn.functional.linear(out, a_norm)

    for op, reference, inputs in ((lambda: lean_mlp.swiglu_lora_a(gate, up, a_mlp), reference_mlp, (gate, up, a_mlp)),
                                  (lambda: lean_norm.rmsnorm_lora_a(x, weight, eps, a_norm), reference_norm,
                                   (x, a_norm))):
        results = []
        for run in (op, reference):
            out, low = run()
            grads = torch.autograd.grad((out * 1.5).sum() + (low * low).sum(), inputs)
            results.append((out, low, *grads))
        assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


@pytest.mark.parametrize("method, checkpointing, kept", [("lora", "none", 2), ("qlora", "none", 2),
                                                         ("lora", "full", 1)])
def test_the_gradients_follow_the_eager_model(tmp_path, method, checkpointing, kept):
    """Both options, fp32 on the CPU, on the layers that keep their activations (the tiny preset's two; full on the
    first: the second). --lean-activations alone: the same bits (the product has two consumers, whose gradients add
    in either order alike). With --lean-norms not: a norm's output feeds three (two) base matmuls and the adapters'
    A, whose gradients autograd sums in its own order, the op in another (4e-7 relative at most)."""
    layers = {"checkpoint_layers": 1} if checkpointing == "full" else {}
    _, alone = two_step_grads(tmp_path / "a", method, checkpointing, dtype="float32", lean_activations=True, **layers)
    _, eager = two_step_grads(tmp_path / "e", method, checkpointing, dtype="float32", **layers)
    built, lean = two_step_grads(tmp_path / "l", method, checkpointing, dtype="float32", lean_activations=True,
                                 lean_norms=True, **layers)
    blocks = metrics.decoder_layers(built.model)
    marked = [i for i, block in enumerate(blocks) if getattr(block.mlp, lean_mlp.MARK, False)]
    assert marked == list(range(2 - kept, 2))  # the checkpointed layer keeps nothing for them to trim
    assert sum(getattr(m, lean_norm.MARK, False) for m in built.model.modules()) == 2 * kept  # two a layer
    assert eager[0].keys() == lean[0].keys() and any("down_proj.lora_A" in k for k in eager[0])
    for before, after, same in zip(eager, lean, alone, strict=True):
        worst = max(float((after[k] - g).abs().max() / g.abs().max()) for k, g in before.items())
        assert worst < 1e-5 and all(torch.equal(same[k], g) for k, g in before.items()), worst


def _per_token(tmp_path, attach=None) -> tuple[float, object]:
    """Bytes a bf16 forward of the tiny preset keeps per token (the line through two lengths: fixed bytes out),
    with ``attach`` applied to its layers."""

    _, built = build_run(tiny_config(tmp_path, "lora", dtype="bfloat16"))
    if attach is not None:
        attach(metrics.decoder_layers(built.model))
    kept = []
    for seq in (32, 64):
        ids = torch.randint(0, built.model.config.vocab_size, (2, seq))
        with SavedActivations(built.model) as meter, torch.autocast("cpu", dtype=torch.bfloat16):
            built.model(input_ids=ids, labels=ids)
        kept.append(meter.bytes)
    return (kept[1] - kept[0]) / 64, built.model.config


def test_each_layer_keeps_less_by_its_products_and_norm_outputs(tmp_path):
    """HF's eager MLP keeps silu(gate) and the product (2 bytes each in bf16): both go. Each norm keeps its input
    instead of its output and HF's fp32 copy of the input: at least the output's bytes go, as the planner counts."""
    plain, config = _per_token(tmp_path / "p")
    mlp, _ = _per_token(tmp_path / "m", lean_mlp.attach)
    both, _ = _per_token(tmp_path / "b", lambda blocks: (lean_mlp.attach(blocks), lean_norm.attach(blocks)))
    layers, hidden, inner = config.num_hidden_layers, config.hidden_size, config.intermediate_size
    assert plain - mlp == layers * 2 * inner * 2
    assert layers * 2 * hidden * 2 <= mlp - both <= layers * 2 * (hidden * 4 + 4)  # (the fp32 copy, its statistic)


def test_mlps_it_does_not_cover_are_left_alone(tmp_path):
    import transformers


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
    (["--lean-norms", "--lora-addmm"], "--lean-norms and --lora-addmm"),
])
def test_refused_beside_another_adapter_forward(tmp_path, capsys, argv, fragment):
    assert_train_refuses(tmp_path, capsys, "lora", argv, fragment)


def test_refused_for_a_full_fine_tune(tmp_path, capsys):
    assert_train_refuses(tmp_path, capsys, "full", ["--lean-activations"], "does not apply to method 'full'")


def test_the_planner_takes_the_products_and_outputs_off_the_layers_that_keep_theirs():
    from ftprof.plan.predict import Target, option_costs
    from tests.plan.planners import planner_for

    p, lean = planner_for("tiny", "lora", seq_len=64, batch_size=2, target=Target("cpu"), checkpointing="full",
                          checkpoint_layers=1, lean_activations=True)
    config = p.source.config
    plain, norms = lean.without("lean_activations"), lean.with_option("lean_norms")
    a, b, c = p.predict(plain), p.predict(lean), p.predict(norms)
    product = 2 * 64 * config.intermediate_size * 2  # tokens x intermediate x bf16, per layer kept
    outputs = 2 * 64 * 2 * config.hidden_size * 2  # two norm outputs a layer
    assert a.activation_bytes - b.activation_bytes == 2 * product  # one layer keeps its own: eager, two products
    assert b.activation_bytes - c.activation_bytes == outputs
    whole = [p.predict(dataclasses.replace(x, checkpoint_layers=None)) for x in (plain, norms)]
    assert whole[0].activation_bytes == whole[1].activation_bytes  # every layer checkpointed: nothing kept to trim
    assert option_costs(plain) == 1.0 and option_costs(norms) == pytest.approx((1 - ACT_COST) * (1 - NORM_COST))


def test_the_norms_outputs_come_off_as_a_run_states_its_options():
    """A run's own prediction plans its configuration as given, where --lora-fused-a is left to its default: the
    norms' outputs still come off (they had not: 34.19 GiB predicted with and without --lean-norms, 29.91 and 33.85
    measured, H200); compiled too (GPU: 98.5% of the outputs' bytes came off)."""
    from ftprof.config import RunConfig
    from ftprof.models.source import resolve_model_source
    from ftprof.plan.candidates import of_config
    from ftprof.plan.predict import Planner, Target

    cfg = RunConfig.from_flat({"model": "tiny", "method": "lora", "seq_len": 64, "batch_size": 2, "compile": True,
                               "lean_norms": True})
    assert cfg.method.lora_fused_a is None  # as a run states it
    p = Planner(cfg, resolve_model_source("tiny"), "bfloat16", Target("NVIDIA H200", capability=(9, 0)), [])
    norms = of_config(cfg)
    config = p.source.config
    # two norm outputs a layer in bf16, but the first layer's first: its input, the frozen table's rows, was not
    # kept without the op, which keeps it instead of the output
    outputs = 2 * 64 * config.hidden_size * 2 * (2 * config.num_hidden_layers - 1)
    assert p.predict(norms.without("lean_norms")).activation_bytes - p.predict(norms).activation_bytes == outputs


@pytest.mark.slow  # (the probe of llama-8b: 8 s with a cold cache)
def test_the_plan_prices_their_measured_cost():
    """Where the calibration has no run with them, a candidate with them is predicted their measured share slower."""
    from tests.plan.planners import planner_for

    p, lean = planner_for("llama-8b", "qlora", seq_len=2048, batch_size=4, checkpointing="none", kernels="liger",
                          compile=True, lean_activations=True)
    plain = lean.without("lean_activations")
    assert p.predict(lean).tokens_per_s == pytest.approx(p.predict(plain).tokens_per_s * (1 - ACT_COST))


@pytest.mark.slow
def test_compiled_keeps_less_and_trains_as_eager(tmp_path):
    """Both options. Compiled, the ops save at least the product (the compiler had left silu(gate) unsaved already)
    and something of the norms' outputs (the planner counts none of those: plan/memory.lean_bytes); the losses stay
    eager's."""
    runs = {(lean, c): ftprof.train(tiny_config(tmp_path / f"{lean}{c}", "lora", lean_activations=lean,
                                                 lean_norms=lean, compile=c, max_steps=3, dtype="float32"))
            for lean in (False, True) for c in (False, True)}
    assert all(r.status == "ok" for r in runs.values()), {k: r.failure for k, r in runs.items()}
    assert runs[(True, True)].compile.outcome.compiled  # (this needs a C++ compiler, as CI's machine has)
    saved = {k: r.memory.memory_breakdown.activations_saved for k, r in runs.items()}
    config = build_run(tiny_config(tmp_path / "c", "lora"))[1].model.config
    product = 4 * 32 * config.intermediate_size * 4  # batch x seq x intermediate x fp32
    assert saved[(False, False)] - saved[(True, False)] > config.num_hidden_layers * 2 * product
    assert saved[(False, True)] - saved[(True, True)] > config.num_hidden_layers * product
    assert runs[(True, True)].throughput.loss_last == pytest.approx(runs[(False, False)].throughput.loss_last,
                                                                    rel=COMPILED_LOSS)


def test_a_run_with_them_calibrates_no_activation_factor(tmp_path):
    """The probe is built without it, so a run with it would teach the planner a factor with its saving in, which
    the planner then takes off again (measured: a 30.0 GiB prediction for a 37.0 GiB run, 2026-12-05)."""
    from ftprof.plan import calibration, probe

    assert {"lean_activations", "lean_norms"} <= calibration.MEMORY_KNOBS
    assert calibration.memory_options_off({"policy": "none", "knobs": {"lean_activations": True}}) == \
        {"lean_activations"}
    cfg = tiny_config(tmp_path, "lora", lean_activations=True, lean_norms=True)
    built = probe._probe_config(cfg, "bfloat16").method
    assert built.lean_activations is False and built.lean_norms is False


def test_auto_takes_it_where_only_it_lets_nothing_be_recomputed(tmp_path):
    """On a CUDA target, with no checkpointing just over the budget: auto keeps none and takes --lean-activations
    (recomputing nothing wins), says so and records it; the run then builds its MLPs lean."""
    from ftprof.metrics import GIB
    from ftprof.plan import budget
    from ftprof.resolved import ResolvedRun
    from tests.data_files import save_checkpoint
    from tests.plan.planners import planner_for

    deep = save_checkpoint(tmp_path / "ckpt", layers=8)
    p, cand = planner_for(deep, "lora", seq_len=512, batch_size=4, checkpointing="auto")
    none = dataclasses.replace(cand, checkpointing="none", checkpoint_layers=None)
    plain, lean = p.predict(none).peak_bytes, p.predict(none.with_option("lean_activations")).peak_bytes
    assert lean < plain
    choice, pred, record, fits = budget.auto_policy(p, cand, GIB + (plain + lean) // 2)  # (a 1 GiB margin here)
    assert fits and choice.checkpointing == "none" and choice.option("lean_activations") is True
    assert record.lean_activations is True and "--lean-activations" in record.reason
    run = ResolvedRun(None, None, "bfloat16", tiny_config(tmp_path / "r", "lora", checkpointing="auto"), None, False,
                      auto_choice=record)
    assert run.lean_activations and run.policy == "none"


def test_joined_projections_keep_their_norms_whole(tmp_path):
    """--lora-fused-projections' joined GEMM keeps its own input for its A: the norms before it are left alone, the
    MLP product still goes, and the gradients stay the joined run's."""
    _, joined = two_step_grads(tmp_path / "j", "lora", "none", dtype="float32", lora_fused_projections=True)
    built, lean = two_step_grads(tmp_path / "l", "lora", "none", dtype="float32", lora_fused_projections=True,
                                 lean_activations=True, lean_norms=True)
    assert sum(getattr(m, lean_norm.MARK, False) for m in built.model.modules()) == 0
    assert sum(getattr(m, lean_mlp.MARK, False) for m in built.model.modules()) == 2
    for before, after in zip(joined, lean, strict=True):
        assert max(float((after[k] - g).abs().max() / g.abs().max()) for k, g in before.items()) < 1e-5


def test_ligers_norms_get_the_lean_forward_and_give_hfs_outputs(tmp_path):
    """--kernels liger replaces the norms by LigerRMSNorm (Llama casting mode, no offset: HF's formula). They get the
    lean forward as HF's do, and the model's logits stay the HF norms' (the op's torch side on the CPU)."""
    liger_norm = pytest.importorskip("liger_kernel.transformers.rms_norm")
    _, built = build_run(tiny_config(tmp_path, "lora", dtype="float32"))
    ids = torch.randint(0, built.model.config.vocab_size, (2, 16))
    with torch.no_grad():
        before = built.model(input_ids=ids).logits
    layers = metrics.decoder_layers(built.model)
    for layer in layers:
        for name in lean_norm.NORMS.values():
            hf = getattr(layer, name)
            liger = liger_norm.LigerRMSNorm(hf.weight.shape[0], eps=hf.variance_epsilon)
            liger.weight.data.copy_(hf.weight.data)
            liger.weight.requires_grad_(False)
            setattr(layer, name, liger)
    assert lean_norm.attach(layers) == 2 * len(layers)
    with torch.no_grad():
        assert torch.equal(built.model(input_ids=ids).logits, before)
    gemma_like = liger_norm.LigerRMSNorm(8, offset=1.0, casting_mode="gemma")
    gemma_like.weight.requires_grad_(False)
    assert not lean_norm._is_rmsnorm(gemma_like)


@pytest.mark.parametrize("values, tried", [
    ({"checkpointing": "none"}, True),
    ({"checkpointing": "full"}, False),
    ({"checkpointing": "full", "checkpoint_layers": 20}, True),
    ({"checkpointing": "full", "checkpoint_layers": 20, "selective_rest": True}, False),
    ({"checkpointing": "selective"}, False),
    ({"checkpointing": "selective", "checkpoint_layers": 20}, True),  # the rest run as none
])
def test_the_planner_tries_them_where_the_engine_applies_them(values, tried):
    """One rule (metrics.keeping_layers) for where the run attaches them and where the planner tries them."""
    kept = metrics.keeping_layers(32, values["checkpointing"], values.get("checkpoint_layers"),
                                  values.get("selective_rest", False))
    assert (len(kept) > 0) is tried
    for name in ("lean_activations", "lean_norms"):
        declared = declarations.BY_NAME[name]
        assert declared.avoided(True, {"method": "qlora", **values}) is not tried
        assert not declared.avoided(False, {"method": "qlora", **values})
