"""--save: the adapter (with a preset's base) or the full model, reloaded with PEFT / transformers, gives the
in-memory model's logits."""

import json

import pytest
import torch

from ftprof.engine.trainer import Trainer
from ftprof.preflight import preflight
from tests.conftest import tiny_config


def _train_and_keep(tmp_path, method, **flat):
    """Train with --save through the Trainer, keeping the in-memory model to compare with."""
    cfg = tiny_config(tmp_path, method, max_steps=3, lr=1e-2, save=True, run_name="s", seq_len=16, batch_size=2,
                      **flat)
    trainer = Trainer(preflight(cfg), log=lambda _: None)
    result = trainer.run()
    assert result.status == "ok", result.failure.error_tail
    return trainer, result


def _logits(model, ids):
    from ftprof.engine.evaluate import evaluating

    with evaluating(model), torch.no_grad():
        return model(input_ids=ids).logits.float()


IDS = torch.tensor([[1, 5, 9, 13, 21, 34, 55, 89]])


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_adapter_reloads_on_the_saved_base(tmp_path, method):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer, result = _train_and_keep(tmp_path, method)
    run = tmp_path / "s"
    assert result.saved.saved == "adapter" and result.saved.save_time_s > 0
    assert (run / "adapter" / "adapter_model.safetensors").is_file() and (run / "base" / "config.json").is_file()
    config = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((run / "base").resolve())
    expected = _logits(trainer.built.model, IDS)
    # qlora: the saved base holds the 4-bit weights dequantized, the weights every forward computed with (loading
    # it with a BitsAndBytesConfig quantizes them again, to the same NF4 codes, on a GPU)
    base = AutoModelForCausalLM.from_pretrained(run / "base")
    reloaded = PeftModel.from_pretrained(base, run / "adapter")
    tol = 1e-4
    assert torch.allclose(_logits(reloaded, IDS), expected, atol=tol, rtol=tol)
    # the adapter really changed the model: without it the logits differ
    with reloaded.disable_adapter():
        assert not torch.allclose(_logits(reloaded, IDS), expected, atol=1e-4)


def test_full_model_reloads_with_transformers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer, result = _train_and_keep(tmp_path, "full")
    run = tmp_path / "s"
    assert result.saved.saved == "model" and result.saved.save_dir == str(run / "model")
    reloaded = AutoModelForCausalLM.from_pretrained(run / "model")
    assert torch.allclose(_logits(reloaded, IDS), _logits(trainer.built.model, IDS), atol=1e-5)
    assert AutoTokenizer.from_pretrained(run / "model") is not None
    saved = json.loads((run / "result.json").read_text()) if (run / "result.json").exists() else None
    assert saved is None or saved["save_time_s"] > 0


def test_save_dir_moves_the_files(tmp_path):
    _, result = _train_and_keep(tmp_path, "lora", save_dir=str(tmp_path / "keep"))
    assert result.saved.save_dir == str(tmp_path / "keep" / "adapter")
    assert (tmp_path / "keep" / "adapter" / "adapter_config.json").is_file()
    assert not list((tmp_path / "keep").glob(".*tmp*"))  # written beside, renamed into place
