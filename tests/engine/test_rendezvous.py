"""A rendezvous that does not gather its nodes ends as one line naming the endpoint (torchrun_entry), not
torchrun's traceback. Loopback only: this node hosts the endpoint and waits for a second node that never comes."""

import pytest

from ftprof.engine import torchrun_entry
from ftprof.engine.distributed import free_port


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_a_rendezvous_that_never_gathers_is_one_line(capsys):
    endpoint = f"127.0.0.1:{free_port()}"
    code = torchrun_entry.run_torchrun(["--nproc-per-node", "1", "--nnodes", "2", "--rdzv-backend", "c10d",
                                        "--rdzv-endpoint", endpoint, "--rdzv-conf", "join_timeout=3,read_timeout=3",
                                        "-m", "ftprof.engine.worker", "unused.json"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    line = [x for x in err if x.startswith("ftprof:")]
    assert len(line) == 1 and endpoint in line[0] and "2 nodes" in line[0] and "Traceback" not in "\n".join(err)
