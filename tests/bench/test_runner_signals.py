"""ftprof bench for real, stopped: a child killed, a timeout that must take torchrun's workers with it, Ctrl-C and
SIGTERM of bench (whatever its parent left SIGINT as), kill -9 of bench. (Split from test_runner.py, so that
``--dist loadfile`` can run the two halves on two workers.)"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import types

import pytest

from ftprof.bench.runner import BenchRunner, plan
from ftprof.bench.sweep import load_sweep
from ftprof.cli.main import main
from tests.bench.test_runner import _status, _sweep


@pytest.mark.slow  # > 4 s on the 2-core machine: `pytest -m 'not slow'` is the fast subset
def test_sigkilled_child_is_killed(tmp_path):
    path = _sweep(tmp_path, "experiments: [{method: full, max_steps: 100000}]\n")
    out = tmp_path / "out"
    sweep = load_sweep(path)

    def on_event(kind, payload):
        if kind == "start":
            run_dir = payload.run_dir

            def kill_when_training():
                for _ in range(600):
                    if (run_dir / "steps.csv").exists():
                        break
                    time.sleep(0.1)
                for proc in runner_ref[0]._running_procs():
                    os.kill(proc.pid, signal.SIGKILL)

            threading.Thread(target=kill_when_training, daemon=True).start()

    runner = BenchRunner(sweep, out, plan(sweep, out), on_event=on_event, slots=[])
    runner_ref = [runner]
    (outcome,) = runner.run()
    assert outcome.status == "killed"  # not oom_host: the OOM killer did not send it (tests/bench/test_killed.py)
    run = out / outcome.name
    assert _status(run) == "killed" and (run / "steps.csv").exists()  # partial steps are kept
    rows = (run / "steps.csv").read_text().strip().splitlines()[1:]
    result = json.loads((run / "result.json").read_text())
    assert len(rows) > 0 and result["steps_completed"] == len(rows)


@pytest.mark.slow  # > 4 s on the 2-core machine: `pytest -m 'not slow'` is the fast subset
def test_ctrl_c_marks_interrupted_and_resumes(tmp_path):
    path = _sweep(tmp_path, "experiments:\n  - {method: full, max_steps: 100000}\n  - {method: lora}\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "ftprof", "bench", str(path), "--output-dir", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.glob("*/steps.csv")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()[-2000:]
    runs = [d for d in out.iterdir() if d.is_dir()]
    assert [_status(d) for d in runs] == ["interrupted"]  # the second experiment never started
    sweep = load_sweep(path)
    assert sorted(p.action for p in plan(sweep, out)) == ["run", "run"]  # interrupted and never-run both resume


@pytest.mark.slow  # > 4 s on the 2-core machine: `pytest -m 'not slow'` is the fast subset
def test_timeout_kills_torchrun_workers_too(tmp_path):
    """A 2-process experiment (torchrun under ftprof) that times out leaves no worker behind. Its limit (40 s, room
    for a loaded machine to start torchrun and its ranks) is brought forward to the moment both ranks write their
    steps: the experiment times out while torchrun and both workers are busy, without waiting out the rest."""
    import psutil

    path = _sweep(tmp_path, "experiments: [{method: full, max_steps: 100000, nproc_per_node: 2}]\ntimeout_s: 40\n")
    out = tmp_path / "out"
    sweep = load_sweep(path)
    runner = BenchRunner(sweep, out, plan(sweep, out), slots=[])
    launched = []  # the runner's record of its one running experiment, deadline included
    launch = runner._launch
    runner._launch = lambda *args: launched.append(launch(*args)) or launched[-1]
    seen: dict[int, psutil.Process] = {}  # this test's own descendants, watched while they live
    done = threading.Event()

    def watch():
        me = psutil.Process()
        while not done.is_set():
            try:
                seen.update((p.pid, p) for p in me.children(recursive=True))
            except psutil.Error:
                pass
            if launched and len(list(out.glob("*/steps_rank*.csv"))) >= 2:  # both ranks are training
                launched[0].deadline = min(launched[0].deadline, time.monotonic())
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    (outcome,) = runner.run()
    done.set()
    watcher.join()
    assert outcome.status == "timeout"
    assert len(seen) >= 3  # torchrun and its two workers were seen
    time.sleep(1.0)
    left = [p for p in seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert left == []


def _start_bench(path, out, *extra):
    proc = subprocess.Popen([sys.executable, "-m", "ftprof", "bench", str(path), "--output-dir", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.glob("*/steps*.csv")) and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
    return proc


LONG = "experiments:\n  - {method: full, max_steps: 100000}\n  - {method: lora}\n"


@pytest.mark.slow
def test_second_bench_is_refused_and_sigterm_is_ctrl_c(tmp_path, capsys):
    path = _sweep(tmp_path, LONG)
    out = tmp_path / "out"
    first = _start_bench(path, out)
    try:
        capsys.readouterr()
        assert main(["bench", str(path), "--output-dir", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"pid {first.pid}" in err[0] and "--wait" in err[0]
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    assert first.returncode == 130, err.decode()[-2000:]
    runs = [d for d in out.iterdir() if d.is_dir()]
    assert [_status(d) for d in runs] == ["interrupted"]
    assert (out / "raw_summary.csv").is_file() and not (runs[0] / ".claim").exists()


@pytest.mark.slow
def test_double_ctrl_c_still_records_and_summarizes(tmp_path):
    path = _sweep(tmp_path, LONG)
    out = tmp_path / "out"
    bench = _start_bench(path, out)
    bench.send_signal(signal.SIGINT)
    time.sleep(0.5)  # the second Ctrl-C while bench waits for its child to stop
    bench.send_signal(signal.SIGINT)
    _, err = bench.communicate(timeout=120)
    assert bench.returncode == 130, err.decode()[-2000:]
    assert [_status(d) for d in out.iterdir() if d.is_dir()] == ["interrupted"]
    assert (out / "raw_summary.csv").is_file()


def _leave_sigint(how: str):
    """A preexec_fn: the child starts with SIGINT ``ignored`` or ``blocked``, as a parent may leave it."""
    def pre():
        if how == "ignored":
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        else:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    return pre


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ignored", "blocked"])
def test_ctrl_c_stops_bench_whatever_its_parent_left(tmp_path, how):
    """A bench started with SIGINT ignored or blocked (inherited from its parent) still stops its experiment and
    records it on Ctrl-C (seen in CI: one ran on for 18 minutes)."""
    path = _sweep(tmp_path, LONG)
    out = tmp_path / "out"
    bench = subprocess.Popen([sys.executable, "-m", "ftprof", "bench", str(path), "--output-dir", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_leave_sigint(how))
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.glob("*/steps*.csv")) and bench.poll() is None:
        time.sleep(0.2)
    bench.send_signal(signal.SIGINT)
    try:
        _, err = bench.communicate(timeout=90)
    finally:
        BenchRunner._signal(types.SimpleNamespace(proc=bench), signal.SIGKILL)  # whatever the verdict
    assert bench.returncode == 130, err.decode()[-2000:]
    assert [_status(d) for d in out.iterdir() if d.is_dir()] == ["interrupted"]


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_kill_9_of_bench_stops_its_experiment(tmp_path, nproc):
    """kill -9 of bench: its experiment (and, for a torchrun experiment, every worker) stops by itself."""
    import psutil

    path = _sweep(tmp_path, LONG.replace("max_steps: 100000", f"max_steps: 100000, nproc_per_node: {nproc}"))
    out = tmp_path / "out"
    bench = _start_bench(path, out)
    family = psutil.Process(bench.pid).children(recursive=True)
    assert len(family) >= (1 if nproc == 1 else 4)  # the worker; or it, torchrun and two ranks
    bench.kill()
    bench.wait()
    _, alive = psutil.wait_procs(family, timeout=60)
    for p in alive:  # leave nothing behind, whatever the verdict
        p.kill()
    assert [" ".join(p.cmdline()[-3:]) for p in alive if p.is_running()] == []
    (run,) = [d for d in out.iterdir() if d.is_dir()]
    assert plan(load_sweep(path), out)[0].action == "run"  # its claim is stale now: a rerun may take it
