"""--lean-recompute with --offload-checkpoints (models/split_layer.py): each full-checkpointed layer checkpointed as
its two halves, whose recomputation leaves out the attention's output projection too. The halves are each
architecture's layer; the gradients are full checkpointing's; both projections skip in the recomputation, both
halves' inputs are offloaded and come back; the FLOP count and the planner's price follow; other layers stay
whole."""


import pytest
import torch

import ftprof
from ftprof import metrics
from ftprof.models import offload, recompute, split_layer
from tests.conftest import build_run, tiny_config, two_step_grads
from tests.tolerances import COMPILED_LOSS

FAMILIES = {
    "LlamaDecoderLayer": ("LlamaConfig", "LlamaForCausalLM"),
    "MistralDecoderLayer": ("MistralConfig", "MistralForCausalLM"),
    "Qwen2DecoderLayer": ("Qwen2Config", "Qwen2ForCausalLM"),
    "Qwen3DecoderLayer": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def test_every_split_class_has_its_check():
    assert set(FAMILIES) == metrics.SPLIT_CLASSES


@pytest.mark.parametrize("layer_class", sorted(FAMILIES))
def test_the_two_halves_are_the_layer(layer_class):
    """The halves reproduce the layer's own forward, bit for bit, with the arguments the model gives it."""
    import transformers

    config_name, model_name = FAMILIES[layer_class]
    config = getattr(transformers, config_name)(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                                head_dim=16)
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config).eval()
    layer = metrics.decoder_layers(model)[1]
    assert type(layer).__name__ == layer_class
    seen = {}
    layer.register_forward_pre_hook(lambda m, args, kwargs: seen.update(args=args, kwargs=kwargs), with_kwargs=True)
    with torch.no_grad():
        model(input_ids=torch.randint(0, 128, (2, 12)))
        whole = layer(*seen["args"], **seen["kwargs"])
        (hidden,) = seen["args"] or (seen["kwargs"].pop("hidden_states"),)
        kwargs = {k: v for k, v in seen["kwargs"].items() if k != "hidden_states"}
        halves = split_layer.mlp_half(layer, split_layer.attention_half(layer, hidden, **kwargs))
    whole = whole[0] if isinstance(whole, tuple) else whole
    assert torch.equal(halves, whole)


@pytest.fixture
def skips(monkeypatch):
    """The shapes of the matmuls the recomputation skipped (their output width tells which projection)."""
    calls = []
    real = recompute.skipped
    monkeypatch.setattr(recompute, "skipped", lambda x, width, *rest: calls.append(width) or real(x, width, *rest))
    return calls


@pytest.mark.parametrize("method, flat", [("lora", {}), ("qlora", {}), ("qlora", {"fp8_base": True}),
                                          ("qlora", {"lora_fused_projections": True})])
def test_the_gradients_are_full_checkpointings_and_both_projections_skip(tmp_path, method, flat, skips):
    torch.manual_seed(0)
    _, plain = two_step_grads(tmp_path / "plain", method, **flat)
    torch.manual_seed(0)
    built, split = two_step_grads(tmp_path / "split", method, offload_checkpoints=True, lean_recompute=True, **flat)
    layers = metrics.decoder_layers(built.model)
    assert split_layer.split_layers(built.model) == layers and offload.offloaded_layers(built.model) == layers
    offloader = offload.offloader_of(built.model)
    assert offloader.offloaded == 2 * 2 * len(layers) and offloader.pending == []  # both halves' inputs came back
    config = built.model.config
    # each step, each layer's recomputation skipped its attention's output (hidden wide) and its MLP's
    assert sorted(skips) == sorted([config.hidden_size, config.hidden_size] * len(layers) * 2)
    for a, b in zip(plain, split, strict=True):
        assert a.keys() == b.keys() and a
        for name, g in a.items():
            torch.testing.assert_close(b[name], g, rtol=0, atol=1e-6, msg=name)


def test_without_offloading_or_lean_the_layers_stay_whole(tmp_path):
    for flat in ({"lean_recompute": True}, {"offload_checkpoints": True}):
        _, built = build_run(tiny_config(tmp_path / str(len(flat)), "lora", checkpointing="full", **flat))
        assert split_layer.split_layers(built.model) == []


def test_only_the_checkpointed_layers_split(tmp_path):
    _, built = build_run(tiny_config(tmp_path, "lora", checkpointing="full", checkpoint_layers=1,
                                     offload_checkpoints=True, lean_recompute=True))
    first, second = metrics.decoder_layers(built.model)
    assert split_layer.split_layers(built.model) == [first]
    marked = [[n for n, m in block.named_modules() if recompute.marked(m)] for block in (first, second)]
    assert marked == [["self_attn.o_proj.base_layer", "mlp.down_proj.base_layer"], []]


def test_the_recomputed_flops_leave_the_attention_output_out(tmp_path):
    built = {split: build_run(tiny_config(tmp_path / str(split), "lora", checkpointing="full", lean_recompute=True,
                                          offload_checkpoints=split))[1] for split in (False, True)}
    lean, split = (built[k].flops.recompute_per_token for k in (False, True))
    o_proj = sum(m.in_features * m.out_features for n, m in built[True].model.named_modules()
                 if n.endswith("o_proj.base_layer"))
    assert lean - split == pytest.approx(2 * o_proj)  # 2 FLOPs a weight a token, every layer
    assert built[True].flops.per_token == built[False].flops.per_token


def test_the_planner_prices_it():
    from ftprof.plan import speed
    from ftprof.plan.predict import Target
    from tests.plan.planners import planner_for

    p, split = planner_for("tiny", "lora", seq_len=64, batch_size=2, target=Target("cpu"), checkpointing="full",
                           lean_recompute=True, offload_checkpoints=True)
    lean = split.without("offload_checkpoints")
    probe = p.probe("lora")
    flops = {c: speed.flops_per_token(probe, c, 64, p.attn_dim) for c in (split, lean)}
    assert flops[split].model == flops[lean].model and 0 < flops[split].recomputed < flops[lean].recomputed
    assert probe.per_layer.matmul_recomputed_lean - probe.per_layer.matmul_recomputed_split == 64 * 64  # o_proj


@pytest.mark.slow
def test_compiled_the_same_losses_as_eager(tmp_path, skips):
    """Compiled, each half is compiled as the layer's function was, and the recomputation skips at run time."""
    runs = {c: ftprof.train(tiny_config(tmp_path / str(c), "lora", checkpointing="full", compile=c, max_steps=3,
                                        offload_checkpoints=True, lean_recompute=True)) for c in (False, True)}
    assert all(r.status == "ok" for r in runs.values()), {k: r.failure for k, r in runs.items()}
    assert skips and all(r.checkpointing.split_layers == 2 for r in runs.values())  # result.json says so
    if runs[True].compile.outcome.compiled:  # (a CPU without a C++ compiler runs eager, and says so)
        assert runs[True].throughput.loss_last == pytest.approx(runs[False].throughput.loss_last, rel=COMPILED_LOSS)
