"""One sweep, three trainers on tiny (CPU): ftprof's loop, the HF Trainer + PEFT recipe and TRL's SFTTrainer, each in
its own process, each writing a complete run directory that ftprof's report reads beside the others."""

from __future__ import annotations

import csv
import json
import shlex

import pytest

pytest.importorskip("trl", reason="trl is not installed (pip install 'ftprof[trl]')")

pytestmark = pytest.mark.slow  # three training processes: about a minute on the 2-core machine

SWEEP = """schema_version: 2
name: peers-tiny
base: {model: tiny, method: lora, lora_r: 8, seq_len: 64, batch_size: 2, max_steps: 4, device: cpu,
       lr_scheduler_type: constant}
matrix:
  trainer: [ftprof, hf, trl]
memory_logging: torch
timeout_s: 300
"""
RUN_FILES = ("config.json", "steps.csv", "result.json", "env.json", "memory_stages.csv", "command.sh", "stdout.log",
             "stderr.log")


def test_ftprof_hf_and_trl_cells_run_side_by_side(tmp_path, capsys):
    import ftprof
    from ftprof.cli.main import main

    path = tmp_path / "peers.yaml"
    path.write_text(SWEEP)
    out = tmp_path / "out"
    assert main(["bench", str(path), "--output-dir", str(out)]) == 0, capsys.readouterr()
    dirs = {d.name.split("-")[0].removeprefix("trainer="): d for d in out.iterdir() if d.is_dir()}
    assert set(dirs) == {"ftprof", "hf", "trl"}
    for trainer, run_dir in dirs.items():
        assert all((run_dir / f).is_file() for f in RUN_FILES), (trainer, sorted(p.name for p in run_dir.iterdir()))
        result = json.loads((run_dir / "result.json").read_text())
        assert result["status"] == "ok", (trainer, result.get("error_message"), result["notes"])
        assert result["training_proof"]["passed"] is True
        assert result["flops_per_token"] > 0 and result["tokens_per_s"] > 0
        steps = list(csv.DictReader((run_dir / "steps.csv").open()))
        assert len(steps) == 4 and all(int(s["tokens"]) == 2 * 64 for s in steps)
        config = json.loads((run_dir / "config.json").read_text())
        assert (config["model"]["model"], config["method"]["method"], config["method"]["lora_r"],
                config["data"]["dataset"], config["data"]["seq_len"], config["data"]["batch_size"]) == \
            ("tiny", "lora", 8, "synthetic", 64, 2)
        if trainer == "ftprof":
            assert "trainer" not in config  # ftprof's own loop: no trainer section
            continue
        assert config["trainer"]["name"] == {"hf": "hf-trainer", "trl": "trl-sft"}[trainer]
        assert config["trainer"]["recipe"] == trainer and config["trainer"]["versions"]["transformers"]
        assert config["trainer"]["training_args"]["max_steps"] == 4
        assert config["trainer"]["training_args"]["lr_scheduler_type"] == "constant"
        command = (run_dir / "command.sh").read_text().splitlines()[-1]
        assert shlex.split(command)[2:9] == ["-m", f"ftprof.integrations.recipes.{trainer}", "--config",
                                             str(run_dir / "peer_config.json"), "--run-dir", str(run_dir), "$@"]
    # one FLOP count: the same model, method and shape count the same FLOPs per token whoever trained it
    flops = {t: json.loads((d / "result.json").read_text())["flops_per_token"] for t, d in dirs.items()}
    assert len(set(flops.values())) == 1, flops

    frame = ftprof.load_results(out)
    assert len(frame) == 3 and set(frame["status"]) == {"ok"}
    assert sorted(n.split("-")[0] for n in frame["run_name"]) == ["trainer=ftprof", "trainer=hf", "trainer=trl"]
    assert sorted(frame["trainer"]) == ["ftprof", "hf-trainer", "trl-sft"]  # three configurations, not repeats
    report = ftprof.build_report([out], tmp_path / "report")
    assert report is not None and (tmp_path / "report" / "summary.md").is_file()
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert all(name in summary for name in ("hf-trainer", "trl-sft")) and "±" not in summary.split("##")[0]
