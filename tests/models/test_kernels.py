"""--kernels liger's fused loss (models/kernels.py): ftprof asks Liger for chunks of up to LOSS_CHUNK_TOKENS tokens
instead of its 64-token chunks at micro-batch 1 x 2048, only while the run's patch is on."""

import pytest
import torch

from ftprof.models import kernels

LLAMA_8B = (128256, 4096)  # vocabulary, hidden


def test_the_chunk_is_ligers():
    # Liger's own example (ops/fused_linear_cross_entropy.py): 4096 x 4 tokens, vocabulary 32,000, hidden 4,096
    assert kernels.loss_chunk_tokens(4096 * 4, 32000, 4096, 1) == 2048
    assert kernels.loss_chunk_tokens(2048, *LLAMA_8B, 1) == 64
    assert kernels.loss_chunk_tokens(8192, *LLAMA_8B, 1) == 256
    assert kernels.loss_chunk_tokens(100, *LLAMA_8B, 64) == 100  # never more than the tokens


@pytest.mark.parametrize("tokens, most", [(2048, 2048), (2048, 1024), (8192, 2048), (8192, 1000), (16384, 512)])
def test_the_budget_gives_the_largest_chunk_within_the_bound(tokens, most):
    budget = kernels.loss_budget(tokens, *LLAMA_8B, most)
    assert kernels.loss_chunk_tokens(tokens, *LLAMA_8B, budget) <= most
    assert kernels.loss_chunk_tokens(tokens, *LLAMA_8B, budget + 1) > most or budget * LLAMA_8B[1] >= LLAMA_8B[0]


@pytest.mark.slow  # (imports Liger and transformers' Llama: 4 s)
def test_the_run_asks_liger_for_the_chunk_and_gives_the_loss_back(monkeypatch):
    llama = pytest.importorskip("liger_kernel.transformers.model.llama")
    calls = []
    recorder = lambda **kw: calls.append(kw) or "loss"  # noqa: E731
    monkeypatch.setattr(llama, "LigerForCausalLMLoss", recorder)
    monkeypatch.setattr(kernels, "LOSS_CHUNK_TOKENS", 2048)
    hidden = torch.empty(1, 2048, LLAMA_8B[1], device="meta")
    head = torch.empty(*LLAMA_8B, device="meta")
    with kernels.patched("liger", "llama"):
        assert llama.LigerForCausalLMLoss(hidden_states=hidden, lm_head_weight=head, labels=None,
                                          hidden_size=LLAMA_8B[1]) == "loss"
    assert llama.LigerForCausalLMLoss is recorder  # put back
    budget = calls[0]["chunk_mem_const"]
    assert kernels.loss_chunk_tokens(2048, *LLAMA_8B, budget) == 2048 and calls[0]["hidden_states"] is hidden
    monkeypatch.setattr(kernels, "LOSS_CHUNK_TOKENS", 0)  # Liger's own chunks
    with kernels.patched("liger", "llama"):
        assert llama.LigerForCausalLMLoss is recorder


def test_a_run_records_the_chunks_its_fused_loss_ran_in(monkeypatch):
    """result.json's compile.loss_chunk_tokens: what a kept run's loss ran as (runs before 2026-12-06: Liger's)."""
    from types import SimpleNamespace

    from ftprof.engine.result import _compile

    built = SimpleNamespace(compiled=None, sdpa_backend_used=None)
    monkeypatch.setattr(kernels, "LOSS_CHUNK_TOKENS", 1024)
    assert _compile(built, [*kernels.BLOCK_KERNELS, kernels.FUSED_LOSS], [], "auto").loss_chunk_tokens == 1024
    assert _compile(built, [], [], "auto").loss_chunk_tokens is None  # no fused loss


@pytest.mark.parametrize("text, tokens", [(None, kernels.DEFAULT_LOSS_CHUNK_TOKENS), ("0", 0), ("2048", 2048),
                                          ("-1", None), ("many", None)])
def test_the_switch_reads_a_whole_number_of_tokens(text, tokens):
    assert kernels._chunk_setting(text) == tokens


def test_a_bad_switch_is_refused_before_the_run(monkeypatch):
    from ftprof.errors import ConfigError

    pytest.importorskip("liger_kernel")
    monkeypatch.setenv(kernels.CHUNK_SWITCH, "many")
    with pytest.raises(ConfigError, match="FTPROF_LOSS_CHUNK_TOKENS='many': give the most tokens"):
        kernels.check_liger("llama")
    monkeypatch.setenv(kernels.CHUNK_SWITCH, "0")
    kernels.check_liger("llama")
