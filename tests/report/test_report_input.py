"""`ftprof report`'s paths and its regression gate: a file where a directory belongs is named as such, --threshold
without --baseline is refused, and a gate that compares nothing fails instead of passing."""

import json
import shutil

import pytest

from ftprof.cli.main import main
from tests.report.synthetic_runs import make_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two CPU run directories, a copy of them, and a baseline of the same two at another seq_len (nothing
    matches)."""
    root = tmp_path_factory.mktemp("runs")
    make_runs(root / "cur", 2, device="cpu")
    shutil.copytree(root / "cur", root / "copy")
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
    # the runs compared with themselves: refused before any work, however the folder is spelled
    (["report", "{root}/cur", "--baseline", "{root}/cur"],
     "--baseline: '{root}/cur' is also a path to report (the same folder): runs compared with themselves check"),
    (["report", "{root}/cur", "--baseline", "{root}/other/../cur/"], "is also a path to report (the same folder)"),
    (["report", "{root}/copy", "{root}/cur", "--baseline", "{root}/cur/run00001"],
     "--baseline: '{root}/cur/run00001' lies inside '{root}/cur', so some runs would be compared with themselves"),
    (["report", "{root}/cur/run00000", "--baseline", "{root}/cur"], "'{root}/cur/run00000' lies inside '{root}/cur'"),
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
    # a copy of the same runs as the baseline: compared, and the gate passes
    assert main(["report", str(runs / "cur"), "--baseline", str(runs / "copy"), "--threshold", "5", "--format", "md",
                 "--output-dir", str(tmp_path / "r2")]) == 0
    assert "no regression beyond 5% (2 configurations compared)" in capsys.readouterr().out


def _copy(runs, tmp_path, name, change):
    """A copy of the two runs, each changed by ``change(run_dir)``."""
    out = tmp_path / name
    shutil.copytree(runs / "cur", out)
    for run_dir in sorted(out.iterdir()):
        change(run_dir)
    return out


def _failed(run_dir):
    result = json.loads((run_dir / "result.json").read_text())
    result.update(status="error", tokens_per_s=None)
    (run_dir / "result.json").write_text(json.dumps(result))


def test_a_gate_over_failed_runs_only_fails_and_says_why(runs, tmp_path, capsys, monkeypatch):
    """Every run failed on both sides: nothing was compared, so the gate fails (not "no regression")."""
    monkeypatch.setenv("COLUMNS", "300")
    base, cur = _copy(runs, tmp_path, "base", _failed), _copy(runs, tmp_path, "cur", _failed)
    code = main(["report", str(cur), "--baseline", str(base), "--format", "md", "--output-dir", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert code == 1 and "no regression" not in out
    assert "nothing compared: 2 configurations matched, none with the data to compare: no successful run on either " \
           "side (baseline error, current error)" in out
    assert out.count("not compared ") == 2
    md = (tmp_path / "r" / "summary.md").read_text().split("## Comparison with the baseline")[1]
    assert md.count("| not compared |") == 2 and "| ok |" not in md and "**Nothing was compared**" in md


def test_a_gate_on_damaged_steps_fails_and_names_steps_csv(runs, tmp_path, capsys, monkeypatch):
    """One run a side whose steps.csv is empty or cut short: no interval, so inconclusive (not ok), steps.csv named;
    with nothing else compared the gate fails. Beside a configuration that was compared, it passes and says how
    many lacked the data."""
    monkeypatch.setenv("COLUMNS", "300")
    empty = _copy(runs, tmp_path, "empty", lambda d: (d / "steps.csv").write_text(""))
    cut = _copy(runs, tmp_path, "cut", lambda d: (d / "steps.csv").write_text((d / "steps.csv").read_text()[:40]))
    code = main(["report", str(cut), "--baseline", str(empty), "--format", "md", "--output-dir", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert code == 1 and "no regression" not in out and "nothing compared: 2 configurations matched" in out
    assert "baseline run00000: steps.csv empty; current run00000: steps.csv cut short, no timed steady steps" in out
    md = (tmp_path / "r" / "summary.md").read_text().split("## Comparison with the baseline")[1]
    assert md.count("| inconclusive |") == 2 and "| ok |" not in md
    one_empty = _copy(runs, tmp_path, "one", lambda d: d.name == "run00001" and (d / "steps.csv").write_text(""))
    assert main(["report", str(runs / "cur"), "--baseline", str(one_empty), "--format", "md",
                 "--output-dir", str(tmp_path / "r2")]) == 0
    out = capsys.readouterr().out
    assert "inconclusive " in out and "baseline run00001: steps.csv empty" in out
    assert "no regression beyond 5% (1 configuration compared; 1 without the data to compare)" in out
