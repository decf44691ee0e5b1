"""The report's note on CPU runs says what its columns mean there, in words a reader can use (issue 41 part 8)."""

from ftprof.report.tables import CPU_NOTE


def test_cpu_note_says_what_the_gpus_column_counts():
    assert "GPUs are processes" not in CPU_NOTE
    assert "the GPUs column counts the run's processes" in CPU_NOTE
