"""`ftprof bench --dry-run` runs every check `ftprof train` runs before it loads a model, and says the same line."""

import importlib.util

import pytest

from ftprof.cli.main import main
from tests import data_files


def _no_chat_assistant(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
            {"messages": [{"role": "user", "content": "no answer"}]}]
    return {"dataset": data_files.write_jsonl(tmp_path / "chat.jsonl", rows)}


def _corrupt_parquet(tmp_path):
    path = tmp_path / "rows.parquet"
    path.write_bytes(b"PAR1 this is not a parquet file at all")
    return {"dataset": str(path)}


def _csv_without_text(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("title,body\na,b\nc,d\n")
    return {"dataset": str(path), "data_format": "text"}


def _tracker_missing(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    return {"report_to": "wandb"}


CASES = {
    "chat row without an assistant turn": (_no_chat_assistant, "chat row 1 of"),
    "corrupt parquet": (_corrupt_parquet, "is not a Parquet file"),
    "csv without the text column": (_csv_without_text, "has no column 'text'"),
    "tracker package missing": (_tracker_missing, "--report-to wandb needs the 'wandb' package"),
    "cuda profiling on cpu": (lambda tmp_path: {"prof_activities": "cuda", "profile": True},
                              "--prof-activities cuda: the run is on --device cpu"),
}


def _option_words(values: dict) -> list[str]:
    words = []
    for key, value in values.items():
        if key == "profile":
            continue  # any --prof-* option turns profiling on
        words += [f"--{key.replace('_', '-')}", str(value)]
    return words


@pytest.mark.parametrize("case", list(CASES))
def test_dry_run_says_what_train_says(tmp_path, monkeypatch, capsys, case):
    make, fragment = CASES[case]
    values = make(tmp_path, monkeypatch) if case == "tracker package missing" else make(tmp_path)
    train_out = tmp_path / "train-out"
    code = main(["train", "lora", "--device", "cpu", "--output-dir", str(train_out), *_option_words(values)])
    train_err = capsys.readouterr().err.strip()
    assert code == 2 and fragment in train_err and len(train_err.splitlines()) == 1, train_err
    said = train_err.removeprefix("ftprof train: error: ")

    base = ", ".join(f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {str(v).lower()}" for k, v in values.items())
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"base: {{model: tiny, device: cpu, max_steps: 3, {base}}}\nexperiments: [{{method: lora}}]\n")
    code = main(["bench", str(sweep), "--dry-run", "--output-dir", str(tmp_path / "out")])
    bench_err = capsys.readouterr().err.strip()
    assert code == 2 and len(bench_err.splitlines()) == 1, bench_err
    assert bench_err.startswith("ftprof bench: error: s.yaml: experiments[0]: ") and bench_err.endswith(said), \
        (bench_err, said)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
