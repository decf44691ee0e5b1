"""--save-merged: the LoRA adapters merged into the base, loadable by AutoModelForCausalLM, computing what the
adapted model computes (issue 40)."""

import pytest
import torch

from ftprof.config import RunConfig
from ftprof.errors import ConfigError


def _run(tmp_path, method, **options):
    from ftprof.engine.run import train

    cfg = RunConfig.from_flat({"model": "tiny", "device": "cpu", "dtype": "float32", "seq_len": 32, "batch_size": 2,
                               "max_steps": 3, "quiet": True, "method": method, "output_dir": str(tmp_path),
                               "run_name": "r", "save": True, "save_merged": True, "lr": 1e-2, **options})
    result = train(cfg)
    assert result.status == "ok", result.failure
    return result, tmp_path / "r"


@pytest.mark.parametrize("method, tolerance", [("lora", 1e-4), ("qlora", 1e-3)])
def test_merged_logits_equal_the_adapted_models(tmp_path, method, tolerance):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    result, run_dir = _run(tmp_path, method, lora_dropout=0.1)
    assert result.artifacts["merged_model"] == "merged"
    merged = AutoModelForCausalLM.from_pretrained(run_dir / "merged").eval()
    assert (run_dir / "merged" / "tokenizer_config.json").is_file() or \
        (run_dir / "merged" / "tokenizer.json").is_file()
    base = AutoModelForCausalLM.from_pretrained(run_dir / "base")
    adapted = PeftModel.from_pretrained(base, run_dir / "adapter").eval()
    ids = torch.randint(3, merged.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = adapted(input_ids=ids).logits
        got = merged(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(run_dir / "base").eval()(input_ids=ids).logits
    assert (want - plain).abs().max() > 10 * tolerance  # the adapters trained: merging them is no no-op
    torch.testing.assert_close(got, want, atol=tolerance, rtol=0)


@pytest.mark.parametrize("method, fragment", [
    ("gptq-lora", "a GPTQ base cannot take merged 16-bit weights"),
    ("full", "full fine-tuning has no adapters to merge"),
])
def test_save_merged_refused_in_one_line(tmp_path, method, fragment):
    from ftprof.engine.run import resolve_resume

    cfg = RunConfig.from_flat({"method": method, "save_merged": True, "output_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=fragment):
        resolve_resume(cfg)


def test_save_dir_takes_save_merged_alone():
    cfg = RunConfig.from_flat({"method": "lora", "save_merged": True, "save_dir": "x"})
    assert cfg.save.save_dir == "x" and not cfg.save.save
