"""What the backward holds above the saved activations at its peak (plan/memory.transient_bytes): the loss's
working set or the layer being recomputed, whichever is larger, where the recomputation starts only after the
layers partial checkpointing leaves unchecked have released theirs."""

from __future__ import annotations

import dataclasses

import pytest

from ftprof.plan import memory
from tests.data_files import save_checkpoint
from tests.plan.planners import planner_for


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("deep") / "ckpt", layers=8, vocab=64)  # a layer outweighs the logits


def _planner(model, **flat):
    return planner_for(model, "qlora", seq_len=256, batch_size=4, **flat)


def test_a_recomputed_layer_no_longer_meets_the_unchecked_layers_activations(deep):
    """mistral-7b QLoRA, full on 19 of 32 layers (H200): 0.0-0.85 GiB above the activations measured, where the
    recomputed layer's 1.41 GiB had been added to all of them."""
    p, cand = _planner(deep, checkpointing="full")
    probe, shape = p.probe(cand.method), p.shape(cand)
    every = memory.transient_bytes(probe, cand, shape)
    partial = dataclasses.replace(cand, checkpoint_layers=2)
    assert memory.transient_bytes(probe, partial, shape, freed=every) == memory.transient_bytes(
        probe, dataclasses.replace(cand, checkpointing="none"), shape)  # only the loss's part is left
    assert memory.transient_bytes(probe, partial, shape, freed=0) == every
    assert every > memory.transient_bytes(probe, dataclasses.replace(cand, checkpointing="none"), shape)


def test_liger_s_fused_loss_holds_a_working_set_of_its_chunks(deep):
    p, cand = _planner(deep, kernels="liger", checkpointing="none")
    shape = p.shape(cand)
    expected = int(memory.FUSED_LOSS_WORKSET * 4 * 256 * shape.layer_input_bytes_per_token)
    assert memory.transient_bytes(p.probe(cand.method), cand, shape) == expected > 0
