"""--selective-rest: full checkpointing on the first --checkpoint-layers, selective on the rest. What each layer
keeps, the same numbers as the other policies, how compile treats the two kinds of layer, and the one-line refusals.
The planner's side is tests/plan/test_selective_rest_plan.py; the GPU numerics tests/gpu/test_gpu_fast_paths.py."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import ftprof
from ftprof import metrics
from ftprof.engine import compiled_checkpoint
from ftprof.engine.compile import compile_targets
from ftprof.models.checkpointing import SelectivePolicy, apply_policy, is_selective, selective_layers
from ftprof.models.presets import preset_config
from ftprof.profiling.memory import SavedActivations
from tests.conftest import assert_train_refuses, tiny_config
from tests.tolerances import COMPILED_LOSS


def _model():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(preset_config("tiny"))
    model.train()
    return model


def _kept_and_grads(model, selective: SelectivePolicy, ids) -> tuple[int, float, dict]:
    """Bytes the forward keeps for backward (autograd's saved tensors and selective's cache), the loss, gradients."""
    model.zero_grad()
    selective.start_counting()
    with SavedActivations(model) as saved:
        loss = model(input_ids=ids, labels=ids).loss
    kept = saved.bytes + selective.stop_counting()
    loss.backward()
    return kept, float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}


def _policy(policy: str, **kwargs):
    model, selective = _model(), SelectivePolicy()
    apply_policy(model, policy, selective, **kwargs)
    return model, selective


def test_each_layer_keeps_what_its_policy_keeps_and_the_gradients_are_the_same():
    ids = torch.randint(0, 256, (1, 16))
    runs = {name: _kept_and_grads(*_policy(policy, **kwargs), ids) for name, (policy, kwargs) in {
        "none": ("none", {}), "full": ("full", {}), "selective": ("selective", {}),
        "mixed": ("full", {"layers": 1, "selective_rest": True})}.items()}
    kept = {name: run[0] for name, run in runs.items()}
    # two identical layers: one as full keeps, one as selective keeps (the loss's tensors are in every policy)
    assert 2 * kept["mixed"] == kept["full"] + kept["selective"], kept
    assert kept["full"] < kept["mixed"] < kept["selective"] < kept["none"], kept
    for name in ("full", "selective", "mixed"):
        assert runs[name][1] == pytest.approx(runs["none"][1], abs=1e-6)
        worst = max(float((runs[name][2][n] - g).abs().max()) for n, g in runs["none"][2].items())
        assert worst < 1e-5, (name, worst)


def test_the_first_layers_are_full_and_the_rest_selective():
    model, _ = _policy("full", layers=1, selective_rest=True)
    first, second = metrics.decoder_layers(model)
    assert first.gradient_checkpointing and second.gradient_checkpointing
    assert not is_selective(first._gradient_checkpointing_func) and is_selective(second._gradient_checkpointing_func)
    assert selective_layers(model) == 1
    # compile: the full layer inside its checkpoint, the selective one whole (its checkpoint traced inside it)
    assert compile_targets(model) == [second]
    assert compiled_checkpoint.checkpointed(first) and not compiled_checkpoint.checkpointed(second)


@pytest.mark.parametrize("kwargs", [{"selective_rest": True}, {"layers": 1, "selective_rest": True,
                                                                 "policy": "selective"}])
def test_a_selective_rest_needs_full_on_part_of_the_layers(kwargs):
    policy = kwargs.pop("policy", "full")
    with pytest.raises(ValueError, match="selective rest needs full checkpointing on part of the layers"):
        apply_policy(_model(), policy, **kwargs)


@pytest.mark.slow
def test_a_run_with_a_selective_rest_trains_as_partial_full_checkpointing_does(tmp_path):
    runs = {name: ftprof.train(tiny_config(tmp_path / name, "lora", checkpointing="full", checkpoint_layers=1,
                                           max_steps=3, seq_len=64, lr=3e-3, **extra))
            for name, extra in (("rest", {"selective_rest": True}), ("plain", {}))}
    rest, plain = runs["rest"], runs["plain"]
    assert rest.status == plain.status == "ok"
    assert rest.checkpointing.checkpointing_policy == "full" and rest.checkpointing.checkpointed_layers == 1
    assert (rest.throughput.loss_first, rest.throughput.loss_last) == pytest.approx(
        (plain.throughput.loss_first, plain.throughput.loss_last), rel=1e-6)
    # the unchecked layer's activations become selective's: fewer kept, the same matmuls recomputed
    assert rest.memory.memory_breakdown.activations_saved < plain.memory.memory_breakdown.activations_saved
    assert rest.flops.recompute_flops_per_token == plain.flops.recompute_flops_per_token > 0


@pytest.mark.slow
def test_compiled_the_full_layer_is_compiled_in_its_checkpoint_and_the_selective_one_whole(tmp_path):
    from torch._dynamo.utils import counters

    counters.clear()
    flat = dict(checkpointing="full", checkpoint_layers=1, selective_rest=True, max_steps=3, seq_len=64, lr=3e-3)
    compiled = ftprof.train(tiny_config(tmp_path / "c", "lora", compile=True, **flat))
    eager = ftprof.train(tiny_config(tmp_path / "e", "lora", **flat))
    assert compiled.status == eager.status == "ok"
    if compiled.compile.outcome.compiled:  # (a CPU without a C++ compiler runs eager, and says so)
        assert compiled.compile.outcome.scope == "block inside its checkpoint in 1 of 2 blocks"
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert compiled.throughput.loss_last == pytest.approx(eager.throughput.loss_last, rel=COMPILED_LOSS)


@pytest.mark.parametrize("argv, fragment", [
    (["--selective-rest"], "--selective-rest needs --checkpointing full"),
    (["--checkpointing", "full", "--selective-rest"], "--selective-rest needs --checkpoint-layers"),
    (["--checkpointing", "selective", "--checkpoint-layers", "1", "--selective-rest"],
     "--selective-rest needs --checkpointing full"),
])
def test_bad_input_is_one_line(tmp_path, capsys, argv, fragment):
    assert_train_refuses(tmp_path, capsys, "lora", argv, fragment)
