"""The effective configuration: options that did nothing in a run are dropped, each value has one spelling, and
runs that ran the same way share one key."""

import pandas as pd

from ftprof.results.effective import config_key, effective, effective_frame


def _row(**kw):
    return {"method": "qlora", "model": "llama-8b", "batch_size": 2, "seq_len": 128, "kernels": "eager",
            "compile": False, "compile_loss": True, "compile_dequant": False, "compile_mode": "default",
            "compile_tuning": False, "checkpointing": "none", "checkpoint_layers": None, "dataset": "synthetic",
            "data_format": "auto", "train_on": "completion", "packing": False, "lora_r": 16, "lora_alpha": 32.0,
            "quant_type": "nf4", "keep_dequantized": True, "gptq_bits": None, "lr": 2e-4, **kw}


def test_options_that_do_not_apply_are_dropped():
    liger = effective(_row(kernels="liger", compile=True, checkpointing="full"))
    assert liger["compile_loss"] is None  # Liger computes the loss
    assert liger["compile_dequant"] is False and liger["keep_dequantized"] is True
    eager = effective(_row())
    assert all(eager[k] is None for k in ("compile_loss", "compile_dequant", "compile_mode", "compile_tuning"))
    assert eager["keep_dequantized"] is None  # only under full checkpointing
    assert eager["data_format"] is None and eager["train_on"] is None and eager["packing"] is None  # synthetic
    full = effective(_row(method="full"))
    assert full["lora_r"] is None and full["quant_type"] is None
    assert effective(_row(checkpoint_layers=2))["checkpoint_layers"] is None  # no checkpointing
    assert effective(_row(checkpointing="full", checkpoint_layers=2))["checkpoint_layers"] == 2
    real = effective(_row(dataset="data.jsonl", data_format="text", response_field="output", text_field="text"))
    assert real["text_field"] == "text" and real["response_field"] is None and real["train_on"] is None


def test_one_spelling_per_value():
    a = effective(_row(compile=True, compile_dequant=0, lora_alpha=32, lr="0.0002", batch_size=2.0))
    b = effective(_row(compile=True, compile_dequant=False, lora_alpha=32.0, lr=2e-4, batch_size=2))
    assert a == b
    assert a["compile_dequant"] is False and isinstance(a["batch_size"], int) and isinstance(a["lora_alpha"], float)
    assert effective(_row(compile="True"))["compile"] is True


def test_runs_that_ran_the_same_way_share_a_key():
    df = pd.DataFrame([_row(compile=True, compile_dequant=0), _row(compile=True, compile_dequant=False),
                       _row(compile=False, compile_dequant=False, compile_loss=False), _row()])
    keys = config_key(df)
    assert keys[0] == keys[1] and keys[2] == keys[3] and keys[0] != keys[2]


def test_old_runs_get_the_policy_and_the_frame_is_idempotent():
    df = pd.DataFrame([{**_row(), "checkpointing": None, "gradient_checkpointing": True}])
    eff = effective_frame(df)
    assert eff["checkpointing"][0] == "full" and eff["world_size"][0] == 1
    assert effective_frame(eff) is eff
    assert effective_frame(eff.copy()).equals(eff)
