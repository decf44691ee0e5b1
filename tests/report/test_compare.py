"""The baseline gate's noise model on planted distributions: a real regression is flagged once, same-code noise is
not, and a spread wider than the threshold is called inconclusive with the samples that would settle it."""

import csv

import numpy as np
import pandas as pd
import pytest

from ftprof.report.compare import INCONCLUSIVE, NOT_COMPARED, OK, REGRESSION, compare, step_throughputs, to_markdown

TOKENS = 4096


def _run(tmp, name, tps, step_times=None, status="ok", peak=10 * 2**30):
    run_dir = tmp / name
    run_dir.mkdir(parents=True)
    if step_times is not None:
        with open(run_dir / "steps.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, ["step", "step_time_s", "tokens", "warmup", "profiler_phase"])
            w.writeheader()
            w.writerow({"step": 0, "step_time_s": 5.0, "tokens": TOKENS, "warmup": True, "profiler_phase": ""})
            for i, t in enumerate(step_times, 1):
                w.writerow({"step": i, "step_time_s": t, "tokens": TOKENS, "warmup": False, "profiler_phase": ""})
    return {"run_dir": str(run_dir), "status": status, "method": "lora", "model": "tiny", "batch_size": 4,
            "seq_len": 1024, "world_size": 1, "tokens_per_s": tps, "step_time_p50_s": None if tps is None else
            TOKENS / tps, "torch_peak_reserved": peak}


def _repeats(tmp, side, values, **kw):
    return pd.DataFrame([_run(tmp / side, f"r{i}", v, **kw) for i, v in enumerate(values)])


def test_real_regression_over_repeats_is_flagged_once(tmp_path):
    rng = np.random.default_rng(0)
    base = _repeats(tmp_path, "b", rng.normal(1000, 10, 5))
    cur = _repeats(tmp_path, "c", rng.normal(850, 10, 5))
    cmp = compare(cur, base, threshold_pct=5)
    assert cmp.failed and len(cmp.configs) == 1 and len(cmp.regressions) == 1  # not once per figure
    c = cmp.regressions[0]
    assert c.throughput.samples == "repeats" and c.throughput.p_value < 0.001
    assert c.throughput.change_pct == pytest.approx(-15, abs=2)
    assert "step p50" in c.context and c.context["step p50"][2] > 10  # shown beside, not counted again
    assert "**regression**" in to_markdown(cmp, 5)


def test_same_code_noise_is_not_a_regression(tmp_path):
    rng = np.random.default_rng(1)
    for trial in range(5):
        base = _repeats(tmp_path / str(trial), "b", rng.normal(1000, 15, 5))
        cur = _repeats(tmp_path / str(trial), "c", rng.normal(1000, 15, 5))
        cmp = compare(cur, base, threshold_pct=5)
        assert not cmp.failed and cmp.configs[0].verdict == OK


def test_spread_wider_than_the_threshold_is_inconclusive(tmp_path):
    """Same code on a noisy machine: a -25% mean change inside a ±40% interval is not called a regression."""
    base = _repeats(tmp_path, "b", [1000, 400, 1600])
    cur = _repeats(tmp_path, "c", [300, 1200, 750])
    cmp = compare(cur, base, threshold_pct=5)
    assert not cmp.failed
    c = cmp.configs[0]
    assert c.verdict == INCONCLUSIVE and c.throughput.halfwidth_pct > 5
    assert c.throughput.needed > 3
    assert f"about {c.throughput.needed} repeats per side would settle it" in c.reasons[0]


def test_an_interval_wholly_past_the_threshold_is_a_regression_however_wide(tmp_path):
    """A 2x slowdown measured on a noisy machine (±28%): every value the data allows is worse than -5%."""
    rng = np.random.default_rng(3)
    base = _repeats(tmp_path, "b", rng.normal(1000, 150, 4))
    slow = _repeats(tmp_path, "c", rng.normal(500, 150, 4))
    c = compare(slow, base, threshold_pct=5).configs[0]
    assert c.verdict == REGRESSION and c.throughput.halfwidth_pct > 5
    fast = _repeats(tmp_path, "f", rng.normal(1500, 150, 4))  # an improvement as wide: not inconclusive
    assert compare(fast, base, threshold_pct=5).configs[0].verdict == OK


def test_steady_steps_judge_the_headline_change(tmp_path):
    """The figures are each run's headline tokens/s (total tokens over total time), as in the report's table,
    not the mean of the steps' own rates, which weights fast steps more."""
    times = np.array([0.1, 0.1, 0.1, 0.3] * 5)
    base = pd.DataFrame([_run(tmp_path / "b", "r", TOKENS / times.mean(), step_times=times)])
    cur = pd.DataFrame([_run(tmp_path / "c", "r", TOKENS / times.mean(), step_times=times)])
    t = compare(cur, base, threshold_pct=5).configs[0].throughput
    assert (t.baseline, t.current, t.change_pct) == (pytest.approx(TOKENS / 0.15), pytest.approx(TOKENS / 0.15), 0)
    assert np.mean(TOKENS / times) > 1.2 * t.baseline  # what the steps' mean would have shown


def test_one_run_per_side_uses_the_steady_steps(tmp_path):
    rng = np.random.default_rng(2)
    base_times = rng.normal(0.100, 0.002, 30)
    base = pd.DataFrame([_run(tmp_path / "b", "r", TOKENS / base_times.mean(), step_times=base_times)])
    assert len(step_throughputs(base["run_dir"][0])) == 30  # the warm-up step is left out
    slow = rng.normal(0.115, 0.002, 30)
    cur = pd.DataFrame([_run(tmp_path / "c", "r", TOKENS / slow.mean(), step_times=slow)])
    cmp = compare(cur, base, threshold_pct=5)
    assert cmp.failed and cmp.configs[0].throughput.samples == "steady steps"
    same = rng.normal(0.100, 0.002, 30)
    cur2 = pd.DataFrame([_run(tmp_path / "c2", "r", TOKENS / same.mean(), step_times=same)])
    assert compare(cur2, base, threshold_pct=5).configs[0].verdict == OK


def test_memory_growth_and_a_run_that_stopped_succeeding_are_regressions(tmp_path):
    base = _repeats(tmp_path, "b", [1000, 1001, 999])
    cur = _repeats(tmp_path, "c", [1000, 1001, 999], peak=12 * 2**30)
    c = compare(cur, base, threshold_pct=5).configs[0]
    assert c.verdict == REGRESSION and "torch_peak_reserved +20.0%" in c.reasons
    failed = _repeats(tmp_path, "f", [None], status="oom_device")
    c = compare(failed, base, threshold_pct=5).configs[0]
    assert c.verdict == REGRESSION and c.reasons == ["status ok -> oom_device"]


def test_nothing_matched_is_a_failed_gate_naming_the_options_apart(tmp_path):
    steps = [TOKENS / 1000] * 4
    base = pd.DataFrame([{**_run(tmp_path / "b", f"r{b}", 1000, step_times=steps), "batch_size": b} for b in (1, 2)])
    cur = pd.DataFrame([{**_run(tmp_path / "c", f"r{b}", 1000), "batch_size": b, "seq_len": 2048} for b in (2, 4)])
    cmp = compare(cur, base, threshold_pct=5)
    assert cmp.configs == [] and cmp.nothing_compared and cmp.failed and not cmp.regressions
    # batch_size 2 is on both sides: seq_len, with no value in common, is why nothing matched
    assert cmp.differences == ["seq_len 2048 here, 1024 in the baseline"]
    assert "**No configuration matched the baseline**, so nothing was compared (seq_len 2048" in to_markdown(cmp, 5)
    matched = compare(base, base, threshold_pct=5)
    assert not matched.nothing_compared and not matched.failed and matched.differences == []


def test_a_configuration_without_a_successful_run_is_not_compared(tmp_path):
    """Failed on both sides, or only in the baseline: nothing measured to compare, so not an ok. A gate where no
    configuration was compared fails; one where others were compared judges those. Failing now, ok before: still a
    regression."""
    failed_b = _repeats(tmp_path, "fb", [None], status="error")
    failed_c = _repeats(tmp_path, "fc", [None], status="error")
    cmp = compare(failed_c, failed_b, threshold_pct=5)
    (c,) = cmp.configs
    assert c.verdict == NOT_COMPARED and not c.checked and c.throughput is None
    assert c.reasons == ["no successful run on either side (baseline error, current error)"]
    assert cmp.nothing_compared and cmp.failed and not cmp.regressions
    assert "1 configuration matched, none with the data to compare: no successful run on either side" in \
        cmp.why_nothing()
    md = to_markdown(cmp, 5)
    assert "| not compared |" in md and "**Nothing was compared**" in md
    ok = _repeats(tmp_path, "ok", [1000, 1001, 999])
    fixed = compare(ok, failed_b, threshold_pct=5)
    assert fixed.configs[0].verdict == NOT_COMPARED and fixed.failed
    assert fixed.configs[0].reasons == ["no successful run in the baseline (baseline error, current ok)"]
    assert compare(failed_c, ok, threshold_pct=5).configs[0].verdict == REGRESSION  # stopped succeeding
    # beside a configuration that was compared: the gate judges that one and names the other
    other_b = pd.DataFrame([{**_run(tmp_path / "ob", "r", None, status="error"), "batch_size": 8}])
    other_c = pd.DataFrame([{**_run(tmp_path / "oc", "r", None, status="error"), "batch_size": 8}])
    mixed = compare(pd.concat([ok, other_c]), pd.concat([_repeats(tmp_path, "ok2", [1000, 1001, 999]), other_b]), 5)
    assert not mixed.failed and len(mixed.checked) == 1 and [c.verdict for c in mixed.unchecked] == [NOT_COMPARED]
    assert "1 of 2 matching configurations lacked the data to compare" in to_markdown(mixed, 5)


def _damage(run_dir, how):
    steps = run_dir / "steps.csv"
    text = steps.read_text()
    if how == "empty":
        steps.write_text("")
    elif how == "header only":
        steps.write_text(text.splitlines()[0] + "\n")
    elif how == "cut short":
        steps.write_text(text[:text.index("\n", text.index("\n") + 1) + 12])  # header, warm-up, a part of a step
    elif how == "missing":
        steps.unlink()
    elif how == "unreadable":
        steps.unlink()
        steps.mkdir()  # a folder where the file belongs: open() fails (root reads any file)


@pytest.mark.parametrize("how, why", [("empty", "steps.csv empty"), ("header only", "steps.csv empty"),
                                      ("cut short", "steps.csv cut short, no timed steady steps"),
                                      ("missing", "no steps.csv"), ("unreadable", "steps.csv unreadable")])
def test_one_run_a_side_without_usable_steps_is_inconclusive_and_says_why(tmp_path, how, why):
    """No interval to judge by: not an ok. The verdict names the run and its steps.csv, and a gate with nothing
    else to judge fails."""
    times = [0.1] * 10
    base = pd.DataFrame([_run(tmp_path / "b", "r", TOKENS / 0.1, step_times=times)])
    cur = pd.DataFrame([_run(tmp_path / "c", "r", TOKENS / 0.1, step_times=times)])
    _damage(tmp_path / "c" / "r", how)
    cmp = compare(cur, base, threshold_pct=5)
    (c,) = cmp.configs
    assert c.verdict == INCONCLUSIVE and not c.checked and c.throughput.samples == "single values"
    assert f"(current r: {why}" in c.reasons[0] and "no spread to judge by" in c.reasons[0]
    assert cmp.nothing_compared and cmp.failed and why in cmp.why_nothing()
    # a slowdown past the threshold is flagged all the same, spread unknown
    slow = pd.DataFrame([{**cur.iloc[0].to_dict(), "tokens_per_s": TOKENS / 0.15}])
    c = compare(slow, base, threshold_pct=5).configs[0]
    assert c.verdict == REGRESSION and c.checked and "spread unknown" in c.reasons[0] and why in c.reasons[0]


def test_runs_without_tokens_per_s_are_inconclusive(tmp_path):
    """A run whose steps were all warm-up has no tokens/s and no steady steps: nothing to compare, not an ok."""
    base = pd.DataFrame([_run(tmp_path / "b", "r", None, step_times=[])])
    cur = pd.DataFrame([_run(tmp_path / "c", "r", None, step_times=[])])
    cmp = compare(cur, base, threshold_pct=5)
    (c,) = cmp.configs
    assert c.verdict == INCONCLUSIVE and not c.checked and c.throughput is None and cmp.failed
    assert c.reasons[0].startswith("nothing to compare: no tokens/s (none in the baseline's result.json; none in the "
                                   "current's result.json; baseline r: steps.csv has no timed steady steps")
