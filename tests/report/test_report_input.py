"""`ftprof report`'s paths and its regression gate: a file where a directory belongs is named as such, --threshold
without --baseline is refused, and a gate that compares nothing fails instead of passing."""

import json

import pytest

from ftprof.cli.main import main
from tests.report.synthetic_runs import make_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two CPU run directories, and a baseline of the same two at another seq_len (nothing matches)."""
    root = tmp_path_factory.mktemp("runs")
    make_runs(root / "cur", 2, device="cpu")
    make_runs(root / "other", 2, device="cpu")
    for config in (root / "other").glob("*/config.json"):
        data = json.loads(config.read_text())
        data["data"]["seq_len"] = 999
        config.write_text(json.dumps(data))
    (root / "notes.txt").write_text("x")
    return root


@pytest.mark.parametrize("argv, fragment", [
    (["report", "{root}/notes.txt"], "'{root}/notes.txt' is a file, not a directory (a run directory or a folder"),
    (["report", "{root}/cur/run00000/result.json"], "is a file, not a directory (a run directory or a folder of "
                                                    "them); its run directory is '{root}/cur/run00000'"),
    (["report", "{root}/cur", "--baseline", "{root}/notes.txt"], "--baseline: '{root}/notes.txt' is a file"),
    (["report", "{root}/cur", "--threshold", "5"], "--threshold applies to the comparison with --baseline"),
])
def test_report_refuses_in_one_line(runs, tmp_path, capsys, argv, fragment):
    argv = [a.format(root=runs) for a in argv]
    assert main(argv + ["--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment.format(root=runs) in err and "\n" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_run_directory_and_a_folder_of_them_are_reported(runs, tmp_path, capsys):
    assert main(["report", str(runs / "cur" / "run00000"), "--format", "csv", "--output-dir", str(tmp_path / "a")]) == 0
    assert main(["report", str(runs / "cur"), "--format", "csv", "--output-dir", str(tmp_path / "b")]) == 0
    assert len((tmp_path / "a" / "raw_summary.csv").read_text().splitlines()) == 2  # header and the one run
    assert len((tmp_path / "b" / "raw_summary.csv").read_text().splitlines()) == 3


def test_a_gate_that_compares_nothing_fails_and_says_what_differs(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # one line on the terminal
    code = main(["report", str(runs / "cur"), "--baseline", str(runs / "other"), "--format", "md",
                 "--output-dir", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert code == 1  # the gate's failure status, as for a regression
    assert "nothing compared: no configuration matches one of the baseline (seq_len 256 here, 999 in the " \
           "baseline)" in out and "no regression" not in out
    assert "**No configuration matched the baseline**" in (tmp_path / "r" / "summary.md").read_text()
    # the same runs as their own baseline: compared, and the gate passes
    assert main(["report", str(runs / "cur"), "--baseline", str(runs / "cur"), "--threshold", "5", "--format", "md",
                 "--output-dir", str(tmp_path / "r2")]) == 0
    assert "no regression beyond 5% (2 configurations compared)" in capsys.readouterr().out
