"""ftprof bench --launcher slurm: the generated job script, Slurm's verdicts as failure classes, and (marked
``slurm``) whole sweeps through a real single-node Slurm started by scripts/slurm-single-node.sh."""

import json
import subprocess
import time

import pytest

from ftprof.bench import slurm
from ftprof.bench.cell import experiment_command
from ftprof.bench.flow import run_sweep
from ftprof.bench.launcher import parse_launcher
from ftprof.bench.runner import plan
from ftprof.bench.sweep import load_sweep
from ftprof.results.load import read_result, read_runs

TINY = "model: tiny, seq_len: 32, batch_size: 1, warmup_steps: 0, device: cpu"


def _sweep(tmp_path, body: str, name="s"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\n" + body)
    return load_sweep(path)


# ---------------------------------------------------------------------------------------------- no Slurm needed
def test_a_multi_node_experiment_runs_torchrun_under_srun(tmp_path):
    sweep = _sweep(tmp_path, "base: {model: tiny, seq_len: 32, nproc_per_node: 8}\nmatrix: {method: [lora]}\n")
    settings = parse_launcher({"type": "slurm", "nodes": 2, "partition": "gpu", "time": "01:00:00", "max_jobs": 3,
                               "sbatch": ["--exclusive"]})
    exp = sweep.experiments[0]
    shape = slurm.job_shape(exp, settings)
    assert shape == (2, 8, 8)
    tasks = [(d, experiment_command(exp, d)) for d in (tmp_path / "a", tmp_path / "b")]
    text = slurm.sbatch_script("job", tasks, shape, settings, tmp_path, {"X": "1"})
    for line in ("#SBATCH --array=0-1%3", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --gpus-per-node=8", "#SBATCH --partition=gpu", "#SBATCH --time=01:00:00",
                 "#SBATCH --exclusive", "export X=1"):
        assert line in text.splitlines()
    assert 'srun --ntasks-per-node=1' in text and '--nnodes="$SLURM_NNODES" --nproc-per-node=8' in text
    assert '--rdzv-endpoint="$HEAD:$PORT"' in text and "-m ftprof.engine.worker" in text
    # bash accepts it
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_a_cpu_experiment_asks_for_no_gpu(tmp_path):
    sweep = _sweep(tmp_path, f"base: {{{TINY}}}\nmatrix: {{method: [full]}}\n")
    settings = parse_launcher({"type": "slurm"})
    shape = slurm.job_shape(sweep.experiments[0], settings)
    text = slurm.sbatch_script("job", [(tmp_path / "a", experiment_command(sweep.experiments[0], tmp_path / "a"))],
                               shape, settings, tmp_path, {})
    assert shape == (1, 1, 0) and "--gpus-per-node" not in text and "torch.distributed.run" not in text


def _run_task(tmp_path, text: str, task: int) -> list[str]:
    """Run array task ``task`` of a job script as Slurm would (srun and scontrol faked): the argv srun was given."""
    bin_dir, argv = tmp_path / "fakebin", tmp_path / f"argv{task}"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >{argv}\n')
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node1\n")
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_JOB_ID": "7",
           "SLURM_JOB_ID": "8", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1"}
    subprocess.run(["bash", "-c", text], env=env, check=True, timeout=30)
    return argv.read_text().splitlines()


def test_peer_and_python_cells_run_their_own_process_in_the_job(tmp_path):
    """The job runs what a local sweep runs (``experiment_command``): a peer cell's recipe in its ``python:``, an
    ftprof cell's worker in its ``python:``; several processes: torchrun in that interpreter."""
    from tests.bench.pythons import logging_python

    other, _ = logging_python(tmp_path)
    sweep = _sweep(tmp_path, f"base: {{{TINY}, method: lora}}\nexperiments:\n  - {{trainer: hf, python: {other}}}\n"
                             f"  - {{trainer: trl}}\n  - {{python: {other}, lr: 0.001}}\n  - {{lr: 0.002}}\n"
                             f"  - {{python: {other}, nproc_per_node: 2, parallel: ddp}}\n")
    planned = plan(sweep, tmp_path / "out")
    settings = parse_launcher({"type": "slurm"})
    single = [p for p in planned if slurm.job_shape(p.experiment, settings) == (1, 1, 0)]
    assert len(single) == 4
    text = slurm.sbatch_script("job", slurm.task_commands(single), (1, 1, 0), settings, tmp_path, {})
    for p in single:
        p.run_dir.mkdir(parents=True)
    for task, p in enumerate(single):
        assert _run_task(tmp_path, text, task) == ["--ntasks=1", *experiment_command(p.experiment, p.run_dir)]
        assert (p.run_dir / "slurm_task.json").exists()  # the task wrote its record in its own run directory
    hf, trl, own_other, own = (_run_task(tmp_path, text, t)[1:] for t in range(4))
    assert hf == [str(other), "-m", "ftprof.integrations.recipes.hf", "--config",
                  str(single[0].run_dir / "peer_config.json"), "--run-dir", str(single[0].run_dir)]
    assert trl[1:3] == ["-m", "ftprof.integrations.recipes.trl"]
    assert own_other[:3] == [str(other), "-m", "ftprof.engine.worker"] and own[1:3] == ["-m", "ftprof.engine.worker"]
    (ddp,) = (p for p in planned if p not in single)
    text = slurm.sbatch_script("job", slurm.task_commands([ddp]), slurm.job_shape(ddp.experiment, settings),
                               settings, tmp_path, {})
    ddp.run_dir.mkdir(parents=True)
    argv = _run_task(tmp_path, text, 0)
    assert argv[2:5] == [str(other), "-m", "ftprof.engine.torchrun_entry"] and "--nproc-per-node=2" in argv
    assert argv[-3:] == ["-m", "ftprof.engine.worker", str(ddp.run_dir / "config.json")]


def _submitted(tmp_path, record_extra=None, result=None):
    """A run directory as bench leaves it once its job is submitted (config.json, slurm.json)."""
    sweep = _sweep(tmp_path, f"base: {{{TINY}}}\nmatrix: {{method: [full]}}\n")
    (p,) = plan(sweep, tmp_path / "out")
    p.run_dir.mkdir(parents=True)
    (p.run_dir / "config.json").write_text(json.dumps(p.experiment.config.to_dict()))
    (p.run_dir / "slurm.json").write_text(json.dumps({"job_name": "j", "array_task": 0, "job_id": "7_0",
                                                      **(record_extra or {})}))
    if result:
        (p.run_dir / "result.json").write_text(json.dumps({"status": result, "run_dir": str(p.run_dir)}))
    return p.run_dir


@pytest.mark.parametrize("state, worker_said, recorded", [
    ("TIMEOUT", "interrupted", "timeout"),  # the worker saw Slurm's SIGTERM; Slurm knows it was the time limit
    ("TIMEOUT", None, "timeout"),
    ("OUT_OF_MEMORY", None, "oom_host"),
    ("PREEMPTED", None, "interrupted"),
    ("NODE_FAIL", None, "interrupted"),
    ("CANCELLED", "interrupted", "interrupted"),
    ("FAILED", None, "error"),
    ("COMPLETED", "ok", "ok"),
    ("GONE", None, "interrupted"),  # Slurm forgot it and it left nothing: resumable
])
def test_slurm_verdicts_become_failure_classes(tmp_path, monkeypatch, state, worker_said, recorded):
    # the controller no longer knows job 7_0 (this test asks no Slurm of the machine's: a stopped one makes
    # scontrol retry its connection for ~18 s)
    monkeypatch.setattr(slurm, "scontrol_job", lambda job_id: {})
    run_dir = _submitted(tmp_path, result=worker_said)
    assert slurm.reconcile(run_dir, slurm.Job("" if state == "GONE" else "7_0", "j", state)) == recorded
    assert read_result(run_dir)["status"] == recorded
    record = json.loads((run_dir / "slurm.json").read_text())
    assert record["reconciled"] is True
    assert slurm.reconcile(run_dir, slurm.Job("7_0", "j", "COMPLETED")) is None  # once


def test_a_job_still_pending_is_never_submitted_again(tmp_path):
    run_dir = _submitted(tmp_path)
    sweep = load_sweep(tmp_path / "s.yaml")
    jobs = {"7_0": slurm.Job("7_0", "j", "PENDING")}
    (p,) = slurm.plan_with_jobs(plan(sweep, run_dir.parent, force=True), jobs)
    assert p.action == "busy" and "7_0 is pending" in p.reason


def test_a_job_found_by_name_when_the_submitter_died_before_recording_its_id(tmp_path):
    run_dir = _submitted(tmp_path, {"job_id": None})
    jobs = {"9_0": slurm.Job("9_0", "j", "RUNNING", "node1")}
    assert slurm.active_job(run_dir, jobs).job_id == "9_0"


def test_report_rows_carry_the_job_and_node(tmp_path):
    run_dir = _submitted(tmp_path, result="ok")
    (run_dir / "slurm_task.json").write_text(json.dumps({"job_id": "7_0", "nodes": "gpu-17"}))
    (row,) = read_runs([run_dir]).rows
    assert (row["slurm_job_id"], row["slurm_nodes"]) == ("7_0", "gpu-17")


# ---------------------------------------------------------------------------------------------- a real Slurm
def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def _events():
    seen = []
    return seen, lambda kind, payload: seen.append(kind)


@pytest.mark.slurm
@pytest.mark.slow
def test_a_sweep_runs_as_slurm_jobs_and_a_rerun_submits_nothing(tmp_path, slurm_cluster):
    sweep = _sweep(tmp_path, f"base: {{{TINY}, max_steps: 2}}\nmatrix: {{method: [full, lora]}}\n"
                             "launcher: {type: slurm, time: 5, poll_s: 1}\n")
    seen, on_event = _events()
    done = run_sweep(sweep, tmp_path / "out", on_event=on_event)
    assert [o.status for o in done.outcomes] == ["ok", "ok"] and done.exit_code() == 0
    assert seen.count("submit") == 2
    rows = read_runs([tmp_path / "out"]).rows
    assert len(rows) == 2 and all(r["status"] == "ok" and r["slurm_job_id"] and r["slurm_nodes"] for r in rows)
    seen, on_event = _events()
    again = run_sweep(sweep, tmp_path / "out", on_event=on_event)
    assert "submit" not in seen and [p.action for p in again.planned] == ["skip", "skip"]


@pytest.mark.slurm
@pytest.mark.slow
def test_a_two_process_experiment_runs_under_slurm_through_torchrun(tmp_path, slurm_cluster):
    """srun starts ftprof's torchrun wrapper, which starts two gloo ranks on the node: one result per rank, and
    rank 0's result for the experiment."""
    sweep = _sweep(tmp_path, f"base: {{{TINY}, max_steps: 3, nproc_per_node: 2, parallel: ddp}}\n"
                             "matrix: {method: [lora]}\nlauncher: {type: slurm, time: 5, poll_s: 1}\n")
    done = run_sweep(sweep, tmp_path / "out", on_event=_events()[1])
    assert [o.status for o in done.outcomes] == ["ok"], done.outcomes
    run_dir = next(p for p in (tmp_path / "out").iterdir() if (p / "slurm_task.json").exists())
    assert (run_dir / "result_rank0.json").exists() and (run_dir / "result_rank1.json").exists()
    scripts = list((tmp_path / "out" / ".slurm").glob("*.sbatch"))
    assert scripts and all("-m ftprof.engine.torchrun_entry" in f.read_text() for f in scripts)
    assert json.loads((run_dir / "result.json").read_text())["world_size"] == 2


LONG = f"base: {{{TINY}, max_steps: 1000000}}\nmatrix: {{method: [full]}}\n"


@pytest.mark.slurm
@pytest.mark.slow
def test_a_job_killed_at_its_time_limit_is_a_timeout(tmp_path, slurm_cluster):
    sweep = _sweep(tmp_path, LONG + "launcher: {type: slurm, time: 1, poll_s: 2}\n")  # Slurm's minimum: 1 minute
    done = run_sweep(sweep, tmp_path / "out")
    (outcome,) = done.outcomes
    assert outcome.status == "timeout" and done.exit_code() == 1
    assert "TIMEOUT" in outcome.result["error_message"] and outcome.result["steps_completed"] > 0


@pytest.mark.slurm
@pytest.mark.slow
def test_a_cancelled_job_is_resumed_and_a_live_one_never_resubmitted(tmp_path, slurm_cluster):
    sweep = _sweep(tmp_path, LONG + "launcher: {type: slurm, time: 5, poll_s: 1}\n")
    out = tmp_path / "out"
    run_sweep(sweep, out, watch=False)
    run_dir = out / sweep.experiments[0].name
    first = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    _wait(lambda: (run_dir / "steps.csv").exists() or (run_dir / "stdout.log").stat().st_size > 0
          if (run_dir / "stdout.log").exists() else False, 120, "the job to start")
    seen, on_event = _events()
    busy = run_sweep(sweep, out, watch=False, on_event=on_event)
    assert busy.planned[0].action == "busy" and "submit" not in seen
    subprocess.run(["scancel", first], check=True)
    _wait(lambda: not slurm.refresh([run_dir]), 60, "the cancelled job to end")
    assert read_result(run_dir)["status"] == "interrupted"
    resumed = run_sweep(sweep, out, watch=False)
    second = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    try:
        assert resumed.planned[0].action == "run" and second != first
        assert slurm.active_job(run_dir, slurm.squeue_jobs()) is not None
    finally:
        subprocess.run(["scancel", second], check=False)
        _wait(lambda: not slurm.refresh([run_dir]), 60, "the resumed job to end")


def test_status_shows_each_experiments_job_and_result(tmp_path, capsys, monkeypatch):
    from ftprof.cli.main import main

    run_dir = _submitted(tmp_path, result="ok")
    (run_dir / "slurm_task.json").write_text(json.dumps({"job_id": "7_0", "nodes": "gpu-17"}))
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))  # no squeue: what the files say
    assert main(["bench", "--status", str(tmp_path / "s.yaml"), "--output-dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "7_0" in out and "gpu-17" in out and "1 ok" in out


def test_status_asks_squeue_only_when_a_submitted_job_may_still_be_out_there(tmp_path, capsys, monkeypatch):
    """A sweep never submitted has nothing for squeue to tell (and a stopped controller takes seconds to say so)."""
    from ftprof.cli.main import main

    bin_dir, asked = tmp_path / "fakebin", tmp_path / "squeue-asked"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/sh\ntouch {asked}\nexit 1\n")  # an unreachable controller, at once
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    _sweep(tmp_path, f"base: {{{TINY}}}\nmatrix: {{method: [full]}}\n")
    argv = ["bench", "--status", str(tmp_path / "s.yaml"), "--output-dir", str(tmp_path / "out")]
    assert main(argv) == 0
    assert "1 not submitted" in capsys.readouterr().out and not asked.exists()
    run_dir = _submitted(tmp_path)  # now a job was submitted and not yet seen to end: squeue is asked
    assert main(argv) == 0
    assert asked.exists() and "7_0" in capsys.readouterr().out
    assert "reconciled" not in json.loads((run_dir / "slurm.json").read_text())  # squeue could not say it ended
