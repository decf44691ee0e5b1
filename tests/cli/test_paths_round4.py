"""Every path a command will write is checked before the work starts (one line naming the path, exit 2, no torch);
a partial save a killed run left is removed and named; notes on a run's length (issue 41, parts 6 and 7)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cli.test_bad_input import run_in_one_interpreter

TRAIN = ["train", "lora", "--model", "tiny", "--device", "cpu", "--max-steps", "1"]


def _run(cases, cwd, env=None):
    results = run_in_one_interpreter([argv for argv, _ in cases], cwd, timeout=120, env=env)
    problems = []
    for (argv, want), res in zip(cases, results, strict=True):
        lines = res["stderr"].strip().splitlines()
        if res["code"] != 2 or len(lines) != 1 or any(w not in res["stderr"] for w in want) or res["torch"]:
            problems.append(f"{' '.join(argv)}: exit {res['code']}, torch {res['torch']}, stderr {res['stderr']!r}")
    assert problems == [], "\n".join(problems)


def test_paths_refused_before_the_work(tmp_path):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "sv.yaml").write_text("base: {model: tiny, device: cpu, max_steps: 1, save: true, save_dir: a_file}\n"
                                      "matrix: {method: [lora]}\n")
    out = ["--output-dir", str(tmp_path / "o")]
    _run([
        ([*TRAIN, *out, "--save", "--save-dir", "a_file"], ["--save-dir", "a_file", "is a file"]),
        ([*TRAIN, *out, "--save", "--save-dir", "/proc/ftprof-save"], ["--save-dir", "/proc/ftprof-save"]),
        (["bench", "sv.yaml", "--dry-run"], ["--save-dir", "a_file", "is a file"]),
        (["plan", "lora", "--gpus", "2"], ["--gpus 2", "no NVIDIA GPU", "--gpu NAME"]),
        (["plan", "lora", "--plan-dir", ""], ["--plan-dir", "empty path"]),
        (["plan", "lora", "--plan-dir", "a_file"], ["--plan-dir", "a_file", "is a file"]),
    ], tmp_path)


@pytest.mark.parametrize("env, want", [
    ({"FTPROF_CACHE_DIR": "a_file"}, ["FTPROF_CACHE_DIR", "a_file", "is a file"]),
    ({"FTPROF_CACHE_DIR": "~no-such-user-ftprof/x"}, ["FTPROF_CACHE_DIR", "no such user"]),
    ({"HOME": "/proc/ftprof-home", "FTPROF_CACHE_DIR": ""}, ["/proc/ftprof-home", "set FTPROF_CACHE_DIR"]),
    ({"FTPROF_CALIBRATION": "~no-such-user-ftprof/c.jsonl"}, ["FTPROF_CALIBRATION", "no such user"]),
])
def test_cache_dir_refused_by_train_and_plan(tmp_path, env, want):
    (tmp_path / "a_file").write_text("x")
    if os.environ.get("HF_HOME") is None and "HOME" in env:
        env = {**env, "HF_HOME": str(tmp_path / "hf")}  # the hub's cache stays where it was
    _run([([*TRAIN, "--output-dir", str(tmp_path / "o")], want), (["plan", "lora"], want)], tmp_path, env)


def test_partial_save_is_removed_and_named(tmp_path, capsys):
    from ftprof.checks import check_save_dir
    from ftprof.config import RunConfig

    save = tmp_path / "save"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (save / f".adapter.tmp-{dead.pid}").mkdir(parents=True)  # a run killed while saving
    (save / f".merged.tmp-{dead.pid}").mkdir()  # ... or while --save-merged wrote
    (save / f".adapter.tmp-{os.getppid()}").mkdir()  # a live process still writing: left alone
    (save / ".other.tmp-1").mkdir()  # not ours
    cfg = RunConfig.from_flat({"method": "lora", "save": True, "save_dir": str(save)})
    check_save_dir(cfg, clean=False)
    assert (save / f".adapter.tmp-{dead.pid}").exists()  # bench --dry-run only checks
    check_save_dir(cfg)
    assert sorted(p.name for p in save.iterdir()) == sorted([f".adapter.tmp-{os.getppid()}", ".other.tmp-1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("partial save" in line for line in err)
    assert f".adapter.tmp-{dead.pid}" in "".join(err) and f".merged.tmp-{dead.pid}" in "".join(err)


def test_publish_leaves_nothing_when_the_write_fails(tmp_path):
    from ftprof.engine.save import _publish

    def fail(where):
        where.mkdir()
        (where / "half.safetensors").write_text("x")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        _publish(tmp_path / "adapter", fail)
    assert list(tmp_path.iterdir()) == []


def test_publish_replaces_by_renames_and_a_kill_between_them_keeps_the_old_folder(tmp_path):
    """The replaced folder is moved aside, not removed before the new one is in place: a kill between the two
    renames leaves it beside (.adapter.old-<pid>), kept by the next run's cleanup while adapter/ is missing."""
    from ftprof.engine.save import _publish
    from ftprof.results.store import remove_partial_dirs

    def write(text):
        return lambda where: (where.mkdir(), (where / "w.txt").write_text(text))

    _publish(tmp_path / "adapter", write("old"))
    _publish(tmp_path / "adapter", write("new"))
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"] and (tmp_path / "adapter" / "w.txt").read_text() == "new"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".adapter.old-{dead.pid}").mkdir()  # adapter/ in place: a leftover, removed
    (tmp_path / f".base.old-{dead.pid}").mkdir()  # base/ missing: the only copy, kept
    removed = remove_partial_dirs(tmp_path, ("adapter", "base"))
    assert [p.name for p in removed] == [f".adapter.old-{dead.pid}"] and (tmp_path / f".base.old-{dead.pid}").is_dir()


