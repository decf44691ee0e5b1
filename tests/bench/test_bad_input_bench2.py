"""More of what `ftprof bench` refuses in one line, exit 2, before torch: an output directory holding another sweep's
results, a ``python:`` that is no Python interpreter, the options bench sets itself. And what it must keep taking:
the same sweep, edited or renamed, run again into its own directory."""

import json
import re

import pytest

from ftprof.bench.flow import run_sweep
from ftprof.bench.runner import plan, write_sweep_record
from ftprof.bench.sweep import load_sweep
from ftprof.errors import ConfigError
from tests.bench.pythons import logging_python
from tests.bench.test_bad_input_bench import FAST, _run

HOLDS_REAL = ("holds the results of sweep 'real' (from real.yaml), and this is sweep 'other' (other.yaml): use "
              "another --output-dir")


def _fake_python(tmp_path, name, body):
    fake = tmp_path / name / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    return fake


def _real_sweep_dir(tmp_path, cells="[full]"):
    """sweep 'real' (real.yaml) run into sw_out/real: its sweep.json, its summary and one finished run."""
    (tmp_path / "real.yaml").write_text(FAST + f"matrix: {{method: {cells}}}\n")
    sweep = load_sweep(tmp_path / "real.yaml")
    out = tmp_path / "sw_out" / "real"
    out.mkdir(parents=True)
    planned = plan(sweep, out)
    for p in planned:
        p.run_dir.mkdir()
        (p.run_dir / "result.json").write_text(json.dumps({"status": "ok", "run_dir": str(p.run_dir)}))
    write_sweep_record(sweep, out, planned)
    (out / "raw_summary.csv").write_text("experiment,status\nreal-cell,ok\n")
    return out


def _one_line_before_torch(cases, results):
    problems = []
    for (argv, words), res in zip(cases, results, strict=True):
        lines = res["stderr"].strip().splitlines()
        if res["code"] != 2 or len(lines) != 1 or res["torch"] or not all(w in res["stderr"] for w in words):
            problems.append(f"{' '.join(argv[1:])}: exit {res['code']}, torch {res['torch']}, {res['stderr']!r}")
    return problems


def test_bench_bad_input_is_one_line_before_torch_too(tmp_path):
    out = _real_sweep_dir(tmp_path)
    before = {name: (out / name).read_bytes() for name in ("sweep.json", "raw_summary.csv")}
    (tmp_path / "other.yaml").write_text(FAST + "matrix: {method: [lora]}\n")
    shell = _fake_python(tmp_path, "shenv", "echo hi")
    (tmp_path / "py.yaml").write_text(FAST + f"experiments: [{{method: full, python: {shell}}}]\n")
    (tmp_path / "quiet.yaml").write_text(FAST + "matrix: {method: [full], quiet: [true]}\n")
    (tmp_path / "run_name.yaml").write_text(FAST + "experiments: [{method: full, run_name: mine}]\n")
    (tmp_path / "repeats.yaml").write_text(FAST + "matrix: {method: [full]}\nrepeats: two\n")
    (tmp_path / "base_quiet.yaml").write_text("base: {model: tiny, quiet: true}\nmatrix: {method: [full]}\n")
    other, fresh = str(tmp_path / "other.yaml"), ["--output-dir", str(tmp_path / "fresh")]
    not_python = (f"experiments[0].python: '{shell}': is not a Python interpreter: asked to run a line of Python, "
                  "it exited 0 printing 'hi'")
    quietly = ("bench always runs experiments quietly (their output goes to each one's stdout.log and stderr.log); "
               "leave it out")
    cases = [(["bench", other, "--output-dir", str(out), *mode], [f"{out} {HOLDS_REAL}"])
             for mode in ([], ["--dry-run"], ["--status"], ["--force"], ["--retry-failed"], ["--resume"])]
    cases += [(["bench", str(tmp_path / "py.yaml"), *fresh, *mode], [f"py.yaml: {not_python}"])
              for mode in ([], ["--dry-run"])]
    cases += [
        (["bench", str(tmp_path / "quiet.yaml"), *fresh], [f"quiet.yaml: matrix.quiet: {quietly}"]),
        (["bench", str(tmp_path / "base_quiet.yaml"), *fresh], [f"base_quiet.yaml: base.quiet: {quietly}"]),
        (["bench", str(tmp_path / "run_name.yaml"), *fresh],
         ["experiments[0].run_name: is set by bench for each experiment (its directory name, from the options that "
          "vary); leave it out"]),
        (["bench", str(tmp_path / "repeats.yaml"), *fresh], ["repeats.yaml: repeats: must be a whole number, got str"]),
    ]
    results = _run([argv for argv, _ in cases], tmp_path)
    assert _one_line_before_torch(cases, results) == []
    assert {name: (out / name).read_bytes() for name in before} == before  # the other sweep's record is as it was
    assert not (tmp_path / "fresh").exists()
    assert all("--output-dir" not in res["stderr"] for res in results[-4:-1])  # no advice that does not apply


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_the_same_sweep_edited_or_renamed_runs_on_in_its_directory(tmp_path):
    """A sweep is its name: real.yaml with a cell more, or a copy with name: real, is sweep 'real' still, in every
    mode; the run (its cells finished already: all skipped) records the edited sweep."""
    out = _real_sweep_dir(tmp_path, cells="[full, lora]")
    (tmp_path / "real.yaml").write_text(FAST + "matrix: {method: [full, lora]}\nexclude: [{method: lora}]\n")
    (tmp_path / "renamed.yaml").write_text("name: real\n" + FAST + "matrix: {method: [full, lora]}\n")
    real, renamed, at = str(tmp_path / "real.yaml"), str(tmp_path / "renamed.yaml"), ["--output-dir", str(out)]
    argvs = [["bench", sweep, *at, *mode] for sweep in (real, renamed)
             for mode in (["--dry-run"], ["--dry-run", "--force"], ["--dry-run", "--retry-failed"], ["--status"])]
    argvs += [["bench", real, *at, "--resume"], ["bench", renamed, *at, "--retry-failed"]]
    results = _run(argvs, tmp_path)
    assert [(r["code"], r["stderr"]) for r in results] == [(0, "")] * len(argvs), results
    record = json.loads((out / "sweep.json").read_text())
    assert record["name"] == "real" and record["sweep_file"] == renamed and len(record["experiments"]) == 2


