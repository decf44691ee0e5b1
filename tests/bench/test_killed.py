"""A child killed by a signal bench did not send: `killed` with the signal named, `oom_host` only with evidence that
the kernel's OOM killer took it (its OOM-kill count rose while the child ran); a rerun runs `killed` cells again."""

import json
import signal
import sys

import pytest

from ftprof.bench import cell as cell_mod
from ftprof.bench import runner as runner_mod
from ftprof.bench.runner import BenchRunner, killed_by, plan
from ftprof.bench.sweep import load_sweep
from ftprof.host_memory import VMSTAT, oom_kill_counts
from ftprof.results.status import Status

FAST = "base: {model: tiny, seq_len: 32, batch_size: 2, max_steps: 3, warmup_steps: 1, device: cpu}\n"
CGROUP = "/sys/fs/cgroup/memory/x/memory.oom_control"


@pytest.mark.parametrize("signum, before, after, status, words", [
    (signal.SIGKILL, {VMSTAT: 0}, {VMSTAT: 0}, "killed", "nor by the kernel's OOM killer"),
    (signal.SIGKILL, {}, {}, "killed", "unreadable"),
    (signal.SIGKILL, {VMSTAT: 0, CGROUP: 0}, {VMSTAT: 1, CGROUP: 1}, "oom_host", "out of host memory"),
    (signal.SIGKILL, {VMSTAT: 0}, {VMSTAT: 1}, "oom_host", "out of host memory"),
    (signal.SIGKILL, {VMSTAT: 0, CGROUP: 0}, {VMSTAT: 1, CGROUP: 0}, "killed", "possibly out of host memory"),
    (signal.SIGTERM, {VMSTAT: 0}, {VMSTAT: 5}, "killed", "killed by SIGTERM"),
    (signal.SIGSEGV, {}, {}, "killed", "killed by SIGSEGV"),
])
def test_killed_by(signum, before, after, status, words):
    got, reason = killed_by(signum, before, after)
    assert got.value == status and words in reason
    assert ("out of host memory" in reason) == (after != before and signum == signal.SIGKILL)
    assert got is Status.OOM_HOST or reason.startswith(f"killed by {signal.Signals(signum).name}")


def test_oom_kill_counts_reads_what_it_can():
    counts = oom_kill_counts()
    assert all(isinstance(v, int) and v >= 0 for v in counts.values())


def _run_killed(tmp_path, monkeypatch, counts):
    path = tmp_path / "sweep.yaml"
    path.write_text(FAST + "experiments: [{method: full}]\n")
    out = tmp_path / "out"
    sweep = load_sweep(path)
    # the child kills itself with SIGKILL at once (no torch: the test stays fast)
    monkeypatch.setattr(cell_mod, "child_command", lambda run_dir: [
        sys.executable, "-c", "import os, signal; print('loading', flush=True); os.kill(os.getpid(), signal.SIGKILL)"])
    seq = iter(counts)
    monkeypatch.setattr(runner_mod, "oom_kill_counts", lambda: next(seq))
    (outcome,) = BenchRunner(sweep, out, plan(sweep, out), slots=[]).run()
    return sweep, out, outcome, json.loads((out / outcome.name / "result.json").read_text())


def test_sigkill_without_oom_evidence_is_killed_and_rerun(tmp_path, monkeypatch):
    sweep, out, outcome, result = _run_killed(tmp_path, monkeypatch, [{VMSTAT: 3}, {VMSTAT: 3}])
    assert outcome.status == result["status"] == "killed"
    assert "killed by SIGKILL" in result["error_message"] and "host memory" not in result["error_message"]
    assert Status.KILLED.failed and Status.KILLED.resumed  # the sweep exits 1; a rerun runs it again
    assert [p.action for p in plan(sweep, out)] == ["run"]


def test_sigkill_with_the_oom_killer_counted_is_oom_host(tmp_path, monkeypatch):
    sweep, out, outcome, result = _run_killed(tmp_path, monkeypatch, [{VMSTAT: 3}, {VMSTAT: 4}])
    assert outcome.status == result["status"] == "oom_host" and "out of host memory" in result["error_message"]
    assert [p.action for p in plan(sweep, out)] == ["skip"]  # kept, like every failure, unless --retry-failed
    assert [p.action for p in plan(sweep, out, retry_failed=True)] == ["run"]


def test_bench_says_a_rerun_runs_killed_cells_again(tmp_path, monkeypatch, capsys):
    from ftprof.cli.main import main

    path = tmp_path / "sweep.yaml"
    path.write_text(FAST + "experiments: [{method: full}]\n")
    monkeypatch.setattr(cell_mod, "child_command", lambda run_dir: [
        sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    monkeypatch.setattr(runner_mod, "oom_kill_counts", lambda: {VMSTAT: 0})
    assert main(["bench", str(path), "--output-dir", str(tmp_path / "out")]) == 1
    text = capsys.readouterr().out
    assert "killed by SIGKILL" in text and "a rerun runs them again" in text and "out of host memory" not in text
    assert main(["report", str(tmp_path / "out")]) == 0
    assert "killed" in capsys.readouterr().out
