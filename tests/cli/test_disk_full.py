"""A full disk (here: a file size limit, which fails writes the same way, EFBIG instead of ENOSPC) is one line and
exit status 1, with every file written before it kept: no traceback from teardown."""

import json
import resource
import signal
import subprocess
import sys

import pytest


def _limited(limit):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def _config_json_bytes(argv: list[str]) -> int:
    """The size config.json will have: the resolved config, as the run writes it."""
    from ftprof.cli.common import config_from_args
    from ftprof.cli.main import build_parser
    from ftprof.preflight import preflight

    cfg = preflight(config_from_args(build_parser().parse_args(argv))).config
    return len(json.dumps(cfg.to_dict(), indent=2, default=str).encode()) + 1


@pytest.mark.slow
def test_full_disk_is_one_line_and_keeps_what_was_written(tmp_path):
    argv = ["train", "full", "--model", "tiny", "--device", "cpu", "--max-steps", "3", "--measure-warmup-steps", "1",
            "--seq-len", "32", "--output-dir", str(tmp_path), "--run-name", "r", "--quiet"]
    # config.json (and the small steps.csv) fit under the limit; result.json, larger, does not
    limit = _config_json_bytes(argv) + 64
    proc = subprocess.run([sys.executable, "-m", "ftprof", *argv], preexec_fn=_limited(limit), capture_output=True,
                          text=True, timeout=180)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[0].startswith("ftprof train: error: cannot write ") and "File too large" in lines[0]
    assert (tmp_path / "r" / "config.json").is_file() and (tmp_path / "r" / "steps.csv").is_file()
