"""A corpus of bad input, generated from the config fields: every option with values of every wrong kind, every
input file kind broken, and sweep files with every field in a wrong shape. Each case is a one-line error with exit
status 2 or a clean acceptance: never a traceback, never a hang. Runs in-process (``ftprof.cli.main.main``);
an accepted ``train`` stops after preflight (the run's plan), so nothing trains."""

from __future__ import annotations

import json
import typing

import pytest

from ftprof.bench.sweep import load_sweep
from ftprof.config import flat_field_owners
from ftprof.config.run import _field_types
from ftprof.errors import ConfigError

# Options the command line spells differently or that only make sense under other commands/processes.
SKIPPED = {"method", "quiet", "profile", "gradient_checkpointing"}
BAD_INTS = ["-1", "0", "abc", "1.5", "1e99", "99999999999999999999999", ""]
BAD_FLOATS = ["nan", "inf", "-inf", "-1", "abc", "", "1e400"]
BAD_STRINGS = ["", "nope", "../..", "a" * 300, "\u00e9\u6f22", " "]


def _base(hint) -> type:
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    base = args[0]
    return tuple if typing.get_origin(base) is tuple else base


def _cli_cases() -> list[tuple[str, list[str]]]:
    cases = []
    types = _field_types()
    for key in flat_field_owners():
        if key in SKIPPED:
            continue
        flag, base = f"--{key.replace('_', '-')}", _base(types[key])
        if base is bool:
            values = ["=yes", "=2", ""]
            cases += [(f"{key}{v or '(flag)'}", [flag + v] if v else [flag]) for v in values]
            continue
        values = {int: BAD_INTS, float: BAD_FLOATS}.get(base, BAD_STRINGS)
        cases += [(f"{key}={v!r}"[:60], [flag, v]) for v in values]
        cases.append((f"{key} twice", [flag, values[0], flag, values[0]]))
        cases.append((f"{key} without a value", [flag]))
    return cases


def _file_cases(tmp_path) -> list[tuple[str, list[str]]]:
    """Every input file kind, broken."""
    files = {
        "empty.jsonl": "", "bad-line.jsonl": '{"text": "a"}\n{oops\n', "array-line.jsonl": "[1, 2]\n",
        "empty.json": "", "bad.json": "{", "scalar.json": "5", "no-text.csv": "a,b\n1,2\n", "empty.csv": "",
        "header-only.csv": "text\n", "bad.parquet": "PAR1 junk", "empty.txt": "", "blank.txt": "\n\n\n",
        "binary.txt": "\udcff", "chat-no-assistant.jsonl": json.dumps({"messages": [{"role": "user",
                                                                                   "content": "hi"}]}) + "\n",
        "chat-not-list.jsonl": json.dumps({"messages": "hello"}) + "\n",
        "instr-no-output.jsonl": json.dumps({"instruction": "x"}) + "\n",
        "config.yaml": "lr: [1, 2]\n", "config-bad.yaml": "{", "config-list.yaml": "- a\n",
        "config-unknown.yaml": "learning_rat: 1\n", "config-nested.yaml": "lora_targets: [[q_proj]]\n",
        "config-dict.yaml": "batch_size: {a: 1}\n", "config-sci.yaml": "lr: 2e-4\nmax_steps: 3\n",
    }
    cases = []
    for name, text in files.items():
        path = tmp_path / name
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        option = "--config" if name.startswith("config") else "--dataset"
        cases.append((f"{option} {name}", [option, str(path)]))
        if option == "--dataset":
            cases.append((f"--eval-dataset {name}", ["--eval-dataset", str(path)]))
    (tmp_path / "folder").mkdir()
    cases += [("--dataset folder", ["--dataset", str(tmp_path / "folder")]),
              ("--model file", ["--model", str(tmp_path / "empty.json")]),
              ("--model empty folder", ["--model", str(tmp_path / "folder")]),
              ("--output-dir a file", ["--output-dir", str(tmp_path / "empty.json")]),
              ("--save-dir a file", ["--save", "--save-dir", str(tmp_path / "empty.json")]),
              ("--prof-output-dir a file", ["--prof-output-dir", str(tmp_path / "empty.json")])]
    return cases


class _Accepted(Exception):
    pass


@pytest.fixture
def stop_before_training(monkeypatch):
    """``train`` runs its preflight (every check before the model loads), then stops: accepted."""
    import ftprof.engine.run as run

    def preflight_only(cfg, **kwargs):
        from ftprof.preflight import preflight

        preflight(cfg)
        raise _Accepted

    monkeypatch.setattr(run, "train", preflight_only)


