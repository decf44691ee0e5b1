"""Peer recipes as bench cells (``trainer:``, ``python:``): what is refused before anything runs, the command a
peer cell runs and replays, a crashing recipe recorded as a failed row, the Unsloth cell where Unsloth is absent,
and benchmarks/peers.yaml. The three-trainer sweep that trains is tests/bench/test_peers_run.py (slow); peer cells
under Slurm are tests/bench/test_slurm_peers.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from ftprof.bench import runner as runner_mod
from ftprof.bench.runner import BenchRunner, plan, recipe_command, replay_command
from ftprof.bench.sweep import TRAINER_NAMES, TRAINERS, load_sweep
from ftprof.errors import ConfigError
from tests.bench.pythons import crashing_python

ROOT = Path(__file__).resolve().parents[2]
BASE = "schema_version: 2\nbase: {model: tiny, method: lora, seq_len: 32, batch_size: 2, max_steps: 4, device: cpu}\n"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "peers.yaml"
    path.write_text(BASE + text)
    return path


def _bench(args: list[str], capsys) -> tuple[int, str]:
    from ftprof.cli.main import main

    code = main(["bench", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# ---------------------------------------------------------------------------------------- refused up front
@pytest.mark.parametrize("cell, words", [
    ("{trainer: hff}", ["experiments[0].trainer", "'hff' is not one of ftprof, hf, trl, unsloth", "hf"]),
    ("{trainer: hf, compile: true}", ["experiments[0].compile", "ftprof option", "trainer: hf"]),
    ("{trainer: trl, checkpointing: selective}", ["experiments[0].checkpointing", "none, full"]),
    ("{trainer: hf, method: gptq-lora}", ["experiments[0].method", "full, lora, qlora"]),
    ("{trainer: unsloth, kernels: liger}", ["experiments[0].kernels", "Unsloth"]),
    ("{trainer: hf, python: /no/such/env/bin/python}", ["experiments[0].python", "/no/such/env/bin/python",
                                                         "does not exist"]),
    ("{trainer: hf, python: $FTPROF_TEST_UNSET_PYTHON}", ["FTPROF_TEST_UNSET_PYTHON is not set"]),
])
def test_bad_cells_are_refused_in_one_line_before_anything_runs(tmp_path, capsys, monkeypatch, cell, words):
    monkeypatch.delenv("FTPROF_TEST_UNSET_PYTHON", raising=False)
    path = _write(tmp_path, f"experiments:\n  - {cell}\n")
    out = tmp_path / "out"
    for extra in ([], ["--dry-run"]):
        code, text = _bench([str(path), "--output-dir", str(out), *extra], capsys)
        assert code == 2
        lines = [ln for ln in text.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("ftprof bench: error: peers.yaml: "), text
        assert all(w in lines[0] for w in words), lines[0]
        assert not out.exists()  # nothing ran, nothing was created


def test_a_bad_trainer_in_the_matrix_is_named_by_its_place(tmp_path):
    with pytest.raises(ConfigError, match=r"matrix\.trainer\[1\]: 'torchtune' is not one of"):
        load_sweep(_write(tmp_path, "matrix: {trainer: [hf, torchtune]}\n"))


def test_an_interpreter_without_ftprof_is_refused(tmp_path):
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 3\n")  # what the probe gets from a Python that cannot find ftprof
    fake.chmod(0o755)
    with pytest.raises(ConfigError, match="cannot import ftprof"):
        load_sweep(_write(tmp_path, f"experiments: [{{trainer: hf, python: {fake}}}]\n"))


# ---------------------------------------------------------------------------------------- what runs
def test_cells_carry_trainer_and_python_and_name_the_trainer(tmp_path, monkeypatch):
    monkeypatch.setenv("FTPROF_TEST_PEERS", sys.executable)
    sweep = load_sweep(_write(tmp_path, "matrix: {trainer: [ftprof, hf, trl]}\n"
                                        "experiments: [{trainer: hf, python: $FTPROF_TEST_PEERS, lr: 0.001},\n"
                                        "              {trainer: trl, python: '${FTPROF_TEST_NOPE:-}', lr: 0.002}]\n"))
    got = [(e.trainer, e.python) for e in sweep.experiments]
    assert got == [("ftprof", None), ("hf", None), ("trl", None), ("hf", str(Path(sys.executable).absolute())),
                   ("trl", None)]
    assert "trainer" in sweep.varying and "python" not in sweep.varying
    assert [e.name.split("-")[0] for e in sweep.experiments[:3]] == ["trainer=ftprof", "trainer=hf", "trainer=trl"]
    assert all(e.config.method.method == "lora" for e in sweep.experiments)  # trainer/python are not train options
    assert not sweep.experiments[0].is_peer and sweep.experiments[1].is_peer


def test_peer_commands_are_the_recipe_in_its_interpreter(tmp_path):
    sweep = load_sweep(_write(tmp_path, f"experiments: [{{trainer: trl, python: {sys.executable}}}, {{lr: 0.001}}]\n"))
    peer, own = sweep.experiments
    run_dir = tmp_path / "out" / peer.name
    cmd = replay_command(peer, run_dir)
    assert cmd == recipe_command(peer, run_dir) == runner_mod.experiment_command(peer, run_dir)
    assert cmd[1:] == ["-m", "ftprof.integrations.recipes.trl", "--config", str(run_dir / "peer_config.json"),
                       "--run-dir", str(run_dir)]
    assert Path(cmd[0]) == Path(sys.executable).absolute()
    assert replay_command(own, tmp_path / own.name)[1:4] == ["-m", "ftprof", "train"]
    assert runner_mod.experiment_command(own, tmp_path / own.name)[1:3] == ["-m", "ftprof.engine.worker"]


def test_dry_run_shows_each_cells_command(tmp_path, capsys):
    path = _write(tmp_path, "matrix: {trainer: [ftprof, hf, trl, unsloth]}\n")
    code, text = _bench([str(path), "--output-dir", str(tmp_path / "out"), "--dry-run"], capsys)
    assert code == 0, text
    for name in ("hf", "trl", "unsloth"):
        assert f"-m ftprof.integrations.recipes.{name} --config" in text
    assert "-m ftprof train lora" in text


def test_trainer_names_agree_with_the_recipes():
    from ftprof.integrations.recipes import RECIPES

    assert set(TRAINER_NAMES) == set(RECIPES) == set(TRAINERS) - {"ftprof"}
    for name in RECIPES:
        assert importlib.util.find_spec(f"ftprof.integrations.recipes.{name}") is not None


# ---------------------------------------------------------------------------------------- failures are rows
def test_a_crashing_recipe_is_a_failed_row_with_its_stderr_tail(tmp_path):
    fake = crashing_python(tmp_path)
    sweep = load_sweep(_write(tmp_path, f"experiments: [{{trainer: hf, python: {fake}}}]\n"))
    out = tmp_path / "out"
    (outcome,) = BenchRunner(sweep, out, plan(sweep, out), slots=[]).run()
    run_dir = out / outcome.name
    result = json.loads((run_dir / "result.json").read_text())
    assert outcome.status == result["status"] == "error"
    assert result["error_message"] == "RuntimeError: the recipe fell over"
    assert "Traceback" in result["error_tail"] and "recorded by ftprof bench" in " ".join(result["notes"])
    config = json.loads((run_dir / "config.json").read_text())
    assert config["trainer"] == {"name": "hf-trainer", "recipe": "hf", "python": str(fake)}
    assert json.loads((run_dir / "peer_config.json").read_text())["method"]["method"] == "lora"
    assert f"exec {fake} -m ftprof.integrations.recipes.hf" in (run_dir / "command.sh").read_text()
    import ftprof

    frame = ftprof.load_results(out)
    assert list(frame["status"]) == ["error"] and list(frame["trainer"]) == ["hf-trainer"]
    assert [p.action for p in plan(sweep, out)] == ["skip"]  # kept like every failure, unless --retry-failed
    assert [p.action for p in plan(sweep, out, retry_failed=True)] == ["run"]


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_unsloth_cell_refuses_cleanly_where_unsloth_is_absent(tmp_path):
    if importlib.util.find_spec("unsloth") is not None:
        pytest.skip("unsloth is installed here: tests/integrations/test_recipes.py runs it")
    sweep = load_sweep(_write(tmp_path, "experiments: [{trainer: unsloth}]\n"))
    out = tmp_path / "out"
    (outcome,) = BenchRunner(sweep, out, plan(sweep, out), slots=[]).run()
    result = json.loads((out / outcome.name / "result.json").read_text())
    assert outcome.status == "error" and "Unsloth does not import" in result["error_message"]
    assert "exited with code 2" in " ".join(result["notes"])
    stderr = [ln for ln in (out / outcome.name / "stderr.log").read_text().splitlines() if ln.strip()]
    assert stderr[-1].startswith("ftprof: error: trainer: unsloth: Unsloth does not import in ")


# ---------------------------------------------------------------------------------------- peers.yaml
def test_peers_sweep_reproduces_issue_40s_cells(monkeypatch):
    monkeypatch.delenv("PEERS_PYTHON", raising=False)
    sweep = load_sweep(ROOT / "benchmarks" / "peers.yaml")
    cells = [(e.trainer, e.config.model.checkpointing, e.config.model.compile, e.config.model.kernels)
             for e in sweep.experiments]
    assert cells == [("ftprof", "full", True, "liger"), ("ftprof", "full", True, "liger"),  # the second offloads
                     ("hf", "full", False, "eager"), ("unsloth", "full", False, "eager"),
                     ("ftprof", "none", True, "eager"), ("unsloth", "none", False, "eager"),
                     ("trl", "full", False, "eager")]
    for e in sweep.experiments:
        c = e.config
        assert (c.model.model, c.method.method, c.method.lora_r, c.data.batch_size, c.data.seq_len) == \
            ("llama-8b", "qlora", 16, 4, 2048)
        assert (c.train.max_steps, c.train.optimizer, c.train.lr) == (12, "adamw", 2e-4)
        assert e.python is None  # PEERS_PYTHON unset: bench's interpreter


def test_peers_sweep_dry_run_passes_as_the_gpu_sweeps_do(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PEERS_PYTHON", sys.executable)
    code, text = _bench([str(ROOT / "benchmarks" / "peers.yaml"), "--dry-run", "--launcher", "slurm",
                         "--output-dir", str(tmp_path / "out")], capsys)
    assert code == 0, text
    assert text.count("-m ftprof.integrations.recipes.unsloth") == 2 and "recipes.hf" in text
