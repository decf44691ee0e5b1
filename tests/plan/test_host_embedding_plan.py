"""The planner prices --offload-embeddings (models/host_embedding.py) like any declared option: on a CUDA target it
is a candidate whose weights are the input table lighter, and where the output layer shares that table (tied
embeddings) it is no candidate at all. Planned from the CPU for an H200 on small checkpoints (the probe builds two
layers)."""

from __future__ import annotations

import dataclasses

import pytest

from ftprof.config import RunConfig
from ftprof.plan.make import PlanRequest, make_plan
from tests.data_files import save_checkpoint
from tests.plan.planners import planner_for


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    return {tied: save_checkpoint(root / f"tied-{tied}", tied=tied) for tied in (False, True)}


def _config(model: str, tmp_path, **flat) -> RunConfig:
    return RunConfig.from_flat({"model": model, "method": "qlora", "seq_len": 256, "batch_size": 2,
                                "output_dir": str(tmp_path), **flat})


def test_the_table_comes_off_the_predicted_weights(checkpoints, tmp_path):
    p, plain = planner_for(checkpoints[False], "qlora", seq_len=256, batch_size=2, output_dir=str(tmp_path),
                           checkpointing="full")
    moved = dataclasses.replace(plain, options=tuple(sorted((*plain.options, ("offload_embeddings", True)))))
    config = p.source.config
    table = config.vocab_size * config.hidden_size * 2
    assert p.host_embedding_bytes == table
    a, b = p.predict(plain), p.predict(moved)
    rows = 2 * 256 * config.hidden_size * 2  # the prefetched next micro-batch's rows (2 x 256 tokens, bf16)
    assert a.static_bytes - b.static_bytes == table and a.peak_bytes - b.peak_bytes == table - rows
    assert b.tokens_per_s is not None


def test_tied_embeddings_offer_no_such_candidate(checkpoints, tmp_path):
    rows = {tied: make_plan(PlanRequest(_config(checkpoints[tied], tmp_path, memory_limit_gib=8), ("qlora",),
                                        gpu="h200")).rows for tied in (False, True)}
    assert any(r.candidate.option("offload_embeddings") for r in rows[False])
    assert rows[True] and not any(r.candidate.option("offload_embeddings") for r in rows[True])
