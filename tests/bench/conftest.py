import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm-single-node.sh"


def _node_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30)
    return done.returncode == 0 and any(s.strip() in ("idle", "mix", "alloc") for s in done.stdout.splitlines())


@pytest.fixture(scope="session")
def slurm_cluster():
    """A single-node Slurm for the session: one already up (CI starts it) is used as is; otherwise
    scripts/slurm-single-node.sh starts one (as root, installing with apt-get) and stops it at the end.
    Skips, saying why, where neither works."""
    if _node_up():
        yield
        return
    if os.environ.get("FTPROF_SLURM_UNAVAILABLE"):  # .ci/run tried already
        pytest.skip(f"cannot start a single-node Slurm: {os.environ['FTPROF_SLURM_UNAVAILABLE']}")
    if os.geteuid() != 0:
        pytest.skip("no Slurm is running and starting one needs root")
    try:
        done = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.skip("scripts/slurm-single-node.sh start did not finish within 600 s")
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
        pytest.skip(f"cannot start a single-node Slurm: {why[0]}")
    try:
        yield
    finally:
        subprocess.run([str(SCRIPT), "stop"], capture_output=True, timeout=60)
