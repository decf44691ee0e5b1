"""tests/xdist_order.py: how the suite is shared between xdist's workers (heavy files first, one share of the
cores per worker)."""

from __future__ import annotations

import os
from pathlib import Path

from tests import xdist_order

ROOT = Path(__file__).resolve().parent.parent


def test_the_heavy_files_go_first_longest_first_and_the_rest_keep_their_order():
    files = ["tests/a.py", "tests/bench/test_autotune.py", "tests/b.py", "tests/bench/test_slurm.py"]
    assert xdist_order.heavy_first(files) == ["tests/bench/test_slurm.py", "tests/bench/test_autotune.py",
                                              "tests/a.py", "tests/b.py"]


def test_every_heavy_file_named_exists():
    """A renamed or split file would silently lose its place at the head of the queue."""
    missing = [f for f in xdist_order.HEAVY_FILES if not (ROOT / f).is_file()]
    assert missing == []


def test_each_worker_takes_its_share_of_the_cores(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    try:
        threads = xdist_order.share_cores()
        assert threads == max(1, (os.cpu_count() or 1) // 2) == torch.get_num_threads()
        assert os.environ["OMP_NUM_THREADS"] == str(threads)  # the children's share too
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        assert xdist_order.share_cores() is None  # a setting given is left alone
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert xdist_order.share_cores() is None  # one worker: every core
    finally:
        torch.set_num_threads(before)
