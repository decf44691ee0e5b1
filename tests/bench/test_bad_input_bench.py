"""`ftprof bench` refuses what it would otherwise ignore or find late: one line on stderr, exit 2, before torch is
imported. Every case runs in one fresh interpreter, in-process through ``ftprof.cli.main.main``, so ``sys.modules``
tells what each case imported."""

import json
import socket
import subprocess
import sys

import pytest

from ftprof.bench.lock import OutputLock
from ftprof.bench.sweep import load_sweep
from tests.cli.test_bad_input import run_in_one_interpreter

HOLD = """
import sys, time
from pathlib import Path
from ftprof.bench.lock import OutputLock
with OutputLock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""
FAST = "base: {model: tiny, seq_len: 32, max_steps: 3, device: cpu}\n"


def _run(argvs, cwd):
    return run_in_one_interpreter(argvs, cwd, timeout=120)


def _files(tmp):
    (tmp / "ok.yaml").write_text(FAST + "matrix: {method: [full]}\n")
    (tmp / "slurm.yaml").write_text(FAST + "matrix: {method: [full]}\nlauncher: {type: slurm}\n")
    (tmp / "no_name.yaml").write_text("name: ''\n" + FAST + "matrix: {method: [full]}\n")
    (tmp / "typo_exclude.yaml").write_text(FAST + "matrix: {method: [full, lora]}\nexclude: [{method: qlora}]\n")
    (tmp / "a_dir").mkdir()


def _cases(t):
    ok, out = str(t / "ok.yaml"), ["--output-dir", str(t / "out")]
    slurm_only = "applies to Slurm jobs only, and this sweep runs locally"
    return [
        (["bench", str(t / "a_dir")], f"'{t / 'a_dir'}' is a directory, not a sweep file"),
        (["bench", ok, "--output-dir", str(t / "busy")], "is in use by ftprof bench pid"),
        # Slurm's options on a sweep that runs here would be ignored
        (["bench", ok, "--partition", "gpu"], f"--partition {slurm_only}"),
        (["bench", ok, "--cancel"], f"--cancel {slurm_only}"),
        (["bench", ok, "--no-watch"], f"--no-watch {slurm_only}"),
        (["bench", ok, "--sbatch=--exclusive"], f"--sbatch {slurm_only}"),
        (["bench", ok, "--max-jobs", "2", "--dry-run"], f"--max-jobs {slurm_only}"),
        (["bench", str(t / "slurm.yaml"), "--launcher", "local", "--time", "10"], f"--time {slurm_only}"),
        # options that cannot both apply
        (["bench", ok, "--status", "--dry-run"], "--status and --dry-run cannot be used together"),
        (["bench", ok, "--retry-failed", "--force"], "--force and --retry-failed cannot be used together"),
        (["bench", ok, "--status", "--force"], "--status and --force cannot be used together"),
        # sweep files
        (["bench", str(t / "no_name.yaml")], "no_name.yaml: name: is empty"),
        (["bench", str(t / "typo_exclude.yaml")], "exclude[0].method: 'qlora' is not one of the matrix's values"),
    ], out


def test_bench_bad_input_is_one_line_before_torch(tmp_path):
    _files(tmp_path)
    cases, out = _cases(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "busy")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        results = _run([argv + out if "--output-dir" not in argv else argv for argv, _ in cases], tmp_path)
    finally:
        holder.kill()
        holder.wait()
    problems = []
    for (argv, why), res in zip(cases, results, strict=True):
        lines = res["stderr"].strip().splitlines()
        if res["code"] != 2 or len(lines) != 1 or why not in res["stderr"] or res["torch"]:
            problems.append(f"{' '.join(argv[1:])}: exit {res['code']}, torch {res['torch']}, {res['stderr']!r}")
    assert problems == [], "\n".join(problems)
    busy = results[1]
    assert f"pid {holder.pid} on {socket.gethostname()}" in busy["stderr"] and busy["seconds"] < 3
    assert not (tmp_path / "out").exists()  # nothing ran, nothing was written


def test_slurm_options_are_taken_where_the_sweep_runs_as_slurm_jobs(tmp_path):
    """The same options on a Slurm sweep are accepted (the rule is the launcher, not the options)."""
    _files(tmp_path)
    slurm = str(tmp_path / "slurm.yaml")
    (res,) = _run([["bench", slurm, "--partition", "gpu", "--no-watch", "--cancel", "--max-jobs", "2", "--dry-run",
                    "--output-dir", str(tmp_path / "out")]], tmp_path)
    assert res["code"] == 0 and res["stderr"] == "" and not res["torch"]


def test_a_dry_run_previews_a_gpu_sweep_on_a_machine_without_one(tmp_path):
    """A GPU sweep is refused here (one line, exit 2), but its dry run prints the plan and says why it would not run
    here, as on a laptop or a cluster's login node."""
    from ftprof.checks import host_has_cuda

    if host_has_cuda():
        pytest.skip("this machine has an NVIDIA GPU: the sweep would run here")
    (tmp_path / "gpu.yaml").write_text("base: {model: tiny, seq_len: 32, max_steps: 3, device: cuda}\n"
                                       "matrix: {method: [full, lora]}\n")
    argv = ["bench", str(tmp_path / "gpu.yaml"), "--output-dir", str(tmp_path / "out")]
    dry = subprocess.run([sys.executable, "-m", "ftprof", *argv, "--dry-run"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    assert dry.returncode == 0 and "2 experiments" in dry.stdout, dry.stdout + dry.stderr
    assert "not on this machine: " in dry.stdout and "--device cuda: this machine has no NVIDIA GPU" in dry.stdout
    (real,) = _run([argv], tmp_path)
    assert real["code"] == 2 and "--device cuda: this machine has no NVIDIA GPU" in real["stderr"], real
    assert not list((tmp_path / "out").glob("*/result.json"))  # nothing ran


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_wait_waits_for_the_holder_then_runs_holding_the_directory(tmp_path):
    """--wait: the lock bench takes up front is waited for (saying whose), and held while the sweep runs; an
    experiment already finished is skipped, so nothing trains here."""
    _files(tmp_path)
    (exp,) = load_sweep(tmp_path / "ok.yaml").experiments
    run_dir = tmp_path / "busy" / exp.name
    run_dir.mkdir(parents=True)
    (run_dir / "result.json").write_text(json.dumps({"status": "ok", "run_dir": str(run_dir)}))
    hold = HOLD.replace("time.sleep(60)", "time.sleep(2)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / "busy")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        done = subprocess.run([sys.executable, "-m", "ftprof", "bench", str(tmp_path / "ok.yaml"), "--wait",
                               "--output-dir", str(tmp_path / "busy")], capture_output=True, text=True, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 0, done.stderr
    assert f"waiting for ftprof bench pid {holder.pid}" in " ".join(done.stdout.split())
    assert json.loads((tmp_path / "busy" / "sweep.json").read_text())["experiments"] == [exp.name]
    with OutputLock(tmp_path / "busy"):  # released at the end
        pass
