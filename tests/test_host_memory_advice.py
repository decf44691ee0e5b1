"""A CPU run refused for host memory is told what can help: only the logits shrink with the batch and the sequence,
so a run whose weights (or weights, gradients and Adam state) do not fit is not told to lower them."""

import types

import pytest

from ftprof import host_memory

LLAMA_8B = types.SimpleNamespace(hidden_size=4096, num_hidden_layers=32, intermediate_size=14336, vocab_size=128256,
                                 num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)
GIB = 1 << 30


@pytest.mark.parametrize("method, dtype, available_gib, says, never", [
    ("lora", "float32", 20, ["weights alone do not fit", "--dtype bfloat16", "smaller --model", "GPU"],
     ["--batch-size"]),
    ("lora", "float32", 10, ["weights alone do not fit", "smaller --model", "more memory"],
     ["--batch-size", "--dtype bfloat16"]),
    ("full", "float32", 40, ["gradients and Adam state do not", "lora or qlora"], ["--batch-size"]),
    ("lora", "bfloat16", 16.1, ["--batch-size or --seq-len"], ["weights alone"]),
])
def test_refusal_advises_what_can_help(monkeypatch, method, dtype, available_gib, says, never):
    monkeypatch.setattr(host_memory, "available_bytes", lambda: int(available_gib * GIB))
    batch = 64 if "--batch-size or --seq-len" in says else 2  # the logits dominate only with a big batch
    line = host_memory.refusal(LLAMA_8B, method, dtype, batch_size=batch, seq_len=1024)
    assert line is not None and "\n" not in line
    assert all(w in line for w in says), line
    assert not any(w in line for w in never), line