@pytest.mark.parametrize("flat, want", [
    ({"warmup_steps": 100, "max_steps": 10}, "--warmup-steps 100 is longer than the run"),
    ({"num_train_epochs": 1e9, "dataset": "x.jsonl"}, "--num-train-epochs 1e+09"),
])
def test_length_notes(flat, want):
    from ftprof.checks import length_notes
    from ftprof.config import RunConfig

    notes = length_notes(RunConfig.from_flat({"method": "lora", **flat}))
    assert len(notes) == 1 and want in notes[0]
    assert length_notes(RunConfig.from_flat({"method": "lora", "warmup_steps": 5, "max_steps": 10})) == []


def test_a_name_longer_than_the_file_system_allows_is_one_line(tmp_path):
    """exists() and is_dir() raise for a path component over 255 bytes (where a missing path returns False): every
    command that reads a path names it in one line, exit 2, before torch."""
    long = str(tmp_path / ("a" * 300))
    want = ["longer than the file system allows"]
    _run([
        (["train", "lora", "--model", long], want),
        ([*TRAIN, "--dataset", long + ".jsonl"], want),
        ([*TRAIN, "--config", long + ".yaml"], want),
        (["plan", "lora", "--model", long], want),
        (["report", long], want),
        (["bench", long + ".yaml"], want),
        (["profile", "--summarize", long], want),
    ], tmp_path)


def test_a_save_dir_holding_another_save_is_refused(tmp_path):
    """--save-dir names a shared place: a model/ or adapter/ another run saved there is not replaced unless asked."""
    (tmp_path / "shared" / "model").mkdir(parents=True)
    (tmp_path / "shared" / "adapter").mkdir()
    out = ["--output-dir", str(tmp_path / "o")]
    _run([
        ([*TRAIN[:1], "full", *TRAIN[2:], *out, "--save", "--save-dir", "shared"], ["--save-dir 'shared' already holds "
                                                                                   "model/ from another save"]),
        ([*TRAIN, *out, "--save", "--save-dir", "shared"], ["already holds adapter/", "--overwrite-output-dir"]),
    ], tmp_path)


def test_summarize_finds_the_trace_of_a_run_s_one_profiling_cycle(tmp_path):
    """`ftprof profile --summarize RUN/profile`: the traces sit in its cycle folder; one cycle is taken, several are
    named (it said the folder held no trace)."""
    from ftprof.cli.profile import _inputs
    from ftprof.errors import ConfigError
    from ftprof.profiling.layout import TRACE_SUFFIX

    trace = tmp_path / "profile" / "cycle1" / f"rank0{TRACE_SUFFIX}"
    trace.parent.mkdir(parents=True)
    trace.write_bytes(b"")
    assert _inputs(str(tmp_path / "profile"), "--summarize") == [trace]
    (tmp_path / "profile" / "cycle2").mkdir()
    (tmp_path / "profile" / "cycle2" / f"rank0{TRACE_SUFFIX}").write_bytes(b"")
    with pytest.raises(ConfigError, match="its cycles are in cycle1/, cycle2/: give one"):
        _inputs(str(tmp_path / "profile"), "--summarize")
