import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm-single-node.sh"


# sinfo's short states of a node that cannot take a job; any other (idle, mix, alloc, comp while another pytest
# worker's job ends, with a suffix such as mix- or idle*) is a node that is up
DOWN_STATES = ("down", "drain", "drng", "fail", "failg", "unk", "boot", "futr", "inval", "maint", "npc", "pow_dn",
               "powered_down", "resv")


def _node_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:  # a loaded machine: slurmctld is there (it answers slowly)
        return _slurmctld_running()
    states = [s.strip().rstrip("*~#!%$@^-+") for s in done.stdout.splitlines() if s.strip()]
    return done.returncode == 0 and any(s not in DOWN_STATES for s in states)


def _slurmctld_running() -> bool:
    return subprocess.run(["pgrep", "-x", "slurmctld"], capture_output=True).returncode == 0


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
    ours = not _slurmctld_running()  # one already running (CI's, another worker's) is never stopped here
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
        if ours:
            subprocess.run([str(SCRIPT), "stop"], capture_output=True, timeout=60)
