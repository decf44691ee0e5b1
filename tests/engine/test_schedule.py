"""Learning-rate schedules: the HF Trainer's names and values, per step in steps.csv."""

import csv

import pytest
import torch

import ftprof
from ftprof.engine.schedule import lr_factor, make_scheduler
from tests.conftest import tiny_config


@pytest.mark.parametrize("kind", ["linear", "cosine", "constant_with_warmup", "constant"])
@pytest.mark.parametrize("warmup", [0, 3])
def test_lr_per_step_matches_transformers(kind, warmup):
    from transformers import get_scheduler

    if kind == "constant" and warmup:
        pytest.skip("transformers' constant ignores a warm-up; the config refuses it")
    total, lr = 10, 1e-3

    def lrs(make):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
        sched = make(opt)
        out = []
        for _ in range(total):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    ours = lrs(lambda opt: make_scheduler(opt, kind, warmup, total))
    theirs = lrs(lambda opt: get_scheduler(kind, opt, num_warmup_steps=warmup, num_training_steps=total))
    assert ours == pytest.approx(theirs, abs=1e-15)


def test_closed_forms():
    linear, cosine = lr_factor("linear", 2, 10), lr_factor("cosine", 2, 10)
    assert [linear(s) for s in (0, 1, 2, 6, 10)] == pytest.approx([0, 0.5, 1, 0.5, 0])
    assert [cosine(s) for s in (2, 6, 10)] == pytest.approx([1, 0.5, 0])


def test_steps_csv_shows_the_schedule(tmp_path):
    cfg = tiny_config(tmp_path, "lora", max_steps=5, warmup_steps=2, lr=1e-3, lr_scheduler_type="linear",
                      run_name="s", seq_len=16, batch_size=2)
    assert ftprof.train(cfg).status == "ok"
    with open(tmp_path / "s" / "steps.csv") as fh:
        rows = list(csv.DictReader(fh))
    factor = lr_factor("linear", 2, 5)
    assert [float(r["lr"]) for r in rows] == pytest.approx([1e-3 * factor(s) for s in range(5)])
    assert [r["warmup"] for r in rows] == ["True", "False", "False", "False", "False"]  # measure warm-up: 1
