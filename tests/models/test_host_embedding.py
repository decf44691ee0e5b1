"""--offload-embeddings (ftprof/models/host_embedding.py): the input embedding table in host memory, its rows
gathered there. On the CPU the arithmetic must be the eager run's bit for bit; what leaves the device is checked on
the GPU (tests/gpu/test_gpu_memory_levers.py)."""

import csv
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import ftprof
from ftprof import metrics
from ftprof.config import declarations
from ftprof.engine.feed import BatchFeed
from ftprof.models import host_embedding
from ftprof.models.host_embedding import HostEmbedding
from tests.conftest import assert_train_refuses, build_run, run_one_step, tiny_config


def _losses(result) -> list[float]:
    with open(Path(result.run_dir) / "steps.csv") as fh:
        return [float(r["loss"]) for r in csv.DictReader(fh)]


@pytest.mark.slow  # two training runs each: about 3 s for lora, more for qlora
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_runs_train_the_same_losses_with_the_table_on_the_host(tmp_path, method):
    runs = {on: ftprof.train(tiny_config(tmp_path / str(on), method, max_steps=3, lr=3e-3, grad_accum=2,
                                         offload_embeddings=on)) for on in (False, True)}
    assert all(r.status == "ok" for r in runs.values()), {k: r.failure for k, r in runs.items()}
    assert len(_losses(runs[False])) == 3 and _losses(runs[True]) == _losses(runs[False])  # bitwise
    assert runs[True].flops.params_total == runs[False].flops.params_total  # the host table still counts


def test_the_table_leaves_the_model_parameters_and_gathers_the_same_rows(tmp_path):
    _, plain = build_run(tiny_config(tmp_path / "p", "lora"))
    _, moved = build_run(tiny_config(tmp_path / "m", "lora", offload_embeddings=True))
    table = moved.model.get_input_embeddings()
    assert isinstance(table, HostEmbedding) and moved.host_embedding is table
    assert all(p is not table.host_weight for p in moved.model.parameters())
    assert sum(p.numel() for p in moved.model.parameters()) == (
        sum(p.numel() for p in plain.model.parameters()) - table.host_weight.numel())
    ids = torch.randint(0, table.host_weight.shape[0], (2, 7))
    assert torch.equal(table(ids), plain.model.get_input_embeddings()(ids))
    assert metrics.count_params(moved.model).total == metrics.count_params(plain.model).total


def test_gradients_match_with_the_rows_fed_as_embeddings(tmp_path):
    grads = {}
    for on in (False, True):
        resolved, built = build_run(tiny_config(tmp_path / str(on), "lora", offload_embeddings=on))
        with torch.no_grad():  # PEFT's zero B would leave every A without a gradient
            for name, p in built.model.named_parameters():
                if "lora_B" in name:
                    torch.nn.init.normal_(p, std=0.02)
        run_one_step(resolved, built)
        grads[on] = {n: p.grad for n, p in built.model.named_parameters() if p.grad is not None}
    assert grads[True].keys() == grads[False].keys() and grads[True]
    assert all(torch.equal(grads[True][k], g) for k, g in grads[False].items())


def test_the_feed_sends_rows_instead_of_ids(tmp_path):
    _, built = build_run(tiny_config(tmp_path, "lora", offload_embeddings=True))
    ids = torch.randint(0, 100, (2, 5))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    fed, tokens, real = BatchFeed(iter([batch]), torch.device("cpu"), built.host_embedding).take()
    assert "input_ids" not in fed and fed["inputs_embeds"].shape == (2, 5, built.host_embedding.host_weight.shape[1])
    assert torch.equal(fed["inputs_embeds"], built.host_embedding.host_weight[ids])
    assert tokens == 10 and torch.equal(fed["labels"], ids)  # counted from the batch as it came


def test_tied_embeddings_stay_on_the_device():
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    before = model.get_input_embeddings()
    assert host_embedding.is_tied(model)
    assert host_embedding.move_to_host(model, torch.device("cpu")) is None
    assert model.get_input_embeddings() is before


def test_refused_for_full_fine_tuning(tmp_path, capsys):
    assert_train_refuses(tmp_path, capsys, "full", ["--offload-embeddings"],
                         "--offload-embeddings is a LoRA, QLoRA and GPTQ-LoRA option")


def test_refused_with_several_processes():
    values = {"method": "qlora", "offload_embeddings": True, declarations.SEVERAL: False}
    assert declarations.problems(values) == []
    several = declarations.problems({**values, declarations.SEVERAL: True})
    assert len(several) == 1 and several[0].startswith("--offload-embeddings keeps one process's table")
