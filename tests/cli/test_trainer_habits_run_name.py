"""A reused --run-name never overwrites a finished run silently (issue 40)."""

import json
import sys

import pytest

from ftprof.cli.main import main


def _finished(tmp_path, name="r"):
    run = tmp_path / name
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "result.json").write_text(json.dumps({"status": "ok"}))
    (run / "checkpoint-2").mkdir()
    return run


def test_a_finished_run_is_refused_in_one_line_before_torch(tmp_path, capsys, monkeypatch):
    run = _finished(tmp_path)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    import builtins

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise AssertionError("torch imported before the refusal")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    code = main(["train", "lora", "--output-dir", str(tmp_path), "--run-name", "r"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert str(run) in err and "--overwrite-output-dir" in err and "another --run-name" in err
    assert (run / "result.json").is_file() and (run / "checkpoint-2").is_dir()


def test_an_unfinished_run_dir_is_reused(tmp_path):
    from ftprof.cli.common import config_from_args
    from ftprof.cli.main import build_parser
    from ftprof.results.run_dir import finished_run

    run = tmp_path / "r"
    run.mkdir()
    (run / "config.json").write_text("{}")  # bench wrote its config; the cell never finished
    cfg = config_from_args(build_parser().parse_args(["train", "lora", "--output-dir", str(tmp_path),
                                                      "--run-name", "r"]))
    assert finished_run(cfg.output.output_dir, cfg.output.run_name) is None
    assert finished_run(cfg.output.output_dir, None) is None


def test_overwrite_output_dir_replaces_the_finished_run(tmp_path):
    from ftprof.cli.common import config_from_args
    from ftprof.cli.main import build_parser
    from ftprof.results.run_dir import replace_named_run

    run = _finished(tmp_path)
    cfg = config_from_args(build_parser().parse_args(["train", "lora", "--output_dir", str(tmp_path),
                                                      "--run_name", "r", "--overwrite_output_dir", "true"]))
    replace_named_run(cfg.output.output_dir, cfg.output.run_name, cfg.output.overwrite_output_dir)
    assert run.is_dir() and list(run.iterdir()) == []


def test_overwrite_output_dir_empties_an_unfinished_run_too(tmp_path):
    # a killed run's checkpoint would pass for the new run's (--resume-from-checkpoint latest takes the newest)
    from ftprof.errors import ConfigError
    from ftprof.results.run_dir import replace_named_run

    run = tmp_path / "r"
    (run / "checkpoint-9").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    # unfinished with a checkpoint, no --overwrite-output-dir: refused (--save-total-limit pruned the new run's
    # checkpoints and kept the killed run's checkpoint-15)
    with pytest.raises(ConfigError, match="holds checkpoint-9 of a run that did not finish; continue it with "
                                          "--resume-from-checkpoint"):
        replace_named_run(tmp_path, "r", overwrite=False)
    assert (run / "checkpoint-9").is_dir()
    (run / "checkpoint-10").mkdir()
    with pytest.raises(ConfigError, match="holds checkpoint-10 of"):  # the newest by step, not by name
        replace_named_run(tmp_path, "r", overwrite=False)
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "config.json").write_text("{}")
    replace_named_run(tmp_path, "s", overwrite=False)  # unfinished without checkpoints: reused as it is
    replace_named_run(tmp_path, "r", overwrite=True)
    assert run.is_dir() and list(run.iterdir()) == []


def test_the_python_api_refuses_a_finished_run_as_the_cli_does(tmp_path):
    import ftprof
    from ftprof.errors import ConfigError

    _finished(tmp_path)
    with pytest.raises(ConfigError, match="holds a finished run; give --overwrite-output-dir"):
        ftprof.train({"method": "lora", "device": "cpu", "output_dir": str(tmp_path), "run_name": "r"})
    assert (tmp_path / "r" / "result.json").is_file()  # untouched


@pytest.mark.slow
def test_a_second_tiny_run_under_the_same_name(tmp_path, capsys):
    argv = ["train", "lora", "--max-steps", "2", "--output-dir", str(tmp_path), "--run-name", "r", "--quiet"]
    assert main(argv) == 0
    assert main(argv) == 2
    assert main(argv + ["--overwrite-output-dir"]) == 0
