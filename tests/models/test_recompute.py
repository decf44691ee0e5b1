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
from tests.tolerances import COMPILED_LOSS


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


@pytest.mark.parametrize("rest, expected", [(False, [["mlp.down_proj.base_layer"], []]),
                                            (True, [["mlp.down_proj.base_layer"], ["mlp.down_proj.base_layer"]])])
def test_only_the_checkpointed_layers_are_marked(tmp_path, rest, expected):
    _, built = _grads("lora", tmp_path, checkpoint_layers=1, selective_rest=rest, lean_recompute=True)
    first, second = metrics.decoder_layers(built.model)
    assert [[n for n, m in block.named_modules() if recompute.marked(m)] for block in (first, second)] == expected


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
    eager = ftprof.train(tiny_config(tmp_path / "e", "lora", checkpointing="full", max_steps=3, **flat))
    assert eager.status == "ok"
    if lean.compile.outcome.compiled:  # (a CPU without a C++ compiler runs eager, and says so)
        assert lean.throughput.loss_last == pytest.approx(eager.throughput.loss_last, rel=COMPILED_LOSS)


def _lean_and_plain(checkpointing: str, dtype: str):
    """A CPU planner for the tiny preset, and its candidate with --lean-recompute and without."""
    from ftprof.plan.predict import Target
    from tests.plan.planners import planner_for

    p, lean = planner_for("tiny", "lora", seq_len=64, batch_size=2, dtype=dtype, target=Target("cpu"),
                          checkpointing=checkpointing, lean_recompute=True)
    assert lean.option("lean_recompute") is True
    return p, lean, lean.without("lean_recompute")


def test_the_planner_prices_fewer_recomputed_flops():
    from ftprof.plan import speed

    p, lean, plain = _lean_and_plain("full", "bfloat16")
    probe = p.probe("lora")
    flops = {c: speed.flops_per_token(probe, c, 64, p.attn_dim) for c in (lean, plain)}
    assert flops[lean].model == flops[plain].model
    assert 0 < flops[lean].recomputed < flops[plain].recomputed
    assert probe.per_layer.matmul_recomputed - probe.per_layer.matmul_recomputed_lean > 0


def test_other_methods_are_refused(tmp_path, capsys):
    assert_train_refuses(tmp_path, capsys, "full", ["--lean-recompute", "--checkpointing", "full"],
                         "--lean-recompute is a LoRA and QLoRA option")


def test_without_checkpointing_it_is_refused(tmp_path, capsys):
    """Nothing is recomputed without checkpointing: asked for there, it is a mistake worth one line, as
    --selective-rest and --offload-checkpoints are."""
    assert_train_refuses(tmp_path, capsys, "lora", ["--lean-recompute"],
                         "--lean-recompute needs --checkpointing full or selective or auto")


@pytest.mark.parametrize("method, flat", [("lora", {}), ("qlora", {}), ("lora", {"fp8_base": True})])
def test_under_selective_the_output_is_not_kept_and_the_gradients_are_the_same_bits(method, flat, tmp_path, skips):
    """Selective saved every matmul's output, the output projection's too, which backward never reads."""
    from ftprof.profiling.memory import SavedActivations

    kept, grads = {}, {}
    for lean in (False, True):
        cfg = tiny_config(tmp_path / str(lean), method, checkpointing="selective", seq_len=32, batch_size=2,
                          lean_recompute=lean, **flat)
        plan, built = build_run(cfg)
        ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
        built.selective.start_counting()
        with SavedActivations(built.model) as saved:
            loss = built.model(input_ids=ids, labels=ids).loss
        kept[lean] = saved.bytes + built.selective.stop_counting()
        loss.backward()
        grads[lean] = {n: p.grad.clone() for n, p in built.model.named_parameters() if p.grad is not None}
    hidden, layers = built.model.config.hidden_size, len(metrics.decoder_layers(built.model))
    width = 2 if flat else 4  # (FP8's matmul writes bf16; the tiny runs are fp32 on the CPU)
    assert kept[False] - kept[True] == layers * 2 * 32 * hidden * width
    assert len(skips) == layers  # eager: the recomputation skips it
    assert grads[True].keys() == grads[False].keys()
    assert all(torch.equal(grads[True][n], g) for n, g in grads[False].items())


