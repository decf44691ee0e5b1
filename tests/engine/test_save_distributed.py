"""--save under FSDP2 and DDP: two CPU processes (gloo) under torchrun, gathered and written once by rank 0, and
reloadable: the adapter on the saved base, the full model with transformers."""

import json

import pytest
import torch

import ftprof
from tests.conftest import tiny_config

IDS = torch.tensor([[1, 5, 9, 13, 21, 34, 55, 89]])


@pytest.mark.slow  # two processes under torchrun: > 10 s on the 2-core machine
@pytest.mark.parametrize("method, parallel", [("lora", "fsdp"), ("lora", "ddp"), ("full", "fsdp")])
def test_two_process_save_reloads(tmp_path, method, parallel):
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(tmp_path, method, nproc_per_node=2, parallel=parallel, max_steps=3, lr=1e-2, save=True,
                      run_name="d", seq_len=16, batch_size=2)
    result = ftprof.train(cfg)
    assert result.status == "ok", result.failure.error_tail
    run = tmp_path / "d"
    assert result.saved.save_time_s > 0
    if method == "full":
        model = AutoModelForCausalLM.from_pretrained(run / "model")
        assert json.loads((run / "model" / "config.json").read_text())["model_type"] == "llama"
    else:
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(run / "base")
        model = PeftModel.from_pretrained(base, run / "adapter")
        with torch.no_grad(), model.disable_adapter():
            plain = base(input_ids=IDS).logits
        # the trained adapter (lr 1e-2, 3 steps) moved the logits away from the base's
        with torch.no_grad():
            assert not torch.allclose(model(input_ids=IDS).logits, plain, atol=1e-4)
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=IDS).logits).all()
    assert not list(run.glob(".*tmp*"))  # one writer: nothing left half-written
