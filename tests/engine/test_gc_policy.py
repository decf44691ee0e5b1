"""The collector's schedule (engine/gc_policy.py): off inside steps, setup's objects frozen, collections between
steps every N steps; --gc-interval 0 leaves Python's automatic collection, which then lands inside steps."""

import gc

import pytest

import ftprof
from ftprof.engine.gc_policy import GcPolicy
from tests.conftest import assert_train_refuses, tiny_config


def test_the_policy_freezes_disables_and_collects_on_its_schedule():
    was = gc.isenabled()
    with GcPolicy(3) as collector:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        for index in range(1, 8):
            collector.between_steps(index)
        assert collector.collections == 2  # after steps 3 and 6
    assert gc.isenabled() == was and gc.get_freeze_count() == 0


def test_interval_zero_changes_nothing():
    was = gc.isenabled()
    with GcPolicy(0) as collector:
        assert gc.isenabled() == was and gc.get_freeze_count() == 0
        collector.between_steps(10)
    assert collector.collections == 0


@pytest.fixture
def eager_collector():
    """Python's collector made to run at nearly every allocation, so that it would run inside every step."""
    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    yield
    gc.set_threshold(*thresholds)


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_no_step_pays_for_a_collection_unless_asked(tmp_path, eager_collector):
    scheduled = ftprof.train(tiny_config(tmp_path / "on", "lora", max_steps=4, gc_interval=2))
    automatic = ftprof.train(tiny_config(tmp_path / "off", "lora", max_steps=4, gc_interval=0))
    assert scheduled.status == automatic.status == "ok"
    assert scheduled.host_time.totals.gc_s == 0.0  # no collection inside a steady step
    assert automatic.host_time.totals.gc_s > 0.0  # the automatic collector ran inside them


def test_a_negative_interval_is_one_line(tmp_path, capsys):
    assert_train_refuses(tmp_path, capsys, "lora", ["--gc-interval", "-1"], "--gc-interval must be >= 0")
