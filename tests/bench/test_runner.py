"""ftprof bench for real: child processes, resume, every failure class (stopping bench and its children:
test_runner_signals.py)."""

import csv
import json
import os
import subprocess
import sys

import pytest

from ftprof.bench.runner import BenchRunner, plan
from ftprof.bench.sweep import load_sweep
from ftprof.cli.main import main
from tests.requires import requires, requires_run

FAST = "base: {model: tiny, seq_len: 32, batch_size: 2, max_steps: 3, warmup_steps: 1, device: cpu}\n"


def _sweep(tmp_path, body):
    path = tmp_path / "sweep.yaml"
    path.write_text(FAST + body)
    return path


def _status(run_dir):
    return json.loads((run_dir / "result.json").read_text())["status"]


def test_dry_run_prints_commands_and_runs_nothing(tmp_path, capsys):
    path = _sweep(tmp_path, "matrix: {method: [full, lora]}\n")
    out = tmp_path / "out"
    assert main(["bench", str(path), "--dry-run", "--output-dir", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("-m ftprof train") == 2 and "--memory-logging all" in text
    assert not out.exists()


@pytest.fixture(scope="module")
def full_and_lora(tmp_path_factory):
    """One bench of two experiments (full, lora) for the tests that read it: (sweep file, output dir, exit status).
    test_command_sh_replays_the_run replays its full run in place, which leaves it as bench did (result.json
    rewritten ok, the rest untouched)."""
    tmp_path = tmp_path_factory.mktemp("full_and_lora")
    path = _sweep(tmp_path, "matrix: {method: [full, lora]}\n")
    out = tmp_path / "out"
    env = dict(os.environ)
    try:
        code = main(["bench", str(path), "--output-dir", str(out)])
    finally:  # as tests/conftest.py does for each test: the process as it was
        os.environ.clear()
        os.environ.update(env)
    return path, out, code


@pytest.mark.slow  # > 4 s on the 2-core machine: `pytest -m 'not slow'` is the fast subset
def test_sweep_runs_resumes_and_forces(full_and_lora, capsys):
    path, out, code = full_and_lora
    assert code == 0
    dirs = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(dirs) == 2
    for d in dirs:
        assert _status(d) == "ok"
        for name in ("command.sh", "stdout.log", "stderr.log", "config.json", "env.json", "steps.csv"):
            assert (d / name).is_file(), name
        assert "-m ftprof train" in (d / "command.sh").read_text()
    with open(out / "raw_summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["method"] for r in rows} == {"full", "lora"} and all(float(r["tokens_per_s"]) > 0 for r in rows)
    mtimes = {d: (d / "result.json").stat().st_mtime for d in dirs}
    capsys.readouterr()
    # same sweep again: nothing reruns
    assert main(["bench", str(path), "--output-dir", str(out)]) == 0
    assert {d: (d / "result.json").stat().st_mtime for d in dirs} == mtimes
    planned = plan(load_sweep(path), out)
    assert [p.action for p in planned] == ["skip", "skip"]
    assert [p.action for p in plan(load_sweep(path), out, force=True)] == ["run", "run"]


@pytest.mark.slow  # > 4 s on the 2-core machine: `pytest -m 'not slow'` is the fast subset
def test_command_sh_replays_the_run(full_and_lora):
    _, out, code = full_and_lora
    assert code == 0
    (run,) = [p for p in out.iterdir() if p.is_dir() and p.name.startswith("method=full")]
    (run / "result.json").unlink()
    proc = subprocess.run(["bash", str(run / "command.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert _status(run) == "ok"


@pytest.mark.slow  # > 4 s on the 2-core machine: `pytest -m 'not slow'` is the fast subset
def test_failures_are_rows_and_the_sweep_goes_on(tmp_path, capsys):
    # a checkpoint folder whose config.json is sound and whose model.safetensors has a sound header but not the
    # bytes it promises fails inside the child (the sweep checks the config and the header without torch: a folder
    # without either is refused before anything runs); the next experiment still runs
    from ftprof.models.presets import preset_config

    model = tmp_path / "truncated_weights"
    preset_config("tiny").save_pretrained(model)
    header = json.dumps({"x": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}).encode()
    (model / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    path = _sweep(tmp_path, f"experiments:\n  - {{method: lora, model: '{model}'}}\n  - {{method: full}}\n")
    out = tmp_path / "out"
    assert main(["bench", str(path), "--output-dir", str(out)]) == 1  # some experiment failed
    # the table says "error"; a line under it says why
    assert any(line.startswith("error ") for line in capsys.readouterr().out.splitlines())
    statuses = {d.name.split("-")[0]: _status(d) for d in out.iterdir() if d.is_dir()}
    assert sorted(statuses.values()) == ["error", "ok"]
    bad = next(d for d in out.iterdir() if d.is_dir() and _status(d) == "error")
    result = json.loads((bad / "result.json").read_text())
    assert "deserializing header" in (result["error_message"] or "") + (bad / "stderr.log").read_text()
    with open(out / "raw_summary.csv") as fh:
        assert sorted(r["status"] for r in csv.DictReader(fh)) == ["error", "ok"]
    # failed experiments are kept on resume, rerun with --retry-failed
    assert [p.action for p in plan(load_sweep(path), out)].count("run") == 0
    assert [p.action for p in plan(load_sweep(path), out, retry_failed=True)].count("run") == 1


@pytest.mark.slow  # > 4 s on the 2-core machine: `pytest -m 'not slow'` is the fast subset
def test_timeout_is_recorded(tmp_path):
    path = _sweep(tmp_path, "experiments: [{method: full, max_steps: 100000}]\ntimeout_s: 8\n")
    out = tmp_path / "out"
    assert main(["bench", str(path), "--output-dir", str(out)]) == 1  # a failed experiment
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "timeout" and "timed out after 8 s" in result["error_message"]
    steps = (run / "steps.csv").read_text().strip().splitlines()[1:] if (run / "steps.csv").exists() else []
    assert result["steps_completed"] == len(steps)  # what steps.csv holds, not 0


@pytest.mark.gpu
@requires_run("lora")
@requires("pynvml")
def test_nvml_sampler_reads_the_gpu(tmp_path):
    import ftprof

    cfg = ftprof.RunConfig.from_flat({"method": "lora", "model": "llama-1b", "seq_len": 512, "batch_size": 2,
                                      "max_steps": 6, "device": "cuda", "memory_logging": "all",
                                      "output_dir": str(tmp_path), "quiet": True})
    result = ftprof.train(cfg)
    assert result.status == "ok"
    memory, nvml = result.memory, result.nvml
    assert memory.nvml_device_used_peak >= memory.torch_peak_reserved
    assert memory.nvml_process_used_peak > 0 and memory.non_torch_overhead > 0
    assert nvml.summary["samples"] > 3 and nvml.summary.get("energy_j", 0) > 0
    assert 0 < nvml.energy_per_token_j < 1.0  # joules per token: an H200 does far better than 1 J/token


def test_gpu_slots_of_the_experiments_size(tmp_path):
    """Slots are handed out by size: a 2-GPU experiment waits for two free slots; one too big is a failed row."""
    path = _sweep(tmp_path, "experiments:\n  - {method: full, nproc_per_node: 4}\n")
    sweep = load_sweep(path)
    out = tmp_path / "out"
    runner = BenchRunner(sweep, out, plan(sweep, out), slots=["0", "1"])
    (outcome,) = runner.run()
    assert outcome.status == "error" and "needs 4 GPUs; this machine has 2" in outcome.result["error_message"]
    assert _status(out / outcome.name) == "error"


def test_rerun_does_not_start_a_twin_of_a_live_cell(tmp_path, capsys):
    """A cell whose experiment is still alive (its claim names a live pid here) is reported, not started again."""
    import socket

    path = _sweep(tmp_path, "experiments: [{method: full}]\n")
    out = tmp_path / "out"
    (p,) = plan(load_sweep(path), out)
    p.run_dir.mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (p.run_dir / ".claim").write_text(json.dumps({"pid": sleeper.pid, "pids": [sleeper.pid],
                                                       "host": socket.gethostname(), "started": "earlier"}))
        (again,) = plan(load_sweep(path), out)
        assert again.action == "busy" and str(sleeper.pid) in again.reason
        assert main(["bench", str(path), "--output-dir", str(out)]) == 1  # a cell it did not run: not a success
        assert "being run by pid" in capsys.readouterr().out
        assert not (p.run_dir / "result.json").exists() and not (p.run_dir / "stdout.log").exists()
        (forced,) = plan(load_sweep(path), out, force=True)  # --force wins, and says whose claim it overrides
        assert forced.action == "run" and f"--force: overrides the claim of pid {sleeper.pid}" in forced.reason
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("text, why", [("[1, 2]", "must be a JSON object"),
                                       ('{"status": 3}', "status 3 is not one of"),
                                       ('{"status": "ok", "tokens_per_s": "fast"}', "'tokens_per_s' must be"),
                                       ('{"status": "ok"', "not valid JSON")])
def test_a_damaged_result_is_a_failed_cell_when_planning(tmp_path, capsys, text, why):
    path = _sweep(tmp_path, "experiments: [{method: full}]\n")
    out = tmp_path / "out"
    (p,) = plan(load_sweep(path), out)
    p.run_dir.mkdir(parents=True)
    (p.run_dir / "result.json").write_text(text)
    (again,) = plan(load_sweep(path), out)
    assert (again.action, again.previous) == ("skip", "error") and "result.json" in again.reason
    assert why in again.reason
    assert plan(load_sweep(path), out, retry_failed=True)[0].action == "run"
    assert main(["bench", str(path), "--dry-run", "--output-dir", str(out)]) == 0
    assert "result.json" in capsys.readouterr().out


def test_a_damaged_result_stays_in_the_table_and_the_summary(tmp_path, capsys):
    """Resumed, the cell is skipped as failed; it keeps its row (status error, the file and why) in the sweep's
    table and raw_summary.csv instead of dropping out of both."""
    import csv

    path = _sweep(tmp_path, "experiments: [{method: full}]\n")
    out = tmp_path / "out"
    (p,) = plan(load_sweep(path), out)
    p.run_dir.mkdir(parents=True)
    (p.run_dir / "result.json").write_text('{"status": "ok"')
    assert main(["bench", str(path), "--output-dir", str(out)]) == 1
    printed = capsys.readouterr().out
    assert p.experiment.name in printed and "not valid JSON" in printed
    with open(out / "raw_summary.csv") as fh:
        (row,) = list(csv.DictReader(fh))
    assert (row["experiment"], row["status"], row["error_type"]) == (p.experiment.name, "error", "damaged")
    assert "result.json" in row["error_message"] and row["method"] == "full"


def test_a_damaged_config_is_a_failed_cell(tmp_path):
    path = _sweep(tmp_path, "experiments: [{method: full}]\n")
    out = tmp_path / "out"
    (p,) = plan(load_sweep(path), out)
    p.run_dir.mkdir(parents=True)
    (p.run_dir / "result.json").write_text('{"status": "ok"}')
    (p.run_dir / "config.json").write_text('{"model": []}')
    (again,) = plan(load_sweep(path), out)
    assert again.previous == "error" and "config.json: 'model' must be a JSON object" in again.reason


def test_resume_advice_matches_the_flags():
    from ftprof.cli.bench import resume_advice

    assert "without --force" in resume_advice(force=True)
    assert "same command again" in resume_advice(force=False)


def test_a_rerun_clears_the_previous_attempts_files(tmp_path):
    from ftprof.bench.runner import clear_attempt

    run = tmp_path / "cell"
    run.mkdir()
    old = ["result.json", "steps.csv", "steps_rank1.csv", "memory_stages.csv", "memory_stages_rank0.csv", "env.json",
           "nvml.csv", "stdout.log", "stderr.log", "result_rank1.json"]
    for name in old + ["config.json", "command.sh", ".claim"]:
        (run / name).write_text("x")
    clear_attempt(run)
    assert sorted(p.name for p in run.iterdir()) == [".claim", "command.sh", "config.json"]
