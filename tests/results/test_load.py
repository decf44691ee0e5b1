"""Reading run directories back: a damaged file is a skipped run whose reason names the file, never a crash."""

import json

import pytest

from ftprof.results.load import read_result, read_runs

GOOD_CONFIG = {"schema_version": 1, "model": {"model": "tiny"}, "method": {"method": "lora"}}


def _run(root, name, result, config=GOOD_CONFIG):
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if result is not None:
        (d / "result.json").write_text(result if isinstance(result, str) else json.dumps(result))
    return d


@pytest.mark.parametrize("result, config, fragment", [
    ([1, 2], GOOD_CONFIG, "result.json: must be a JSON object, got list"),
    ({"status": "fine"}, GOOD_CONFIG, "result.json: status 'fine' is not one of"),
    ({"status": "ok", "tokens_per_s": "fast"}, GOOD_CONFIG, "result.json: field 'tokens_per_s' must be"),
    ({"status": "ok", "steps_completed": None}, GOOD_CONFIG, "field 'steps_completed'"),
    ({"status": "ok", "schema_version": "1"}, GOOD_CONFIG, "result.json: schema_version must be an integer"),
    ({"tokens_per_s": 10.0}, GOOD_CONFIG, "result.json: has no 'status'"),
    ({"status": "ok", "tokens_per_s": -40000.0}, GOOD_CONFIG, "field 'tokens_per_s' is -40000.0: a measured"),
    ({"status": "ok", "step_time_p50_s": -1.0}, GOOD_CONFIG, "field 'step_time_p50_s' is -1.0"),
    ({"status": "ok"}, "[]", "config.json: must be a JSON object"),
    ({"status": "ok"}, {"model": "tiny"}, "config.json: 'model' must be a JSON object"),
    ({"status": "ok"}, '{"model": ', "config.json: not valid JSON"),
])
def test_a_damaged_run_is_skipped_with_the_file_named(tmp_path, result, config, fragment):
    _run(tmp_path, "good", {"status": "ok", "tokens_per_s": 10.0})
    bad = _run(tmp_path, "bad", result, config)
    report = read_runs([tmp_path])
    assert [r["run_name"] for r in report.rows] == ["good"]
    (problem,) = report.problems
    assert problem.startswith(f"{bad}: ") and fragment in problem


def test_read_result_is_none_when_absent_and_typed_when_present(tmp_path):
    d = _run(tmp_path, "r", None)
    assert read_result(d) is None
    (d / "result.json").write_text(json.dumps({"status": "oom_host", "steps_completed": 3, "mfu": None}))
    assert read_result(d)["steps_completed"] == 3


def test_a_run_from_before_an_option_existed_reads_as_its_default(tmp_path):
    """config.json written before --compile-mode existed: the row holds the default, so the run is a repeat of
    today's run of the same configuration (and matches it as a baseline)."""
    from ftprof.report.tables import config_key

    new = {"schema_version": 1, "model": {"model": "tiny", "compile_mode": "default"}, "method": {"method": "lora"}}
    _run(tmp_path, "old", {"status": "ok", "tokens_per_s": 10.0})
    _run(tmp_path, "new", {"status": "ok", "tokens_per_s": 11.0}, new)
    # compile_mode applies under --compile only: the effective configuration drops it otherwise, so the run that
    # differs in it is a compiled one
    _run(tmp_path, "other", {"status": "ok", "tokens_per_s": 12.0},
         {**new, "model": {"model": "tiny", "compile": True, "compile_mode": "reduce-overhead"}})
    rows = {r["run_name"]: r for r in read_runs([tmp_path]).rows}
    assert rows["old"]["compile_mode"] == "default" and rows["old"]["sdpa_backend"] == "auto"
    import pandas as pd

    keys = config_key(pd.DataFrame([rows["old"], rows["new"], rows["other"]]))
    assert keys.iloc[0] == keys.iloc[1] != keys.iloc[2]