@pytest.fixture
def one_parser(monkeypatch):
    """``main`` parses every case with one parser, built once: building it took 25 ms, two thirds of the corpus's
    time, and parsing leaves a parser as it found it (each parse starts from a new namespace)."""
    import ftprof.cli.main as cli_main

    parser = cli_main.build_parser()
    monkeypatch.setattr(cli_main, "build_parser", lambda: parser)


def _run_cli(argv: list[str], capsys) -> tuple[int, str]:
    from ftprof.cli.main import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    except _Accepted:
        code = 0
    return code, capsys.readouterr().err


def _clean(code: int, err: str) -> bool:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if code == 0:
        return "Traceback" not in err
    return code == 2 and len(lines) == 1 and "Traceback" not in err


@pytest.mark.slow  # 775 command lines, one parser: ~6 s on an idle 2-core machine
def test_cli_corpus_is_all_one_line_errors_or_acceptances(tmp_path, capsys, stop_before_training, one_parser):
    cases = _cli_cases() + _file_cases(tmp_path)
    assert len(cases) >= 300
    out = tmp_path / "out"
    dirty = []
    for name, words in cases:
        argv = ["train", "lora", "--device", "cpu", "--model", "tiny", "--max-steps", "3", "--output-dir", str(out),
                *words]
        code, err = _run_cli(argv, capsys)
        if not _clean(code, err):
            dirty.append(f"{name}: exit {code}: {err.strip()[-300:]}")
    assert not dirty, f"{len(dirty)} of {len(cases)} cases not clean:\n" + "\n".join(dirty)


SWEEP_VALUES = [{"a": 1}, [[1]], "abc", True, None, -1, 1e400, [], "2e-4", 10**30]


def _sweep_cases() -> list[tuple[str, str]]:
    cases = []
    for i, key in enumerate(k for k in flat_field_owners() if k not in {"method", "output_dir", "run_name", "quiet"}):
        value = SWEEP_VALUES[i % len(SWEEP_VALUES)]
        cases.append((f"base.{key}={value!r}"[:60], json.dumps({"base": {key: value}, "matrix": {"seed": [1]}})))
        other = SWEEP_VALUES[(i + 3) % len(SWEEP_VALUES)]
        cases.append((f"matrix.{key}=[{other!r}]"[:60], json.dumps({"matrix": {key: [other]}})))
    tops = {"name": ["", ".", "..", "a/b", 5, [1]], "repeats": [0, -1, 10**9, 1.5, "x", True],
            "timeout_s": [0, -1, "x", [1]], "memory_logging": ["x", 5], "schema_version": [0, 3, "1"],
            "launcher": [[1], {"type": "x"}, {"partition": [1]}], "exclude": [5, [5], [{"seed": [1]}]],
            "experiments": [5, [5], [[1]], [{}]], "matrix": [[1], {"seed": 1}, {"seed": []}],
            "base": [[1], 5], "description": [5], "unknown_key": [1]}
    for key, values in tops.items():
        for value in values:
            body = {"matrix": {"seed": [1]}} if key != "matrix" else {}
            cases.append((f"{key}={value!r}"[:60], json.dumps({**body, key: value})))
    too_many = ("matrix:\n  seed: [" + ", ".join(map(str, range(2000))) + "]\n"
                "  lr: [" + ", ".join(f"{i + 1}e-6" for i in range(100)) + "]\n")  # 200,000 cells
    texts = ["", "[", "- 1\n", "a: b: c\n", "matrix: {seed: [1]}\nmatrix: {seed: [2]}\n", "\t",
             "!!python/object:os.system x", "matrix: {seed: &a [1]}\nexperiments: *a\n", too_many]
    cases += [(f"text {i}", t) for i, t in enumerate(texts)]
    return cases


def test_sweep_corpus_is_all_one_line_errors_or_acceptances(tmp_path):
    cases = _sweep_cases()
    assert len(cases) >= 100
    dirty = []
    for i, (name, text) in enumerate(cases):
        path = tmp_path / f"s{i}.yaml"
        path.write_text(text)
        try:
            load_sweep(path)
        except ConfigError as exc:
            if "\n" in str(exc) or not str(exc).startswith(f"s{i}.yaml"):
                dirty.append(f"{name}: {exc}")
        except Exception as exc:  # noqa: BLE001 - the corpus records every escape
            dirty.append(f"{name}: {type(exc).__name__}: {exc}")
    assert not dirty, f"{len(dirty)} of {len(cases)} sweep files not clean:\n" + "\n".join(dirty)
