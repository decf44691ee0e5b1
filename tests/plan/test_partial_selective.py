"""Selective checkpointing on part of the layers (--checkpointing selective --checkpoint-layers N): priced as N
layers at selective's rate and the rest at none's, and proposed by ftprof plan where none does not fit."""

from __future__ import annotations

import dataclasses

import pytest

from ftprof.plan.candidates import Candidate
from ftprof.plan.predict import Planner
from tests.plan.planners import planner_for

FP8_LIGER = {"kernels": "liger", "compile": True, "fp8_base": True}


def _planner_and_candidate(**flat) -> tuple[Planner, Candidate]:
    return planner_for("llama-1b", "qlora", seq_len=2048, batch_size=4, **flat)


@pytest.mark.slow  # probes llama-1b on the CPU (about 20 s): the tiny preset is host-bound, every policy alike
def test_selective_on_part_of_the_layers_sits_between_selective_and_none():
    p, selective = _planner_and_candidate(checkpointing="selective", **FP8_LIGER)
    half = p.predict(dataclasses.replace(selective, checkpoint_layers=8))  # of the preset's 16
    every, none = p.predict(selective), p.predict(dataclasses.replace(selective, checkpointing="none"))
    assert every.tokens_per_s < half.tokens_per_s < none.tokens_per_s
    assert every.peak_bytes < half.peak_bytes < none.peak_bytes
    assert "on 8 of 16 layers, the rest at none's rate" in half.speed_source


def test_the_label_names_the_partial_policy():
    _, selective = _planner_and_candidate(checkpointing="selective", checkpoint_layers=8, **FP8_LIGER)
    assert "ckpt selective x8" in selective.label


@pytest.mark.slow  # the same probe
def test_plan_proposes_selective_on_the_fewest_layers_that_fit():
    from ftprof.plan import make

    p, selective = _planner_and_candidate(checkpointing="selective", **FP8_LIGER)
    every, none = p.predict(selective), p.predict(dataclasses.replace(selective, checkpointing="none"))
    budget = (every.peak_bytes + none.peak_bytes) // 2
    found = make._fewest_layers(p, [selective], budget)
    assert [c.checkpointing for c in found] == ["selective"]
    layers = found[0].checkpoint_layers
    assert 0 < layers < p.layer_count
    assert p.predict(found[0]).peak_bytes <= budget
    assert p.predict(dataclasses.replace(found[0], checkpoint_layers=layers - 1)).peak_bytes > budget