def test_an_older_run_reads_as_what_it_ran_for_options_that_changed_the_run(tmp_path):
    """Method options resolve per method (a LoRA run from before --lora-addmm matches today's LoRA run, which
    records it off); a run from before --prefetch made its batches after each step's sync, and a QLoRA run from
    before --keep-dequantized dequantized three times under full checkpointing."""
    from ftprof.config import RunConfig

    _run(tmp_path, "old-lora", {"status": "ok"}, {"schema_version": 1, "method": {"method": "lora"}})
    _run(tmp_path, "old-qlora", {"status": "ok"}, {"schema_version": 1, "method": {"method": "qlora"}})
    rows = {r["run_name"]: r for r in read_runs([tmp_path]).rows}
    today = RunConfig.from_flat({"method": "lora"}).method.resolved("bfloat16")
    assert rows["old-lora"]["lora_addmm"] is today.lora_addmm is False
    assert rows["old-lora"]["keep_dequantized"] is None  # not a LoRA option
    assert rows["old-qlora"]["compile_dequant"] is False and rows["old-qlora"]["keep_dequantized"] is False
    assert rows["old-lora"]["prefetch"] is False and rows["old-qlora"]["prefetch"] is False


def _model_folder(path):
    """A saved model's folder as transformers writes it (config.json with model_type and architectures)."""
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                vocab_size=64, architectures=["LlamaForCausalLM"]).save_pretrained(path)
    return path


def test_saved_models_are_not_runs_and_every_run_is_found(tmp_path):
    """A run's adapter/, base/, merged/ and checkpoint-<step>/ folders, a --save-dir elsewhere and an HF Trainer's
    checkpoints hold transformers' config.json: no rows. Runs still found: finished, incomplete (config.json only),
    from before schema_version, an HF Trainer run, a damaged one (reported)."""
    from ftprof.config import RunConfig
    from ftprof.results.load import find_run_dirs, is_run_dir

    config = RunConfig.from_flat({"method": "lora", "model": "tiny"}).to_dict()
    done = _run(tmp_path / "sweep", "done", {"status": "ok", "tokens_per_s": 10.0}, config)
    for folder in ("base", "merged", "checkpoint-1/base", "checkpoint-2/base", "model"):
        _model_folder(done / folder)
    (done / "checkpoint-1" / "adapter").mkdir()
    (done / "checkpoint-1" / "adapter" / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    _run(tmp_path / "sweep", "started", None, config)  # killed before its result: incomplete
    _run(tmp_path / "sweep", "old", None, {section: config[section] for section in ("model", "method", "data")})
    _model_folder(tmp_path / "hf_out" / "checkpoint-4")  # the Trainer's own checkpoint beside ftprof's run dir
    _run(tmp_path / "hf_out", "ftprof", {"status": "ok"}, {**config, "trainer": {"name": "hf-trainer"}})
    _model_folder(tmp_path / "saved" / "base")  # --save-dir outside the run directory
    _run(tmp_path, "damaged", None, '{"model": {"mod')
    report = read_runs([tmp_path])
    assert sorted(r["run_name"] for r in report.rows) == ["done", "ftprof", "old", "started"]
    assert {r["run_name"]: r["status"] for r in report.rows}["started"] == "incomplete"
    (problem,) = report.problems
    assert "damaged" in problem and "config.json: not valid JSON" in problem
    assert find_run_dirs([done]) == [done] and find_run_dirs([done / "base"]) == []
    assert not is_run_dir(done / "merged") and not is_run_dir(tmp_path / "hf_out" / "checkpoint-4")


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_a_real_saved_run_is_one_row(tmp_path):
    """`ftprof train lora --save --save-steps 1 --save-merged`: its saved models and checkpoints are no runs."""
    import ftprof
    from tests.conftest import tiny_config

    res = ftprof.train(tiny_config(tmp_path, "lora", max_steps=2, run_name="ck", save=True, save_steps=1,
                                   save_merged=True))
    run_dir = tmp_path / "ck"
    assert res.status == "ok" and (run_dir / "checkpoint-2").is_dir() and (run_dir / "merged" / "config.json").is_file()
    report = read_runs([tmp_path])
    assert [r["run_name"] for r in report.rows] == ["ck"] and report.problems == []
    assert [r["run_name"] for r in read_runs([run_dir]).rows] == ["ck"]
