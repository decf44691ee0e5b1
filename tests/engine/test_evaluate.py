"""Evaluation between steps (eval loss in steps.csv, result.json and the report, outside step time) and epochs."""

import csv
import time

import pytest

import ftprof
from ftprof.engine import evaluate
from tests.conftest import tiny_config
from tests.data_files import text_rows, write


def _steps(run_dir):
    with open(run_dir / "steps.csv") as fh:
        return list(csv.DictReader(fh))


def test_eval_loss_every_n_steps_outside_step_time(tmp_path, monkeypatch):
    """Each evaluation's wall-clock window lies between steps' timed windows, never inside one."""
    real_run = evaluate.Evaluator.run
    windows = []

    def timed_run(self, built):
        start = time.time()
        out = real_run(self, built)
        windows.append((start, time.time()))
        return out

    monkeypatch.setattr(evaluate.Evaluator, "run", timed_run)
    cfg = tiny_config(tmp_path, "lora", max_steps=5, eval_steps=2, eval_batches=2, run_name="e", seq_len=16,
                      batch_size=2)
    result = ftprof.train(cfg)
    assert result.status == "ok"
    rows = _steps(tmp_path / "e")
    evaluated = [r["step"] for r in rows if r["eval_loss"]]
    assert evaluated == ["2", "4", "5"]  # every 2 steps, and after the last
    assert all(r["eval_s"] == "" for r in rows if not r["eval_loss"])
    steps = [(float(r["started_unix"]), float(r["started_unix"]) + float(r["step_time_s"])) for r in rows]
    for start, end in windows:
        assert all(end <= s0 or start >= s1 for s0, s1 in steps), (start, end, steps)
    ev = result.evaluation
    assert ev.eval_runs == 3 and ev.eval_loss_last == pytest.approx(float(rows[-1]["eval_loss"]))
    assert ev.eval_loss_best == min(float(r["eval_loss"]) for r in rows if r["eval_loss"])
    assert ev.eval_time_s == pytest.approx(sum(float(r["eval_s"]) for r in rows if r["eval_s"]))
    assert ev.eval_tokens == 2 * 2 * 15

    from ftprof.report.eval_loss import to_markdown
    from ftprof.report.tables import load_results

    section = to_markdown(load_results([tmp_path]))
    assert section.startswith("## Eval loss") and "| e |" in section


def test_eval_split_and_epochs_on_real_data(tmp_path):
    """--num-train-epochs: ceil(rows / (batch x grad accum)) steps per epoch; --eval-dataset scores each row once."""
    data = write(tmp_path / "train.jsonl", text_rows(10))
    held = write(tmp_path / "held.jsonl", text_rows(3))
    cfg = tiny_config(tmp_path, "lora", dataset=data, num_train_epochs=2, batch_size=2, grad_accum=2, seq_len=32,
                      eval_dataset=held, run_name="r")
    result = ftprof.train(cfg)
    assert result.status == "ok", result.failure.error_tail
    assert result.run.steps_completed == 6  # ceil(10 / 4) = 3 per epoch, 2 epochs
    rows = _steps(tmp_path / "r")
    assert [r["step"] for r in rows if r["eval_loss"]] == ["6"]  # eval data without --eval-steps: after the last
    assert result.evaluation.eval_runs == 1 and result.evaluation.eval_tokens > 0


def test_eval_batches_fill_the_last_batch_with_empty_rows():
    import numpy as np

    from ftprof.config import DataConfig
    from ftprof.data.batches import eval_batches
    from ftprof.data.prepare import PreparedData

    ids = np.arange(1, 8)
    prepared = PreparedData(ids, ids.copy(), np.array([0, 3, 5, 7]))  # three rows of 3, 2 and 2 tokens
    batches = eval_batches(prepared, DataConfig(batch_size=2, seq_len=4), pad=0)
    assert len(batches) == 2
    assert batches[1]["attention_mask"].tolist() == [[1, 1, 0, 0], [0, 0, 0, 0]]
    assert batches[1]["labels"][1].tolist() == [-100] * 4
