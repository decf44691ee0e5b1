"""Bad input of the fifth pass (a black-box audit of the CLI): one line naming the problem, exit 2, before torch
where the check needs none. The command-line cases run in one fresh interpreter (tests/cli/test_bad_input.py's
RUNNER); the environment's allocator setting in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cli.test_bad_input import corpus_problems


def _files(t):
    (t / "header-only.csv").write_text("text\n")
    (t / "fake.parquet").write_text("PAR1 junk")
    (t / "numbers.jsonl").write_text('{"text": 5}\n{"text": 6}\n')
    (t / "not-a-trace.json").write_text("{not json")
    (t / "a-file").write_text("x")
    (t / "steps-word.yaml").write_text("max_steps: three\n")
    (t / "lora-file.yaml").write_text("method: lora\nlora_r: 8\n")
    (t / "ckpt").mkdir()  # a checkpoint copied in part: its state file, not its weights or optimizer state
    (t / "ckpt" / "ftprof_checkpoint.json").write_text(json.dumps({"step": 1, "options": {"method": "lora"}}))
    (t / "typo-model").mkdir()
    (t / "typo-model" / "config.json").write_text(json.dumps({"model_type": "lamma", "hidden_size": 64}))
    (t / "trace.json").write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 10, "pid": 1, "tid": 1}]}))


def _cases(t):
    train = ["train", "lora", "--model", "tiny", "--device", "cpu", "--max-steps", "2", "--output-dir", str(t / "o")]
    # (argv, words the line must hold, words it must not hold, torch allowed)
    return [
        ([*train, "--alloc-conf", "garbage"], ["--alloc-conf", "is not key:value"], [], False),
        ([*train, "--alloc-conf", "expandable_segment:True"], ["did you mean 'expandable_segments'"], [], False),
        ([*train, "--alloc-conf", "expandable_segments:maybe"], ["True or False"], [], False),
        ([*train, "--lora-alpha", "0"], ["--lora-alpha must be a positive number"], [], False),
        ([*train, "--lora-alpha", "-1"], ["--lora-alpha must be a positive number"], [], False),
        (["profile", "lora", "--device", "cpu", "--prof-activities", ""], ["--prof-activities", "names nothing"],
         [], False),
        ([*train[:-4], "--max-steps", "1", "--warmup-steps", "50"], ["learning rate 0", "train nothing"], [],
         False),
        ([*train, "--checkpointing", "full", "--checkpoint-layers", "99"], ["'tiny' has 2 decoder layers"], [],
         False),
        ([*train, "--sdpa-backend", "flash"], ["--sdpa-backend flash needs a CUDA device"], [], False),
        (["train", "full", "--model", "llama-70b", "--device", "cpu", "--output-dir", str(t / "o")],
         ["host memory", "weights"], [], False),
        ([*train[:2], "--model", str(t / "typo-model"), *train[4:]], ["model_type 'lamma' is not an architecture",
                                                                      "did you mean 'llama'"], ["defaults"], False),
        (["train", "lora", "--config", str(t / "steps-word.yaml")], ["--config steps-word.yaml:", "max_steps"], [],
         False),
        (["train", "full", "--config", str(t / "lora-file.yaml")], ["--config lora-file.yaml:", "--lora-r"], [],
         False),
        ([*train, "--save-merged", "--save-dir", str(t / "a-file")], ["--save-dir", "a-file"], [], False),
        ([*train, "--resume-from-checkpoint", str(t / "ckpt")], ["has no trainer_state.pt or adapter"], [], False),
        ([*train, "--eval-batches", "3"], ["--eval-batches: nothing is evaluated"], [], False),
        ([*train, "--prompt-template", "{x}"], ["--prompt-template applies to --data-format instruction"], [], False),
        ([*train, "--data-format", "chat"], ["--data-format chat reads rows of a data file"], [], False),
        ([*train, "--train-on", "prompt"], ["--train-on prompt applies to the instruction and chat formats"], [],
         False),
        ([*train, "--dataset", "synthetc"], ["did you mean 'synthetic'"], ["cannot reach"], False),
        ([*train, "--dataset", str(t / "header-only.csv")], ["--dataset", "a header line but no rows"],
         ["--dataset-split"], False),
        ([*train, "--dataset", str(t / "fake.parquet")], ["--dataset", "not a Parquet file"], ["--dataset-split"],
         False),
        (["--versoin"], ["--versoin", "did you mean '--version'"], ["required"], False),
        ([*train, "--dry-run"], ["unrecognized arguments: --dry-run"], ["did you mean"], False),
        (["profile", "lora", "--summarize", str(t / "trace.json"), "--max-steps", "3"],
         ["--max-steps is an option of a run", "--summarize reads traces"], [], False),
        (["profile", "--summarize", str(t / "trace.json"), "--baseline", str(t / "trace.json")],
         ["--baseline names the trace --summarize reads"], [], False),
        ([*train, "--dataset", str(t / "numbers.jsonl")], ["--text-field", "int64", "not text"], [], False),
        # (torch imported: last, as the cases run in one interpreter)
        (["profile", "--summarize", str(t / "trace.json"), "--baseline", str(t / "not-a-trace.json")],
         ["--baseline", "cannot read"], [], True),
    ]


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_round5_corpus(tmp_path):
    _files(tmp_path)
    cases = _cases(tmp_path)
    problems = corpus_problems(cases, tmp_path)
    assert problems == [], "\n".join(problems)
    # the baseline was read before the new side's summary printed: the refusal is all that was said
    assert not (tmp_path / "summaries").exists() or not any((tmp_path / "summaries").iterdir())


def test_an_unparsable_allocator_setting_in_the_environment_is_one_line_not_an_abort(tmp_path):
    # torch aborts at import on it (a C++ stack, exit 134): refused before torch is imported
    env = {**os.environ, "PYTORCH_ALLOC_CONF": "garbage"}
    done = subprocess.run([sys.executable, "-m", "ftprof", "train", "lora", "--device", "cpu", "--output-dir",
                           str(tmp_path / "o")], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert "PYTORCH_ALLOC_CONF='garbage' in the environment" in done.stderr
    assert not (tmp_path / "o").exists()


def test_a_hub_id_that_cannot_be_had_is_refused_before_torch(tmp_path):
    # HF_HUB_OFFLINE=1 and an empty cache: nothing to load, said before torch and transformers are imported
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hub")}
    code = ("import sys; from ftprof.cli.main import main; code = main(sys.argv[1:]); "
            "print('torch' in sys.modules); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code, "train", "lora", "--model", "some-org/not-cached", "--device",
                           "cpu", "--output-dir", str(tmp_path / "o")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 2 and done.stdout.strip() == "False", (done.stdout, done.stderr)
    assert "hub id 'some-org/not-cached' is not in the local cache (HF_HUB_OFFLINE is set)" in done.stderr
    assert done.stderr.count("\n") == 1


def test_a_checkpoint_without_a_tokenizer_is_refused_by_plan_before_its_probe(tmp_path):
    # its every command would fail at `ftprof train` (the dataset needs the checkpoint's tokenizer)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 256}))
    (tmp_path / "text.jsonl").write_text('{"text": "hello"}\n')
    done = subprocess.run([sys.executable, "-m", "ftprof", "plan", "lora", "--device", "cpu", "--model",
                           str(tmp_path / "ckpt"), "--dataset", str(tmp_path / "text.jsonl"), "--output-dir",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "has no tokenizer files" in done.stderr, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and not (tmp_path / "o").exists()


def test_a_save_interval_beyond_the_run_is_said():
    from ftprof.checks import length_notes
    from ftprof.config import RunConfig

    notes = length_notes(RunConfig.from_flat({"method": "lora", "max_steps": 2, "save_steps": 5}))
    assert any("--save-steps 5 is beyond --max-steps 2" in n for n in notes), notes
    assert not length_notes(RunConfig.from_flat({"method": "lora", "max_steps": 8, "save_steps": 5}))
