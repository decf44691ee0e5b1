"""What a cell that died without a result.json is recorded as (ftprof.bench.cell), from the files it left."""

from __future__ import annotations

import json

from ftprof.bench import cell
from ftprof.config import RunConfig
from ftprof.results import run_dir as files
from ftprof.results.status import Status


def test_an_error_is_the_processs_last_line_not_sruns(tmp_path):
    # srun reports the task's exit status on the same stderr, after the task's exception when it gets there first
    (tmp_path / files.STDERR).write_text("Traceback (most recent call last):\n  File \"x\", line 1\n"
                                        "RuntimeError: the recipe fell over\n\n"
                                        "srun: error: node1: task 0: Exited with exit code 1\n"
                                        "slurmstepd: error: *** STEP 7.0 ON node1 CANCELLED ***\n")
    cell.record_no_result(tmp_path, RunConfig(), Status.ERROR, "Slurm job 7 ended FAILED")
    result = json.loads((tmp_path / files.RESULT).read_text())
    assert result["status"] == "error" and result["error_message"] == "RuntimeError: the recipe fell over"
    assert "srun: error" in result["error_tail"]  # the tail keeps everything
    assert any("Slurm job 7 ended FAILED" in n for n in result["notes"])


def test_a_killed_cells_half_written_files_are_removed(tmp_path):
    """A SIGKILL between an atomic write's temp file and its rename leaves the temp file: bench removes it when it
    records the dead cell, and keeps every finished file."""
    from ftprof.results.store import write_text_atomic

    write_text_atomic(tmp_path / files.STEPS, "step,loss\n1,2.0\n")
    left = tmp_path / f".{files.STEPS}.k3j2x9.tmp"
    left.write_text("step,loss\n1,2.0\n2,")
    cell.record_no_result(tmp_path, RunConfig(), Status.KILLED, "killed by SIGKILL")
    assert not left.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([files.STEPS, files.RESULT])
    assert json.loads((tmp_path / files.RESULT).read_text())["steps_completed"] == 1


def test_stderr_with_only_launcher_lines_says_the_reason():
    assert cell.last_error_line("srun: error: node1: task 0: Exited with exit code 1\n", "exit status 1") == \
        "exit status 1"
    assert cell.last_error_line("", "killed") == "killed"
