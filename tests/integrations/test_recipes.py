"""The peer recipes' shared parts (ftprof/integrations/recipes/common.py) in-process: how a recipe's process ends
(bad input one line and exit 2, a crash or a CUDA out-of-memory recorded as a failed result), what the Trainer is
told, the data it is fed; and Unsloth where it is (not) installed. The recipes training end to end inside a sweep:
tests/bench/test_peers_run.py."""

from __future__ import annotations

import importlib.util
import json
import signal
import sys

import pytest
import torch

from ftprof.config import RunConfig
from ftprof.errors import ConfigError
from ftprof.integrations.recipes import common


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM"):  # run() only sets defaults
        monkeypatch.setenv(key, "1" if key != "TOKENIZERS_PARALLELISM" else "false")


def _cell_files(tmp_path, trainer: str = "hf", **flat):
    cfg = RunConfig.from_flat({"model": "tiny", "method": "lora", "seq_len": 32, "batch_size": 2, "max_steps": 3,
                               "device": "cpu", **flat})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    data = cfg.to_dict() | {"trainer": {"name": common.TRAINER_NAMES[trainer], "recipe": trainer,
                                        "python": sys.executable}}
    (tmp_path / "peer_config.json").write_text(json.dumps(data))
    return ["--config", str(tmp_path / "peer_config.json"), "--run-dir", str(run_dir)], run_dir


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    code = common.run("hf", ["--config", str(tmp_path / "missing.json"), "--run-dir", str(tmp_path / "run")],
                      lambda cell: None)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and err[0].startswith("ftprof: error: cannot load the cell's configuration")

    argv, run_dir = _cell_files(tmp_path)

    def refuse(cell):
        raise ConfigError("trainer: hf: something the cell cannot do")

    assert common.run("hf", argv, refuse) == 2
    assert capsys.readouterr().err.strip() == "ftprof: error: trainer: hf: something the cell cannot do"
    assert not (run_dir / "result.json").exists()


def test_a_crash_is_recorded_as_an_error_with_its_traceback(tmp_path, capsys):
    argv, run_dir = _cell_files(tmp_path)
    before = signal.getsignal(signal.SIGTERM)

    def crash(cell):
        assert cell.config.method.method == "lora" and cell.trainer["recipe"] == "hf"
        raise RuntimeError("shapes do not match\nmore detail")

    assert common.run("hf", argv, crash) == 1
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers are put back
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "error" and result["error_type"] == "RuntimeError"
    assert result["error_message"] == "shapes do not match"
    assert "Traceback" in result["error_tail"] and "in crash" in result["error_tail"]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["trainer"]["recipe"] == "hf" and config["method"]["method"] == "lora"
    assert "RuntimeError: shapes do not match" in capsys.readouterr().err


def test_a_cuda_out_of_memory_is_oom_device_exit_3(tmp_path):
    argv, run_dir = _cell_files(tmp_path, "trl")

    def oom(cell):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    assert common.run("trl", argv, oom) == 3
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "oom_device" and result["error_message"].startswith("CUDA out of memory")


def test_the_trainer_is_told_the_cells_settings(tmp_path):
    cfg = RunConfig.from_flat({"model": "tiny", "method": "lora", "seq_len": 32, "batch_size": 3, "grad_accum": 2,
                               "max_steps": 20, "lr": 1e-3, "warmup_ratio": 0.1, "lr_scheduler_type": "cosine",
                               "max_grad_norm": 1.0, "weight_decay": 0.01, "checkpointing": "full", "seed": 7,
                               "device": "cpu"})
    device, dtype, name = common.device_and_dtype(cfg)
    assert (device.type, dtype, name) == ("cpu", torch.float32, "float32")
    s = common.Setup(device, dtype, name, "unused", None, 512, True)
    kw = common.training_kwargs(cfg, s, str(tmp_path))
    assert {k: kw[k] for k in ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
                               "learning_rate", "lr_scheduler_type", "warmup_steps", "max_grad_norm", "weight_decay",
                               "optim", "seed", "bf16", "gradient_checkpointing", "save_strategy", "report_to",
                               "use_cpu", "use_liger_kernel")} == {
        "max_steps": 20, "per_device_train_batch_size": 3, "gradient_accumulation_steps": 2, "learning_rate": 1e-3,
        "lr_scheduler_type": "cosine", "warmup_steps": 2, "max_grad_norm": 1.0, "weight_decay": 0.01,
        "optim": "adamw_torch", "seed": 7, "bf16": False, "gradient_checkpointing": True, "save_strategy": "no",
        "report_to": [], "use_cpu": True, "use_liger_kernel": False}
    from transformers import TrainingArguments

    TrainingArguments(**kw)  # every keyword is one the Trainer takes
    cuda = common.Setup(torch.device("cuda"), torch.bfloat16, "bfloat16", "unused", None, 512, True)
    assert common.optimizer_name(cfg, cuda) == "adamw_torch_fused"  # ftprof's adamw: torch's fused AdamW on CUDA
    lora = common.lora_config(cfg, s)
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (16, 32.0, 0.0)
    assert sorted(lora.target_modules) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                  "down_proj"])


def test_the_recipes_are_fed_ftprofs_synthetic_stream():
    from ftprof.data.synthetic import synthetic_batches

    cfg = RunConfig.from_flat({"model": "tiny", "method": "lora", "seq_len": 16, "batch_size": 2, "max_steps": 3,
                               "grad_accum": 2})
    s = common.Setup(torch.device("cpu"), torch.float32, "float32", "unused", None, 512, True)
    rows = common.fixed_rows(cfg, s)
    assert len(rows) == common.steps_rows(cfg) == 12
    first = next(synthetic_batches(cfg.data, 512, cfg.train.seed))
    assert torch.equal(rows[0]["input_ids"], first["input_ids"][0]) and torch.equal(rows[1]["labels"],
                                                                                    first["labels"][1])
    data = common.document_rows(cfg, s)
    assert list(data) == ["input_ids"] and len(data["input_ids"]) == 12 and len(data["input_ids"][0]) == 16
    assert common.RowsDataset(rows, "synthetic").info.dataset_name == "synthetic"


def test_unsloth_refuses_in_one_line_where_it_does_not_import(tmp_path, capsys):
    if importlib.util.find_spec("unsloth") is not None:
        pytest.skip("unsloth is installed here: see test_unsloth_recipe_trains")
    from ftprof.integrations.recipes import unsloth as recipe

    argv, run_dir = _cell_files(tmp_path, "unsloth")
    assert recipe.main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("ftprof: error: trainer: unsloth: Unsloth does not import in ")
    assert not (run_dir / "result.json").exists()


def test_unsloth_recipe_trains(tmp_path):
    pytest.importorskip("unsloth", reason="unsloth is not installed (it pins its own transformers: run its cells "
                                          "in an environment of their own, benchmarks/peers.yaml)")
    if not torch.cuda.is_available():
        pytest.skip("Unsloth trains on a GPU only")
    from ftprof.integrations.recipes import unsloth as recipe

    argv, run_dir = _cell_files(tmp_path, "unsloth", device="cuda", checkpointing="full")
    assert recipe.main(argv) == 0
    config = json.loads((run_dir / "config.json").read_text())
    assert config["trainer"]["name"] == "unsloth" and config["trainer"]["versions"]["unsloth"]
    assert json.loads((run_dir / "result.json").read_text())["status"] == "ok"
