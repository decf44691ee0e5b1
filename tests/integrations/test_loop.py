"""``ftprof.integrations.measure`` on a plain PyTorch loop, and the method recognised from a model."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from tests.integrations.tiny import VOCAB, tiny_llama


def _loop(model, opt, m, steps: int, accum: int = 1, rows: int = 4, seq: int = 32) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        for _ in range(accum):
            ids = torch.randint(3, VOCAB, (rows, seq), generator=g)
            labels = ids.clone()
            labels[:, :4] = -100  # a prompt without labels
            (model(input_ids=ids, labels=labels).loss / accum).backward()
        opt.step()
        opt.zero_grad()
        m.step()


def test_measure_writes_a_run_directory(tmp_path):
    import ftprof
    from ftprof.integrations import measure

    model = tiny_llama(lora=True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with measure(model, tmp_path / "run", optimizer=opt, max_steps=5) as m:
        _loop(model, opt, m, 5, accum=2)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "ok" and result["training_proof"]["passed"] is True
    assert result["training_proof"]["grad_norm_steps"] == [1, 5]
    steps = list(csv.DictReader((tmp_path / "run" / "steps.csv").open()))
    assert len(steps) == 5
    assert all(int(s["tokens"]) == 2 * 4 * 32 and int(s["real_tokens"]) == 2 * 4 * (32 - 4) for s in steps)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["method"]["method"] == "lora" and config["data"]["seq_len"] == 32
    assert (config["data"]["batch_size"], config["train"]["grad_accum"]) == (4, 2)
    assert config["train"]["lr"] == 1e-3
    assert {"weights_trainable", "gradients", "optimizer_state"} <= set(result["memory_breakdown"])
    assert len(ftprof.load_results(tmp_path / "run")) == 1


def test_a_failed_block_is_recorded_and_reraised(tmp_path):
    from ftprof.integrations import measure

    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(RuntimeError, match="boom"):
        with measure(model, tmp_path / "run", optimizer=opt) as m:
            _loop(model, opt, m, 2)
            raise RuntimeError("boom")
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "error" and result["error_message"] == "boom"
    assert result["steps_completed"] == 2


def test_frozen_everything_is_not_trained(tmp_path):
    """The proof decides the status: a loop whose optimizer moves nothing did not train."""
    from ftprof.integrations import measure

    model = tiny_llama()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with measure(model, tmp_path / "run", optimizer=opt, max_steps=2) as m:
        _loop(model, opt, m, 2)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "not_trained"
    assert result["training_proof"]["reason"] == "no trainable parameter changed"


def test_methods_are_recognised_from_the_quantization_config():
    from ftprof.integrations.describe import method_options

    assert method_options(tiny_llama(), "float32").flat["method"] == "full"
    model = tiny_llama(lora=True)
    assert method_options(model, "float32").flat["method"] == "lora"
    config = model.get_base_model().config
    config.quantization_config = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                  "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16",
                                  "bnb_4bit_quant_storage": "uint8"}
    qlora = method_options(model, "bfloat16").flat
    assert (qlora["method"], qlora["quant_type"], qlora["double_quant"], qlora["compute_dtype"]) == \
        ("qlora", "nf4", True, "bfloat16")
    config.quantization_config = {"quant_method": "gptq", "bits": 4, "group_size": 64}
    gptq = method_options(model, "float16").flat
    assert (gptq["method"], gptq["gptq_bits"], gptq["gptq_group_size"]) == ("gptq-lora", 4, 64)
