"""ftprof plan --train: from a budget to a training run in one command. The top K are timed in their own processes,
the full run trains with the fastest measured, and its result.json says how it was chosen."""

from __future__ import annotations

import json

import pytest

from ftprof.bench.autotune import NoTrialFinished, Trial, choose


def _trial(label, speed, status="ok"):
    return Trial(label, f"/runs/{label}", status, speed, 10_000.0, {"method": "lora"})


def test_the_fastest_measured_trial_is_chosen_whatever_the_plan_predicted():
    chosen, why = choose([_trial("a", 7_531), _trial("b", 13_843), _trial("c", None, "oom_device")])
    assert chosen.label == "b"
    assert why == "fastest measured of 2 trial(s) (13,843 tokens/s; the plan's #1, a, 7,531 measured)"
    with pytest.raises(NoTrialFinished, match="a: oom_device; b: error"):
        choose([_trial("a", None, "oom_device"), _trial("b", None, "error")])


@pytest.mark.slow
def test_plan_train_times_the_top_k_and_trains_the_fastest(tmp_path, capsys):
    from ftprof.cli.main import main

    code = main(["plan", "lora", "--model", "tiny", "--device", "cpu", "--seq-len", "32", "--train", "--verify", "2",
                 "--trial-steps", "3", "--max-steps", "5", "--output-dir", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    trials = sorted((tmp_path / "plan-tiny-lora-s32-2x1-here" / "trials").iterdir())
    assert len([t for t in trials if (t / "result.json").is_file()]) == 2  # two trials, each its own process
    run = next(p for p in tmp_path.iterdir() if p.name.startswith("lora-tiny"))
    result = json.loads((run / "result.json").read_text())
    selection = result["selection"]
    assert result["status"] == "ok" and json.loads((run / "config.json").read_text())["train"]["max_steps"] == 5
    assert len(selection["trials"]) == 2 and selection["choice"] in {t["label"] for t in selection["trials"]}
    assert selection["reason"].startswith("fastest measured of 2 trial(s)")
    chosen = next(t for t in selection["trials"] if t["label"] == selection["choice"])
    assert chosen["tokens_per_s"] == max(t["tokens_per_s"] for t in selection["trials"])
    assert f"training {selection['choice']}" in out
    # the trials ran with today's option meanings, as the full run did (version 1: a constant learning rate)
    ran = [t for t in trials if (t / "config.json").is_file()]
    trial_config = json.loads((ran[0] / "config.json").read_text())
    assert trial_config["train"]["lr_scheduler_type"] == json.loads((run / "config.json").read_text())["train"][
        "lr_scheduler_type"] == "linear"