def test_a_sweep_that_dies_before_its_summary_still_holds_its_directory(tmp_path):
    """sweep.json is written once the plan is known, before any experiment starts: bench dying before its summary
    leaves the directory marked as sweep 'real', and sweep 'other' is refused there (through the API as well)."""
    (tmp_path / "real.yaml").write_text(FAST + "matrix: {method: [full]}\n")
    (tmp_path / "other.yaml").write_text(FAST + "matrix: {method: [lora]}\n")
    out = tmp_path / "sw_out" / "real"

    def die(planned):
        raise RuntimeError("bench died")

    with pytest.raises(RuntimeError):
        run_sweep(tmp_path / "real.yaml", out, on_plan=die, slots=[])
    assert json.loads((out / "sweep.json").read_text())["name"] == "real"
    for locked in (False, True):
        with pytest.raises(ConfigError, match=re.escape(HOLDS_REAL)):
            run_sweep(tmp_path / "other.yaml", out, slots=[], locked=locked)
    assert json.loads((out / "sweep.json").read_text())["name"] == "real"


@pytest.mark.parametrize("body, said", [
    ("echo hi", "printing 'hi'"),
    ("exit 0", "printing nothing"),
    ('echo "ftprof-probe $3"', "printing 'ftprof-probe "),  # echoes the token back: it did not run the probe
])
def test_a_python_that_exits_0_without_running_the_probe_is_refused(tmp_path, body, said):
    fake = _fake_python(tmp_path, "env", body)
    (tmp_path / "s.yaml").write_text(FAST + f"matrix: {{method: [full], python: ['{fake}']}}\n")
    with pytest.raises(ConfigError) as info:
        load_sweep(tmp_path / "s.yaml")
    message = str(info.value)
    assert message.startswith(f"s.yaml: matrix[method=full, python={fake}].python: '{fake}': is not a Python "
                              "interpreter") and said in message and "\n" not in message, message


def test_a_python_that_runs_the_probe_is_taken(tmp_path):
    fake, log = logging_python(tmp_path)
    (tmp_path / "s.yaml").write_text(FAST + f"matrix: {{method: [full], python: ['{fake}']}}\n")
    (exp,) = load_sweep(tmp_path / "s.yaml").experiments
    assert exp.python == str(fake) and log.read_text().startswith("-c ")


def test_sbatch_is_given_once_per_option_and_other_options_once():
    """--sbatch is repeatable (one sbatch option each), as its help says; any other option given twice is refused."""
    from ftprof.cli.main import build_parser

    args = build_parser().parse_args(["bench", "s.yaml", "--sbatch=--exclusive", "--sbatch=--comment=x"])
    assert args.sbatch == ["--exclusive", "--comment=x"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "s.yaml", "--partition", "a", "--partition", "b"])


def test_an_empty_output_dir_is_refused_and_a_status_of_nothing_creates_nothing(tmp_path):
    """--output-dir '' is refused as train refuses it (it fell back to results/<name> silently); --status of a
    directory no sweep ran into shows the cells as not submitted without creating it, or its lock."""
    (tmp_path / "ok.yaml").write_text(FAST + "matrix: {method: [full]}\n")
    missing = tmp_path / "never"
    results = _run([["bench", "ok.yaml", "--output-dir", ""], ["bench", "ok.yaml", "--status", "--output-dir",
                                                                 str(missing)]], tmp_path)
    assert [r["code"] for r in results] == [2, 0], results
    assert "--output-dir: empty path" in results[0]["stderr"]
    assert not missing.exists()
