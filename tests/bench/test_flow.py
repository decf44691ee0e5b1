"""The one sweep flow (ftprof bench and ftprof.run_sweep): lock, plan, run, summary, exit status."""

import json

import pytest

import ftprof
from ftprof.bench.flow import run_sweep
from ftprof.bench.lock import OutputDirBusy, OutputLock
from ftprof.bench.runner import plan
from ftprof.bench.sweep import load_sweep
from ftprof.errors import ConfigError

SWEEP = "base: {model: tiny, seq_len: 32, max_steps: 3, warmup_steps: 1, device: cpu}\nmatrix: {method: [full]}\n"


def _sweep(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SWEEP)
    return path


def _previous(path, out, status):
    """A cell an earlier bench finished with ``status`` (so this one skips it)."""
    (p,) = plan(load_sweep(path), out)
    p.run_dir.mkdir(parents=True)
    (p.run_dir / "config.json").write_text(json.dumps(p.experiment.config.to_dict()))
    (p.run_dir / "result.json").write_text(json.dumps({"status": status, "run_dir": str(p.run_dir)}))


def test_a_held_output_dir_is_refused_before_anything_runs(tmp_path):
    path, out = _sweep(tmp_path), tmp_path / "out"
    with OutputLock(out):
        with pytest.raises(OutputDirBusy, match="is in use by ftprof bench pid"):
            ftprof.run_sweep(path, out)
    assert not any(p.is_dir() for p in out.iterdir())


def test_an_output_dir_that_is_a_file_is_bad_input(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        run_sweep(_sweep(tmp_path), tmp_path / "f" / "out")


@pytest.mark.parametrize("status, code", [("ok", 0), ("oom_device", 1), ("timeout", 1)])
def test_exit_status_counts_failures_kept_from_earlier_runs(tmp_path, status, code):
    path, out = _sweep(tmp_path), tmp_path / "out"
    _previous(path, out, status)
    done = run_sweep(path, out, slots=[])
    assert done.outcomes == [] and done.exit_code() == code
    assert (out / "raw_summary.csv").is_file() and not (out / ".ftprof-bench.lock").read_text()


def test_the_python_api_returns_the_outcomes_kept_from_an_earlier_run(tmp_path):
    """A finished sweep run again runs nothing; ftprof.run_sweep still returns each experiment's outcome (it
    returned [] before), with the seconds of this call (none)."""
    path, out = _sweep(tmp_path), tmp_path / "out"
    _previous(path, out, "oom_device")
    (kept,) = ftprof.run_sweep(path, out)
    assert (kept.status, kept.seconds, kept.result["status"]) == ("oom_device", 0.0, "oom_device")
