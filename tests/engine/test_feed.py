"""The batch feed (engine/feed.py): prefetching changes when a batch is made, never which batch a step trains on."""

from pathlib import Path

import pytest
import torch

import ftprof
from ftprof.engine.feed import BatchFeed
from tests.conftest import tiny_config


def _stream(n: int):
    for i in range(n):
        yield {"input_ids": torch.full((2, 4), i), "labels": torch.full((2, 4), i)}


def test_prefetched_batches_come_in_stream_order_with_their_token_counts():
    feed = BatchFeed(_stream(5), torch.device("cpu"))
    seen = []
    for step in range(4):
        batch, tokens, real = feed.take()
        seen.append(int(batch["input_ids"][0, 0]))
        assert (tokens, real) == (8, 6)  # labels after the causal shift
        if step % 2 == 0:
            feed.prefetch()
            feed.prefetch()  # once per take: a second call keeps the batch already made
    assert seen == [0, 1, 2, 3]
    assert int(feed.take()[0]["input_ids"][0, 0]) == 4


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_a_run_trains_the_same_with_and_without_prefetching(tmp_path, monkeypatch):
    prefetched = []
    real_prefetch = BatchFeed.prefetch
    monkeypatch.setattr(BatchFeed, "prefetch", lambda self: prefetched.append(1) or real_prefetch(self))
    runs = {p: ftprof.train(tiny_config(tmp_path / str(p), "lora", prefetch=p, max_steps=4, grad_accum=3))
            for p in (True, False)}
    assert runs[True].status == runs[False].status == "ok"
    # each step's second and third micro-batches while the step runs, the next step's first after it (not after
    # the last step): 4 x 2 + 3
    assert len(prefetched) == 11
    assert runs[True].throughput.loss_last == pytest.approx(runs[False].throughput.loss_last, rel=1e-6)
    losses = {p: (Path(r.run_dir) / "steps.csv").read_text().splitlines() for p, r in runs.items()}
    column = lambda rows: [row.split(",")[1] for row in rows[1:]]  # noqa: E731 - step,loss,...
    assert column(losses[True]) == column(losses[False]) and len(column(losses[True])) == 4
