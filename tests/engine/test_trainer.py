"""The Trainer's parts: the run's peaks are the max over steps and stages (a peak in a middle step is not lost)."""

import csv

import pytest

import ftprof
from ftprof.engine import loop
from ftprof.profiling import memory as memory_mod
from tests.conftest import tiny_config


class FakeCudaCounters:
    """Allocator counters that peak at ``high`` during one chosen step and at ``low`` otherwise."""

    def __init__(self, low: int, high: int, high_step: int):
        self.low, self.high, self.high_step = low, high, high_step
        self.peak = low
        self.steps_run = 0

    def install(self, monkeypatch):
        cuda = memory_mod.torch.cuda
        monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: 50)
        monkeypatch.setattr(cuda, "memory_reserved", lambda device=None: 60)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(cuda, "max_memory_reserved", lambda device=None: self.peak + 10)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: setattr(self, "peak", self.low))
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
        original_init, original_step = memory_mod.MemoryTracker.__init__, loop.train_step

        def init(tracker, device):
            original_init(tracker, device)
            tracker.cuda = True  # the run is on CPU; its memory tracker reads the fake CUDA counters

        def train_step(*args, **kwargs):
            out = original_step(*args, **kwargs)
            self.steps_run += 1
            if self.steps_run == self.high_step:
                self.peak = self.high
            return out

        monkeypatch.setattr(memory_mod.MemoryTracker, "__init__", init)
        monkeypatch.setattr(loop, "train_step", train_step)


def test_a_peak_in_a_middle_step_is_the_run_peak(tmp_path, monkeypatch):
    FakeCudaCounters(low=100, high=1000, high_step=3).install(monkeypatch)
    result = ftprof.train(tiny_config(tmp_path, "lora", max_steps=5, measure_warmup_steps=1, run_name="r"))
    assert result.status == "ok", result.failure.error_message
    with open(tmp_path / "r" / "steps.csv") as fh:
        peaks = [int(row["mem_peak_allocated"]) for row in csv.DictReader(fh)]
    assert peaks == [100, 100, 1000, 100, 100]
    assert result.memory.torch_peak_allocated == 1000
    assert result.memory.torch_peak_reserved == 1010
    assert result.memory.memory_stages["mem_steady_state_peak"] == 1000
    assert result.memory.memory_breakdown.training_peak == 1000
    assert result.memory.fragmentation == 10


def test_a_failed_build_still_records_a_result(tmp_path):
    """A ConfigError only the model can reveal (no module matches --lora-targets) is recorded, then raised."""
    cfg = tiny_config(tmp_path, "lora", lora_targets="no_such_proj", run_name="bad")
    with pytest.raises(ftprof.ConfigError):
        ftprof.train(cfg)
    import json

    result = json.loads((tmp_path / "bad" / "result.json").read_text())
    assert result["status"] == "error" and result["steps_completed"] == 0
