"""--checkpointing auto and what fits a budget, from the one predictor, decided before the model loads: the fastest
policy that fits, full checkpointing on the fewest layers that fit (a 4-layer checkpoint saved here), and a refusal
naming the closest configuration that fits when none does. Budgets are set by capping the memory this process
reports as available (the margin is at least 1 GiB, so the budgets sit just above it)."""

import dataclasses
import types

import pytest

from ftprof import runtime
from ftprof.errors import ConfigError
from ftprof.metrics import GIB
from ftprof.plan import budget
from ftprof.plan.candidates import of_config
from ftprof.plan.predict import Target, planner
from ftprof.preflight import preflight
from ftprof.results.parts import Prediction
from tests.conftest import assert_train_refuses, tiny_config
from tests.data_files import save_checkpoint


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("deep") / "ckpt", layers=4)


def config(tmp_path, method, deep, policy="none", **flat):
    return tiny_config(tmp_path, method, model=deep, seq_len=128, checkpointing=policy, **flat)


def predicted_peaks(cfg):
    plan = preflight(cfg)
    p = planner(plan.config, plan.source, plan.dtype, Target("cpu"))
    base = of_config(plan.config)
    peaks = {policy: p.predict(dataclasses.replace(base, checkpointing=policy)).peak_bytes
             for policy in ("none", "selective", "full")}
    return p, base, peaks


def auto_with(monkeypatch, cfg, available):
    monkeypatch.setattr(runtime, "available_memory", lambda device, cap=None: available)
    return preflight(cfg)


def test_auto_takes_the_fastest_policy_that_fits(tmp_path, monkeypatch, deep):
    _, _, peaks = predicted_peaks(config(tmp_path, "lora", deep))
    assert peaks["none"] > peaks["selective"] > peaks["full"]
    margin = GIB  # the smallest margin: these budgets are all under 12.5 GiB
    for policy in ("none", "selective"):
        plan = auto_with(monkeypatch, config(tmp_path, "lora", deep, "auto"), margin + peaks[policy])
        assert plan.auto_choice.policy == policy and plan.auto_choice.layers is None, plan.auto_choice.reason
        assert plan.prediction.peak_bytes == peaks[policy] and plan.auto_choice.estimated_peak == peaks


def test_auto_checkpoints_the_fewest_layers_that_fit_before_all_of_them(tmp_path, monkeypatch, deep):
    p, base, peaks = predicted_peaks(config(tmp_path, "lora", deep))
    partial = {n: p.predict(dataclasses.replace(base, checkpointing="full", checkpoint_layers=n)).peak_bytes
               for n in (1, 2, 3)}
    assert peaks["none"] > partial[1] > partial[2] > partial[3] > peaks["full"]
    assert partial[2] < peaks["selective"]  # a budget of partial[2] leaves selective out
    # (with the rest selective, fewer layers still: tests/plan/test_selective_rest_plan.py)
    monkeypatch.setattr(budget, "rest_applies", lambda cand: False)
    plan = auto_with(monkeypatch, config(tmp_path, "lora", deep, "auto"), GIB + partial[2])
    assert (plan.auto_choice.policy, plan.auto_choice.layers) == ("full", 2), plan.auto_choice.reason
    assert "full on 2 of 4 layers" in plan.auto_choice.reason


def test_nothing_fits_refuses_before_loading_and_names_the_closest_that_does(tmp_path, monkeypatch, capsys, deep):
    _, _, peaks = predicted_peaks(config(tmp_path, "full", deep, batch_size=1))  # no smaller micro-batch to take
    _, _, lora_peaks = predicted_peaks(config(tmp_path, "lora", deep, batch_size=1))
    assert lora_peaks["full"] < peaks["full"]
    available = GIB + (lora_peaks["full"] + peaks["full"]) // 2  # LoRA fits, full fine-tuning in no form does
    monkeypatch.setattr(runtime, "available_memory", lambda device, cap=None: available)
    with pytest.raises(ConfigError, match="closest that fits: .*--method") as caught:
        preflight(config(tmp_path, "full", deep, "auto", batch_size=1))
    assert "--checkpointing auto: full ckpt full eager 1x1 is predicted to peak at" in str(caught.value)
    (tmp_path / "cli").mkdir()
    assert_train_refuses(tmp_path / "cli", capsys, "full", ["--model", deep, "--seq-len", "128", "--batch-size",
                                                            "1", "--checkpointing", "auto"], "closest that fits")


def test_describe_change_names_the_flags():
    from ftprof.plan.candidates import Candidate

    a = Candidate("full", "none", None, "eager", False, 4, 1)
    b = Candidate("lora", "full", None, "liger", True, 2, 2)
    assert budget.describe_change(a, b) == ("--method lora --checkpointing full --kernels liger --compile "
                                            "--batch-size 2 --grad-accum 2")


class _Peaks:
    """A planner whose predicted peak is ``peak(layers)``, what stays resident ``static``."""

    def __init__(self, layer_count: int, peak, static: int = 0, records: tuple = ()):
        self.layer_count, self.peak, self.static = layer_count, peak, static
        self.records = [{"model": "m", "seq_len": 8, **r} for r in records]  # the local store's
        self.cfg = types.SimpleNamespace(model=types.SimpleNamespace(model="m"), data=types.SimpleNamespace(seq_len=8))
        self.asked: list[int] = []

    def predict(self, cand):
        self.asked.append(cand.checkpoint_layers)
        return dataclasses.replace(Prediction(), peak_bytes=self.peak(cand.checkpoint_layers),
                                   static_bytes=self.static)


def _linear(planner, budget_bytes):
    return next((n for n in range(1, planner.layer_count) if planner.peak(n) <= budget_bytes), None)


@pytest.mark.parametrize("shape", ["falling", "valley", "flat-then-rising"])
def test_fewest_layers_is_the_first_count_that_fits_in_few_predictions(shape):
    from ftprof.plan.candidates import Candidate

    shapes = {"falling": lambda n: 100 - 3 * n,  # activations set the peak: it falls as layers are checkpointed
             "valley": lambda n: max(100 - 3 * n, 40 + n),  # the recomputed layer sets it past the valley
             "flat-then-rising": lambda n: max(60, 30 + 2 * n)}
    cand = Candidate("lora", "full", None, "eager", True, 4, 1)
    for budget_bytes in range(35, 101):
        planner = _Peaks(32, shapes[shape])
        assert budget.fewest_layers(planner, cand, budget_bytes) == _linear(planner, budget_bytes), budget_bytes
    planner = _Peaks(32, shapes["falling"])
    budget.fewest_layers(planner, cand, 50)
    assert len(planner.asked) <= 8, planner.asked  # (each count in turn: 17)
    resident = _Peaks(32, shapes["falling"], static=60)  # weights and state over the budget: no count is tried
    assert budget.fewest_layers(resident, cand, 50) is None and resident.asked == [31]


def test_fewest_layers_tries_each_count_where_local_runs_may_calibrate_one_count_apart():
    """A local run's activation factor answers at its own layer count only: the peak can dip there (full on 3 of 8
    layers fits, 4 does not, 5 does: a planner with such a run in its store)."""
    from ftprof.plan.candidates import Candidate

    cand = Candidate("lora", "full", None, "eager", True, 4, 1)
    dip = {1: 40, 2: 35, 3: 30, 4: 34, 5: 22, 6: 20, 7: 18}.get
    measured = _Peaks(8, dip, records=({"checkpointed_layers": 3},))
    assert budget.fewest_layers(measured, cand, 30) == 3 == _linear(measured, 30)
