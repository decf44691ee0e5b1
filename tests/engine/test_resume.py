"""--save-steps and --resume-from-checkpoint: a run resumed from a checkpoint has the loss curve of a run that never
stopped (issue 40), on the tiny preset, CPU, fp32."""

import json

import pytest

from ftprof.config import RunConfig
from ftprof.errors import ConfigError

SHAPE = {"model": "tiny", "device": "cpu", "dtype": "float32", "seq_len": 32, "batch_size": 2, "quiet": True,
         "measure_warmup_steps": 1}


def _run(tmp_path, name, **options):
    from ftprof.engine.run import train

    cfg = RunConfig.from_flat({**SHAPE, "output_dir": str(tmp_path), "run_name": name, **options})
    result = train(cfg)
    assert result.status == "ok", result.failure
    return result, tmp_path / name


def _losses(run_dir):
    import csv

    with open(run_dir / "steps.csv") as fh:
        return {int(row["step"]): float(row["loss"]) for row in csv.DictReader(fh)}


@pytest.mark.slow
@pytest.mark.parametrize("method, extra", [
    ("lora", {"lora_dropout": 0.1}),  # dropout draws from the RNG: the restored state must continue it
    ("full", {"grad_accum": 2, "max_grad_norm": 1.0, "warmup_steps": 2}),
])
def test_a_resumed_run_has_the_same_losses(tmp_path, method, extra):
    whole, whole_dir = _run(tmp_path, "whole", method=method, max_steps=8, **extra)
    _, saved_dir = _run(tmp_path, "saved", method=method, max_steps=8, save_steps=4, **extra)
    assert sorted(p.name for p in saved_dir.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-8"]
    if method == "lora":  # a checkpoint's adapter names the checkpoint's base, not the folder it was written in
        adapter = json.loads((saved_dir / "checkpoint-4" / "adapter" / "adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == str((saved_dir / "checkpoint-4" / "base").resolve())
    resumed, resumed_dir = _run(tmp_path, "resumed", method=method, max_steps=8,
                                resume_from_checkpoint=str(saved_dir / "checkpoint-4"), **extra)
    a, b = _losses(whole_dir), _losses(resumed_dir)
    assert sorted(b) == [5, 6, 7, 8]  # steps.csv continues the step numbers
    for step in b:
        assert abs(a[step] - b[step]) <= 1e-6, (step, a[step], b[step])
    assert _losses(saved_dir) == pytest.approx(a, abs=1e-6)  # writing checkpoints changes nothing
    assert any("resumed from" in n and "checkpoint-4" in n and "step 4" in n for n in resumed.notes)
    result = json.loads((resumed_dir / "result.json").read_text())
    assert any("resumed from" in n for n in result["notes"])
    config = json.loads((resumed_dir / "config.json").read_text())
    assert config["save"]["resume_from_checkpoint"] == str((saved_dir / "checkpoint-4").resolve())


@pytest.mark.slow
def test_a_four_step_run_resumed_for_four_more_is_an_eight_step_run(tmp_path):
    """The literal reading: a run of 4 steps, saved, resumed for 4 more (constant learning rate: a schedule's
    length is --max-steps, as in the Trainer)."""
    options = {"method": "lora", "lr_scheduler_type": "constant"}
    _, whole_dir = _run(tmp_path, "eight", max_steps=8, **options)
    _, four_dir = _run(tmp_path, "four", max_steps=4, save_steps=4, **options)
    _, more_dir = _run(tmp_path, "more", max_steps=8, resume_from_checkpoint="latest", **options)
    a, b = _losses(whole_dir), {**_losses(four_dir), **_losses(more_dir)}
    assert sorted(b) == list(range(1, 9))
    assert max(abs(a[s] - b[s]) for s in a) <= 1e-6


def test_save_total_limit_keeps_the_newest(tmp_path, recwarn):
    _, run_dir = _run(tmp_path, "r", method="lora", max_steps=5, save_steps=1, save_total_limit=2)
    assert not [w for w in recwarn if "config file" in str(w.message)]  # PEFT's embedding check, once a checkpoint
    assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-5"]
    assert not list(run_dir.glob(".checkpoint-*"))  # no partial left behind
    state = json.loads((run_dir / "checkpoint-5" / "ftprof_checkpoint.json").read_text())
    assert (state["step"], state["batches_taken"], state["saved"]) == (5, 5, "adapter")
    for name in ("adapter/adapter_model.safetensors", "base/config.json", "trainer_state.pt"):
        assert (run_dir / "checkpoint-5" / name).is_file(), name


def _cfg(tmp_path, **options):
    return RunConfig.from_flat({**SHAPE, "output_dir": str(tmp_path), "method": "lora", **options})


def _checkpoint(tmp_path, step=4, **options):
    path = tmp_path / "old" / f"checkpoint-{step}"
    path.mkdir(parents=True)
    flat = {k: list(v) if isinstance(v, tuple) else v for k, v in _cfg(tmp_path, **options).to_flat().items()}
    (path / "ftprof_checkpoint.json").write_text(json.dumps({"step": step, "batches_taken": step, "options": flat}))
    (path / "trainer_state.pt").write_bytes(b"")  # (resolve_resume checks they are there, not what they hold)
    (path / "adapter").mkdir()
    return path


@pytest.mark.parametrize("options, fragment", [
    ({"resume_from_checkpoint": "latest"}, "no <run dir>/checkpoint-<step>/ under"),
    ({"resume_from_checkpoint": "nowhere"}, "no such directory"),
    ({"save_total_limit": 2}, "--save-total-limit needs --save-steps"),
    ({"save_steps": 0}, "--save-steps must be at least 1"),
    ({"save_steps": 2, "nproc_per_node": 2}, "one process only"),
])
def test_bad_checkpoint_options_are_one_line(tmp_path, options, fragment):
    from ftprof.engine.run import resolve_resume

    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        resolve_resume(_cfg(tmp_path, **options))


def test_resume_refusals_before_torch(tmp_path):
    from ftprof.engine.run import resolve_resume

    ckpt = _checkpoint(tmp_path, step=4, max_steps=8)
    (tmp_path / "junk").mkdir()
    with pytest.raises(ConfigError, match="not an ftprof checkpoint"):
        resolve_resume(_cfg(tmp_path, resume_from_checkpoint=str(tmp_path / "junk")))
    with pytest.raises(ConfigError, match="--max-steps 4 leaves no step to run"):
        resolve_resume(_cfg(tmp_path, resume_from_checkpoint=str(ckpt), max_steps=4))
    with pytest.raises(ConfigError, match="written with --batch-size 2, this run has 4"):
        resolve_resume(_cfg(tmp_path, resume_from_checkpoint=str(ckpt), max_steps=8, batch_size=4))
    with pytest.raises(ConfigError, match="written with method lora, this run has full"):
        resolve_resume(_cfg(tmp_path, resume_from_checkpoint=str(ckpt), max_steps=8, method="full"))
    with pytest.raises(ConfigError, match="writes a run directory of its own"):
        resolve_resume(_cfg(tmp_path, resume_from_checkpoint=str(ckpt), max_steps=8, run_name="old"))
    cfg = resolve_resume(_cfg(tmp_path, resume_from_checkpoint="latest", max_steps=8))
    assert cfg.save.resume_from_checkpoint == str(ckpt.resolve())


def test_resume_refusal_through_the_cli_is_one_line(tmp_path, capsys):
    from ftprof.cli.main import main

    code = main(["train", "lora", "--output_dir", str(tmp_path), "--resume_from_checkpoint", "latest"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "--resume-from-checkpoint latest" in err


def _lrs(run_dir):
    import csv

    with open(run_dir / "steps.csv") as fh:
        return {int(row["step"]): float(row["lr"]) for row in csv.DictReader(fh)}


@pytest.mark.slow
def test_a_resumed_run_follows_its_own_schedule_and_lr(tmp_path):
    """Extending a run (4 steps saved, resumed to 8) runs steps 5-8 at the 8-step schedule's learning rates, and a
    new --lr is the one used: the checkpoint's states carried its own run's (step 5 ran at the 4-step schedule's
    0.0, and a new --lr was never used)."""
    options = {"method": "lora", "lr_scheduler_type": "linear", "warmup_steps": 1}
    _, eight_dir = _run(tmp_path, "eight", max_steps=8, **options)
    _, four_dir = _run(tmp_path, "four", max_steps=4, save_steps=4, **options)
    _, more_dir = _run(tmp_path, "more", max_steps=8, resume_from_checkpoint=str(four_dir / "checkpoint-4"),
                       **options)
    whole, more = _lrs(eight_dir), _lrs(more_dir)
    assert sorted(more) == [5, 6, 7, 8] and all(more[s] == pytest.approx(whole[s]) for s in more)
    assert more[5] > 0
    _, faster_dir = _run(tmp_path, "faster", max_steps=8, lr=1e-3,
                         resume_from_checkpoint=str(four_dir / "checkpoint-4"), **options)
    peak = RunConfig.from_flat({**SHAPE, **options}).train.lr
    assert all(lr == pytest.approx(whole[s] * 1e-3 / peak) for s, lr in _lrs(faster_dir).items())
    notes = json.loads((faster_dir / "result.json").read_text())["notes"]  # the change is said, not silent
    assert any(f"changed since the checkpoint: --lr 0.001 (the checkpoint's run: {peak})" in n and
               "--max-steps 8 (the checkpoint's run: 4)" in n for n in notes), notes


@pytest.mark.slow
def test_an_epoch_run_resumes_past_the_default_step_count(tmp_path):
    """--num-train-epochs sets the steps once the data is read: a checkpoint at step 11 of a 12-step epoch was
    refused against --max-steps' default of 10; one at the last step is refused against the epochs' steps."""
    rows = tmp_path / "d.jsonl"
    rows.write_text("".join(json.dumps({"text": f"row {i} " + "word " * (5 + i % 7)}) + "\n" for i in range(24)))
    options = {"method": "lora", "dataset": str(rows), "num_train_epochs": 1}
    _, saved_dir = _run(tmp_path, "saved", save_steps=11, **options)
    assert sorted(_losses(saved_dir)) == list(range(1, 13))
    _, resumed_dir = _run(tmp_path, "resumed", resume_from_checkpoint=str(saved_dir / "checkpoint-11"), **options)
    assert sorted(_losses(resumed_dir)) == [12]
    _, last_dir = _run(tmp_path, "last", save_steps=12, **options)
    with pytest.raises(ConfigError, match="--num-train-epochs 1 is 12 steps, none left to run"):
        _run(tmp_path, "again", resume_from_checkpoint=str(last_dir / "checkpoint-12"), **options)


@pytest.mark.slow
def test_a_resume_refuses_data_whose_tokens_changed(tmp_path):
    """The same file rewritten with other rows is refused before the model is built (the batches the checkpoint
    took are drawn again and dropped: other rows would take their places unseen); a file touched, not changed,
    resumes."""
    import os

    rows = tmp_path / "d.jsonl"
    text = "".join(json.dumps({"text": f"row {i} " + "word " * (5 + i % 7)}) + "\n" for i in range(24))
    rows.write_text(text)
    options = {"method": "lora", "dataset": str(rows), "max_steps": 4}
    _, saved_dir = _run(tmp_path, "saved", save_steps=2, **options)
    state = json.loads((saved_dir / "checkpoint-2" / "ftprof_checkpoint.json").read_text())
    assert len(state["data_hash"]) == 32
    os.utime(rows)  # touched: the rows' datasets fingerprint changes, their tokens do not
    _, resumed_dir = _run(tmp_path, "resumed", resume_from_checkpoint=str(saved_dir / "checkpoint-2"), **options)
    assert sorted(_losses(resumed_dir)) == [3, 4]
    rows.write_text(text.replace("row 3 ", "row three "))
    with pytest.raises(ConfigError, match="this run's data differs from the checkpoint's"):
        _run(tmp_path, "changed", resume_from_checkpoint=str(saved_dir / "checkpoint-2"), **options)
    assert not (tmp_path / "changed" / "steps.csv").exists()


def test_a_resume_compares_the_dataset_file_and_the_lora_scale(tmp_path, monkeypatch):
    """A local dataset is compared as the file it names (the same name from another directory is another file;
    the same file by another name is the same), and --lora-alpha is the checkpoint's (it changes what the adapter
    computes: another alpha resumed silently, at another loss)."""
    from ftprof.engine.run import resolve_resume

    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a b c"}\n')
    ckpt = _checkpoint(tmp_path, step=4, max_steps=8, dataset=str(data))
    state = json.loads((ckpt / "ftprof_checkpoint.json").read_text())
    state["dataset_path"] = str(data.resolve())
    (ckpt / "ftprof_checkpoint.json").write_text(json.dumps(state))
    monkeypatch.chdir(tmp_path)
    resolve_resume(_cfg(tmp_path, resume_from_checkpoint=str(ckpt), max_steps=8, dataset="d.jsonl"))  # same file
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "d.jsonl").write_text('{"text": "x y z"}\n')
    monkeypatch.chdir(other)
    with pytest.raises(ConfigError, match="written with --dataset"):
        resolve_resume(_cfg(tmp_path, resume_from_checkpoint=str(ckpt), max_steps=8, dataset="d.jsonl"))
    with pytest.raises(ConfigError, match="written with --lora-alpha"):
        resolve_resume(_cfg(tmp_path, resume_from_checkpoint=str(ckpt), max_steps=8, dataset=str(data),
                            lora_alpha=64))
