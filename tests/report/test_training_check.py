"""Runs that did not train like the best run of their data (report/training_check.py), and "which should I pick?"
leaving them out: the round of a first FP8 version that ran 39% faster without training (H200, 2026-12-02)."""

import math

import pandas as pd

from ftprof.metrics import GIB
from ftprof.report.choose import choose, to_markdown
from ftprof.report.training_check import lagging_lines, lagging_runs


def _run(tps, first, last, **extra):
    row = {"status": "ok", "method": "qlora", "model": "llama-8b", "batch_size": 4, "seq_len": 2048,
           "max_steps": 12, "lr": 2e-4, "seed": 0, "world_size": 1, "tokens_per_s": tps, "loss_first": first,
           "loss_last": last, "nvml_process_used_peak": 45 * GIB, "run_dir": "x"}
    row.update(extra)
    return row


def _round15():
    return pd.DataFrame([
        _run(16_604, 12.429, 0.855, fp8_base=False), _run(22_967, 12.340, 8.084, fp8_base=True),
        _run(23_129, 12.340, 8.084, fp8_base=True, compile_mode="reduce-overhead"),
        _run(17_461, 12.354, 0.831, fp8_base=True, compile_mode="default"),
    ])


def test_runs_far_above_the_best_of_their_data_are_flagged():
    flags = lagging_runs(_round15())
    assert sorted(flags) == [1, 2]
    assert "8.084" in flags[1] and "0.831" in flags[1] and "did not train like it" in flags[1]


def test_only_runs_of_the_same_data_and_setup_are_compared():
    df = _round15()
    df.loc[1, "lr"] = 1e-6  # another learning rate: its own stream, alone, not judged
    df.loc[2, "max_steps"] = 2
    assert lagging_runs(df) == {}
    flat = pd.DataFrame([_run(1, 10.0, 9.5), _run(2, 10.0, 9.8)])  # a drop of 5%: too small to judge
    assert lagging_runs(flat) == {}
    nan = pd.DataFrame([_run(1, 10.0, 2.0), _run(2, 10.0, math.nan)])  # a run whose loss went NaN is flagged
    assert list(lagging_runs(nan)) == [1]
    assert lagging_runs(pd.DataFrame([_run(1, 10.0, 2.0), _run(2, 10.0, 4.0)])) == {}  # within half the drop


def test_the_pick_leaves_out_a_fast_run_that_did_not_train():
    choice = choose(_round15(), device=("NVIDIA H200", 141 * GIB))
    assert choice.fastest.tokens_per_s == 17_461  # not the 23,129 of a run that did not train
    assert len(choice.left_out) == 2 and all("did not train like it" in line for line in choice.left_out)
    markdown = to_markdown(choice)
    assert "Left out" in markdown and "8.084" in markdown
    clean = choose(_round15().drop(index=[1, 2]))
    assert clean.left_out == [] and "Left out" not in to_markdown(clean)


def test_bench_says_which_experiments_did_not_train():
    rows = [dict(r, experiment=f"e{i}") for i, r in enumerate(_round15().to_dict("records"))]
    rows.append({"status": "oom_device", "experiment": "failed"})  # failures are said elsewhere
    lines = lagging_lines(rows)
    assert [line.split(":")[1].strip() for line in lines] == ["e1", "e2"]
    assert lagging_lines(rows[:1]) == []


def test_the_summary_table_marks_configurations_that_did_not_train():
    from ftprof.report.tables import LAGS, display_rows, summarize, to_csv_frame
    from ftprof.report.tables import to_markdown as table_markdown

    runs = _round15().assign(kernels=["eager", "liger", "x", "y"])  # four configurations (kernels: not the data)
    table = summarize(runs, sort="tokens_per_s")
    headers, rows = display_rows(table)
    status = {row[headers.index("tokens/s")]: row[headers.index("status")] for row in rows}
    assert status == {"23,129": LAGS, "22,967": LAGS, "17,461": "ok", "16,604": "ok"}
    markdown = table_markdown(table)
    assert "Did not train like the others" in markdown and markdown.count("8.084") == 2
    assert to_csv_frame(table)["loss_lags"].notna().sum() == 2
    # a configuration with one run that trained is not marked: its other run is the pick's business
    repeated = pd.concat([runs, runs.iloc[[1]].assign(loss_last=0.84)], ignore_index=True)
    assert sum(row[-1] == LAGS for row in display_rows(summarize(repeated))[1]) == 1
    assert "Did not train" not in table_markdown(summarize(runs.drop(index=[1, 2])))
