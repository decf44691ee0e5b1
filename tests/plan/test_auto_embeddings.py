"""--checkpointing auto prices --offload-embeddings like the offload of layer inputs: on a CUDA target it takes the
table into host memory where that lets a faster policy fit, says so in its reason and its record, and the run then
moves it; never on the CPU or where the output layer shares the table. Planned from the CPU for an H200 on
8-layer checkpoints of the tiny shape with a 32,768-row table (4 MiB in bf16)."""

from __future__ import annotations

import dataclasses

import pytest

from ftprof.metrics import GIB
from ftprof.plan import budget
from ftprof.plan.predict import Target
from ftprof.resolved import embeddings_offloaded
from ftprof.results.parts import AutoChoice
from tests.data_files import save_checkpoint
from tests.plan.planners import H200, planner_for


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab")
    return {tied: save_checkpoint(root / f"tied-{tied}", layers=8, vocab=32768, tied=tied) for tied in (False, True)}


def _planner(model, target=H200):
    return planner_for(model, "lora", seq_len=512, batch_size=4, target=target, checkpointing="auto")


def _none(p, cand, embed=False):
    none = dataclasses.replace(cand, checkpointing="none")
    return p.predict(none.with_option(budget.EMBED) if embed else none).peak_bytes


def test_auto_keeps_no_checkpointing_with_the_table_on_the_host(models):
    p, cand = _planner(models[False])
    plain, moved = _none(p, cand), _none(p, cand, embed=True)
    assert moved < plain
    choice, pred, record, fits = budget.auto_policy(p, cand, GIB + (plain + moved) // 2)  # the margin: 1 GiB
    assert fits and choice.checkpointing == "none" and choice.option("offload_embeddings") is True
    assert record.host_embeddings is True and record.offload is False and "--offload-embeddings" in record.reason
    assert pred.peak_bytes == moved
    cfg = dataclasses.replace(p.cfg)
    assert embeddings_offloaded(cfg, record) and not embeddings_offloaded(cfg, AutoChoice("none", "fits"))


def test_never_on_the_cpu_nor_with_tied_embeddings(models):
    for p, cand in (_planner(models[False], Target("cpu")), _planner(models[True])):
        assert not budget.offload_applies(p, dataclasses.replace(cand, checkpointing="none"), budget.EMBED)
        plain = _none(p, cand)
        choice, _, record, _ = budget.auto_policy(p, cand, GIB + plain - 1)
        assert not choice.option("offload_embeddings") and record.host_embeddings is False
