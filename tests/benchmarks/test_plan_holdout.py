"""benchmarks/plan_holdout.py: each shipped calibration row as the configuration it measured, and held out."""

import pytest

from benchmarks import plan_holdout
from ftprof.config import RunConfig
from ftprof.plan import calibration
from ftprof.plan.candidates import of_config


def _one_gpu_rows() -> list[dict]:
    return [r for r in calibration.shipped()["speed"] if (r.get("world_size") or 1) == 1]


def test_every_shipped_row_is_a_configuration_of_its_own_class():
    """A row the planner cannot turn back into a run configuration, or whose configuration is another class, is
    a calibration that prices something else than what was measured."""
    rows = _one_gpu_rows()
    assert len(rows) > 50
    for row in rows:
        cfg = RunConfig.from_flat(plan_holdout.flat_config(row))
        cand = of_config(cfg)
        # (the planner's own key: cand.values() holds the policy, which options such as --selective-rest need)
        key = calibration.ClassKey(cand.method, cand.checkpointing, cand.kernels, cand.compile,
                                   calibration.speed_class_options(cand.values()))
        assert key == calibration.class_key(row), row["experiment"]
        assert cand.batch_size * cfg.data.seq_len == row["micro_batch_tokens"]


def test_holding_a_row_out_removes_every_measurement_of_its_configuration_alone():
    data = calibration.shipped()
    row = next(r for r in data["speed"] if r["knobs"].get("fp8_base") and r["policy"] == "none")
    rest = plan_holdout.without(data, row)
    same = plan_holdout.speed_identity(row)
    assert not [r for r in rest["speed"] if plan_holdout.speed_identity(r) == same]
    assert len(data["speed"]) - len(rest["speed"]) >= 1
    removed_memory = len(data["memory"]) - len(rest["memory"])
    assert removed_memory == sum(plan_holdout.memory_identity(r) == plan_holdout.memory_identity(row)
                                 for r in data["memory"])
    assert data is calibration.shipped()  # the shipped calibration itself is untouched


@pytest.mark.slow  # probes llama-1b on the CPU
def test_a_held_out_row_is_predicted_without_its_own_measurement():
    rows = [r for r in _one_gpu_rows() if r["model"] == "llama-1b"]
    data = calibration.shipped()
    held = plan_holdout.held_out(rows, data, plan_holdout.Predictor())
    assert calibration.shipped is plan_holdout.ORIGINAL  # put back
    predicted = [r for r in held if r["predicted"]]
    assert predicted
    # with its own row in the calibration a row predicts its own speed; held out, it cannot have been read
    assert all(abs(r["speed_error"]) > 1e-6 for r in predicted)


def test_holding_out_by_sweep_removes_the_rows_file_as_well():
    data = calibration.shipped()
    row = next(r for r in data["speed"] if r["knobs"].get("fp8_base") and r["policy"] == "none")
    rest = plan_holdout.without(data, row, by="sweep")
    assert not [r for r in rest["speed"] + rest["memory"] + rest["host"] if r.get("csv") == row["csv"]]
    assert len(rest["speed"]) < len(plan_holdout.without(data, row)["speed"]) < len(data["speed"])