@pytest.mark.slow
def test_compiled_selective_computes_the_same_and_keeps_what_it_kept(tmp_path):
    """Compiled, selective's policy is traced with the blocks, and the compiler's partitioner keeps only what
    backward reads: it never kept the projection's output (the eager gain alone), with the option or without."""
    from torch._dynamo.utils import counters

    counters.clear()
    runs = {lean: ftprof.train(tiny_config(tmp_path / str(lean), "lora", checkpointing="selective", compile=True,
                                           max_steps=3, seq_len=64, lean_recompute=lean)) for lean in (False, True)}
    assert all(r.status == "ok" for r in runs.values())
    if runs[True].compile.outcome.compiled:  # (a CPU without a C++ compiler runs eager, and says so)
        assert not counters["graph_break"], dict(counters["graph_break"])
        saved = {k: r.memory.memory_breakdown.activations_saved for k, r in runs.items()}
        assert saved[True] == saved[False], saved
        assert runs[True].throughput.loss_last == pytest.approx(runs[False].throughput.loss_last, rel=1e-5)


def test_the_planner_sizes_eager_selective_without_the_projections_output():
    p, lean, plain = _lean_and_plain("selective", "float32")
    saved = {c: p.predict(c).activation_bytes for c in (lean, plain)}
    hidden = p.source.config.hidden_size
    assert saved[plain] - saved[lean] == pytest.approx(p.layer_count * 2 * 64 * hidden * 4, rel=1e-6)
    compiled = [dataclasses.replace(c, compile=True) for c in (lean, plain)]
    assert p.predict(compiled[0]).activation_bytes == p.predict(compiled[1]).activation_bytes


@pytest.mark.parametrize(("flat", "taken"), [({}, True), ({"fp8_base": True}, False), ({"method": "full"}, False)])
def test_auto_takes_it_under_full_where_the_planner_tries_it(flat, taken):
    """Where only full checkpointing fits, auto adds --lean-recompute in 16 bits (no higher peak, priced faster); not
    under --fp8-base (measured no faster there: config/declarations.py) nor for a full fine-tune."""
    from ftprof.plan import budget
    from tests.plan.planners import planner_for

    defaults = {"method": "lora", "seq_len": 64, "batch_size": 2, "checkpointing": "auto"}
    p, cand = planner_for("tiny", **{**defaults, **flat})  # (flat may name another method)
    full = dataclasses.replace(cand, checkpointing="full")
    selective = p.predict(dataclasses.replace(cand, checkpointing="selective")).peak_bytes
    budget_bytes = (p.predict(full).peak_bytes + selective) // 2  # full fits, selective does not
    choice, pred, record, fits = budget.auto_policy(p, cand, budget.GIB + budget_bytes)
    assert fits and record.policy == "full" and record.lean_recompute is taken
    assert bool(choice.option("lean_recompute")) is taken
    if taken:
        plain = p.predict(choice.without("lean_recompute"))
        # (no more memory: less where a selective rest, run eagerly, no longer keeps the projection's output)
        assert pred.peak_bytes <= plain.peak_bytes and pred.tokens_per_s > plain.tokens_per_s


def test_the_plan_never_pairs_it_with_fp8_but_tries_it_in_16_bits():
    """The avoidance is of a combination: --fp8-base is itself one of the options the plan enumerates, so each
    combination is checked, not only the run's fixed values (plan/candidates.option_sets)."""
    from ftprof.plan.candidates import option_sets

    sets = [dict(s) for s in option_sets("qlora", "liger", True, cuda=True, capability=(9, 0), policy="full")]
    assert any(s.get("lean_recompute") for s in sets) and any(s.get("fp8_base") for s in sets)
    assert not any(s.get("lean_recompute") and s.get("fp8_base") for s in sets)
