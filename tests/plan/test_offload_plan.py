"""The planner prices --offload-checkpoints (a declared option) like every other: tried with full checkpointing
on a GPU target, its checkpointed layers' inputs out of the device's peak, two of them back for the backward."""

from __future__ import annotations

import dataclasses

from ftprof.plan import memory
from ftprof.plan.candidates import enumerate_candidates
from tests.plan.planners import planner_for


def test_offloading_takes_the_layer_inputs_out_of_the_peak():
    p, plain = planner_for("tiny", "qlora", seq_len=64, batch_size=4, checkpointing="full", kernels="liger",
                           compile=True)
    config = p.source.config
    offloaded = dataclasses.replace(plain, options=(("offload_checkpoints", True),))
    a, b = p.predict(plain), p.predict(offloaded)
    layer_input = 4 * 64 * config.hidden_size * 2  # tokens x hidden x bf16
    layers = config.num_hidden_layers
    assert a.activation_bytes - b.activation_bytes == int(memory.OFFLOADED_SHARE * layers * layer_input)
    assert b.transient_bytes - a.transient_bytes == 2 * layer_input
    assert b.candidate["offload_checkpoints"] is True


def test_the_planner_tries_it_only_with_full_checkpointing_on_a_gpu():
    gpu = enumerate_candidates(["lora"], 4, 4, 1, cuda=True, capability=(9, 0))
    offloaded = [c for c in gpu if dict(c.options).get("offload_checkpoints")]
    assert offloaded and {c.checkpointing for c in offloaded} == {"full"}
    cpu = enumerate_candidates(["lora"], 4, 4, 1)
    assert not any(dict(c.options).get("offload_checkpoints") for c in cpu)  # a plain copy on the CPU
