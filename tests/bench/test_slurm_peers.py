"""Peer-recipe cells (``trainer: hf``) and cells in another interpreter (``python:``) as Slurm jobs, through the real
single-node Slurm (scripts/slurm-single-node.sh; skipped where it cannot start), on the tiny model on CPU: complete
run directories as a local sweep leaves them, and a recipe that dies is a failed row beside the other cell's result.
The job script's command for each kind of cell, without Slurm, is tests/bench/test_slurm.py."""

from __future__ import annotations

import json

import pytest

from ftprof.bench.flow import run_sweep
from ftprof.bench.sweep import load_sweep
from ftprof.results.load import read_runs
from tests.bench.pythons import crashing_python, logging_python

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

BASE = """schema_version: 2
name: {name}
base: {{model: tiny, method: lora, lora_r: 8, seq_len: 32, batch_size: 2, max_steps: 3, measure_warmup_steps: 1,
       device: cpu, lr_scheduler_type: constant}}
launcher: {{type: slurm, time: 5, poll_s: 1}}
timeout_s: 300
"""
RUN_FILES = ("config.json", "steps.csv", "result.json", "env.json", "command.sh", "stdout.log", "stderr.log",
             "slurm.json", "slurm_task.json", "slurm_end.txt")


def _sweep(tmp_path, name: str, experiments: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(BASE.format(name=name) + experiments)
    return load_sweep(path)


def _events():
    seen = []
    return seen, lambda kind, payload: seen.append(kind)


def _result(run_dir):
    return json.loads((run_dir / "result.json").read_text())


def test_a_peer_cell_and_a_python_cell_run_as_slurm_jobs(tmp_path, slurm_cluster):
    pytest.importorskip("peft", reason="peft is not installed (the HF Trainer + PEFT recipe needs it)")
    other, calls = logging_python(tmp_path)
    sweep = _sweep(tmp_path, "slurm-peers", f"experiments:\n  - {{trainer: hf, python: {other}}}\n"
                                            f"  - {{python: {other}}}\n")
    out = tmp_path / "out"
    done = run_sweep(sweep, out, on_event=_events()[1])
    assert [o.status for o in done.outcomes] == ["ok", "ok"], [o.result.get("error_message") for o in done.outcomes]
    assert done.exit_code() == 0
    hf_dir, own_dir = (out / e.name for e in sweep.experiments)
    for run_dir in (hf_dir, own_dir):
        assert all((run_dir / f).is_file() for f in RUN_FILES), sorted(p.name for p in run_dir.iterdir())
        result = _result(run_dir)
        assert result["status"] == "ok" and result["training_proof"]["passed"] is True
        assert result["flops_per_token"] > 0 and result["steps_completed"] == 3
        assert json.loads((run_dir / "slurm.json").read_text())["reconciled"] is True
    config = json.loads((hf_dir / "config.json").read_text())
    trainer = config["trainer"]
    assert (trainer["name"], trainer["recipe"]) == ("hf-trainer", "hf")  # python: the one the recipe ran in
    assert trainer["versions"]["transformers"] and trainer["training_args"]["max_steps"] == 3
    assert "trainer" not in json.loads((own_dir / "config.json").read_text())
    # each ran in its python:, the recipe on the peer_config.json bench wrote, as command.sh replays it
    logged = calls.read_text()
    assert (f"-m ftprof.integrations.recipes.hf --config {hf_dir / 'peer_config.json'} --run-dir {hf_dir}"
            in logged) and f"-m ftprof.engine.worker {own_dir / 'config.json'}" in logged
    assert (hf_dir / "peer_config.json").is_file()
    assert f"exec {other} -m ftprof.integrations.recipes.hf" in (hf_dir / "command.sh").read_text()
    rows = read_runs([out]).rows
    assert sorted(r["trainer"] for r in rows) == ["ftprof", "hf-trainer"]
    assert all(r["status"] == "ok" and r["slurm_job_id"] for r in rows)


def test_a_failing_peer_cell_is_a_failed_row_and_the_other_cell_stays(tmp_path, slurm_cluster):
    fake = crashing_python(tmp_path)
    sweep = _sweep(tmp_path, "slurm-crash", f"experiments:\n  - {{trainer: hf, python: {fake}}}\n  - {{lr: 0.001}}\n")
    out = tmp_path / "out"
    done = run_sweep(sweep, out, on_event=_events()[1])
    crashed, fine = (out / e.name for e in sweep.experiments)
    assert [o.status for o in done.outcomes] == ["error", "ok"] and done.exit_code() == 1
    assert done.failed() == [sweep.experiments[0].name]
    result = _result(crashed)
    assert result["error_message"] == "RuntimeError: the recipe fell over"  # the recipe's stderr, as locally
    assert "Traceback" in result["error_tail"]
    assert any("recorded by ftprof bench: Slurm job" in n and "FAILED" in n for n in result["notes"]), result["notes"]
    assert json.loads((crashed / "config.json").read_text())["trainer"] == {"name": "hf-trainer", "recipe": "hf",
                                                                           "python": str(fake)}
    kept = (fine / "result.json").read_bytes()
    assert _result(fine)["status"] == "ok"
    # a rerun keeps both; --retry-failed submits only the failed peer cell, and the other cell's result stays
    seen, on_event = _events()
    again = run_sweep(sweep, out, on_event=on_event)
    assert "submit" not in seen and [p.action for p in again.planned] == ["skip", "skip"]
    seen, on_event = _events()
    retried = run_sweep(sweep, out, retry_failed=True, on_event=on_event)
    assert seen.count("submit") == 1 and [p.action for p in retried.planned] == ["run", "skip"]
    assert [o.status for o in retried.outcomes] == ["error"] and retried.exit_code() == 1
    assert (fine / "result.json").read_bytes() == kept
    rows = {r["run_name"]: r["status"] for r in read_runs([out]).rows}
    assert rows == {crashed.name: "error", fine.name: "ok"}
