"""A full-checkpointed layer compiled inside its checkpoint (engine/compiled_checkpoint.py): where the compiled
forward goes (under the offload wrapper, which stays outermost), that the checkpoint still keeps only the layer
input and recomputes the same numbers, and the way back to eager."""

import functools

import torch
from transformers import AutoModelForCausalLM

from ftprof import metrics
from ftprof.engine import compiled_checkpoint
from ftprof.models import offload
from ftprof.models.checkpointing import apply_policy
from ftprof.models.presets import preset_config
from ftprof.profiling.memory import SavedActivations


def _model(policy: str = "full", **kwargs):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(preset_config("tiny"))
    model.train()
    apply_policy(model, policy, **kwargs)
    return model


def _loss_and_grads(model, ids):
    model.zero_grad()
    with SavedActivations(model) as saved:
        loss = model(input_ids=ids, labels=ids).loss
    kept = saved.bytes
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}, kept


def test_compiled_layers_keep_what_eager_checkpointing_keeps_and_compute_the_same():
    ids = torch.randint(0, 256, (2, 32))
    eager_loss, eager_grads, eager_kept = _loss_and_grads(_model(), ids)
    model = _model()
    layers = compiled_checkpoint.attach(model, {"backend": "aot_eager"})  # aot_eager: no C++ compiler needed
    assert layers == metrics.decoder_layers(model)
    assert all(isinstance(b._gradient_checkpointing_func, compiled_checkpoint.CompiledForward) for b in layers)
    loss, grads, kept = _loss_and_grads(model, ids)
    torch._dynamo.reset()
    assert abs(loss - eager_loss) < 1e-5
    assert max(float((grads[n] - g).abs().max()) for n, g in eager_grads.items()) < 1e-5
    assert kept == eager_kept  # the checkpoint keeps the layer inputs only, compiled or not


def test_the_offload_wrapper_stays_outermost_and_detach_restores_eager():
    model = _model("full", offload=True)
    before = [b._gradient_checkpointing_func.inner for b in metrics.decoder_layers(model)]
    compiled_checkpoint.attach(model, {"backend": "aot_eager"})
    for block, inner in zip(metrics.decoder_layers(model), before, strict=True):
        outer = block._gradient_checkpointing_func
        assert isinstance(outer, offload.OffloadedCheckpoint)  # what offloaded_layers() reads
        assert isinstance(outer.inner, compiled_checkpoint.CompiledForward) and outer.inner.inner is inner
    assert len(offload.offloaded_layers(model)) == len(before)
    compiled_checkpoint.detach(model)
    assert [b._gradient_checkpointing_func.inner for b in metrics.decoder_layers(model)] == before


def test_only_checkpointed_layers_are_wrapped_and_other_callers_pass_through():
    model = _model("full", layers=1)
    first, second = metrics.decoder_layers(model)
    assert compiled_checkpoint.attach(model, {"backend": "aot_eager"}) == [first]
    calls = []
    wrapper = compiled_checkpoint.CompiledForward(lambda fn, *a: calls.append(fn) or fn(*a), {}, {"backend": "eager"})
    plain = lambda x: x + 1  # noqa: E731 - not transformers' partial: run as given
    assert wrapper(plain, 1) == 2 and calls == [plain]
    bound = functools.partial(lambda self, x, k=0: x + k, None, k=2)
    assert wrapper(bound, 1) == 3 and calls[-1] is not bound  # the compiled copy ran
